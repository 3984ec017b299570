"""SlotTable against a dict model: random assignments, evictions and refreshes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.slot_table import SlotTable

CAPACITY = 8
# Few distinct ids (so refreshes and evictions are frequent), some colliding in the table.
ids = st.one_of(st.integers(0, 40), st.integers(-(2**63), 2**63 - 1))
steps = st.lists(st.lists(st.tuples(ids, st.integers(0, CAPACITY - 1)), max_size=6), max_size=30)


@settings(max_examples=300, deadline=None)
@given(steps, st.lists(ids, max_size=20))
def test_find_agrees_with_a_dict_of_live_slots(
    batches: list[list[tuple[int, int]]], probes: list[int]
) -> None:
    table = SlotTable(CAPACITY)
    slot_of: dict[int, int] = {}
    id_in_slot: dict[int, int] = {}
    for batch in batches:
        for key, slot in batch:
            old = id_in_slot.get(slot)
            if old is not None and slot_of.get(old) == slot:
                del slot_of[old]
            slot_of[key] = slot
            id_in_slot[slot] = key
        table.assign(
            np.array([k for k, _ in batch], dtype=np.int64),
            np.array([s for _, s in batch], dtype=np.int64),
        )
        every = list(slot_of) + probes
        got = table.find(np.array(every, dtype=np.int64)).tolist()
        assert got == [slot_of.get(k, -1) for k in every]
