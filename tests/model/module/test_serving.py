"""Configured modules served by the one ScorerFactory: one process (fp32, quantized tables,
compiled) and two gloo ranks, each scoring as the module's own forward does; weighted, sequence
and managed-collision collections too (managed collisions in one process only)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from model.distributed.config import ShardingConfig
from model.features.layout import InputLayout
from model.features.model_input import ModelInput, sparse_features
from model.module.factory import build_module
from model.module.output import output_scores
from model.module.store import check_version, import_state_dict
from model.module.types import ModelConfigError, ModuleConfig
from model.options import QuantDtype
from model.rank import RankContext
from model.serving import Scorer, ScorerFactory, ServingOptions, UnsupportedOption
from model.serving.graph_shapes import graph_shapes, shape_for
from model.serving.served import describe_served
from model.store.checkpoint import META_FILE
from model.store.versions import ModelVersions
from tests.model.distributed.ranks import spawn_ranks
from tests.model.module.configs import (
    DCN,
    DCN_LAYOUT,
    DEEPFM,
    DEEPFM_LAYOUT,
    MANAGED,
    MANAGED_LAYOUT,
    SEQUENCE,
    SEQUENCE_LAYOUT,
    WEIGHTED,
    WEIGHTED_LAYOUT,
)

ROWS = 24


def batch(config: ModuleConfig, layout: InputLayout, rows: int, seed: int) -> ModelInput:
    """Random ids within each table and 0..ids_per_key ids per row."""
    gen = torch.Generator().manual_seed(seed)
    sizes = {f: t.num_embeddings for t in config.tables for f in t.feature_names}
    lengths, values = [], []
    for key, most in zip(layout.keys, layout.ids_per_key, strict=True):
        n = torch.randint(0 if most > 1 else 1, most + 1, (rows,), generator=gen)
        lengths.append(n)
        values.append(torch.randint(0, sizes[key], (int(n.sum()),), generator=gen))
    ids = torch.cat(values)
    weights = torch.rand(len(ids), generator=gen) * 3 if layout.weighted else None
    sparse = sparse_features(
        layout.keys, ids, torch.cat(lengths), rows, [len(v) for v in values], weights
    )
    return ModelInput(torch.randn(rows, layout.dense_dim, generator=gen), sparse)


def imported(tmp_path: Path, config: ModuleConfig, seed: int) -> tuple[Path, torch.nn.Module]:
    module = build_module(config, seed=seed).eval()
    source = tmp_path / f"{seed}.pt"
    torch.save(module.state_dict(), source)
    versions = ModelVersions.create(tmp_path / f"versions-{seed}")
    import_state_dict(config, source, versions, promote=True)
    return versions.current_path(), module


def options(path: Path, config: ModuleConfig, layout: InputLayout, **kw: object) -> ServingOptions:
    return ServingOptions(path, device="cpu", max_batch_rows=32, module=config, layout=layout, **kw)  # type: ignore[arg-type]


CONFIGS = {
    "deepfm": (DEEPFM, DEEPFM_LAYOUT),
    "dcn": (DCN, DCN_LAYOUT),
    "weighted": (WEIGHTED, WEIGHTED_LAYOUT),
    "sequence": (SEQUENCE, SEQUENCE_LAYOUT),
    "managed": (MANAGED, MANAGED_LAYOUT),
}


@pytest.mark.parametrize(("config", "layout"), list(CONFIGS.values()), ids=list(CONFIGS))
def test_one_process_scores_as_the_modules_own_forward(
    tmp_path: Path, config: ModuleConfig, layout: InputLayout
) -> None:
    path, module = imported(tmp_path, config, seed=5)
    scorer = ScorerFactory(options(path, config, layout)).create_scorer()
    assert scorer.model_version == path.name and not scorer.builtin
    scorer.warm_up([8, 4])
    inp = batch(config, layout, ROWS, seed=1)
    with torch.no_grad():
        want = output_scores(module(inp.dense, inp.sparse), config.output)
    got = scorer.forward(scorer.stage_input(inp).ready_input())
    assert torch.allclose(got, want, atol=1e-6)
    scorer.forward_padding(8)  # a collective's padding rows go through the layout
    with pytest.raises(ValueError, match="configured module"):
        _ = scorer.spec


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("dcn", QuantDtype.FP16),
        ("dcn", QuantDtype.INT8),
        ("weighted", QuantDtype.INT8),
        ("sequence", QuantDtype.INT8),
        ("managed", QuantDtype.INT8),
    ],
)
def test_quantized_tables_serve_a_configured_module(
    tmp_path: Path, name: str, dtype: QuantDtype
) -> None:
    config, layout = CONFIGS[name]
    path, module = imported(tmp_path, config, seed=6)
    scorer = ScorerFactory(options(path, config, layout, quantize=dtype)).create_scorer()
    inp = batch(config, layout, ROWS, seed=2)
    with torch.no_grad():
        want = output_scores(module(inp.dense, inp.sparse), config.output)
    assert float((scorer.forward(inp) - want).abs().max()) < 2e-2
    assert scorer.embedding_bytes() < sum(
        t.num_embeddings * t.embedding_dim * 4 for t in config.tables
    )


def test_a_version_of_another_module_is_refused_by_the_factory(tmp_path: Path) -> None:
    path, _ = imported(tmp_path, DCN, seed=7)
    other = dataclasses.replace(DCN, kwargs={**DCN.kwargs, "dcn_num_layers": 3})
    with pytest.raises(ModelConfigError, match="imported for another module"):
        ScorerFactory(options(path, other, DCN_LAYOUT)).create_scorer()


def test_the_factory_takes_the_loaders_check_of_that_version_only(tmp_path: Path) -> None:
    path, _ = imported(tmp_path, DCN, seed=7)
    checked = check_version(DCN, path)
    (path / META_FILE).unlink()  # the check handed on is taken: meta.json is not read again
    served = describe_served(options(path, DCN, DCN_LAYOUT, checked=checked))
    assert served.model_version == checked.meta.model_version
    other_path, _ = imported(tmp_path, DCN, seed=8)  # a swapped-in version: checked itself
    other = dataclasses.replace(DCN, kwargs={**DCN.kwargs, "dcn_num_layers": 3})
    with pytest.raises(ModelConfigError, match="imported for another module"):
        describe_served(options(other_path, other, DCN_LAYOUT, checked=checked))


def _rank(rank: int, world: int, port: int, path: str, out: str, name: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    context = RankContext(rank=rank, local_rank=rank, world_size=world, local_world_size=world)
    config, layout = CONFIGS[name]
    scorer = ScorerFactory(options(Path(path), config, layout), context).create_scorer()
    inp = batch(config, layout, ROWS, seed=10 + rank)
    np.save(f"{out}/rank-{rank}.npy", scorer.forward(inp, pad_to=ROWS + 8).numpy())
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepfm", "weighted", "sequence"])
def test_two_ranks_shard_a_configured_module_and_score_as_one_process(
    tmp_path: Path, name: str
) -> None:
    config, layout = CONFIGS[name]
    path, module = imported(tmp_path, config, seed=8)
    spawn_ranks(_rank, 2, str(path), str(tmp_path), name)
    for rank in range(2):
        inp = batch(config, layout, ROWS, seed=10 + rank)
        with torch.no_grad():
            want = output_scores(module(inp.dense, inp.sparse), config.output).numpy()
        np.testing.assert_allclose(np.load(tmp_path / f"rank-{rank}.npy"), want, atol=1e-5)


def test_what_several_ranks_cannot_serve_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "v"
    with pytest.raises(UnsupportedOption) as error:
        options(path, MANAGED, MANAGED_LAYOUT).check(2)
    assert "model.module.managed_collision serves in one process only" in str(error.value)
    assert "'Unexpected state_dict key type'" in str(error.value)
    options(path, MANAGED, MANAGED_LAYOUT).check(1)
    for kind in ("data_parallel", "table_row_wise", "table_column_wise"):
        sharding = ShardingConfig.parse(f"history={kind}")
        with pytest.raises(UnsupportedOption, match=f"sequence table t_history cannot be {kind}"):
            options(path, SEQUENCE, SEQUENCE_LAYOUT, sharding=sharding).check(2)
    options(path, SEQUENCE, SEQUENCE_LAYOUT, sharding=ShardingConfig.parse("row_wise")).check(2)


@pytest.mark.slow
def test_a_compiled_configured_module_scores_as_its_forward(tmp_path: Path) -> None:
    path, module = imported(tmp_path, DEEPFM, seed=5)
    scorer = ScorerFactory(options(path, DEEPFM, DEEPFM_LAYOUT, compile=True)).create_scorer()
    assert hasattr(scorer.module, "_compiled_call_impl")
    scorer.warm_up([16, 8])
    inp = batch(DEEPFM, DEEPFM_LAYOUT, ROWS, seed=1)
    with torch.no_grad():
        want = output_scores(module(inp.dense, inp.sparse), DEEPFM.output)
    assert torch.allclose(scorer.forward(inp), want, atol=1e-5)


def test_graph_shapes_follow_the_configured_layout(tmp_path: Path) -> None:
    path, _ = imported(tmp_path, DCN, seed=4)
    plain = ScorerFactory(options(path, DCN, DCN_LAYOUT)).create_scorer()
    shapes = graph_shapes(DCN_LAYOUT, 32)
    assert shapes[-1].values_per_key == (32, 32, 32)
    padded = Scorer(plain.module, DCN_LAYOUT, "v", plain.device, graph_shapes=shapes)
    inp = batch(DCN, DCN_LAYOUT, 5, seed=3)
    staged = padded.stage_input(inp).ready_input()
    assert staged.num_rows == shape_for(5, shapes).padded_rows
    assert torch.allclose(padded.forward(staged, rows=5), plain.forward(inp), atol=1e-6)
