"""Tests for model.distributed.checkpoint: DCP checkpoints that reshard across world sizes.

Parity chain (spawned gloo ranks, see test_runtime's module docstring for the batches):
single-process checkpoint -> 2 ranks, table-wise (loads model.pt, saves DCP) -> 3 ranks,
mixed row/column/table-row-wise/data-parallel plan (loads the 2-rank DCP, saves DCP) ->
1 process (export_unsharded). Scores match the original ranker within 1e-5 at every step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from model.distributed import (
    DCP_INDEX_FILE,
    ShardingConfig,
    checkpoint_format,
    export_unsharded,
    load_ranker,
    load_sharded,
    plan_sharding,
    save_sharded,
    shard_ranker,
)
from model.features.build import FeatureColumns, build_model_input
from model.features.spec import FeatureSpec
from model.ranker import build_ranker
from model.serving.inference import score_probabilities
from model.store.checkpoint import (
    META_FILE,
    WEIGHTS_FILE,
    load_checkpoint,
    load_meta,
    load_spec,
    save_checkpoint,
)
from tests.model.conftest import small_spec
from tests.model.distributed.ranks import (
    MIXED_3_RANKS,
    finish_rank,
    rank_inputs,
    spawn_ranks,
    start_rank,
)
from tests.support.foreign_checkpoint import hide_in_real_index

TOLERANCE = 1e-5
SEED = 5


def _chain_worker(
    rank: int,
    world_size: int,
    port: int,
    config: str,
    src: str,
    dst: str,
    out_dir: str,
) -> None:
    device = start_rank(rank, world_size, port)
    spec = load_spec(src)
    reference = build_ranker(spec, seed=SEED).eval()  # the weights of the first checkpoint
    plan = plan_sharding(spec, world_size, config=ShardingConfig.parse(config))
    dmp = shard_ranker(spec, plan, device, seed=123)  # random weights until loaded
    local, full = rank_inputs(spec, world_size, rank)
    before = float((score_probabilities(dmp, local) - reference.score(local)).abs().max())
    meta = load_sharded(dmp, src)
    local_diff = float((score_probabilities(dmp, local) - reference.score(local)).abs().max())
    full_diff = float((score_probabilities(dmp, full) - reference.score(full)).abs().max())
    saved = save_sharded(dmp, spec, dst, metrics={"auc": 0.75})
    try:
        save_sharded(dmp, spec, dst)
        exists_error = False
    except FileExistsError:
        exists_error = True
    Path(out_dir, f"{world_size}-{rank}.json").write_text(
        json.dumps(
            {
                "before": before,
                "local_diff": local_diff,
                "full_diff": full_diff,
                "src_version": meta.model_version,
                "dst_version": saved.model_version,
                "exists_error": exists_error,
            }
        )
    )
    finish_rank()


@pytest.mark.slow
def test_reshard_chain_1_to_2_to_3_to_1(tmp_path: Path) -> None:
    spec = small_spec()
    ranker = build_ranker(spec, seed=SEED).eval()
    c1, c2, c3, c4 = (tmp_path / f"c{i}" for i in range(1, 5))
    saved1 = save_checkpoint(ranker, spec, c1, model_version="v1")

    spawn_ranks(_chain_worker, 2, "table_wise", str(c1), str(c2), str(tmp_path))
    spawn_ranks(_chain_worker, 3, MIXED_3_RANKS, str(c2), str(c3), str(tmp_path))

    results = {
        (ws, r): json.loads((tmp_path / f"{ws}-{r}.json").read_text())
        for ws in (2, 3)
        for r in range(ws)
    }
    for key, res in results.items():
        assert res["before"] > 1e-3, key  # the fresh sharded model really differed
        assert res["local_diff"] <= TOLERANCE, (key, res)
        assert res["full_diff"] <= TOLERANCE, (key, res)
        assert res["exists_error"], key
    assert {res["src_version"] for (ws, _), res in results.items() if ws == 2} == {"v1"}
    # Every rank returns rank 0's metadata.
    assert len({res["dst_version"] for (ws, _), res in results.items() if ws == 2}) == 1

    # The sharded checkpoints: DCP files plus model/checkpoint-compatible metadata.
    for path, world_size in ((c2, 2), (c3, 3)):
        assert checkpoint_format(path) == "dcp"
        names = {p.name for p in path.iterdir()}
        assert {META_FILE, DCP_INDEX_FILE} <= names and WEIGHTS_FILE not in names
        assert {f"__{r}_0.distcp" for r in range(world_size)} <= names
        meta_json = json.loads((path / META_FILE).read_text())
        assert meta_json["weights_format"] == "dcp" and meta_json["world_size"] == world_size
        assert load_meta(path).spec == spec and load_meta(path).metrics == {"auc": 0.75}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left

    exported = export_unsharded(c3, c4)
    assert checkpoint_format(c4) == "torch"
    assert exported.model_version == load_meta(c3).model_version
    assert exported.weights_sha256 == saved1.weights_sha256  # bit-identical weights
    final, _ = load_checkpoint(c4)
    _, full = rank_inputs(spec, 2, 0)
    assert float((final.score(full) - ranker.score(full)).abs().max()) <= TOLERANCE

    # The 2-rank DCP checkpoint loads straight into a plain ranker in this (no-pg) process.
    plain, meta2 = load_ranker(c2)
    assert meta2.spec == spec
    assert torch.equal(plain.score(full), final.score(full))


def test_single_process_round_trip_without_process_group(
    tmp_path: Path, spec: FeatureSpec, cols: FeatureColumns
) -> None:
    ranker = build_ranker(spec, seed=1).eval()
    meta = save_sharded(ranker, spec, tmp_path / "dcp", model_version="m1")
    assert meta.model_version == "m1" and meta.weights_sha256 == ""
    assert checkpoint_format(tmp_path / "dcp") == "dcp"

    other = build_ranker(spec, seed=2).eval()
    inp = build_model_input(cols, spec)
    assert not torch.equal(other.score(inp), ranker.score(inp))
    loaded = load_sharded(other, tmp_path / "dcp")
    assert loaded.model_version == "m1"
    assert torch.equal(other.score(inp), ranker.score(inp))

    # load_sharded also takes model/checkpoint's single-process format.
    save_checkpoint(build_ranker(spec, seed=3), spec, tmp_path / "single")
    load_sharded(other, tmp_path / "single")
    assert torch.equal(other.score(inp), build_ranker(spec, seed=3).eval().score(inp))

    # export of a single-process checkpoint is a plain copy.
    export_unsharded(tmp_path / "single", tmp_path / "copy")
    assert (
        load_meta(tmp_path / "copy").weights_sha256 == load_meta(tmp_path / "single").weights_sha256
    )


def test_errors(tmp_path: Path, spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, seed=1)
    save_sharded(ranker, spec, tmp_path / "dcp")
    with pytest.raises(FileExistsError):
        save_sharded(ranker, spec, tmp_path / "dcp")
    save_sharded(ranker, spec, tmp_path / "dcp", overwrite=True, model_version="again")
    assert load_meta(tmp_path / "dcp").model_version == "again"

    other_spec = small_spec(embedding_dim=8, dense_arch=(32, 8))
    with pytest.raises(ValueError, match="spec"):
        save_sharded(ranker, other_spec, tmp_path / "x")
    with pytest.raises(ValueError, match="FeatureSpec"):
        load_sharded(build_ranker(other_spec), tmp_path / "dcp")

    with pytest.raises(FileNotFoundError):
        load_sharded(ranker, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / META_FILE).write_text((tmp_path / "dcp" / META_FILE).read_text())
    with pytest.raises(FileNotFoundError):
        checkpoint_format(tmp_path / "empty")
    with pytest.raises(FileExistsError):
        export_unsharded(tmp_path / "dcp", tmp_path / "dcp")


class _ModelOnAGpu(nn.Module):
    """What load_sharded sees of a (sharded) model on ``cuda:1``: its parameters' device and
    its ``load_state_dict``, which keeps the state it is given (the sharded modules' load hooks
    slice it to the rank's shards; tested by the reshard chain above)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, torch.Tensor] = {}

    def parameters(self, recurse: bool = True) -> Iterator[Any]:
        yield SimpleNamespace(is_meta=False, device=torch.device("cuda", 1))

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        self.loaded = dict(state_dict)
        return SimpleNamespace(missing_keys=[], unexpected_keys=[])


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges at which this process maps ``path`` (Linux ``/proc/self/maps``)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]) == path.resolve():
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux /proc")
def test_a_single_process_checkpoint_stays_mapped_on_the_host(
    tmp_path: Path, spec: FeatureSpec
) -> None:
    # Before: the whole file was loaded onto the model's device (every full table on each
    # rank's GPU) and sliced there. Now the state handed to the model is views of the mapped
    # file on the host; the model copies only its own slices to its device.
    ranker = build_ranker(spec, seed=4)
    save_checkpoint(ranker, spec, tmp_path / "single")
    on_gpu = _ModelOnAGpu()
    load_sharded(on_gpu, tmp_path / "single")
    expected = ranker.state_dict()
    assert set(on_gpu.loaded) == set(expected)
    mapped = _file_mappings(tmp_path / "single" / WEIGHTS_FILE)
    assert mapped
    for name, tensor in on_gpu.loaded.items():
        assert tensor.device == torch.device("cpu"), name
        assert torch.equal(tensor, expected[name]), name
        if tensor.numel():
            address = tensor.data_ptr()
            assert any(start <= address < end for start, end in mapped), f"{name} was copied"


def _foreign_worker(rank: int, world_size: int, port: int, src: str, out_dir: str) -> None:
    device = start_rank(rank, world_size, port)
    spec = load_spec(src)
    plan = plan_sharding(spec, world_size, config=ShardingConfig.parse("table_wise"))
    dmp = shard_ranker(spec, plan, device)
    try:
        load_sharded(dmp, src)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    Path(out_dir, f"foreign-{rank}.txt").write_text(refused)
    finish_rank()


def test_ranks_refuse_an_index_that_would_run_code_and_it_never_runs(tmp_path: Path) -> None:
    """A sharded job's start-up (every rank loads the shards): a real DCP index with a pickle
    inside is refused by each rank before any collective read, and its payload never runs."""
    spec = small_spec()
    src = tmp_path / "sharded"
    save_sharded(build_ranker(spec, seed=SEED), spec, src)
    marker = tmp_path / "payload-ran"
    hide_in_real_index(src, marker)
    spawn_ranks(_foreign_worker, 2, str(src), str(tmp_path))
    for rank in range(2):
        refused = (tmp_path / f"foreign-{rank}.txt").read_text()
        assert "refused sharded checkpoint index" in refused, (rank, refused)
    assert not marker.exists()
