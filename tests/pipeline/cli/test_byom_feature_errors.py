"""Weighted, sequence and managed-collision models: each start-up mistake is one line naming the
key, exit code 2, through the real CLI (``run`` checks the model before it looks for Kafka,
Redis or a version; a sharded job checks what its ranks cannot serve before any starts)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.pipeline.cli.conftest import CliRunner
from tests.pipeline.cli.test_user_errors import _assert_one_line_user_error

pytestmark = pytest.mark.slow

EXAMPLES = REPO_ROOT / "examples"


def _config(tmp_path: Path, name: str, *replacements: tuple[str, str], append: str = "") -> Path:
    """examples/<name>/streamrank.toml with its paths absolute and ``replacements`` made."""
    text = (EXAMPLES / name / "streamrank.toml").read_text()
    text = text.replace('schema_file = "examples/', f'schema_file = "{EXAMPLES}/')
    text = text.replace('code_dir = "examples/', f'code_dir = "{EXAMPLES}/')
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text + append)
    return path


def _run(run_cli: CliRunner, config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "run", *options, "-c", str(config), env={"STREAMRANK_MODEL__CHECKPOINT": "nowhere"}
    )


@pytest.mark.parametrize(
    ("name", "replacement", "fragments"),
    [
        (
            "weighted",
            ("weighted = true", "weighted = false"),
            ("features.sparse.topics.weights: model.module.weighted is false",),
        ),
        (
            "weighted",
            ('weights = "topic_minutes"', 'weights = "topics"'),
            ("features.sparse.topics.weights = 'topics' is array<long>", "needs float_list"),
        ),
        (
            "weighted",
            ('follow_strength = "weights:follows"', 'follow_strength = "weights:profile"'),
            ("features.user.fields.follow_strength = 'weights:profile': weights pair with",),
        ),
        (
            "weighted",
            ('name = "t_topic"', 'name = "t_topic"\npooling = "mean"'),
            ("model.module.weighted: table t_topic pools by mean",),
        ),
        (
            "sequence",
            ('sequence_collection_argument = "embedding_collection"', ""),
            ("model.module.tables: t_history is a sequence table: set",),
        ),
    ],
    ids=[
        "weights-without-a-weighted-collection",
        "weights-not-floats",
        "redis-weights-of-a-vector",
        "weighted-mean-pooling",
        "sequence-table-without-its-keyword",
    ],
)
def test_a_weighted_or_sequence_mistake_is_one_line_at_start_up(
    run_cli: CliRunner,
    tmp_path: Path,
    name: str,
    replacement: tuple[str, str],
    fragments: tuple[str, ...],
) -> None:
    _assert_one_line_user_error(_run(run_cli, _config(tmp_path, name, replacement)), *fragments)


def test_a_sharded_job_refuses_what_its_ranks_cannot_serve_in_one_line(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    managed = _config(
        tmp_path,
        "deepfm",
        ('"torchrec.models.deepfm:SimpleDeepFMNN"', '"tests.model.module.modules:managed_deepfm"'),
        append="\n[model.module.managed_collision]\ninput_hash_size = 1048576\n",
    )
    says = (
        "model.module.managed_collision serves in one process only",
        "ManagedCollisionCollectionSharder",
        "use --nproc 1",
    )
    _assert_one_line_user_error(_run(run_cli, managed, "--nproc", "2"), *says)
    _assert_one_line_user_error(run_cli("plan", "--nproc", "2", "-c", str(managed)), *says)
    data_parallel = _config(
        tmp_path,
        "sequence",
        append='\n[model.sharding.tables.history]\nsharding_type = "data_parallel"\n',
    )
    _assert_one_line_user_error(
        _run(run_cli, data_parallel, "--nproc", "2"),
        "model.sharding: sequence table t_history cannot be data_parallel",
    )


def test_a_managed_collision_model_refuses_ingest_workers_in_one_line(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    managed = _config(
        tmp_path,
        "deepfm",
        ('"torchrec.models.deepfm:SimpleDeepFMNN"', '"tests.model.module.modules:managed_deepfm"'),
        append="\n[model.module.managed_collision]\ninput_hash_size = 1048576\n"
        "\n[batching]\ningest_workers = 1\n",
    )
    _assert_one_line_user_error(
        _run(run_cli, managed),
        "batching.ingest_workers = 1",
        "managed-collision collection, served by the one-process path only",
    )
