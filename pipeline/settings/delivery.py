"""The ``[delivery]`` and ``[shutdown]`` sections: the output's delivery guarantee, and how a
run ends on SIGTERM/SIGINT.

``at_least_once`` (default): offsets are committed after every record they guard is
acknowledged, at most every ``commit_interval_ms`` (:mod:`pipeline.stages.commit`); a crash can
repeat the recommendations of up to that long.

``exactly_once``: the recommendations, dead letters and consumed offsets of the batches of each
``commit_interval_ms`` go into one Kafka transaction
(:mod:`pipeline.stages.commit.transactions`); a ``read_committed`` reader of the output sees
every valid event once, across crashes and restarts.
"""

from __future__ import annotations

import enum

from pydantic import field_validator

from pipeline.settings.section import Section


class Guarantee(enum.StrEnum):
    """``delivery.guarantee``."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


class DeliverySettings(Section):
    """``[delivery]``.

    Example::

        [delivery]
        guarantee = "exactly_once"
        commit_interval_ms = 100
    """

    guarantee: Guarantee = Guarantee.AT_LEAST_ONCE
    commit_interval_ms: float = 100.0
    """exactly_once: a transaction spans the batches of this long, then commits.
    at_least_once: the least time between two offset commits (each is a broker request; with
    batches scored as soon as the scorer is free they can be a few milliseconds apart)."""
    transactional_id: str | None = None
    """exactly_once: the producer's ``transactional.id``; default
    ``<group_id>-<client_id>-<RANK>``. Must be stable across restarts of one member (so a
    restart fences and aborts its predecessor's open transaction) and distinct between
    members: give each single-process member of a group its own ``kafka.client_id``."""

    @field_validator("commit_interval_ms")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be > 0")
        return value


class ShutdownSettings(Section):
    """``[shutdown]``: how SIGTERM/SIGINT end a run."""

    timeout_s: float = 10.0
    """From the signal to the exit: the open batch is scored, every record acknowledged and the
    offsets committed within this time; what is not acknowledged by then stays uncommitted
    (replayed by the next run, never lost)."""

    @field_validator("timeout_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be > 0")
        return value
