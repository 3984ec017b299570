"""ModelSwap's decisions from what the ranks agree on (offers of several simulated ranks, each
with its own watcher over one versions directory), and the collective stepper's agreement on
real gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from model.serving.options import ServingOptions
from model.store.versions import ModelVersions
from pipeline.models.loader import PendingModel, ServedModel
from pipeline.models.watch import ModelWatcher
from pipeline.runtime.model_swap import ModelSwap, SwapAction
from pipeline.runtime.stepping import LocalStep, StepAgreement, StepDecision, SwapOffer
from tests.model.distributed.ranks import finish_rank, spawn_ranks, start_rank
from tests.pipeline.models.test_watch import Recorder


def _version(versions: ModelVersions, name: str, good: bool = True) -> None:
    path = versions.root / name
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"model_version": name}))
    (path / "model.pt").write_text("good" if good else "corrupt")


class FakeLoader:
    """``load_local`` fails on corrupt weights (or everywhere in ``fail_on``); ``complete``
    returns a stand-in ServedModel (no torch)."""

    def __init__(self, fail_on: set[str] | None = None) -> None:
        self.fail_on = fail_on or set()
        self.completed: list[str] = []

    def load_local(self, path: Path) -> PendingModel:
        if (path / "model.pt").read_text() != "good" or path.name in self.fail_on:
            raise ValueError(f"corrupt {path.name}")
        return PendingModel(path, path.name, None, None)

    def complete(self, pending: PendingModel) -> ServedModel:
        self.completed.append(pending.version)
        scorer: Any = type("S", (), {"model_version": pending.version})()
        return ServedModel(scorer, None, ServingOptions(checkpoint=pending.path))


@pytest.fixture
def versions(tmp_path: Path) -> ModelVersions:
    versions = ModelVersions.create(tmp_path / "models")
    for name in ("v1", "v2", "v3"):
        _version(versions, name)
    _version(versions, "bad", good=False)
    versions.promote("v1")
    return versions


def _rank(versions: ModelVersions, loader: FakeLoader) -> tuple[ModelSwap, Recorder]:
    seen = Recorder()
    watcher: ModelWatcher[PendingModel] = ModelWatcher(
        versions.root, loader.load_local, "v1", observer=seen
    )
    return ModelSwap(watcher, loader), seen  # type: ignore[arg-type]


def _agree(offers: list[SwapOffer]) -> SwapOffer:
    """What the ranks' stepper computes from their offers."""
    gens = [o.generation for o in offers]
    return SwapOffer(
        generation=gens[0] if min(gens) == max(gens) else 0,
        ok=all(o.ok for o in offers),
        drained=all(o.drained for o in offers),
    )


def test_one_process_holds_until_drained_then_swaps(versions: ModelVersions) -> None:
    loader = FakeLoader()
    swap, seen = _rank(versions, loader)
    assert swap.decide(swap.offer(drained=True), batches_empty=True) is SwapAction.NONE
    generation = versions.promote("v2").generation
    swap.watcher.check_once()
    offer = swap.offer(drained=False)
    assert offer == SwapOffer(generation, ok=True, drained=False)
    assert swap.decide(offer, batches_empty=True) is SwapAction.HOLD
    assert swap.holding
    versions.promote("v3")  # a newer promotion during the hold does not change the agreed one
    swap.watcher.check_once()
    offer = swap.offer(drained=True)
    assert offer.generation == generation
    assert swap.decide(offer, batches_empty=False) is SwapAction.HOLD  # a batch is still open
    assert swap.decide(offer, batches_empty=True) is SwapAction.SWAP
    served = swap.complete(StepAgreement())
    assert served is not None and served.version == "v2"
    swap.swapped(served, warm_up_s=0.0)
    assert not swap.holding
    assert ("swapped", "v1", "v2") in seen.calls
    # v3 (loaded during the hold) is the next offer
    later = swap.offer(drained=True)
    assert later.generation == generation + 1
    assert swap.decide(later, batches_empty=True) is SwapAction.SWAP


