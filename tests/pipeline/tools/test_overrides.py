"""``--variant section.key=value``: one setting changed, validated like a config file's."""

from __future__ import annotations

import pytest

from pipeline.settings.loading import Settings
from pipeline.tools.bench.overrides import with_override


def test_one_setting_changes_and_is_validated() -> None:
    settings = Settings()
    changed = with_override(settings, "retrieval.enabled=false")
    assert changed.retrieval.enabled is False and settings.retrieval.enabled is True
    assert changed.retrieval.num_candidates == settings.retrieval.num_candidates
    assert with_override(changed, "batching.max_batch_rows = 1024").batching.max_batch_rows == 1024


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("retrieval.enabled", "not section.key=value"),
        ("nosuch.key=1", "not section.key=value"),
        ("retrieval.nosuch=1", "not section.key=value"),
        ("batching.max_batch_rows=many", "valid integer"),
    ],
)
def test_a_bad_assignment_is_refused(assignment: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        with_override(Settings(), assignment)
