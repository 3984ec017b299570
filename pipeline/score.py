"""Score: the served ranker, one forward per batch, then top-K per event."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from model.checkpoint import load_checkpoint
from model.features import FeatureColumns, ModelInput, build_model_input
from model.ranker import Ranker
from model.spec import FeatureSpec
from model.topk import TopK, top_k_per_event
from pipeline.batch import EventColumns

log = logging.getLogger(__name__)


def pick_device(setting: str) -> torch.device:
    """``auto`` -> ``cuda:{LOCAL_RANK}`` when a GPU is present, else ``cpu``."""
    if setting != "auto":
        return torch.device(setting)
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    return torch.device("cpu")


@dataclass
class ScoredBatch:
    """Top-K result of a batch, in item ids.

    Attributes:
        counts: int64[E] items per event.
        item_ids: int64[sum(counts)] event-major, best first.
        scores: float64[sum(counts)].
    """

    counts: npt.NDArray[np.int64]
    item_ids: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float64]


class Scorer:
    """Runs the ranker on batches.

    Args:
        ranker: an authoring-module ranker (eval mode is set here).
        spec: its feature spec.
        model_version: written into every Recommendation.
        device: where the forward runs.

    Example::

        scorer = Scorer.from_checkpoint(Path("artifacts/model"))
        probs = scorer.forward(scorer.model_input(feature_columns))
        scored = scorer.top_k(probs, events)
    """

    def __init__(
        self, ranker: Ranker, spec: FeatureSpec, model_version: str, device: torch.device
    ) -> None:
        self.ranker = ranker.to(device).eval()
        self.spec = spec
        self.model_version = model_version
        self.device = device

    @classmethod
    def from_checkpoint(cls, path: Path, device: str = "auto") -> Scorer:
        target = pick_device(device)
        ranker, meta = load_checkpoint(path, device=target)
        log.info("loaded model %s from %s onto %s", meta.model_version, path, target)
        return cls(ranker, meta.spec, meta.model_version, target)

    def model_input(self, features: FeatureColumns) -> ModelInput:
        """Feature columns -> dense tensor + KJT on the model's device."""
        inp = build_model_input(features, self.spec)
        return inp if self.device.type == "cpu" else inp.to(self.device, non_blocking=True)

    def forward(self, inp: ModelInput) -> torch.Tensor:
        """Click probabilities [R] (one forward, no autograd)."""
        return self.ranker.score(inp)

    def top_k(self, probs: torch.Tensor, events: EventColumns) -> ScoredBatch:
        """Best ``min(num_results, candidates)`` items of every event."""
        top: TopK = top_k_per_event(probs, events.candidate_counts, events.num_results)
        return ScoredBatch(
            counts=top.counts,
            item_ids=events.candidate_ids[top.row_index],
            scores=top.scores.astype(np.float64),
        )
