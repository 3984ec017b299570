#!/usr/bin/env bash
# One-shot setup of the compose stack (the `init` service), all through streamrank itself:
# 1. the input, output and DLQ topics with topics.partitions partitions (pipeline.connectors.kafka.clients's
#    ensure_topics, the same call `streamrank run` makes);
# 2. the synthetic world's user and item features into Redis (`streamrank seed-features`);
# 3. the model, trained once into the shared volume as the first version of a versions
#    directory (`streamrank init-model --versioned`: it becomes current); kept on reruns. Later
#    versions are added and promoted with `streamrank init-model`/`streamrank model` (docs/models.md).
set -euo pipefail

python -c '
from pipeline.settings.loading import load_settings
from pipeline.connectors.kafka.clients import ensure_topics

settings = load_settings()
ensure_topics(settings.kafka, settings.topics)
print("topics ready:", settings.topics.input, settings.topics.output, settings.topics.dlq)
'
streamrank seed-features
checkpoint="${STREAMRANK_MODEL__CHECKPOINT:-/models/ranker}"
if [[ -f "$checkpoint/current.json" || -f "$checkpoint/meta.json" ]]; then
    echo "model already in $checkpoint"
    streamrank model list --dir "$checkpoint" || true  # a plain checkpoint has no versions
else
    streamrank init-model --versioned --events "${STREAMRANK_INIT_EVENTS:-20000}"
fi
