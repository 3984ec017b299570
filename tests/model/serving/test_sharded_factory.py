"""The model factory on two gloo ranks: the sharded path gets the precision the single-process
path gets, and the scores agree with one process in each precision."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from model.options import Precision
from model.rank import RankContext
from model.ranker import build_ranker
from model.serving import ScorerFactory, ServingOptions
from model.store.checkpoint import save_checkpoint
from tests.model.conftest import small_spec
from tests.model.distributed.ranks import rank_inputs, spawn_ranks

pytestmark = pytest.mark.slow
PRECISIONS = (Precision.BF16, Precision.FP32)


def _options(checkpoint: Path, precision: Precision) -> ServingOptions:
    return ServingOptions(checkpoint, device="cpu", precision=precision, max_batch_rows=64)


def _rank(rank: int, world: int, port: int, checkpoint: str, out: str, precision: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    context = RankContext(rank=rank, local_rank=rank, world_size=world, local_world_size=world)
    options = _options(Path(checkpoint), Precision(precision))
    scorer = ScorerFactory(options, context).create_scorer()
    assert scorer.precision is Precision(precision)
    local, _ = rank_inputs(scorer.spec, world, rank)
    np.save(f"{out}/{precision}-{rank}.npy", scorer.forward(local).numpy())
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see tests.model.distributed.ranks.finish_rank


def test_two_ranks_score_in_bf16_as_one_process_does(tmp_path: Path) -> None:
    spec = small_spec()
    checkpoint = tmp_path / "model"
    save_checkpoint(build_ranker(spec, seed=3), spec, checkpoint)
    for precision in PRECISIONS:  # one job each: a job's factory joins its process group once
        spawn_ranks(_rank, 2, str(checkpoint), str(tmp_path), precision.value)
    single = {p: ScorerFactory(_options(checkpoint, p)).create_scorer() for p in PRECISIONS}
    for rank in range(2):
        local, _ = rank_inputs(spec, 2, rank)
        want = {p: scorer.forward(local).numpy() for p, scorer in single.items()}
        bf16 = np.load(tmp_path / f"bf16-{rank}.npy")
        fp32 = np.load(tmp_path / f"fp32-{rank}.npy")
        np.testing.assert_allclose(fp32, want[Precision.FP32], atol=1e-5)
        np.testing.assert_allclose(bf16, want[Precision.BF16], atol=2e-3)
        assert np.abs(bf16 - fp32).max() > 1e-5  # bf16 really ran: it is not fp32
