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
from model.serving import Scorer
from model.store.checkpoint import load_meta, save_checkpoint
from model.store.versions import NoCurrentVersionError, resolve_checkpoint
from pipeline.models.loader import ModelLoader
from pipeline.observability.metrics import Metrics
from pipeline.runtime.loop import ScoringPipeline
from pipeline.serve import build_pipeline
from pipeline.settings.loading import Settings

__all__ = [
    "LEFT_OUT",
    "UNTRAINED",
    "bench_checkpoint",
    "bench_pipeline_of",
    "bench_scorer",
    "checkpoint_env",
    "configured_version",
    "describe",
    "model_identity",
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


UNTRAINED = "untrained"
"""The model version of the freshly initialised weights a benchmark serves without a version."""


def configured_version(settings: Settings) -> Path | None:
    """The current version of ``model.checkpoint`` when it is a version of ``[model.module]``
    (its architecture checked), else ``None``.

    Raises:
        ModelConfigError: the version was imported for another architecture (one line).
    """
    from model.module.store import check_architecture, is_module_version, load_module_meta
    from pipeline.models.preflight import configured_module

    try:
        served = resolve_checkpoint(settings.model.checkpoint)
    except (FileNotFoundError, NoCurrentVersionError):
        return None
    if not is_module_version(served):
        return None
    config, _ = configured_module(settings)
    check_architecture(config, load_module_meta(served), served)
    return served


def model_identity(settings: Settings, version: str) -> dict[str, Any]:
    """Whose figures a report holds (``streamrank plan-capacity`` prints it).

    Returns:
        ``model`` (``built-in`` or ``configured``), ``factory`` (the module's factory),
        ``model_version`` and ``weights`` (``trained`` or ``untrained``: freshly initialised).
    """
    module = settings.model.module
    return {
        "model": "built-in" if module is None else "configured",
        "factory": "model.ranker:ranker_from_collection" if module is None else module.factory,
        "model_version": version,
        "weights": UNTRAINED if version == UNTRAINED else "trained",
    }


@contextmanager
def bench_checkpoint(settings: Settings) -> Iterator[tuple[Settings, Path, list[str]]]:
    """The checkpoint ``streamrank run`` would serve, or an untrained one of the configured spec
    (of ``[model.module]``'s module: the current version of ``model.checkpoint`` when it is a
    version of that module, else the module freshly initialised).

    Args:
        settings: ``model.checkpoint``: a checkpoint, a versions directory (its current
            version is served) or nothing yet.

    Yields:
        ``(settings, checkpoint directory, notes)``; without a checkpoint, a freshly
        initialised ranker saved to a temporary directory (deleted afterwards; same shapes,
        same speed), the settings serving it and a note saying so.

    Raises:
        ModelConfigError: ``model.checkpoint``'s version was imported for another architecture.
    """
    if settings.model.module is not None:
        with _configured_checkpoint(settings) as configured:
            yield configured
        return
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
        path = Path(scratch) / UNTRAINED
        save_checkpoint(build_ranker(spec, seed=0), spec, path, model_version=UNTRAINED)
        note = f"the trained model: no checkpoint at {settings.model.checkpoint}, an untrained one"
        yield serving(settings, path), path, [note]


def checkpoint_env(settings: Settings, checkpoint: Path, notes: list[str]) -> dict[str, str]:
    """What a ``streamrank run`` child of a benchmark needs to serve ``checkpoint``
    (:func:`bench_checkpoint`'s): a configured model's version (served as it is), or an
    untrained stand-in; nothing when it is the built-in model's own ``model.checkpoint``
    (the child reads it from the configuration, as ``streamrank run`` does)."""
    if settings.model.module is None and not notes:
        return {}
    return {"STREAMRANK_MODEL__CHECKPOINT": str(checkpoint)}


@contextmanager
def _configured_checkpoint(settings: Settings) -> Iterator[tuple[Settings, Path, list[str]]]:
    """:func:`bench_checkpoint` of a configured model: its version, served as it is (no
    watcher: one version for the whole benchmark), or its module freshly initialised."""
    from pipeline.tools.bench.configured import configured_checkpoint

    version = configured_version(settings)
    if version is not None:
        yield serving(settings, version), version, []
        return
    log.warning(
        "no version of [model.module] at %s: benchmarking the module untrained",
        settings.model.checkpoint,
    )
    with tempfile.TemporaryDirectory(prefix="streamrank-bench-") as scratch:
        path = configured_checkpoint(settings, Path(scratch))
        note = (
            f"the trained model: no version of [model.module] at {settings.model.checkpoint}, "
            "the module freshly initialised (seed 0)"
        )
        yield serving(settings, path), path, [note]


@contextmanager
def bench_scorer(settings: Settings) -> Iterator[tuple[Scorer, list[str]]]:
    """The model a forward-only benchmark times: the built-in one as
    :func:`~pipeline.tools.bench.common.load_or_build_scorer` loads it, or ``[model.module]``'s
    (:func:`bench_checkpoint`: its version, or the module untrained) loaded as ``streamrank
    run`` loads it.

    Yields:
        ``(scorer, notes)``: the notes say what stands in for the trained model.
    """
    if settings.model.module is None:
        from pipeline.tools.bench.common import load_or_build_scorer

        yield load_or_build_scorer(settings), []
        return
    with bench_checkpoint(settings) as (served, checkpoint, notes):
        yield ModelLoader(served).load(checkpoint).scorer, notes


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
        ``built_by``, ``model`` (:func:`model_identity`), ``model_version``, ``device``,
        ``retrieval_index``, ``model_watcher``, ``torch_threads`` and ``left_out``.
    """
    index = pipeline.retriever.index
    indexed = None if index is None else f"{index.kind.value}, {index.num_items} items"
    return {
        "built_by": "pipeline.serve.build_pipeline (as streamrank run)",
        "model": model_identity(pipeline.settings, pipeline.scorer.model_version),
        "model_version": pipeline.scorer.model_version,
        "device": str(pipeline.scorer.device),
        "retrieval_index": indexed,
        "model_watcher": pipeline.models is not None,
        "torch_threads": torch.get_num_threads(),
        "left_out": [*LEFT_OUT, *(notes or [])],
    }
