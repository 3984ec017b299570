"""When a member is idle (``--exit-when-idle``): no input and nothing to do for a while.

Counted from the later of the last input and the last time the member had work, so a loop that
spent longer than the idle time scoring what one poll brought (or going back after an aborted
transaction) is not idle when it is done: a rebalance may be what keeps the next poll empty.
With several members, the stepper stops them once every one is idle.
"""

from __future__ import annotations

import time


class IdleClock:
    """This member's idleness.

    Example::

        clock = IdleClock()
        clock.idle(has_work=False, last_activity=source.last_activity, idle_s=5.0)
    """

    def __init__(self) -> None:
        self._busy_at = 0.0

    def busy(self) -> None:
        """The member has work now."""
        self._busy_at = time.monotonic()

    def idle(self, has_work: bool, last_activity: float | None, idle_s: float | None) -> bool:
        """Whether there has been no input and nothing to do for ``idle_s``.

        Args:
            has_work: events wait to be batched or scored now.
            last_activity: monotonic time of the last input or assignment (``None``: none yet).
            idle_s: ``--exit-when-idle`` (``None``: never idle).
        """
        if has_work:
            self.busy()
            return False
        return (
            idle_s is not None
            and last_activity is not None
            and time.monotonic() - max(last_activity, self._busy_at) >= idle_s
        )
