"""Mistakes in an output schema of the user's (``[output]``) at start-up: one line naming the key,
exit code 2, through the real CLI (``run`` checks them before it looks for Kafka, Redis or a
model version; ``model import`` too)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.byom import documented_output
from tests.pipeline.cli.conftest import CliRunner
from tests.pipeline.cli.test_user_errors import _assert_one_line_user_error

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dcn"


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"
    return f'"{value}"'


def _config(tmp_path: Path, output: dict[str, Any], *replacements: tuple[str, str]) -> Path:
    """examples/dcn/streamrank.toml with its documented [output] section (changed by
    ``output``) and ``replacements`` made (each must apply)."""
    text = (EXAMPLE / "streamrank.toml").read_text()
    text = text.replace(
        '"examples/dcn/search_request.avsc"', f'"{EXAMPLE / "search_request.avsc"}"'
    )
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    section = {**documented_output(), **output}
    text += "\n[output]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in section.items() if v)
    path = tmp_path / "dcn.toml"
    path.write_text(text)
    return path


def _run(run_cli: CliRunner, config: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("run", "-c", str(config), env={"STREAMRANK_MODEL__CHECKPOINT": "nowhere"})


@pytest.mark.parametrize(
    ("output", "replacement", "fragments"),
    [
        (
            {"model_version": "", "fallback_features": "model"},
            None,
            ("output.fallback_features = 'model' is string", "needs array<string> or boolean"),
        ),
        (
            {"task_scores": {"click": "ranked.p_click", "views": "ranked.p_purchase"}},
            None,
            ("output.task_scores.views", "model.module.output_names has no column 'views'"),
        ),
        (
            {"user_id": ""},
            None,
            ("output.schema_file", "'shopper_id' (long) has no default"),
        ),
        (
            {"echo": {"country": "want"}},
            None,
            ("output.echo.country = 'want'", "the event's field is int"),
        ),
        (
            {},
            ('output_names = ["click", "purchase"]', 'output_names = ["click", "purchase", "x"]'),
            ("model.module.output_names: 3 names for an output of 2 column(s)",),
        ),
        (
            {"echo": {"country": "session.region"}},
            None,
            ("output.echo.country = 'session.region'", "session has no field 'region'"),
        ),
    ],
    ids=["role-type", "unknown-task", "unfilled", "echo-type", "names-count", "echo-missing"],
)
def test_an_output_mistake_is_one_line_at_start_up(
    run_cli: CliRunner,
    tmp_path: Path,
    output: dict[str, Any],
    replacement: tuple[str, str] | None,
    fragments: tuple[str, ...],
) -> None:
    config = _config(tmp_path, output, *([replacement] if replacement else []))
    _assert_one_line_user_error(_run(run_cli, config), *fragments)


def test_model_import_checks_the_output_too(run_cli: CliRunner, tmp_path: Path) -> None:
    config = _config(tmp_path, {"scores": "channel"})
    result = run_cli(
        "model", "import", str(tmp_path / "none.pt"), "--dir", str(tmp_path / "v"),
        "-c", str(config),
    )  # fmt: skip
    _assert_one_line_user_error(result, "output.scores = 'channel' is string")


def test_roles_without_a_schema_and_echoes_of_the_built_in_model_are_one_line(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    config = tmp_path / "half.toml"
    config.write_text('[output]\nitems = "ranked.item"\n')
    _assert_one_line_user_error(
        _run(run_cli, config), "output.items is set but output.schema_file is not"
    )
    section = {**documented_output(), "task_scores": {}}
    config.write_text(
        "[output]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in section.items() if v)
    )
    _assert_one_line_user_error(
        _run(run_cli, config), "output.echo.country: echoed fields are read by a configured"
    )
