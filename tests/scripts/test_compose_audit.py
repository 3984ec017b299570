"""The counting of the compose check's audit (scripts/compose_audit.py): every input message is
matched with what the pipeline wrote for it. The Kafka and Prometheus parts run only in the
compose check (`make compose-check`), against the running stack."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compose_audit.py"


@pytest.fixture(scope="module")
def audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_audit", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compose_audit"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_clean_run_has_no_problem(audit: ModuleType) -> None:
    inputs = [audit.InputMessage(0, 0, "a"), audit.InputMessage(0, 1, None)]
    inputs += [audit.InputMessage(1, 0, "b")]
    result = audit.audit_topics(
        inputs, ["a", "b"], [audit.DeadLetter(0, 1, "undecodable")], ["v1", "v2"]
    )
    assert (result.sent, result.malformed, result.scored, result.missing) == (2, 1, 2, 0)
    assert (result.duplicates, result.dead_lettered) == (0, 1)
    assert result.reasons == {"undecodable": 1} and result.versions == {"v1": 1, "v2": 1}
    assert result.problems(exactly_once=True) == []


def test_missing_duplicates_and_misrouted_messages_are_counted(audit: ModuleType) -> None:
    inputs = [audit.InputMessage(0, o, f"e{o}") for o in range(4)]
    inputs += [audit.InputMessage(1, 0, None), audit.InputMessage(1, 1, None)]
    letters = [
        audit.DeadLetter(1, 0, "empty_value"),
        audit.DeadLetter(1, 0, "empty_value"),  # the same message twice
        audit.DeadLetter(0, 3, "processing_error"),  # a valid event dead-lettered
    ]
    result = audit.audit_topics(inputs, ["e0", "e1", "e1", "e1", "zz"], letters)
    assert (result.scored, result.missing, result.duplicates) == (2, 2, 2)
    assert result.malformed_not_dead_lettered == 1  # (1, 1)
    assert result.dead_letter_duplicates == 1
    assert result.valid_dead_lettered == 1
    assert result.unknown_outputs == 1
    problems = audit.audit_topics(inputs, ["e0", "e1", "e1", "e1", "zz"], letters).problems
    assert problems(exactly_once=False) == [
        "missing: 2",
        "malformed messages not dead-lettered: 1",
        "valid events dead-lettered: 1",
        "recommendations of unknown events: 1",
    ]
    assert "duplicates: 2" in problems(exactly_once=True)


def test_nothing_sent_is_a_problem(audit: ModuleType) -> None:
    assert audit.audit_topics([], [], []).problems(exactly_once=False) == ["events sent (none): 1"]
