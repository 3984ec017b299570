"""``python -m tests.support.late_kernels ARGS``: ``streamrank ARGS``, and the compiled (numba)
kernels that were loaded or compiled while a scoring loop ran.

Every kernel of the serving path is to be loaded when its stage is built (a warm-up call with
arguments of the types a batch passes), never by the first batch: loading one from numba's
cache takes milliseconds, compiling it (a cold cache: a fresh image) seconds, all of it in that
batch's latency. A kernel whose warm-up passed other types (a read-only array, a
non-contiguous one) is compiled apart, and shows here. At exit the kernels' names go to the
file named by :data:`LATE_KERNELS_ENV` (a JSON list).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from numba.core import dispatcher

from pipeline.cli import app
from pipeline.runtime.loop import ScoringPipeline

LATE_KERNELS_ENV = "LATE_KERNELS_FILE"
_LOOP = ScoringPipeline._loop.__code__


def _in_loop(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _LOOP:
            return True
        frame = frame.f_back
    return False


def watch(out: Path) -> None:
    """Record every kernel loaded or compiled inside the scoring loop; write them at exit."""
    late: list[str] = []
    compile_for_args = dispatcher._DispatcherBase._compile_for_args

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _in_loop(sys._getframe(1)):
            late.append(f"{self.py_func.__module__}.{self.py_func.__qualname__}")
        return compile_for_args(self, *args, **kwargs)

    dispatcher._DispatcherBase._compile_for_args = spy  # type: ignore[method-assign]
    atexit.register(lambda: out.write_text(json.dumps(late)))


if __name__ == "__main__":
    watch(Path(os.environ[LATE_KERNELS_ENV]))
    app()
