"""The model watcher: loads promoted versions off the loop, hands them over once, keeps the
old version when a load fails, follows rollbacks; and its metrics."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from model.ranker import build_ranker
from model.store.checkpoint import load_checkpoint
from model.store.versions import POINTER_FILE, ModelVersions
from pipeline.models.watch import MetricsSwapObserver, ModelWatcher
from pipeline.observability.metrics import Metrics
from tests.model.conftest import small_spec


class Recorder:
    """A SwapObserver that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.loaded_event = threading.Event()

    def serving(self, version: str) -> None:
        self.calls.append(("serving", version))

    def swapped(self, old: str, new: str) -> None:
        self.calls.append(("swapped", old, new))

    def loaded(self, version: str, seconds: float) -> None:
        self.calls.append(("loaded", version))
        self.loaded_event.set()

    def load_failed(self, version: str, error: Exception) -> None:
        self.calls.append(("failed", version, type(error).__name__))


def _fake_version(versions: ModelVersions, name: str, good: bool = True) -> None:
    """A version directory the fake loader reads: meta.json, and weights that say good/bad."""
    path = versions.root / name
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"model_version": name}))
    (path / "model.pt").write_text("good" if good else "corrupt")


class FakeLoader:
    """Loads a fake version as ``"model:<name>"``; raises on corrupt weights."""

    def __init__(self, during_load: Callable[[], None] | None = None) -> None:
        self.loaded: list[str] = []
        self.during_load = during_load

    def __call__(self, path: Path) -> str:
        self.loaded.append(path.name)
        if self.during_load is not None:
            self.during_load()
        if (path / "model.pt").read_text() != "good":
            raise ValueError(f"corrupt checkpoint weights {path}/model.pt")
        return f"model:{path.name}"


@pytest.fixture
def versions(tmp_path: Path) -> ModelVersions:
    versions = ModelVersions.create(tmp_path / "models")
    for name in ("v1", "v2", "v3"):
        _fake_version(versions, name)
    _fake_version(versions, "bad", good=False)
    versions.promote("v1")
    return versions


def _watcher(
    versions: ModelVersions, loader: FakeLoader, observer: Recorder | None = None
) -> ModelWatcher[str]:
    return ModelWatcher(versions.root, loader, "v1", poll_interval_s=0.01, observer=observer)


def test_nothing_promoted_nothing_loaded(versions: ModelVersions) -> None:
    loader = FakeLoader()
    watcher = _watcher(versions, loader)
    assert watcher.check_once() is False
    assert watcher.take_ready() is None
    assert loader.loaded == [] and watcher.serving_version == "v1"


def test_a_promoted_version_is_loaded_once_and_taken_once(versions: ModelVersions) -> None:
    loader, seen = FakeLoader(), Recorder()
    watcher = _watcher(versions, loader, seen)
    pointer = versions.promote("v2")
    assert watcher.check_once() is True
    assert watcher.check_once() is False  # no new promotion: no second load
    assert watcher.ready_generation() == pointer.generation
    assert watcher.serving_version == "v1"  # not before the loop takes it
    assert watcher.take_ready() == "model:v2"
    assert watcher.take_ready() is None
    assert watcher.serving_version == "v2"
    assert loader.loaded == ["v2"]
    assert seen.calls == [
        ("serving", "v1"),
        ("loaded", "v2"),
        ("swapped", "v1", "v2"),
        ("serving", "v2"),
    ]


def test_a_corrupt_version_keeps_the_old_one_and_is_logged_once(
    versions: ModelVersions, caplog: pytest.LogCaptureFixture
) -> None:
    loader, seen = FakeLoader(), Recorder()
    watcher = _watcher(versions, loader, seen)
    versions.promote("bad")
    with caplog.at_level(logging.WARNING, logger="pipeline.models.watch"):
        assert watcher.check_once() is False
        assert watcher.check_once() is False  # the same promotion is not retried
    assert watcher.take_ready() is None
    assert watcher.serving_version == "v1"
    assert loader.loaded == ["bad"]
    assert ("failed", "bad", "ValueError") in seen.calls
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1
    assert "bad failed to load, still serving v1" in lines[0] and "\n" not in lines[0]
    versions.promote("bad")  # promoting it again retries it
    assert watcher.check_once() is False
    assert loader.loaded == ["bad", "bad"]
    versions.promote("v3")  # and a good version after a bad one is taken
    assert watcher.check_once() is True
    assert watcher.take_ready() == "model:v3"


