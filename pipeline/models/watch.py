"""Watch a versions directory and load a newly promoted model off the scoring path.

A :class:`ModelWatcher` polls the pointer of a versions directory (:mod:`model.store.versions`) on a
background thread. When a new version is promoted it calls the ``loader`` it was given (load,
warm up, build what goes with the model, e.g. its retrieval index) on that thread, and keeps
the result ready. The serving loop picks it up between two batches with :meth:`take_ready`,
so every event of a batch is scored by one version, and the forward never waits for a load.

A load that raises leaves the old version serving: one warning line, and the observer's
``load_failed`` (a metric). Promoting the same version again (``streamrank model promote V``
bumps the pointer's generation) retries it.

Several ranks: each rank runs its own watcher; they switch at the same step when all of them
hold the same generation. The serving loop does that through :mod:`pipeline.runtime.model_swap`: it
moves a loaded model out of the watcher (:meth:`ModelWatcher.take_loaded`), offers its
generation (or that of a failed load, :meth:`ModelWatcher.failed_generation`) in the step's
all_reduce, and reports the outcome back (:meth:`ModelWatcher.swapped`,
:meth:`ModelWatcher.report_failure`).

Example::

    watcher = ModelWatcher(settings.model.checkpoint, load_scorer, scorer.model_version,
                           observer=MetricsSwapObserver(metrics))
    watcher.start()
    ...                                   # between two batches:
    new = watcher.take_ready()
    if new is not None:
        scorer = new
    ...
    watcher.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from model.store.versions import ModelVersions

if TYPE_CHECKING:
    from pipeline.observability.metrics import Metrics

__all__ = ["LoadedModel", "MetricsSwapObserver", "ModelWatcher", "SwapObserver"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two reads of the pointer (one small file read each).
DEFAULT_POLL_INTERVAL_S = 2.0


@dataclass(frozen=True)
class LoadedModel(Generic[T]):
    """A model the loader finished, waiting for the loop.

    Attributes:
        version: the version's name (its ``model_version``).
        generation: the pointer's generation that promoted it.
        model: what the loader returned (e.g. a warmed-up scorer).
        load_seconds: how long the loader ran.
    """

    version: str
    generation: int
    model: T
    load_seconds: float


class SwapObserver(Protocol):
    """What a :class:`ModelWatcher` reports (metrics, tests)."""

    def serving(self, version: str) -> None:
        """``version`` is now served (at start and after each swap)."""

    def swapped(self, old: str, new: str) -> None:
        """The loop took ``new`` in place of ``old``."""

    def loaded(self, version: str, seconds: float) -> None:
        """``version`` loaded in ``seconds`` and is ready."""

    def load_failed(self, version: str, error: Exception) -> None:
        """Loading ``version`` raised ``error``; the old version keeps serving."""


class MetricsSwapObserver:
    """A :class:`SwapObserver` that updates the pipeline's Prometheus metrics.

    Args:
        metrics: the process's :class:`~pipeline.observability.metrics.Metrics` (``model_info``,
            ``model_swaps``, ``model_load_failures``, ``model_load_seconds``).

    Example::

        watcher = ModelWatcher(root, loader, version, observer=MetricsSwapObserver(metrics))
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def serving(self, version: str) -> None:
        self._metrics.model_info.info({"model_version": version})

    def swapped(self, old: str, new: str) -> None:
        self._metrics.model_swaps.inc()

    def loaded(self, version: str, seconds: float) -> None:
        self._metrics.model_load_seconds.set(seconds)

    def load_failed(self, version: str, error: Exception) -> None:
        self._metrics.model_load_failures.inc()


class _NoObserver:
    def serving(self, version: str) -> None:
        pass

    def swapped(self, old: str, new: str) -> None:
        pass

    def loaded(self, version: str, seconds: float) -> None:
        pass

    def load_failed(self, version: str, error: Exception) -> None:
        pass


