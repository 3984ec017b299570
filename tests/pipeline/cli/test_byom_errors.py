"""A configured model's mistakes at start-up: one line naming the key, exit code 2, through the
real CLI (``run`` checks the model before it looks for Kafka, Redis or a model version; ``model
import`` checks the state_dict file)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.pipeline.cli.conftest import CliRunner
from tests.pipeline.cli.test_user_errors import _assert_one_line_user_error

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "deepfm"
_RETRIEVAL_OFF = "enabled = false                               # every page view brings its offers"


def _config(tmp_path: Path, *replacements: tuple[str, str], append: str = "") -> Path:
    """examples/deepfm/streamrank.toml with ``replacements`` made (each must apply)."""
    text = (EXAMPLE / "streamrank.toml").read_text()
    text = text.replace('"examples/deepfm/page_view.avsc"', f'"{EXAMPLE / "page_view.avsc"}"')
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "byom.toml"
    path.write_text(text + append)
    return path


def _run(run_cli: CliRunner, config: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("run", "-c", str(config), env={"STREAMRANK_MODEL__CHECKPOINT": "nowhere"})


@pytest.mark.parametrize(
    ("replacement", "append", "fragments"),
    [
        (
            ('"torchrec.models.deepfm:SimpleDeepFMNN"', '"torchrec.models.deepfm:DeepFM2"'),
            "",
            ("model.module.factory", "torchrec.models.deepfm has no DeepFM2"),
        ),
        (
            ('"torchrec.models.deepfm:SimpleDeepFMNN"', '"team.models:Ranker"'),
            "",
            ("model.module.factory 'team.models:Ranker': cannot import team.models",),
        ),
        (
            ("[features.sparse.viewer]", "[features.sparse.viewer]"),
            '\n[features.sparse.country]\nsource = "event"\nfield = "viewer.browser"\n',
            ("features.sparse.country: the module has no embedding feature 'country'",),
        ),
        (
            ('user_id = "viewer.id"', 'user_id = "viewer.uid"'),
            "",
            ("events.user_id = 'viewer.uid'", "viewer has no field 'uid'"),
        ),
        (
            ('field = "hour_of_day"', 'field = "viewer.browser"'),
            "",
            ("features.dense[0].field = 'viewer.browser' is string", "a dense part needs"),
        ),
        (
            ('field = "recent_offer_ids"', 'field = "recent_offers"'),
            "",
            ("features.sparse.recent_offers.field = 'recent_offers'", "has no field"),
        ),
        (
            ("num_dense_features = 7", "num_dense_features = 6"),
            "",
            ("features.dense: the dense input is 7 wide", "num_dense_features = 6 in"),
        ),
        (
            ('fields = { stats = "vector:2" }', 'fields = { price = "vector:2" }'),
            "",
            ("features.dense[2].field = 'stats': [features.item] declares no such field",),
        ),
        (
            ('missing = "empty"', 'missing = "row"\nmissing_row = 12'),
            "",
            ("features.sparse.segment.missing_row = 12: the table has 12 rows",),
        ),
        (
            ('missing = "empty"', "missing_row = 3"),
            "",
            (
                "features.sparse.segment",
                "missing_row is for missing = 'row' (missing is 'empty')",
            ),
        ),
        (
            ('transform = "hash"', 'transform = "hash"\nmissing = "id"\nmissing_id = "?"'),
            "",
            ("features.sparse.browser.missing = 'id': viewer.browser is never missing",),
        ),
        (
            (_RETRIEVAL_OFF, 'query = { source = "table", table = "t_viewer" }'),
            '\n[retrieval.items]\nsource = "item"\nfield = "stats"\n',
            (
                "retrieval.query: the query vectors are 16 wide (table t_viewer) but the "
                "indexed ones 2 (features.item.fields.stats = 'vector:2')",
            ),
        ),
        (
            (_RETRIEVAL_OFF, "enabled = true"),
            "",
            ("retrieval.enabled = true with [model.module] needs retrieval.query and",),
        ),
    ],
    ids=[
        "factory-attribute",
        "factory-module",
        "key-the-module-lacks",
        "role-field-missing",
        "field-of-wrong-type",
        "feature-field-missing",
        "dense-width",
        "redis-field-undeclared",
        "missing-row-outside-the-table",
        "missing-row-without-its-policy",
        "missing-for-a-value-never-missing",
        "retrieval-widths",
        "retrieval-without-vectors",
    ],
)
def test_a_configured_model_mistake_is_one_line_at_start_up(
    run_cli: CliRunner,
    tmp_path: Path,
    replacement: tuple[str, str],
    append: str,
    fragments: tuple[str, ...],
) -> None:
    result = _run(run_cli, _config(tmp_path, replacement, append=append))
    _assert_one_line_user_error(result, *fragments)


def test_a_state_dict_of_other_shapes_is_one_line_at_import(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    from tests.integration.byom import load_example

    script = load_example("deepfm")
    state = script.build_model().state_dict()
    state["sparse_arch.embedding_bag_collection.embedding_bags.t_viewer.weight"] = torch.zeros(
        999, 16
    )
    wrong = tmp_path / "wrong.pt"
    torch.save(state, wrong)
    config = _config(tmp_path)
    result = run_cli("model", "import", str(wrong), "--dir", str(tmp_path / "v"), "-c", str(config))
    _assert_one_line_user_error(
        result, "does not fit model.module", "t_viewer.weight is [999, 16]", "[1000, 16]"
    )
    del state["over_arch.model.0.bias"]
    torch.save(state, wrong)
    result = run_cli("model", "import", str(wrong), "--dir", str(tmp_path / "v"), "-c", str(config))
    _assert_one_line_user_error(result, "missing keys over_arch.model.0.bias")


def test_events_and_features_without_a_module_are_one_line(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    config = tmp_path / "half.toml"
    config.write_text('[events]\nschema_file = "x.avsc"\n')
    _assert_one_line_user_error(_run(run_cli, config), "set [model.module]")


def test_a_configured_model_retrieval_without_a_module_is_one_line(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    config = tmp_path / "builtin.toml"
    config.write_text('[retrieval]\nquery = { source = "table", table = "t_viewer" }\n')
    _assert_one_line_user_error(
        _run(run_cli, config), "retrieval.query: a configured model's retrieval ([model.module])"
    )


@pytest.mark.parametrize(
    "command", [["bench", "codec"], ["bench", "quantize"], ["bench", "ranks"], ["bench", "swap"]]
)
def test_bench_commands_of_the_built_in_model_refuse_a_configured_one(
    run_cli: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    result = run_cli(*command, "-c", str(_config(tmp_path)))
    _assert_one_line_user_error(
        result,
        f"{' '.join(command)} measures the built-in model only",
        "`bench model / pipeline / overhead / latency / ingest / soak`",
    )


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "model"],
        ["bench", "pipeline"],
        ["bench", "overhead"],
        ["bench", "latency"],
        ["bench", "ingest"],
        ["bench", "soak"],
    ],
)
def test_bench_commands_of_a_configured_model_check_it_first_in_one_line(
    run_cli: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    config = _config(tmp_path, ('"torchrec.models.deepfm:SimpleDeepFMNN"', '"team.models:Ranker"'))
    result = run_cli(*command, "-c", str(config))  # before Kafka or Redis is looked for
    _assert_one_line_user_error(
        result, "model.module.factory 'team.models:Ranker': cannot import team.models"
    )


def test_init_model_refuses_a_configured_model(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli("init-model", "-c", str(_config(tmp_path)))
    _assert_one_line_user_error(result, "init-model trains the built-in DLRM", "model import")


def test_plan_places_the_modules_own_tables(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli("plan", "--nproc", "2", "--json", "-c", str(_config(tmp_path)))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    tables = {t["name"]: t for t in report["tables"]}
    assert set(tables) == {"t_viewer", "t_browser", "t_offer", "t_recent_offers", "t_segment"}
    assert (
        tables["t_viewer"]["num_embeddings"] == 1000 and tables["t_viewer"]["embedding_dim"] == 16
    )
    assert {r for t in tables.values() for r in t["ranks"]} == {0, 1}
