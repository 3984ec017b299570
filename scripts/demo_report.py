"""Pretty-print for scripts/demo.sh.

`recs` reads Recommendations as JSON lines on stdin; `summary FILE [RATE]` reads a run summary;
`rate FILE` reads a `streamrank bench latency --capacity-only --json` report and prints the
capacity and half of it (events/s, whole numbers).
"""

import json
import sys


def show_recommendations() -> None:
    for line in sys.stdin:
        rec = json.loads(line)
        top = ", ".join(f"{i['item_id']}:{i['score']:.3f}" for i in rec["items"][:5])
        print(
            f"  event {rec['event_id'][:12]}.. user {rec['user_id']} model {rec['model_version']}"
            f" fallback={rec['fallback_features']}\n    top items: {top}"
        )


def show_summary(path: str, rate: str | None) -> None:
    with open(path) as f:
        s = json.load(f)
    print(f"  events in            {s['events_in']}")
    print(f"  recommendations out  {s['events_out']}")
    print(f"  dead-lettered        {s['dead_lettered']}")
    if rate:
        print(f"  offered              {rate} events/s")
    print(f"  events/s             {s['events_per_s']}")
    print(f"  scored rows/s        {s['rows_per_s']}")
    print(f"  end-to-end latency   p50 {s['latency_p50_ms']} ms, p99 {s['latency_p99_ms']} ms")


def show_rate(path: str) -> None:
    """The last line of the file is the report; prints `capacity half`."""
    with open(path) as f:
        report = json.loads(f.read().strip().splitlines()[-1])
    capacity = float(report["capacity_events_per_s"])
    print(f"{capacity:.0f} {max(1, round(capacity / 2))}")


if __name__ == "__main__":
    if sys.argv[1] == "recs":
        show_recommendations()
    elif sys.argv[1] == "rate":
        show_rate(sys.argv[2])
    else:
        show_summary(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
