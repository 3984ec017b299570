"""What a rank gives its ingest workers: their settings, their share of --max-events, the idle
flags they stop on together, and one summary of all of them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from model.rank import RankContext
from pipeline.ingest.stepping import IdleFlags, WorkerStepper
from pipeline.ingest.workers import share_of, worker_settings
from pipeline.runtime.stepping import LocalStep
from pipeline.settings.delivery import DeliverySettings, Guarantee
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings, load_settings
from pipeline.stages.commit import transactional_kafka


def _tid(settings: Settings, rank: RankContext) -> str:
    return str(transactional_kafka(settings, rank).config.producer["transactional.id"])


def test_each_worker_has_its_own_stable_transactional_id_and_worker_0_keeps_the_ranks() -> None:
    settings = Settings(
        kafka=KafkaSettings(group_id="g", client_id="c"),
        delivery=DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE),
    )
    rank = RankContext(rank=1, local_rank=1, world_size=2, local_world_size=2)
    ids = [_tid(worker_settings(settings, rank, i), rank) for i in range(3)]
    assert ids == ["g-c-1", "g-c-1-w1", "g-c-1-w2"]
    assert ids == [_tid(worker_settings(settings, rank, i), rank) for i in range(3)]  # stable
    named = settings.model_copy(
        update={"delivery": settings.delivery.model_copy(update={"transactional_id": "t"})}
    )
    assert _tid(worker_settings(named, rank, 2), rank) == "t-w2"


def test_settings_loaded_from_a_file_can_be_sent_to_a_worker(tmp_path: Path) -> None:
    config = tmp_path / "conf.toml"
    config.write_text('[topics]\ninput = "from-file"\n')
    settings = load_settings(config)
    with pytest.raises(Exception):  # noqa: B017 (a class made per config file)
        pickle.dumps(settings)
    sent = pickle.loads(pickle.dumps(worker_settings(settings, RankContext(), 0)))
    assert type(sent) is Settings and sent.topics.input == "from-file"
    assert sent == Settings.model_construct(**dict(settings))


@pytest.mark.parametrize(
    ("total", "count", "shares"), [(5, 2, [3, 2]), (1, 3, [1, 0, 0]), (6, 3, [2, 2, 2])]
)
def test_max_events_is_shared_out_never_more_in_all(
    total: int, count: int, shares: list[int]
) -> None:
    assert [share_of(total, i, count) for i in range(count)] == shares
    assert share_of(None, 0, 2) is None


def test_a_worker_stops_on_idleness_only_when_every_worker_is_idle() -> None:
    flags = IdleFlags.allocate(2)
    first, second = WorkerStepper(flags, 0), WorkerStepper(flags, 1)
    assert not first.agree(LocalStep(False, 0, False, idle=True)).stop  # the other one is busy
    assert not second.agree(LocalStep(True, 10, False, idle=False)).stop
    assert second.agree(LocalStep(False, 0, False, idle=True)).stop  # now both are idle
    assert first.agree(LocalStep(False, 0, False, idle=True)).stop
    # a signal: at once
    assert first.agree(LocalStep(False, 0, stop_requested=True, idle=False)).stop
    assert first.agree(LocalStep(True, 7, False, idle=False)).run  # scores as a local stepper does


def test_a_worker_that_left_does_not_hold_the_others_back() -> None:
    flags = IdleFlags.allocate(2)
    first, second = WorkerStepper(flags, 0), WorkerStepper(flags, 1)
    first.agree(LocalStep(False, 0, False, idle=False))
    first.leave()
    assert second.agree(LocalStep(False, 0, False, idle=True)).stop
