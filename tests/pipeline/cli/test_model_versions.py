"""``streamrank init-model`` into versions, ``model list|promote|import``, run as a user runs
them; every mistake is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.pipeline.cli.conftest import CliRunner
from tests.pipeline.cli.test_user_errors import _assert_one_line_user_error
from tests.support.foreign_checkpoint import payload_runs, write_foreign_index

TINY_MODEL = """
[model]
embedding_dim = 8
dense_arch = [16, 8]
over_arch = [16, 1]
recent_items_cap = 4
[model.num_embeddings]
user_id = 500
item_id = 700
item_category = 20
device = 8
country = 16
recent_items = 700
[synthetic]
num_users = 200
num_items = 600
num_categories = 20
"""


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_MODEL)
    return path


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _listing(run_cli: CliRunner, conf: Path, models: Path) -> dict[str, object]:
    result = _ok(run_cli("model", "list", "--dir", str(models), "--json", "-c", str(conf)))
    parsed: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


@pytest.mark.slow
def test_versions_from_init_model_to_promote_and_back(
    run_cli: CliRunner, conf: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    train = ("init-model", "--events", "300", "--out", str(models), "-c", str(conf))
    _ok(run_cli(*train, "--versioned", "--version", "v1"))
    _ok(run_cli(*train, "--version", "v2", "--seed", "1"))  # a versions dir: a new version
    listing = _listing(run_cli, conf, models)
    assert listing["current"] == "v1"  # the first version became current, v2 waits
    versions = {v["version"]: v for v in listing["versions"]}  # type: ignore[attr-defined]
    assert set(versions) == {"v1", "v2"}
    assert versions["v1"]["current"] and versions["v1"]["complete"]
    assert "auc" in versions["v2"]["metrics"]

    promoted = _ok(run_cli("model", "promote", "v2", "--dir", str(models), "-c", str(conf)))
    assert "v2 is current" in promoted.stderr and "was v1" in promoted.stderr
    assert _listing(run_cli, conf, models)["current"] == "v2"
    text = _ok(
        run_cli("model", "list", "-c", str(conf), env={"STREAMRANK_MODEL__CHECKPOINT": str(models)})
    )  # the default dir: model.checkpoint
    marks = {line[2:].split()[0]: line[0] for line in text.stdout.splitlines()}
    assert marks == {"v1": " ", "v2": "*"}

    # init-model --promote makes the new version current at once.
    _ok(run_cli(*train, "--version", "v3", "--seed", "2", "--promote"))
    assert _listing(run_cli, conf, models)["current"] == "v3"

    # A plain checkpoint trained as before, imported under a new name and promoted.
    plain = tmp_path / "plain"
    _ok(run_cli("init-model", "--events", "300", "--out", str(plain), "-c", str(conf)))
    assert (plain / "meta.json").is_file() and not (plain / "current.json").exists()
    _ok(
        run_cli(
            "model",
            "import",
            str(plain),
            "--dir",
            str(models),
            "--version",
            "v4",
            "--promote",
            "-c",
            str(conf),
        )
    )
    listing = _listing(run_cli, conf, models)
    assert listing["current"] == "v4" and listing["previous"] == "v3"

    # plan reads the current version's spec (the tiny one), not the [model] defaults.
    plan = _ok(
        run_cli("plan", "--nproc", "1", "--json", env={"STREAMRANK_MODEL__CHECKPOINT": str(models)})
    )
    tables = json.loads(plan.stdout.strip().splitlines()[-1])["tables"]
    assert {t["feature"]: t["num_embeddings"] for t in tables}["item_id"] == 700


def test_promote_an_unknown_version(run_cli: CliRunner, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "current.json").write_text(
        json.dumps({"format_version": 1, "version": None, "generation": 0})
    )
    result = run_cli("model", "promote", "v9", "--dir", str(models))
    _assert_one_line_user_error(result, "no model version 'v9'", "known: none")


def test_versions_commands_on_a_missing_directory(run_cli: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for args in (("model", "list"), ("model", "promote", "v1")):
        result = run_cli(*args, env={"STREAMRANK_MODEL__CHECKPOINT": str(missing)})
        _assert_one_line_user_error(result, str(missing), "does not exist", "--versioned")


def test_versions_commands_on_a_plain_checkpoint(run_cli: CliRunner, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "meta.json").write_text("{}")
    result = run_cli("model", "list", "--dir", str(plain))
    _assert_one_line_user_error(result, "plain checkpoint", "model import")
    result = run_cli("init-model", "--out", str(plain), "--promote")
    _assert_one_line_user_error(result, "plain checkpoint", "--out NEWDIR")


def test_a_corrupt_pointer(run_cli: CliRunner, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "current.json").write_text("{")
    _assert_one_line_user_error(run_cli("model", "list", "--dir", str(models)), "corrupt")


def test_init_model_refuses_a_taken_version_before_training(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    (models / "v1").mkdir(parents=True)
    (models / "current.json").write_text(
        json.dumps({"format_version": 1, "version": "v1", "generation": 1})
    )
    result = run_cli("init-model", "--out", str(models), "--version", "v1")
    _assert_one_line_user_error(result, "v1 already exists", "--overwrite")
    result = run_cli("init-model", "--out", str(models), "--version", "v1", "--overwrite")
    _assert_one_line_user_error(result, "v1 is current")
    result = run_cli("init-model", "--out", str(models), "--version", "../x")
    _assert_one_line_user_error(result, "--version", "bad version name")


def test_run_with_nothing_promoted(run_cli: CliRunner, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "current.json").write_text(
        json.dumps({"format_version": 1, "version": None, "generation": 0})
    )
    result = run_cli("run", env={"STREAMRANK_MODEL__CHECKPOINT": str(models)})
    _assert_one_line_user_error(result, "no current model version", "model promote")


def test_import_refuses_a_sharded_checkpoint_whose_index_runs_code(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "meta.json").write_text(json.dumps({"format_version": 1, "model_version": "f1"}))
    marker = tmp_path / "payload-ran"
    write_foreign_index(foreign, marker)
    assert payload_runs(tmp_path)  # what DCP's own reader (plain pickle) would do with it
    models = tmp_path / "models"
    result = run_cli("model", "import", str(foreign), "--dir", str(models))
    _assert_one_line_user_error(result, "refused sharded checkpoint index", "io.open")
    assert not marker.exists()
    assert not (models / "f1").exists()
