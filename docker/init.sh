#!/usr/bin/env bash
# One-shot setup of the compose stack (the `init` service), all through streamrank itself:
# 1. the input, output and DLQ topics with topics.partitions partitions (pipeline.kafka_io's
#    ensure_topics, the same call `streamrank run` makes);
# 2. the synthetic world's user and item features into Redis (`streamrank seed-features`);
# 3. the model, trained once into the shared volume (`streamrank init-model`); kept on reruns.
set -euo pipefail

python -c '
from pipeline.config import load_settings
from pipeline.kafka_io import ensure_topics

settings = load_settings()
ensure_topics(settings.kafka, settings.topics)
print("topics ready:", settings.topics.input, settings.topics.output, settings.topics.dlq)
'
streamrank seed-features
checkpoint="${STREAMRANK_MODEL__CHECKPOINT:-/models/current}"
if [[ -f "$checkpoint/meta.json" ]]; then
    echo "model already trained in $checkpoint"
else
    streamrank init-model --events "${STREAMRANK_INIT_EVENTS:-20000}"
fi
