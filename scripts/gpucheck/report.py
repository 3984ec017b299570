"""The GPU check's report: one JSON object, rewritten whole after every section.

A GPU is lent for minutes and a section may crash the process (a CUDA fault, an OOM kill), so
nothing waits for the end: after each section the whole object is written to a temporary file
next to ``path`` and renamed over it (a reader sees the previous or the new version, never half
of one), and one line ``{"section": ..., "seconds": ..., "result": ...}`` is printed. A section
that raises is recorded as ``{"error": ..., "traceback": [...]}`` and the next one runs.

The object::

    {
      "check": {"started": ISO time, "updated": ISO time, "finished": false,
                "running": "forward" | null, "done": ["parity", ...], "failed": [...],
                "seconds": {"parity": 3.1, ...}, "argv": [...]},
      "device": ..., "versions": {...},        # the header
      "parity": {...}, "worker_transfer": {...}, ...   # one key per section, in run order
      "ok": true                               # only once finished
    }
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

Section = Callable[[], dict[str, Any]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` through a temporary sibling and a rename.

    Args:
        path: the target file.
        data: a JSON-serialisable object.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckReport:
    """The check's results so far, on disk after every change.

    Args:
        path: the JSON file (``None``: stdout lines only).
        header: what describes the run (device, versions), written at once.
        out: where the per-section lines go.

    Example::

        report = CheckReport(Path("gpu_check.json"), {"device": "cpu"})
        report.section("parity", lambda: {"ok": True})
        report.finish(ok=True)
    """

    def __init__(self, path: Path | None, header: dict[str, Any], out: TextIO = sys.stdout) -> None:
        self.path = path
        self._out = out
        self.data: dict[str, Any] = {
            "check": {
                "started": _now(),
                "updated": _now(),
                "finished": False,
                "running": None,
                "done": [],
                "failed": [],
                "seconds": {},
                "argv": sys.argv[1:],
            },
            **header,
        }
        self._save()

    @property
    def failed(self) -> list[str]:
        """Sections that raised."""
        return list(self.data["check"]["failed"])

    def section(self, name: str, run: Section) -> dict[str, Any]:
        """Run one section, keep its result (or its error), save, print its line.

        Args:
            name: the section's key in the report.
            run: returns the section's result.

        Returns:
            The result recorded (``{"error": ..., "traceback": [...]}`` if ``run`` raised).
        """
        check = self.data["check"]
        check["running"] = name
        self._save()  # a run killed inside the section still says where it died
        start = time.perf_counter()
        try:
            result = run()
        except Exception as exc:
            result = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc().splitlines()[-15:],
            }
            check["failed"].append(name)
        seconds = round(time.perf_counter() - start, 3)
        self.data[name] = result
        check["seconds"][name] = seconds
        check["done"].append(name)
        check["running"] = None
        self._save()
        self._print({"section": name, "seconds": seconds, "result": result})
        return result

    def finish(self, ok: bool) -> None:
        """Mark the run finished with its verdict, save, and print the whole object."""
        self.data["ok"] = ok
        self.data["check"]["finished"] = True
        self._save()
        self._print(self.data)

    def _save(self) -> None:
        self.data["check"]["updated"] = _now()
        if self.path is not None:
            write_json_atomically(self.path, self.data)

    def _print(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj) + "\n")
        self._out.flush()
