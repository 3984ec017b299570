"""A module's weights as a plain ``state_dict`` file: read safely, check, load.

The file is what ``torch.save(model.state_dict(), f)`` writes, read with ``weights_only=True``
(no code runs). Trainers often wrap the model (TorchRec's ``DLRMTrain`` keeps it under
``model.``): a prefix is stripped from every key that has it. Keys and shapes are checked
against the module before anything is loaded, in one line: the module may be on the ``meta``
device (its shapes are all that is compared).

Example::

    state = read_state_dict(Path("dlrm.pt"), strip_prefix="model.")
    check_state_dict(module, state)
    module.load_state_dict(state, strict=True)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from model.module.types import ModelConfigError

__all__ = ["check_state_dict", "read_state_dict"]

_SHOWN = 4
"""Keys named in an error line at most (then a count)."""


def read_state_dict(
    path: Path, strip_prefix: str = "", mmap: bool = False
) -> dict[str, torch.Tensor]:
    """The tensors of a ``state_dict`` file, ``strip_prefix`` removed from the keys that have it.

    Args:
        path: the file.
        strip_prefix: e.g. ``"model."`` for ``DLRMTrain``'s state dict.
        mmap: map the file instead of reading it (CPU tensors share the page cache).

    Returns:
        Name -> CPU tensor.

    Raises:
        ModelConfigError: a missing or unreadable file, or one that is not a flat dict of
            tensors (one line).
    """
    if not path.is_file():
        raise ModelConfigError(f"state_dict file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for garbled or unsafe files
        detail = " ".join(str(exc).split())[:300]
        raise ModelConfigError(
            f"{path} is not a state_dict file torch.load(weights_only=True) can read: {detail}"
        ) from exc
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelConfigError(
            f"{path} does not hold a state_dict (a dict of name -> tensor): save "
            "torch.save(model.state_dict(), path)"
        )
    if not strip_prefix:
        return dict(state)
    return {k.removeprefix(strip_prefix): v for k, v in state.items()}


def check_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise one line if ``state``'s keys or shapes differ from ``module``'s.

    Args:
        module: the module (any device, ``meta`` included).
        state: the weights to load.
        source: where they come from (named in the error).

    Raises:
        ModelConfigError: missing or unexpected keys, or a tensor of another shape.
    """
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        hint = _prefix_hint(unexpected, missing)
        raise ModelConfigError(
            f"{source} does not fit model.module: missing keys {_some(missing)}, unexpected "
            f"keys {_some(unexpected)}{hint}"
        )
    for key, shape in expected.items():
        got = tuple(state[key].shape)
        if got != shape:
            raise ModelConfigError(
                f"{source} does not fit model.module: {key} is {list(got)}, the module's is "
                f"{list(shape)}"
            )


def _some(keys: list[str]) -> str:
    if not keys:
        return "none"
    shown = ", ".join(keys[:_SHOWN])
    return shown + (f" (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else "")


def _prefix_hint(unexpected: list[str], missing: list[str]) -> str:
    """A hint when every unexpected key is a missing one behind a common prefix."""
    if not unexpected or not missing:
        return ""
    first = unexpected[0]
    for key in missing:
        if first.endswith(key) and first != key:
            prefix = first[: len(first) - len(key)]
            if all(k.startswith(prefix) for k in unexpected):
                return f" (set model.module.state_dict_prefix = {prefix!r})"
    return ""
