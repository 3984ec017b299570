"""``--version`` and ``--config`` on either side of the command."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from tests.pipeline.cli.conftest import CliRunner


def test_version(run_cli: CliRunner) -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"streamrank {importlib.metadata.version('streamrank')}\n"


def test_config_after_the_command_is_applied(run_cli: CliRunner, tmp_path: Path) -> None:
    small = tmp_path / "small.toml"
    small.write_text(
        f'[model]\ncheckpoint = "{tmp_path / "none"}"\nembedding_dim = 8\ndense_arch = [16, 8]\n'
    )
    result = run_cli("plan", "--nproc", "1", "--json", "--config", str(small))
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    assert {table["embedding_dim"] for table in plan["tables"]} == {8}


def test_config_after_the_command_wins_over_the_one_before(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[topics]\ninput = "events"\n')
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[topics]\ninputs = "events"\n')
    after_wins = run_cli("--config", str(good), "consume", "--config", str(unknown))
    assert after_wins.returncode == 2
    assert "unknown config key topics.inputs" in after_wins.stderr
    before_is_used = run_cli("--config", str(unknown), "consume")
    assert before_is_used.returncode == 2
    assert "unknown config key topics.inputs" in before_is_used.stderr


def test_help_of_a_command_lists_config(run_cli: CliRunner) -> None:
    result = run_cli("bench", "model", "--help")
    assert result.returncode == 0
    assert "--config" in result.stdout
