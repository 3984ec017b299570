"""``streamrank plan-capacity``, run as a user runs it (no stack): the plan from report files,
as text and JSON; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pipeline.cli.conftest import CliRunner
from tests.pipeline.tools.test_capacity import H200, OVERHEAD


def test_the_command_prints_the_plan_and_refuses_bad_input(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    files = []
    for name, report in (("overhead.json", OVERHEAD), ("model.json", H200)):
        path = tmp_path / name
        path.write_text("some progress line\n" + json.dumps(report) + "\n")  # a whole stdout
        files += ["--from", str(path)]
    text = run_cli("plan-capacity", *files)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "capacity plan for 120,000 events/s x 60 candidates, p99 under 100 ms" in text.stdout
    assert "gpus = ceil(rows_per_s / (gpu_rows_per_s x u)) = 8" in text.stdout
    assert "[overhead.json (streamrank bench overhead --json > overhead.json)]" in text.stdout
    as_json = run_cli("plan-capacity", *files, "--events-per-s", "60000", "--json")
    plan = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert plan["plan"]["gpus"]["value"] == 4 and plan["target"]["events_per_s"] == 60000
    for args, fragment in (
        (["--from", str(tmp_path / "missing.json")], "missing.json"),
        (["--from", str(tmp_path / "overhead.json"), "--utilisation", "1.5"], "utilisation"),
    ):
        bad = run_cli("plan-capacity", *args)
        assert bad.returncode == 2 and fragment in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