class ModelWatcher(Generic[T]):
    """Polls a versions directory and loads promoted versions on a background thread.

    Args:
        root: the versions directory (``model.checkpoint``).
        loader: loads and warms up the checkpoint directory of one version; whatever it
            raises counts as a failed load. Runs on the watcher's thread only.
        serving_version: the version the loop serves now.
        poll_interval_s: seconds between two reads of the pointer.
        observer: told about swaps, loads and failures (e.g. :class:`MetricsSwapObserver`).
        clock: seconds, for ``load_seconds`` (``time.perf_counter``).

    Raises:
        FileNotFoundError: if ``root`` is not a versions directory.

    Example::

        watcher = ModelWatcher(root, loader, "v1", poll_interval_s=2.0)
        watcher.check_once()       # what the thread does every poll_interval_s
        scorer = watcher.take_ready() or scorer
    """

    def __init__(
        self,
        root: str | Path,
        loader: Callable[[Path], T],
        serving_version: str,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        observer: SwapObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._versions = ModelVersions(root)
        self._loader = loader
        self._poll_interval_s = poll_interval_s
        self._observer: SwapObserver = observer or _NoObserver()
        self._clock = clock
        self._lock = threading.Lock()
        self._serving = serving_version
        self._ready: LoadedModel[T] | None = None
        self._seen_generation = -1  # the first check compares the pointer with what is served
        self._failed_generation = 0
        self._last_pointer_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer.serving(serving_version)

    @property
    def serving_version(self) -> str:
        """The version the loop serves (updated by :meth:`take_ready`)."""
        with self._lock:
            return self._serving

    def start(self) -> None:
        """Start polling on a daemon thread (``model-watch``)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="model-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop polling and wait for the thread (a load in progress finishes first).

        Args:
            timeout_s: the longest wait; ``None`` waits for the load.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def check_once(self) -> bool:
        """Read the pointer once; load a newly promoted version (blocking: the thread's job).

        Returns:
            True when a new version was loaded and is ready.
        """
        try:
            pointer = self._versions.pointer()
        except ValueError as exc:  # a corrupt pointer: say so once, keep serving
            if str(exc) != self._last_pointer_error:
                log.warning("cannot read the model pointer, keeping the served model: %s", exc)
                self._last_pointer_error = str(exc)
            return False
        self._last_pointer_error = ""
        with self._lock:
            if pointer.generation == self._seen_generation or pointer.version is None:
                return False
            self._seen_generation = pointer.generation
            self._failed_generation = 0
        target = pointer.version
        with self._lock:
            if target == self._serving:  # rolled back before the loop took the other one
                self._ready = None
                return False
            if self._ready is not None and self._ready.version == target:
                self._ready = LoadedModel(
                    target, pointer.generation, self._ready.model, self._ready.load_seconds
                )
                return False
        return self._load(target, pointer.generation)

    def ready_generation(self) -> int:
        """The pointer generation of the model waiting for the loop, 0 if none.

        Ranks of a sharded job switch together when every rank reports the same non-zero
        generation (e.g. all_reduce MIN and MAX agree), then call ``take_ready(generation)``.
        """
        with self._lock:
            return self._ready.generation if self._ready is not None else 0

    def take_ready(self, generation: int | None = None) -> T | None:
        """The newly loaded model, once, now the served version; call it between two batches
        (:meth:`take_loaded` then :meth:`swapped`).

        Args:
            generation: take it only if it is this generation (what the ranks agreed on).

        Returns:
            The loader's result; ``None`` when nothing (or another generation) is waiting.
        """
        with self._lock:
            ready = self._ready
            if ready is None or (generation is not None and ready.generation != generation):
                return None
            self._ready = None
        self.swapped(ready.version, ready.load_seconds)
        return ready.model

    def take_loaded(self) -> LoadedModel[T] | None:
        """The loaded model waiting for the loop, once (the watcher forgets it); it is not the
        served version until :meth:`swapped` says so."""
        with self._lock:
            ready, self._ready = self._ready, None
        return ready

    def latest_generation(self) -> int:
        """The pointer generation last read (-1 before the first read): a loaded model of an
        older generation has been superseded (a newer promotion, or a rollback)."""
        with self._lock:
            return self._seen_generation

    def failed_generation(self) -> int:
        """The generation whose load failed, while it is the latest one read; 0 otherwise."""
        with self._lock:
            return self._failed_generation

    def swapped(self, version: str, load_seconds: float | None = None) -> None:
        """The loop now serves ``version``: logs it, tells the observer, and compares the
        pointer with it again at the next poll (a promotion read while the swap was agreed,
        e.g. a rollback, is then loaded)."""
        with self._lock:
            old, self._serving = self._serving, version
            self._seen_generation = -1
        took = f" (loaded in {load_seconds:.2f}s)" if load_seconds is not None else ""
        log.info("model swapped: %s -> %s%s", old, version, took)
        self._observer.swapped(old, version)
        self._observer.serving(version)

    def report_failure(self, version: str, reason: str) -> None:
        """A loaded ``version`` is not served after all (e.g. it failed to load on another rank,
        or its warm-up failed): one warning line, and the observer's ``load_failed``."""
        log.warning(
            "model version %s failed to load, still serving %s: %s",
            version,
            self.serving_version,
            " ".join(reason.split())[:500],
        )
        self._observer.load_failed(version, RuntimeError(reason))

    def _load(self, version: str, generation: int) -> bool:
        start = self._clock()
        try:
            model = self._loader(self._versions.path(version))
        except Exception as exc:  # any failure of the new version keeps the old one serving
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())
            log.warning(
                "model version %s failed to load, still serving %s: %s",
                version,
                self.serving_version,
                detail[:500],
            )
            self._observer.load_failed(version, exc)
            with self._lock:
                if self._seen_generation == generation:
                    self._failed_generation = generation
            return False
        seconds = self._clock() - start
        try:
            now = self._versions.pointer()
        except ValueError:
            now = None
        if now is None or now.version != version:
            log.info("model version %s loaded but no longer current: discarded", version)
            return False
        with self._lock:
            self._seen_generation = now.generation  # a re-promotion during the load is this one
            self._ready = LoadedModel(version, now.generation, model, seconds)
        self._observer.loaded(version, seconds)
        log.info("model version %s loaded in %.2fs, ready to swap", version, seconds)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._poll_interval_s):
            self.check_once()