def test_a_rollback_before_the_swap_drops_the_loaded_version(versions: ModelVersions) -> None:
    loader = FakeLoader()
    watcher = _watcher(versions, loader)
    versions.promote("v2")
    assert watcher.check_once() is True
    versions.promote("v1")
    assert watcher.check_once() is False
    assert watcher.take_ready() is None
    assert watcher.serving_version == "v1"


def test_a_newer_version_replaces_one_not_taken_yet(versions: ModelVersions) -> None:
    loader = FakeLoader()
    watcher = _watcher(versions, loader)
    versions.promote("v2")
    watcher.check_once()
    versions.promote("v3")
    watcher.check_once()
    assert watcher.take_ready() == "model:v3"
    assert watcher.take_ready() is None


def test_ranks_take_only_the_agreed_generation(versions: ModelVersions) -> None:
    watcher = _watcher(versions, FakeLoader())
    generation = versions.promote("v2").generation
    watcher.check_once()
    assert watcher.take_ready(generation + 1) is None
    assert watcher.take_ready(generation) == "model:v2"


def test_a_version_superseded_during_its_load_is_discarded(versions: ModelVersions) -> None:
    loader = FakeLoader(during_load=lambda: versions.promote("v3"))
    watcher = _watcher(versions, loader)
    versions.promote("v2")
    assert watcher.check_once() is False  # v2 loaded, but v3 is current by then
    assert watcher.take_ready() is None
    loader.during_load = None
    assert watcher.check_once() is True
    assert watcher.take_ready() == "model:v3"


def test_a_promotion_before_the_watcher_started_is_picked_up(versions: ModelVersions) -> None:
    versions.promote("v2")
    watcher = _watcher(versions, FakeLoader())  # the loop still serves v1
    assert watcher.check_once() is True
    assert watcher.take_ready() == "model:v2"


def test_a_corrupt_pointer_keeps_serving(
    versions: ModelVersions, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = _watcher(versions, FakeLoader())
    (versions.root / POINTER_FILE).write_text("{")
    with caplog.at_level(logging.WARNING, logger="pipeline.models.watch"):
        assert watcher.check_once() is False
        assert watcher.check_once() is False
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert watcher.serving_version == "v1"


def test_the_background_thread_loads_promotions(versions: ModelVersions) -> None:
    seen = Recorder()
    watcher = _watcher(versions, FakeLoader(), seen)
    watcher.start()
    try:
        versions.promote("v2")
        assert seen.loaded_event.wait(60), "the watcher thread never loaded v2"
        assert watcher.take_ready() == "model:v2"
    finally:
        watcher.stop()


def test_real_checkpoints_and_a_truncated_one(tmp_path: Path) -> None:
    spec = small_spec()
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(build_ranker(spec, seed=1), spec, version="good-1", promote=True)
    versions.write(build_ranker(spec, seed=2), spec, version="good-2")
    versions.write(build_ranker(spec, seed=3), spec, version="torn")
    weights = versions.path("torn") / "model.pt"
    weights.write_bytes(weights.read_bytes()[:1000])  # a torn copy

    def load(path: Path) -> str:
        return load_checkpoint(path)[1].model_version

    seen = Recorder()
    watcher = ModelWatcher(versions.root, load, "good-1", observer=seen)
    versions.promote("torn")
    assert watcher.check_once() is False
    assert watcher.serving_version == "good-1"
    versions.promote("good-2")
    assert watcher.check_once() is True
    assert watcher.take_ready() == "good-2"
    assert [c[0] for c in seen.calls].count("failed") == 1


def test_metrics_observer(versions: ModelVersions) -> None:
    metrics = Metrics()
    watcher = ModelWatcher(versions.root, FakeLoader(), "v1", observer=MetricsSwapObserver(metrics))
    get = metrics.registry.get_sample_value
    assert get("streamrank_model_info", {"model_version": "v1"}) == 1
    versions.promote("bad")
    watcher.check_once()
    versions.promote("v2")
    watcher.check_once()
    watcher.take_ready()
    assert get("streamrank_model_swaps_total") == 1
    assert get("streamrank_model_load_failures_total") == 1
    assert get("streamrank_model_info", {"model_version": "v2"}) == 1
    assert get("streamrank_model_info", {"model_version": "v1"}) is None
    assert get("streamrank_model_load_seconds") is not None
