"""Rebalance handling for a single process and for a rank of a sharded model."""

from __future__ import annotations

from tests.pipeline.runtime.drains import T, rig


def test_single_process_scores_its_open_batch_then_commits_synchronously() -> None:
    r = rig(collective=False)
    r.handler.on_revoke({(T, 1)})
    assert len(r.producer.on_topic("out")) == 4  # the open batch was scored, then handed over
    assert len(r.batcher) == 0
    assert r.consumer.commits[-1] == ({(T, 0): 2, (T, 1): 2}, False)


def test_rank_drops_revoked_events_and_commits_only_what_was_delivered() -> None:
    r = rig(collective=True)
    r.handler.on_revoke({(T, 1)})
    assert r.producer.on_topic("out") == []  # a rank never runs a forward alone
    assert len(r.batcher) == 2
    assert r.checkpointer.open.next_offsets == {(T, 0): 2}
    assert r.consumer.commits == []  # nothing delivered yet, nothing committed


def test_after_a_failure_a_revocation_scores_and_commits_nothing() -> None:
    r = rig(collective=False)
    r.drain.closing = True
    r.handler.on_revoke({(T, 0), (T, 1)})
    assert r.producer.on_topic("out") == [] and r.consumer.commits == []


def test_lost_partitions_are_forgotten() -> None:
    r = rig(collective=False)
    r.handler.on_lost({(T, 0)})
    assert r.checkpointer.open.next_offsets == {(T, 1): 2}
