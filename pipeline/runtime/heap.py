"""Python's garbage collector and the loop's latency: what start-up built is kept out of the
full collections while the loop serves.

A full (generation 2) collection walks every object the collector tracks, with the GIL held:
the loop, the scoring thread and librdkafka's delivery callbacks all wait for it. The imports
of the serving path alone leave some 420,000 objects, and a full collection over them takes
75-100 ms on our 2-core VM when nothing else runs; a ``bench latency`` process made eight full
collections, of up to 168 ms (BENCHMARKS.md section 19). CPython starts one whenever the
objects that survived younger collections reach a quarter of those already in generation 2:
under a steady load, at random steps, each a stall of the whole process that shows in the tail
of the latency.

:func:`frozen_heap` collects once before the loop starts and then freezes what is left
(:func:`gc.freeze`: moved to a permanent generation that collections skip); the collections
that follow walk only what was made since. The objects are not changed, and reference counting
frees them as before; only a reference cycle among frozen objects is not collected while
frozen. The one such garbage a run can make is a replaced model version (the built-in model in
one process holds no cycle, measured; a sharded one or a user's module may), so
:func:`collect_after_swap` collects everything once after each swap (one full-collection pause
per swap, beside the swap's own warm-up) and freezes again.

Example::

    with frozen_heap():
        serve()  # ... a swap:
        collect_after_swap()
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collect_after_swap", "frozen_heap"]

log = logging.getLogger(__name__)


def _collect_and_freeze(reason: str) -> None:
    started = time.perf_counter()
    unreachable = gc.collect()
    gc.freeze()
    log.debug(
        "%s: %d unreachable objects collected, %d frozen, in %.0f ms",
        reason,
        unreachable,
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1e3,
    )


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, freeze what is left for the block, unfreeze after it (a process that runs
    several loops, as a benchmark or a test does, collects between them as before)."""
    _collect_and_freeze("before the loop")
    try:
        yield
    finally:
        gc.unfreeze()


def collect_after_swap() -> None:
    """Collect everything once (the replaced version's cycles among it) and freeze again."""
    gc.unfreeze()
    _collect_and_freeze("after a model swap")