def test_ranks_swap_only_when_all_offer_the_same_loaded_generation(
    versions: ModelVersions,
) -> None:
    loaders = [FakeLoader(), FakeLoader()]
    ranks = [_rank(versions, loader)[0] for loader in loaders]
    generation = versions.promote("v2").generation
    ranks[0].watcher.check_once()  # rank 1 has not read the pointer yet
    agreed = _agree([r.offer(drained=True) for r in ranks])
    assert agreed.generation == 0
    assert [r.decide(agreed, True) for r in ranks] == [SwapAction.NONE, SwapAction.NONE]
    ranks[1].watcher.check_once()
    agreed = _agree([r.offer(drained=True) for r in ranks])
    assert agreed == SwapOffer(generation, ok=True, drained=True)
    assert [r.decide(agreed, True) for r in ranks] == [SwapAction.SWAP, SwapAction.SWAP]
    assert [r.complete(StepAgreement()) is not None for r in ranks] == [True, True]
    assert [loader.completed for loader in loaders] == [["v2"], ["v2"]]


def test_a_load_that_failed_on_one_rank_is_discarded_on_all(versions: ModelVersions) -> None:
    loaders = [FakeLoader(), FakeLoader(fail_on={"v2"})]
    pairs = [_rank(versions, loader) for loader in loaders]
    ranks = [swap for swap, _ in pairs]
    versions.promote("v2")
    for rank in ranks:
        rank.watcher.check_once()
    offers = [r.offer(drained=True) for r in ranks]
    assert [o.ok for o in offers] == [True, False]
    agreed = _agree(offers)
    assert [r.decide(agreed, True) for r in ranks] == [SwapAction.DISCARD, SwapAction.DISCARD]
    failures = [[c for c in seen.calls if c[0] == "failed"] for _, seen in pairs]
    # Each rank counted one failure: rank 1 its own, rank 0 "failed on another rank".
    assert failures == [[("failed", "v2", "RuntimeError")], [("failed", "v2", "ValueError")]]
    assert all(r.offer(drained=True).generation == 0 for r in ranks)  # not offered again
    assert [loader.completed for loader in loaders] == [[], []]
    versions.promote("v3")  # the next promotion is taken on both
    for rank in ranks:
        rank.watcher.check_once()
    agreed = _agree([r.offer(drained=True) for r in ranks])
    assert [r.decide(agreed, True) for r in ranks] == [SwapAction.SWAP, SwapAction.SWAP]


def test_a_rollback_before_the_agreement_drops_the_loaded_version(
    versions: ModelVersions,
) -> None:
    swap, _ = _rank(versions, FakeLoader())
    versions.promote("v2")
    swap.watcher.check_once()
    assert swap.offer(drained=False).generation > 0  # loaded, not agreed yet (not drained...)
    versions.promote("v1")  # ... rolled back: the loaded v2 is stale
    swap.watcher.check_once()
    assert swap.offer(drained=True).generation == 0


class _FailingStepper(StepAgreement):
    """Another rank failed to build it."""

    def all_ok(self, ok: bool) -> bool:
        return False


def test_a_build_that_failed_anywhere_keeps_the_old_version(versions: ModelVersions) -> None:
    swap, seen = _rank(versions, FakeLoader())
    versions.promote("v2")
    swap.watcher.check_once()
    assert swap.decide(swap.offer(drained=True), True) is SwapAction.SWAP
    assert swap.complete(_FailingStepper()) is None
    assert ("failed", "v2", "RuntimeError") in seen.calls
    assert swap.watcher.serving_version == "v1"


def _agree_on_gloo(rank: int, world_size: int, port: int) -> None:
    from pipeline.runtime.stepping import ProcessGroup

    start_rank(rank, world_size, port)
    stepper = StepAgreement(ProcessGroup())
    offer = SwapOffer(7, True, True)
    same = stepper.agree(LocalStep(rank == 0, 10 * (rank + 1), False, False, offer=offer))
    assert same == StepDecision(run=True, rows=20, stop=False, swap=SwapOffer(7, True, True))
    offer = SwapOffer(7 + rank, rank == 0, rank == 1)
    differ = stepper.agree(LocalStep(False, 0, False, False, offer=offer))
    assert differ.swap == SwapOffer(0, ok=False, drained=False)
    offer = SwapOffer(9, rank == 1, True)
    failed = stepper.agree(LocalStep(False, 0, False, True, offer=offer))
    assert failed.swap == SwapOffer(9, ok=False, drained=True) and failed.stop
    assert stepper.all_ok(True) is True
    assert stepper.all_ok(rank == 0) is False
    finish_rank()


def test_the_collective_stepper_agrees_on_swaps_across_ranks() -> None:
    spawn_ranks(_agree_on_gloo, 2)
