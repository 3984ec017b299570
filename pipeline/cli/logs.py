"""Where streamrank's logs go and what they look like.

``--log-format`` (or ``$STREAMRANK_LOG_FORMAT``):

- ``auto`` (default): ``rich`` when stderr is a terminal, else ``text``;
- ``rich``: colours and columns for a person at a terminal (wrapped to its width);
- ``text``: one record per line, never wrapped (newlines inside a message are written as
  ``\\n``): ``2026-01-31T12:00:00.123Z INFO pipeline.runtime.loop: message``;
- ``json``: one JSON object per line: ``time``, ``level``, ``logger``, ``message``, ``rank``
  (under torchrun) and ``exception`` (a traceback, when there is one).

Python warnings become log records too (``py.warnings``). Known third-party noise is dropped
(:data:`NOISE`): torch's ``is_fx_tracing`` notice and TorchRec's ``broadcast_buffers``
deprecation, which every scoring process would print once with no action for the user.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import time
import warnings
from typing import Any, TextIO

from rich.console import Console
from rich.logging import RichHandler

from model.rank import RankContext

__all__ = [
    "LOG_FORMAT_ENV",
    "NOISE",
    "LogFormat",
    "active_format",
    "configure_logging",
    "json_formatter",
    "text_formatter",
]

LOG_FORMAT_ENV = "STREAMRANK_LOG_FORMAT"
OWN_LOGGERS = ("pipeline", "model", "streamrank")


class LogFormat(enum.StrEnum):
    """How log records are written (see the module docstring)."""

    AUTO = "auto"
    RICH = "rich"
    TEXT = "text"
    JSON = "json"


#: ``(logger name, start of the message)`` of third-party records that are dropped.
NOISE: tuple[tuple[str, str], ...] = (
    ("torch.fx._symbolic_trace", "is_fx_tracing will return true"),
)
#: ``(category, regex matching the start of the message)`` of warnings that are ignored.
NOISY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`broadcast_buffers` is deprecated"),
)


def _rank() -> int | None:
    """This process's global rank under torchrun, else ``None``."""
    rank = RankContext.from_env()
    return rank.rank if rank.distributed else None


class _DropNoise(logging.Filter):
    """Drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def _utc_time(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class _TextFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> [rank N ]<logger>: <message>`` on one line."""

    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = "" if rank is None else f"rank{rank} "

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        one_line = message.replace("\\", "\\\\").replace("\n", "\\n")
        return f"{_utc_time(record)} {record.levelname} {self.rank}{record.name}: {one_line}"


class _JsonFormatter(logging.Formatter):
    """One JSON object per record (strict JSON: no NaN)."""

    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.rank is not None:
            entry["rank"] = self.rank
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def text_formatter(rank: int | None = None) -> logging.Formatter:
    """The ``text`` format: one line per record (see the module docstring).

    Args:
        rank: the rank to label records with (``None``: no label).

    Returns:
        A :class:`logging.Formatter`.

    Example::

        handler.setFormatter(text_formatter())
    """
    return _TextFormatter(rank)


def json_formatter(rank: int | None = None) -> logging.Formatter:
    """The ``json`` format: one JSON object per record (see the module docstring).

    Args:
        rank: the rank to add as ``"rank"`` (``None``: no such field).

    Returns:
        A :class:`logging.Formatter`.

    Example::

        handler.setFormatter(json_formatter(rank=1))
    """
    return _JsonFormatter(rank)


def resolve_format(chosen: LogFormat, stream: TextIO) -> LogFormat:
    """``chosen``, with ``auto`` made ``rich`` on a terminal and ``text`` otherwise.

    Args:
        chosen: the ``--log-format`` value.
        stream: where the logs go.

    Returns:
        ``rich``, ``text`` or ``json``.
    """
    if chosen is not LogFormat.AUTO:
        return chosen
    return LogFormat.RICH if stream.isatty() else LogFormat.TEXT


def _handler(fmt: LogFormat, stream: TextIO) -> logging.Handler:
    rank = _rank()
    if fmt is LogFormat.RICH:
        handler: logging.Handler = RichHandler(
            console=Console(file=stream), show_path=False, rich_tracebacks=True
        )
        label = "" if rank is None else f"rank{rank} "
        handler.setFormatter(logging.Formatter(f"{label}%(name)s: %(message)s"))
        return handler
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter(rank) if fmt is LogFormat.JSON else text_formatter(rank))
    return handler


def drop_known_noise() -> None:
    """Filter the third-party records of :data:`NOISE` and the warnings of
    :data:`NOISY_WARNINGS` (the loggers need not exist yet: nothing is imported)."""
    for name, prefix in NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropNoise(prefix))
    for category, message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


_active: list[LogFormat] = []
"""The format :func:`configure_logging` chose (one entry once configured)."""


def active_format() -> LogFormat | None:
    """The log format in use, or ``None`` before :func:`configure_logging` ran."""
    return _active[-1] if _active else None


def configure_logging(
    level: str, chosen: LogFormat = LogFormat.AUTO, stream: TextIO | None = None
) -> LogFormat:
    """Send every log record to ``stream`` (stderr) in the chosen format.

    streamrank's own loggers (``pipeline``, ``model``, ``streamrank``) log at ``level``;
    third-party ones from WARNING (fbgemm logs a line per library it loads at INFO).

    Args:
        level: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.
        chosen: the format (``auto`` resolves by whether ``stream`` is a terminal).
        stream: where records go (default ``sys.stderr``).

    Returns:
        The format in use (``rich``, ``text`` or ``json``).

    Example::

        configure_logging("INFO", LogFormat.JSON)
    """
    out = stream or sys.stderr
    fmt = resolve_format(chosen, out)
    logging.basicConfig(level=logging.WARNING, handlers=[_handler(fmt, out)], force=True)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(True)
    drop_known_noise()
    _active[:] = [fmt]
    return fmt
