"""TEST HOOK: inject a processing failure for chosen event ids (fault-suite tests only).

Set ``STREAMRANK_TEST_FAULTS`` to a comma-separated list of ``stage:event_id`` pairs, where
stage is ``features`` (raised while a batch is featurised) or ``forward`` (raised on the
scoring thread before the forward). The variable is read once when a
:class:`~pipeline.loop.ScoringPipeline` is built; when it is unset (production) the loop holds
``None`` and pays one ``is None`` test per batch.

Example::

    STREAMRANK_TEST_FAULTS=features:evt-42 python -m pipeline.cli run
"""

from __future__ import annotations

import os
from collections.abc import Mapping

FAULTS_ENV_VAR = "STREAMRANK_TEST_FAULTS"
STAGES = ("features", "forward")


class InjectedFault(RuntimeError):
    """Raised by :class:`FaultInjector` for an event id it was told to fail."""


class FaultInjector:
    """Raises :class:`InjectedFault` when a batch of a stage holds a chosen event id.

    Args:
        targets: stage -> event ids that fail in that stage.

    Example::

        faults = FaultInjector({"features": {"evt-1"}})
        faults.check("features", ["evt-0", "evt-1"])  # raises InjectedFault
    """

    def __init__(self, targets: Mapping[str, set[str]]) -> None:
        unknown = set(targets) - set(STAGES)
        if unknown:
            raise ValueError(f"{FAULTS_ENV_VAR}: unknown stage(s) {sorted(unknown)}")
        self._targets = {stage: frozenset(ids) for stage, ids in targets.items()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultInjector | None:
        """The injector ``STREAMRANK_TEST_FAULTS`` asks for, or ``None`` when it is unset.

        Returns:
            ``None`` in production (the variable unset or empty).
        """
        spec = (os.environ if environ is None else environ).get(FAULTS_ENV_VAR, "").strip()
        if not spec:
            return None
        targets: dict[str, set[str]] = {}
        for item in spec.split(","):
            stage, sep, event_id = item.strip().partition(":")
            if not sep or not event_id:
                raise ValueError(f"{FAULTS_ENV_VAR}: {item!r} is not stage:event_id")
            targets.setdefault(stage, set()).add(event_id)
        return cls(targets)

    def check(self, stage: str, event_ids: list[str]) -> None:
        """Raise if ``stage`` must fail for one of ``event_ids``.

        Raises:
            InjectedFault: naming the stage and the event id.
        """
        targets = self._targets.get(stage)
        if not targets:
            return
        for event_id in event_ids:
            if event_id in targets:
                raise InjectedFault(f"injected {stage} failure for event {event_id}")
