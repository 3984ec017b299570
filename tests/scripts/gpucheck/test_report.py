"""Tests for scripts.gpucheck.report: the JSON is on disk after every section, errors are kept."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from scripts.gpucheck.report import CheckReport


def test_every_section_is_saved_before_the_next_one_runs(tmp_path: Path) -> None:
    path = tmp_path / "check.json"
    out = io.StringIO()
    report = CheckReport(path, {"device": "cpu"}, out=out)
    assert json.loads(path.read_text())["device"] == "cpu"  # the header, before any section
    seen_on_disk: list[dict[str, Any]] = []

    def second() -> dict[str, Any]:
        seen_on_disk.append(json.loads(path.read_text()))
        return {"ok": True, "n": 2}

    def broken() -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    report.section("first", lambda: {"ok": True, "n": 1})
    report.section("broken", broken)
    report.section("second", second)
    on_disk = seen_on_disk[0]
    assert on_disk["first"] == {"ok": True, "n": 1}
    assert on_disk["broken"]["error"].startswith("RuntimeError: CUDA error: an illegal memory")
    assert on_disk["check"]["running"] == "second" and on_disk["check"]["done"] == [
        "first",
        "broken",
    ]
    assert report.failed == ["broken"]
    saved = json.loads(path.read_text())
    assert not saved["check"]["finished"] and "ok" not in saved
    report.finish(ok=False)
    saved = json.loads(path.read_text())
    assert saved["check"]["finished"] and saved["ok"] is False
    assert saved["second"] == {"ok": True, "n": 2}
    assert any("raise RuntimeError" in line for line in saved["broken"]["traceback"])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line.get("section") for line in lines] == ["first", "broken", "second", None]
    assert lines[1]["result"] == saved["broken"] and lines[-1] == saved
    assert [p.name for p in tmp_path.iterdir()] == ["check.json"]


def test_without_a_file_the_lines_still_come(tmp_path: Path) -> None:
    out = io.StringIO()
    report = CheckReport(None, {"device": "cpu"}, out=out)
    report.section("only", lambda: {"ok": True})
    assert json.loads(out.getvalue().splitlines()[0])["result"] == {"ok": True}
    assert list(tmp_path.iterdir()) == []
