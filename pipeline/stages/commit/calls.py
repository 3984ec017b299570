"""librdkafka's transactional calls, one at a time, each within a budget the loop can rely on.

librdkafka's ``send_offsets_to_transaction`` ignores its timeout while the coordinator is
unreachable, and may not come back at all after a broker restart (librdkafka #5456, #5511). So
:class:`TransactionCalls` runs every call on a helper thread while the loop's thread waits in
short slices; a call still running at the end of its budget (or at the shutdown deadline, set
the moment SIGTERM arrives) is left running and reported (:class:`GaveUp`). Retriable errors
are retried, the same call again (librdkafka resumes it where it stopped), until the budget is
spent. Two calls never overlap: the next one waits for, or gives up on, the one in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.types import DeliveryFailed

log = logging.getLogger(__name__)


class GaveUp(Exception):
    """A call did not succeed within its budget (``in_flight``: it still runs)."""

    def __init__(self, what: str, reason: str, in_flight: bool) -> None:
        super().__init__(f"{what}: {reason}")
        self.in_flight = in_flight


class TransactionCalls:
    """Runs a transactional producer's calls (see the module docstring).

    Args:
        producer: the transactional producer (replaced by :meth:`renewed`).
        budget_s: how long one call may take, its retries included.
        deadline: ``time.monotonic()`` by which every wait must end (``None`` until a stop).
        clock: seconds, monotonic (tests pass a fake).

    Example::

        calls = TransactionCalls(producer, 60.0, lambda: shutdown.deadline)
        calls.call("commit_transaction", producer.commit_transaction)
    """

    WAIT_SLICE_S = 0.1
    """How often the loop's thread looks up (deadline, signals) while a call runs."""
    RETRY_BACKOFF_S = 0.2
    """Pause between attempts of a call that failed with a retriable error (callbacks are
    served meanwhile)."""

    def __init__(
        self,
        producer: OutputProducer,
        budget_s: float,
        deadline: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.producer = producer
        self._budget_s = budget_s
        self._deadline = deadline
        self._clock = clock
        self._end_at = 0.0
        self.in_flight: str | None = None
        """The call still running on its helper thread, if any."""
        self._done = threading.Event()
        self._done.set()

    def past_deadline(self) -> bool:
        """Whether a stop was requested and its deadline has passed."""
        deadline = self._deadline()
        return deadline is not None and self._clock() >= deadline

    def call(self, what: str, call: Callable[[float], object]) -> None:
        """Run one call until it succeeds, retrying retriable errors.

        Args:
            what: its name (logs, errors).
            call: the call, given the seconds it may take.

        Raises:
            KafkaClientError: an abortable, fatal or unclassified error.
            GaveUp: retriable errors, or the call still running, past its budget; or another
                call still in flight.
        """
        if self.in_flight is not None:
            raise GaveUp(what, f"{self.in_flight} still in progress", in_flight=True)
        self._end_at = self._clock() + self._budget_s
        while True:
            try:
                self._attempt(what, call)
                return
            except KafkaClientError as err:
                if not err.retriable or err.fatal or err.txn_requires_abort:
                    raise
                if self._clock() >= self._end():
                    raise GaveUp(what, str(err), in_flight=False) from err
                log.warning("%s: %s (retriable): retrying", what, err)
                self.producer.poll(self.RETRY_BACKOFF_S)

    def wait(self, limit_s: float | None = None) -> bool:
        """Wait until no call is in flight, at most ``limit_s`` (``None``: as long as it takes).

        Returns:
            Whether none is in flight.

        Raises:
            DeliveryFailed: the shutdown deadline passed first.
        """
        until = None if limit_s is None else self._clock() + limit_s
        while not self._done.wait(self.WAIT_SLICE_S):
            if self.past_deadline():
                raise DeliveryFailed(f"{self.in_flight} still in progress at the deadline")
            if until is not None and self._clock() >= until:
                return False
        return True

    def renewed(self, producer: OutputProducer) -> None:
        """Go on with ``producer``: the call in flight on the old one, if any, is abandoned (it
        never delays another call again)."""
        self.producer = producer
        self.in_flight = None
        self._done = threading.Event()
        self._done.set()

    def _end(self) -> float:
        """When the call in progress must give up: its budget, or the shutdown deadline."""
        deadline = self._deadline()
        return self._end_at if deadline is None else min(self._end_at, deadline)

    def _attempt(self, what: str, call: Callable[[float], object]) -> None:
        """One call on a helper thread; the loop's thread waits in slices until it returns
        or the call's end passes (then the call is left running: :class:`GaveUp`)."""
        outcome: list[BaseException | None] = []
        done = threading.Event()
        timeout_s = max(0.1, min(self._budget_s, self._end() - self._clock()))

        def run() -> None:
            try:
                call(timeout_s)
                outcome.append(None)
            except BaseException as exc:  # handed to the waiting thread
                outcome.append(exc)
            finally:
                if self._done is done:  # not abandoned meanwhile
                    self.in_flight = None
                done.set()

        self.in_flight = what
        self._done = done
        threading.Thread(target=run, name=f"txn-{what}", daemon=True).start()
        while not done.wait(self.WAIT_SLICE_S):
            if self._clock() >= self._end():
                raise GaveUp(what, "no answer from the broker", in_flight=True)
        if outcome[0] is not None:
            raise outcome[0]
