"""What the GPU check's sections share: the small spec, synthetic batches, score differences."""

from __future__ import annotations

import socket

import numpy as np
import torch

from model.features.build import build_model_input
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec, SparseFeature, TableSpec
from model.synthetic import SampledEvents, SyntheticWorld, WorldConfig, feature_columns

#: Largest score difference accepted between two devices or two paths.
TOLERANCE = 1e-5
#: ``--small``: a model small enough for the CPU tests.
SMALL_SPEC = FeatureSpec(
    tables=tuple(
        TableSpec(f, n) for f, n in zip(SparseFeature, (4000, 8000, 101, 16, 32, 8000), strict=True)
    ),
    embedding_dim=16,
    dense_arch=(32, 16),
    over_arch=(32, 1),
)


def check_spec(small: bool) -> FeatureSpec:
    """:data:`SMALL_SPEC` or the default spec."""
    return SMALL_SPEC if small else FeatureSpec()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_world(spec: FeatureSpec) -> SyntheticWorld:
    """The check's synthetic world (seed 3), with the spec's dense widths."""
    return SyntheticWorld(
        WorldConfig(seed=3, user_dense_dim=spec.user_dense_dim, item_dense_dim=spec.item_dense_dim)
    )


def sample_events(world: SyntheticWorld, rows: int, seed: int = 0) -> SampledEvents:
    """About ``rows`` rows' worth of events (at least one event)."""
    mean = (world.config.min_candidates + world.config.max_candidates) / 2
    return world.sample_events(max(1, int(rows / mean)), np.random.default_rng(seed))


def batch(world: SyntheticWorld, spec: FeatureSpec, rows: int, seed: int = 0) -> ModelInput:
    """A host batch of about ``rows`` rows."""
    return build_model_input(feature_columns(sample_events(world, rows, seed), world, spec), spec)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of two score vectors (any devices and float dtypes)."""
    if a.numel() == 0 and b.numel() == 0:
        return 0.0
    return float((a.float().cpu() - b.float().cpu()).abs().max())
