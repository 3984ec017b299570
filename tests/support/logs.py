"""What a failed run's log says, for an assertion message.

A run of several processes (ranks, ingest workers) writes one log; when one of them fails, the
others fail after it (a closed connection, a collective cut short), and their long tracebacks
fill the log's tail. The cause is the first error line, often far above the tail.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["failure_excerpt"]

#: Words that start a line worth showing from anywhere in the log.
_ERROR_MARKS = (" ERROR ", " CRITICAL ", "Traceback (most recent call last)", "Error: ")


def failure_excerpt(log: Path, tail: int = 3000, line_chars: int = 2000, lines: int = 8) -> str:
    """The first ``lines`` error lines of ``log`` (each cut at ``line_chars``), then its last
    ``tail`` characters.

    Args:
        log: the run's log (missing: an empty string).
        tail: how many characters of the end to show.
        line_chars: how much of each error line to show (a traceback is one escaped line).
        lines: how many error lines to show, the first ones.

    Returns:
        The excerpt, for an assertion message.

    Example::

        assert proc.wait(300) == 0, failure_excerpt(log)
    """
    if not log.exists():
        return ""
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if any(m in line for m in _ERROR_MARKS)]
    shown = [line[:line_chars] for line in errors[:lines]]
    head = "first error lines:\n" + "\n".join(shown) + "\n" if shown else ""
    return f"{head}last {tail} characters:\n{text[-tail:]}"
