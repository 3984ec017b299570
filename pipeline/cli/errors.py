"""User errors: one line on stderr and exit code 2, never a traceback.

Checks raise :class:`UserError`; :func:`as_user_error` also turns the configuration's own
exceptions into one; the app (``pipeline.cli``) catches them in one place and prints one line.
"""

from __future__ import annotations

import sys

import pydantic
from pydantic_settings import SettingsError

from pipeline.settings.loading import ConfigError
from pipeline.settings.secrets import is_secret_name

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A mistake the user can fix, told in one line: what is wrong and what to do.

    Args:
        message: the line to show (newlines are folded into spaces).

    Example::

        raise UserError("no model at artifacts/model: run `streamrank init-model` first")
    """

    exit_code = USER_ERROR_EXIT_CODE


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """One line naming every bad or unknown key of a settings validation error.

    Args:
        error: raised while validating :class:`pipeline.settings.loading.Settings`.

    Returns:
        e.g. ``unknown config key kafka.bogus; bad config value for batching.max_batch_rows:
        Value error, must be >= 1``.
    """
    problems = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"])
        if problem["type"] == "extra_forbidden":
            problems.append(f"unknown config key {key}")
        elif not key:  # a check across sections: its message names the keys
            problems.append(f"bad config: {problem['msg'].removeprefix('Value error, ')}")
        else:
            shown = not isinstance(problem["input"], dict) and not is_secret_name(key)
            got = f" (got {problem['input']!r})" if shown else ""
            problems.append(f"bad config value for {key}{got}: {problem['msg']}")
    return "; ".join(problems)


def as_user_error(error: BaseException) -> UserError | None:
    """The :class:`UserError` that ``error`` stands for, or ``None`` for a genuine failure.

    Args:
        error: anything raised by a command.

    Returns:
        ``error`` itself when it is a :class:`UserError`; one made from a configuration error
        (unknown key, missing file, bad value) or a launch error (more ranks than GPUs); else
        ``None`` (it keeps its traceback).
    """
    if isinstance(error, UserError):
        return error
    if isinstance(error, pydantic.ValidationError):
        return UserError(describe_validation_error(error))
    if isinstance(error, ConfigError):
        return UserError(str(error))
    if isinstance(error, SettingsError):
        return UserError(f"bad config value: {error}")
    device = sys.modules.get(
        "model.serving.device"
    )  # not imported: no such error (and no torch here)
    if device is not None and isinstance(error, device.DeviceUnavailableError):
        return UserError(str(error))  # a rank started for a GPU this host does not have
    return None


def one_line(message: str) -> str:
    """``message`` with every run of whitespace (newlines too) folded into one space."""
    return " ".join(message.split())
