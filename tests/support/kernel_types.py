"""The numba argument types a compiled kernel is called with (tests of warm-ups).

A warm-up that passes a kernel arguments of other numba types than a batch does (a read-only
array where a batch's is writable, a non-contiguous one) makes numba compile the batch's
specialization apart, when the first batch comes: these tests hold the two equal.
"""

from __future__ import annotations

from typing import Any

import numba
import pytest


def record_argument_types(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str
) -> list[tuple[Any, ...]]:
    """Replace ``module.name`` (a kernel) by a spy; the list it returns gets the numba types of
    each call's arguments, in call order."""
    calls: list[tuple[Any, ...]] = []
    kernel = getattr(module, name)

    def spy(*args: Any) -> Any:
        calls.append(tuple(numba.typeof(a) for a in args))
        return kernel(*args)

    monkeypatch.setattr(module, name, spy)
    return calls
