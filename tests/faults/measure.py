"""What a fault test measured, printed in one line (``pytest -s``) for RELIABILITY.md."""

from __future__ import annotations

from collections import Counter
from typing import Any


def report(
    scenario: str, sent: set[str], recs: list[dict[str, Any]], recover_s: float, mode: str
) -> tuple[int, int]:
    """Print ``RELIABILITY scenario events missing duplicates recover_s mode``.

    Returns:
        (missing, duplicates): valid events with no recommendation, and extra recommendations.
    """
    counts = Counter(r["event_id"] for r in recs)
    missing = len(sent - set(counts))
    duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\nRELIABILITY scenario={scenario} events={len(sent)} missing={missing} "
        f"duplicates={duplicates} recover_s={recover_s:.1f} mode={mode}"
    )
    return missing, duplicates
