"""The loop's frozen heap: what exists when the loop starts is skipped by collections, a
replaced model's cycles are still collected, and nothing stays frozen after the loop."""

from __future__ import annotations

import gc
import weakref

from pipeline.runtime.heap import collect_after_swap, frozen_heap


class _Node:
    """A reference cycle (as a replaced model's may be)."""

    def __init__(self) -> None:
        self.me = self


def test_what_start_up_built_is_frozen_for_the_loop_and_thawed_after_it() -> None:
    long_lived = [_Node() for _ in range(3)]
    with frozen_heap():
        assert gc.get_freeze_count() >= len(long_lived)
        young = _Node()
        assert gc.is_tracked(young)
    assert gc.get_freeze_count() == 0


def test_garbage_of_start_up_is_collected_before_freezing() -> None:
    cycle = _Node()
    gone = weakref.ref(cycle)
    del cycle
    with frozen_heap():
        assert gone() is None


def test_a_cycle_frozen_at_start_and_dropped_by_a_swap_is_collected_after_it() -> None:
    replaced = _Node()
    gone = weakref.ref(replaced)
    with frozen_heap():
        del replaced  # the old version, frozen with the rest, now garbage
        gc.collect()
        assert gone() is not None  # frozen: no collection sees it
        collect_after_swap()
        assert gone() is None
        assert gc.get_freeze_count() > 0  # frozen again
    assert gc.get_freeze_count() == 0
