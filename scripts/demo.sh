#!/usr/bin/env bash
# The whole job end to end on the local stack (run by `make demo`, after install + stack-up):
# seed features into Redis, train a model, measure what this machine sustains, start the
# pipeline, produce events at half that rate (with a few malformed ones) once the pipeline has
# joined its consumer group, wait until all are scored, show recommendations and a summary.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STACK_DIR="${STACK_DIR:-.stack}"
DEMO_EVENTS="${DEMO_EVENTS:-5000}"
DEMO_RATE="${DEMO_RATE:-}"                          # events/s; empty: half the measured capacity
DEMO_CAPACITY_EVENTS="${DEMO_CAPACITY_EVENTS:-3000}"
DEMO_MALFORMED="${DEMO_MALFORMED:-25}"
SR=.venv/bin/streamrank

# shellcheck disable=SC1091
source "$STACK_DIR/env"
export STREAMRANK_MODEL__CHECKPOINT="${STREAMRANK_MODEL__CHECKPOINT:-artifacts/model}"
export STREAMRANK_METRICS__PORT="${STREAMRANK_METRICS__PORT:-0}"
mkdir -p artifacts

# The Redis URL may carry a password: print it masked.
redis_shown="$(sed -E 's#(://[^:/@]*:)[^@]*@#\1***@#' <<<"$STREAMRANK_REDIS__URL")"
echo "== 1/6 seeding synthetic user and item features into Redis ($redis_shown)"
$SR seed-features

if [[ ! -f "$STREAMRANK_MODEL__CHECKPOINT/meta.json" ]]; then
    echo "== 2/6 training the DLRM ranker on synthetic interactions"
    $SR init-model
else
    echo "== 2/6 using the trained model in $STREAMRANK_MODEL__CHECKPOINT (delete it to retrain)"
fi

if [[ -z "$DEMO_RATE" ]]; then
    echo "== 3/6 measuring what this machine sustains: the pipeline drains a backlog of" \
        "$DEMO_CAPACITY_EVENTS events (scratch topics, deleted after)"
    $SR bench latency --capacity-only --capacity-events "$DEMO_CAPACITY_EVENTS" --json \
        >artifacts/demo-capacity.json 2>artifacts/demo-capacity.log ||
        { echo "capacity run failed; see artifacts/demo-capacity.log" >&2; exit 1; }
    read -r capacity DEMO_RATE < <(
        .venv/bin/python scripts/demo_report.py rate artifacts/demo-capacity.json
    )
    echo "   capacity $capacity events/s: offering half of it, $DEMO_RATE events/s"
else
    echo "== 3/6 offering DEMO_RATE=$DEMO_RATE events/s (capacity not measured)"
fi

echo "== 4/6 starting the pipeline (stops after 5 s without input)"
summary=artifacts/demo-summary.json
rm -f "$summary"
$SR run --exit-when-idle 5 --summary-json "$summary" 2>artifacts/demo-pipeline.log &
pipeline_pid=$!
trap 'kill $pipeline_pid 2>/dev/null || true' EXIT

echo "== 5/6 once the pipeline has joined its consumer group: $DEMO_EVENTS events at" \
    "$DEMO_RATE/s plus $DEMO_MALFORMED malformed messages"
$SR produce --wait-for-group --wait-timeout 180 --events "$DEMO_EVENTS" --rate "$DEMO_RATE" \
    --malformed "$DEMO_MALFORMED"
wait $pipeline_pid || { echo "pipeline failed; see artifacts/demo-pipeline.log" >&2; exit 1; }
trap - EXIT

echo "== 6/6 a few recommendations from the output topic"
$SR consume --max 3 --timeout 10 | .venv/bin/python scripts/demo_report.py recs
echo
echo "== summary (every event was sent after the pipeline had joined: no start-up in the latency)"
.venv/bin/python scripts/demo_report.py summary "$summary" "$DEMO_RATE"
