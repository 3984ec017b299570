"""Poison isolation: find the events a failing batch step chokes on, by bisection.

When a step after decode (enrich, features, forward, top-K, encode) raises for a batch, the
batch is split in halves and each half is retried, recursively, until the failing events stand
alone. Those are dead-lettered with reason ``processing_error``; the rest are scored. One
poison event among ``n`` costs about ``2 log2 n`` extra attempts, paid only when a batch fails.

Not every exception is a poison event: an error of the environment (the broker, a delivery,
memory, the operating system, the GPU, the ranks' communication) says nothing about the events,
so :func:`is_isolatable` refuses those and they propagate: the process stops uncommitted and a
restart (torchrun's, or the supervisor's) scores the batch again on a fresh device context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
import torch.distributed as dist
from confluent_kafka import KafkaException

from pipeline.types import DeliveryFailed

T = TypeVar("T")
E = TypeVar("E")

_ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    DeliveryFailed,
    KafkaException,
    BufferError,
    MemoryError,
    OSError,
    torch.cuda.OutOfMemoryError,
    torch.AcceleratorError,  # a CUDA error: the device context is broken, not the events
    dist.DistError,  # NCCL/gloo/store failures of the ranks' collectives
)


def is_isolatable(exc: BaseException) -> bool:
    """Whether ``exc`` may be caused by the events of the batch (and so worth bisecting).

    Example::

        is_isolatable(ValueError("bad value"))  # True
        is_isolatable(DeliveryFailed("broker down"))  # False
    """
    return isinstance(exc, Exception) and not isinstance(exc, _ENVIRONMENT_ERRORS)


@dataclass
class Isolation(Generic[E, T]):
    """What bisection found.

    Attributes:
        good: groups of events whose attempt succeeded, with its result (in input order).
        failed: each event that fails alone, with the exception it raised.
        attempts: attempts made (the initial failure not counted).
    """

    good: list[tuple[list[E], T]] = field(default_factory=list)
    failed: list[tuple[E, Exception]] = field(default_factory=list)
    attempts: int = 0

    @property
    def good_items(self) -> list[E]:
        """Every event of the good groups, in input order."""
        return [item for group, _ in self.good for item in group]


def bisect(
    records: list[E],
    attempt: Callable[[list[E]], T],
    first_error: Exception,
) -> Isolation[E, T]:
    """Split a failed batch until every failing event stands alone.

    Args:
        records: the batch's events (e.g. their indices), whose attempt already raised
            ``first_error``.
        attempt: processes a group of events; raises if it cannot. It must have no effect
            when it raises (or only effects that are harmless to repeat).
        first_error: what the whole batch raised.

    Returns:
        The good groups with their results, and the failing records with their errors.

    Raises:
        Exception: an attempt raised an error :func:`is_isolatable` refuses (an outage, not
            an event): it propagates.

    Example::

        found = bisect(records, lambda group: prepare(group), first_error=exc)
        for record, error in found.failed:
            dead_letter(record, error)
    """
    found: Isolation[E, T] = Isolation()

    def split(group: list[E], error: Exception) -> None:
        if len(group) == 1:
            found.failed.append((group[0], error))
            return
        middle = len(group) // 2
        for half in (group[:middle], group[middle:]):
            found.attempts += 1
            try:
                result = attempt(half)
            except Exception as exc:
                if not is_isolatable(exc):
                    raise
                split(half, exc)
            else:
                found.good.append((half, result))

    split(records, first_error)
    return found
