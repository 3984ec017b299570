"""A worker's stepper: it stops on idleness only with every worker of its rank, and passes the
step's other parts (the swap offer included) on as the local stepper decides them."""

from __future__ import annotations

from pipeline.ingest.stepping import IdleFlags, WorkerStepper
from pipeline.runtime.stepping import LocalStep, SwapOffer


def test_a_worker_stops_on_idleness_only_when_every_worker_is_idle() -> None:
    flags = IdleFlags.allocate(2)
    first, second = WorkerStepper(flags, 0), WorkerStepper(flags, 1)
    assert not first.agree(LocalStep(False, 0, False, idle=True)).stop  # worker 1 is not idle yet
    decision = second.agree(LocalStep(True, 12, False, idle=True))
    assert decision.stop and decision.run and decision.rows == 12
    assert second.agree(LocalStep(False, 0, True, idle=False)).stop  # asked to stop: at once


def test_a_worker_that_left_does_not_hold_the_others_back() -> None:
    flags = IdleFlags.allocate(2)
    first, second = WorkerStepper(flags, 0), WorkerStepper(flags, 1)
    second.leave()
    assert first.agree(LocalStep(False, 0, False, idle=True)).stop


def test_the_swap_offer_and_isolation_are_passed_on() -> None:
    flags = IdleFlags.allocate(2)
    stepper = WorkerStepper(flags, 0)
    offer = SwapOffer(generation=3, ok=True, drained=False)
    decision = stepper.agree(LocalStep(True, 5, False, idle=False, isolate=True, offer=offer))
    assert decision.swap == offer and decision.run and not decision.stop
    WorkerStepper(flags, 1).leave()
    last = stepper.agree(LocalStep(False, 0, False, idle=True, offer=offer))
    assert last.stop and last.swap == offer
