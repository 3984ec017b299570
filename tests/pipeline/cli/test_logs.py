"""Log records on stderr: one per line (text), JSON objects (json), third-party noise dropped."""

from __future__ import annotations

import io
import json
import logging
import sys
import warnings
from collections.abc import Iterator

import pytest

from pipeline.cli import StreamrankApp
from pipeline.cli.logs import LogFormat, configure_logging, resolve_format


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with warnings.catch_warnings():
        yield
    logging.captureWarnings(False)
    root.handlers[:] = handlers
    root.setLevel(level)


def _log_a_multiline_record_and_an_exception() -> None:
    log = logging.getLogger("pipeline.test")
    log.info("sharding plan:\ntable  ranks\nt_user 0,1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")


def test_text_is_one_record_per_line(restore_logging: None) -> None:
    out = io.StringIO()
    assert configure_logging("INFO", LogFormat.AUTO, out) is LogFormat.TEXT  # not a terminal
    _log_a_multiline_record_and_an_exception()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(" INFO pipeline.test: sharding plan:\\ntable  ranks\\nt_user 0,1")
    assert " ERROR pipeline.test: failed\\nTraceback" in lines[1]
    assert "RuntimeError: boom" in lines[1]


def test_json_lines_are_objects(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    out = io.StringIO()
    configure_logging("INFO", LogFormat.JSON, out)
    _log_a_multiline_record_and_an_exception()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["message"] for r in records] == ["sharding plan:\ntable  ranks\nt_user 0,1", "failed"]
    assert all(r["logger"] == "pipeline.test" and r["rank"] == 1 for r in records)
    assert [r["level"] for r in records] == ["INFO", "ERROR"]
    assert "RuntimeError: boom" in records[1]["exception"]
    assert records[0]["time"].endswith("Z")


def test_levels_of_own_and_third_party_loggers(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("DEBUG", LogFormat.JSON, out)
    logging.getLogger("model.x").debug("ours")
    logging.getLogger("fbgemm").info("theirs, below WARNING")
    logging.getLogger("fbgemm").warning("theirs, a warning")
    assert [json.loads(line)["message"] for line in out.getvalue().splitlines()] == [
        "ours",
        "theirs, a warning",
    ]


def test_known_noise_is_dropped_and_other_warnings_are_records(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", LogFormat.JSON, out)
    # torch's loggers have their own handler once torch is imported: check the logger's verdict.
    fx = logging.getLogger("torch.fx._symbolic_trace")
    noise = fx.makeRecord(
        fx.name, logging.WARNING, __file__, 1, "is_fx_tracing will return true for both", (), None
    )
    other = fx.makeRecord(fx.name, logging.WARNING, __file__, 1, "something else", (), None)
    assert not fx.filter(noise)
    assert fx.filter(other)
    warnings.warn(
        "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.",
        FutureWarning,
        stacklevel=1,
    )
    warnings.warn("a warning the user should see", UserWarning, stacklevel=1)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["logger"] for r in records] == ["py.warnings"]
    assert "a warning the user should see" in records[0]["message"]


def test_rich_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_format(LogFormat.AUTO, Terminal()) is LogFormat.RICH
    assert resolve_format(LogFormat.AUTO, io.StringIO()) is LogFormat.TEXT
    assert resolve_format(LogFormat.JSON, Terminal()) is LogFormat.JSON


@pytest.mark.parametrize("fmt", [LogFormat.JSON, LogFormat.TEXT])
def test_a_crash_is_one_record_when_logs_are_collected(
    restore_logging: None, capsys: pytest.CaptureFixture[str], fmt: LogFormat
) -> None:
    crashing = StreamrankApp()

    @crashing.callback()
    def main() -> None:
        configure_logging("INFO", fmt, sys.stderr)

    @crashing.command()
    def boom() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(SystemExit) as exited:
        crashing(["boom"], prog_name="streamrank")
    assert exited.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    if fmt is LogFormat.JSON:
        record = json.loads(lines[0])
        assert record["level"] == "CRITICAL" and "RuntimeError: a bug" in record["exception"]
    else:
        assert " CRITICAL streamrank: failed: RuntimeError('a bug')\\nTraceback" in lines[0]
