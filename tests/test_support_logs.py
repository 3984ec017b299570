"""tests/support/logs.py: a failed run's first error lines come before its tail."""

from __future__ import annotations

from pathlib import Path

from tests.support.logs import failure_excerpt


def test_the_first_error_of_a_rank_is_shown_when_another_ranks_traceback_fills_the_tail(
    tmp_path: Path,
) -> None:
    log = tmp_path / "run.log"
    lines = [
        "2026-12-04T18:56:20Z INFO rank0 streamrank: serving",
        "2026-12-04T18:56:21Z ERROR rank1 streamrank: the cause",
        "2026-12-04T18:56:22Z INFO rank0 pipeline: scoring",
        "RuntimeError: Connection closed by peer " + "x" * 5000,
    ]
    log.write_text("\n".join(lines))

    excerpt = failure_excerpt(log, tail=100)

    assert "ERROR rank1 streamrank: the cause" in excerpt
    assert excerpt.index("the cause") < excerpt.index("last 100 characters")
    assert excerpt.endswith("x" * 100)
    assert "INFO rank0" not in excerpt


def test_a_log_without_errors_is_its_tail_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("a\nb\n")
    assert failure_excerpt(log) == "last 3000 characters:\na\nb\n"
    assert failure_excerpt(tmp_path / "missing.log") == ""
