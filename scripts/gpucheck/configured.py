"""``configured``: a model of the user's (``--config`` with ``[model.module]``, e.g.
examples/deepfm/streamrank.toml) on the device against the CPU, unsharded, through a 1-rank
``DistributedModelParallel`` planned on its own tables (not with managed collisions: they serve
in one process), and with fp16/int8 tables. A weighted collection's batch carries weights.

Needs the pipeline's settings to read the TOML (``skipped`` without ``--config``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from model.features.layout import InputLayout
from model.features.model_input import ModelInput, sparse_features
from model.module.checks import module_tables
from model.module.factory import build_module
from model.module.types import ModuleConfig
from model.serving.inference import score_probabilities
from scripts.gpucheck.common import TOLERANCE, free_port, max_abs_diff


def layout_batch(config: ModuleConfig, layout: InputLayout, rows: int) -> ModelInput:
    """``rows`` rows of random ids inside each table (1..most ids per key), their weights (a
    weighted layout), and dense values."""
    gen = torch.Generator().manual_seed(0)
    sizes = {f: t.num_embeddings for t in config.tables for f in t.feature_names}
    lengths, values = [], []
    for key, most in zip(layout.keys, layout.ids_per_key, strict=True):
        n = torch.randint(1, most + 1, (rows,), generator=gen)
        lengths.append(n)
        values.append(torch.randint(0, sizes[key], (int(n.sum()),), generator=gen))
    ids = torch.cat(values)
    weights = torch.rand(len(ids), generator=gen) * 2 if layout.weighted else None
    sparse = sparse_features(
        layout.keys, ids, torch.cat(lengths), rows, [len(v) for v in values], weights
    )
    return ModelInput(torch.randn(rows, layout.dense_dim, generator=gen), sparse)


def configured_parity(config_path: Path | None, device: torch.device, rows: int) -> dict:
    """Scores of the configured module on ``device`` against the CPU (module docstring).

    Returns:
        ``{"factory": ..., "max_abs_diff": {"unsharded", "dmp_1_rank", "fp16_tables",
        "int8_tables"}, "ok": every difference <= TOLERANCE}``; ``{"skipped": why}`` without
        ``--config``.
    """
    if config_path is None:
        return {"skipped": "no --config naming a [model.module]"}
    from model.serving.quantize import quantize_ranker
    from pipeline.models.preflight import configured_module
    from pipeline.settings.loading import load_settings

    config, fmap = configured_module(load_settings(config_path))
    layout = fmap.layout
    output = config.output
    cpu = build_module(config, "cpu", seed=0).eval()
    inp = layout_batch(config, layout, rows)
    expected = score_probabilities(cpu, inp, output=output)
    moved = build_module(config, device).eval()
    moved.load_state_dict(cpu.state_dict())
    out = {"unsharded": max_abs_diff(score_probabilities(moved, inp.to(device), output=output),
                                     expected)}  # fmt: skip
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if config.managed_collision is None:  # managed collisions serve in one process only
        out["dmp_1_rank"] = _one_rank(config, layout, device, cpu, inp, expected, backend)
    for dtype in ("fp16", "int8"):
        out[f"{dtype}_tables"] = max_abs_diff(
            score_probabilities(quantize_ranker(moved, dtype), inp.to(device), output=output),
            score_probabilities(quantize_ranker(cpu, dtype), inp, output=output),
        )
    return {
        "factory": config.factory,
        "max_abs_diff": out,
        "ok": all(v <= TOLERANCE for v in out.values()),
    }


def _one_rank(
    config: ModuleConfig,
    layout: InputLayout,
    device: torch.device,
    cpu: torch.nn.Module,
    inp: ModelInput,
    expected: torch.Tensor,
    backend: str,
) -> float:
    """The module through a 1-rank ``DistributedModelParallel`` against the CPU's scores."""
    from model.distributed import join_process_group, plan_sharding, shard_module

    join_process_group(0, 1, local_rank=device.index or 0, backend=backend, timeout_s=120)
    try:
        ids = dict(zip(layout.keys, layout.ids_per_key, strict=True))
        tables = module_tables(build_module(config, "meta", embedding_device="meta"), ids)
        plan = plan_sharding(tables, 1, device.type, local_world_size=1)
        dmp = shard_module(build_module(config, device, embedding_device="meta"), plan, device)
        dmp.load_state_dict(cpu.state_dict())
        got = score_probabilities(dmp, inp.to(device), output=config.output)
        return max_abs_diff(got, expected)
    finally:
        dist.destroy_process_group()
