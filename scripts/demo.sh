#!/usr/bin/env bash
# The whole job end to end on the local stack (run by `make demo`, after install + stack-up):
# seed features into Redis, train a model, start the pipeline, produce events (with a few
# malformed ones), wait until all are scored, show recommendations and a summary.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STACK_DIR="${STACK_DIR:-.stack}"
DEMO_EVENTS="${DEMO_EVENTS:-5000}"
DEMO_RATE="${DEMO_RATE:-500}"
DEMO_MALFORMED="${DEMO_MALFORMED:-25}"
SR=.venv/bin/streamrank

# shellcheck disable=SC1091
source "$STACK_DIR/env"
export STREAMRANK_MODEL__CHECKPOINT="${STREAMRANK_MODEL__CHECKPOINT:-artifacts/model}"
export STREAMRANK_METRICS__PORT="${STREAMRANK_METRICS__PORT:-0}"
mkdir -p artifacts

# The Redis URL may carry a password: print it masked.
redis_shown="$(sed -E 's#(://[^:/@]*:)[^@]*@#\1***@#' <<<"$STREAMRANK_REDIS__URL")"
echo "== 1/5 seeding synthetic user and item features into Redis ($redis_shown)"
$SR seed-features

if [[ ! -f "$STREAMRANK_MODEL__CHECKPOINT/meta.json" ]]; then
    echo "== 2/5 training the DLRM ranker on synthetic interactions"
    $SR init-model
else
    echo "== 2/5 using the trained model in $STREAMRANK_MODEL__CHECKPOINT (delete it to retrain)"
fi

echo "== 3/5 starting the pipeline (stops after 5 s without input)"
summary=artifacts/demo-summary.json
rm -f "$summary"
$SR run --exit-when-idle 5 --summary-json "$summary" 2>artifacts/demo-pipeline.log &
pipeline_pid=$!
trap 'kill $pipeline_pid 2>/dev/null || true' EXIT

echo "== 4/5 producing $DEMO_EVENTS events at $DEMO_RATE/s plus $DEMO_MALFORMED malformed messages"
$SR produce --events "$DEMO_EVENTS" --rate "$DEMO_RATE" --malformed "$DEMO_MALFORMED"
wait $pipeline_pid || { echo "pipeline failed; see artifacts/demo-pipeline.log" >&2; exit 1; }
trap - EXIT

echo "== 5/5 a few recommendations from the output topic"
$SR consume --max 3 --timeout 10 | .venv/bin/python scripts/demo_report.py recs
echo
echo "== summary"
.venv/bin/python scripts/demo_report.py summary "$summary"
