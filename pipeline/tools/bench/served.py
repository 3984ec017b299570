"""The pipeline a benchmark runs: the one ``streamrank run`` builds, and a line on what is not.

Benchmarks of the whole pipeline (``bench pipeline``, ``overhead``, ``latency``) build it with
:func:`pipeline.serve.build_pipeline`, the builder ``streamrank run`` uses: the configured model
loaded by the one :class:`~pipeline.models.loader.ModelLoader` (device, quantization,
precision, compile), its retrieval index with ``[retrieval]`` on, the model watcher when
``model.checkpoint`` is a versions directory, the Redis enricher, the librdkafka statistics
callback and every metric. What ``serve`` adds around it and a benchmark leaves out, and why,
is in :data:`LEFT_OUT` and in each report's ``pipeline`` entry (:func:`describe`).

Example::

    with bench_checkpoint(settings) as (settings, checkpoint, notes):
        pipeline = bench_pipeline_of(run_settings, checkpoint)
        summary = pipeline.run(exit_when_idle_s=2.0)
        report["pipeline"] = describe(pipeline, notes)
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from model.rank import RankContext
from model.ranker import build_ranker
from model.store.checkpoint import load_meta, save_checkpoint
from model.store.versions import NoCurrentVersionError, resolve_checkpoint
from pipeline.observability.metrics import Metrics
from pipeline.runtime.loop import ScoringPipeline
from pipeline.serve import build_pipeline
from pipeline.settings.loading import Settings

__all__ = [
    "LEFT_OUT",
    "bench_checkpoint",
    "bench_pipeline_of",
    "describe",
    "serving",
    "tiny_checkpoint",
]

log = logging.getLogger(__name__)

LEFT_OUT = (
    "the metrics HTTP endpoint: nothing scrapes a benchmark (every metric is still recorded, "
    "as in a run)",
    "SIGTERM/SIGINT handlers: a benchmark's pipeline stops when idle",
)
"""What ``streamrank run`` (:func:`pipeline.serve.serve`) adds to the built pipeline and a
benchmark does not, with the reason."""


@contextmanager
def bench_checkpoint(settings: Settings) -> Iterator[tuple[Settings, Path, list[str]]]:
    """The checkpoint ``streamrank run`` would serve, or an untrained one of the configured spec.

    Args:
        settings: ``model.checkpoint``: a checkpoint, a versions directory (its current
            version is served) or nothing yet.

    Yields:
        ``(settings, checkpoint directory, notes)``; without a checkpoint, a freshly
        initialised ranker saved to a temporary directory (deleted afterwards; same shapes,
        same speed), the settings serving it and a note saying so.
    """
    try:
        served = resolve_checkpoint(settings.model.checkpoint)
    except (FileNotFoundError, NoCurrentVersionError):
        served = None
    if served is not None:
        yield settings, served, []
        return
    log.warning("no checkpoint at %s: benchmarking an untrained model", settings.model.checkpoint)
    spec = settings.model.feature_spec()
    with tempfile.TemporaryDirectory(prefix="streamrank-bench-") as scratch:
        path = Path(scratch) / "untrained"
        save_checkpoint(build_ranker(spec, seed=0), spec, path, model_version="untrained")
        note = f"the trained model: no checkpoint at {settings.model.checkpoint}, an untrained one"
        yield serving(settings, path), path, [note]


def tiny_checkpoint(checkpoint: Path, directory: Path) -> Path:
    """An untrained ranker with ``checkpoint``'s tables and inputs but embedding dim 8 and one
    small layer each side (its forward is negligible), saved under ``directory``.

    Args:
        checkpoint: the served checkpoint (its feature spec is kept, except the widths).
        directory: where to save it (``directory / "tiny"``).

    Returns:
        The tiny checkpoint's directory (``model_version`` ``"tiny"``); serve it with
        :func:`serving`.
    """
    spec = dataclasses.replace(
        load_meta(checkpoint).spec, embedding_dim=8, dense_arch=(8,), over_arch=(8, 1)
    )
    path = directory / "tiny"
    save_checkpoint(build_ranker(spec, seed=0), spec, path, model_version="tiny", overwrite=True)
    return path


def serving(settings: Settings, checkpoint: Path) -> Settings:
    """``settings`` with ``model.checkpoint`` set to a plain checkpoint (an untrained or tiny
    model), so that no version watcher swaps the configured model in."""
    model = settings.model.model_copy(update={"checkpoint": checkpoint})
    return settings.model_copy(update={"model": model})


def bench_pipeline_of(
    settings: Settings, checkpoint: Path, metrics: Metrics | None = None
) -> ScoringPipeline:
    """The pipeline ``streamrank run`` would run with ``settings`` (one process, rank 0).

    Args:
        settings: the run's settings (its topics and group, ``model.checkpoint``).
        checkpoint: the checkpoint directory served (:func:`bench_checkpoint`).
        metrics: the registry (fresh by default).

    Returns:
        The pipeline, its model loaded, not started.
    """
    return build_pipeline(settings, RankContext(), metrics or Metrics(), checkpoint)


def describe(pipeline: ScoringPipeline, notes: list[str] | None = None) -> dict[str, Any]:
    """What a benchmark's pipeline runs, for its report.

    Args:
        pipeline: the pipeline (built by :func:`bench_pipeline_of`).
        notes: parts the benchmark changed or left out beyond :data:`LEFT_OUT`, with why.

    Returns:
        ``built_by``, ``model_version``, ``device``, ``retrieval_index``, ``model_watcher``,
        ``torch_threads`` and ``left_out``.
    """
    index = pipeline.retriever.index
    indexed = None if index is None else f"{index.kind.value}, {index.num_items} items"
    return {
        "built_by": "pipeline.serve.build_pipeline (as streamrank run)",
        "model_version": pipeline.scorer.model_version,
        "device": str(pipeline.scorer.device),
        "retrieval_index": indexed,
        "model_watcher": pipeline.models is not None,
        "torch_threads": torch.get_num_threads(),
        "left_out": [*LEFT_OUT, *(notes or [])],
    }
