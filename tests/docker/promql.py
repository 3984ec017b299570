"""The PromQL of docker/: every query of the Grafana dashboard and every alert expression.

The rule for checking an alert against a live pipeline: a healthy run must not fire it, so its
expression returns nothing; what must return series is each side of its top-level threshold
comparison (numeric literals aside), and for ``absent(X)`` the expression ``X``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO_ROOT / "docker"
DASHBOARD = DOCKER_DIR / "grafana" / "dashboards" / "streamrank.json"
ALERTS = DOCKER_DIR / "prometheus" / "alerts.yml"
SCRAPE_CONFIG = DOCKER_DIR / "prometheus" / "prometheus.yml"
GPU_ONLY_MARKER = "[gpu-only]"
"""In a panel's description: its series exist only on GPU ranks (no data on CPU is right)."""

_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
_NUMBER = re.compile(r"^\s*-?\d+(\.\d+)?([eE][-+]?\d+)?\s*$")
_METRIC = re.compile(r"\bstreamrank_[a-z_]+\b")


@dataclass(frozen=True)
class Query:
    """One expression and where it comes from."""

    source: str
    """``panel <title>`` or ``alert <name>``."""
    expr: str
    gpu_only: bool = False


def dashboard_queries(path: Path = DASHBOARD) -> list[Query]:
    """Every target ``expr`` of every panel (rows' nested panels included)."""
    out: list[Query] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            gpu = GPU_ONLY_MARKER in panel.get("description", "")
            for target in panel.get("targets", []):
                out.append(Query(f"panel {panel['title']}", target["expr"], gpu))

    walk(json.loads(path.read_text())["panels"])
    return out


def alert_queries(path: Path = ALERTS) -> list[Query]:
    """Every rule's ``expr`` (alerting and recording rules)."""
    rules = yaml.safe_load(path.read_text())
    return [
        Query(f"alert {rule.get('alert') or rule.get('record')}", str(rule["expr"]))
        for group in rules["groups"]
        for rule in group["rules"]
    ]


def _top_level_split(expr: str) -> list[str]:
    """Split at comparison operators outside brackets and strings."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            quote = "" if c == quote and expr[i - 1] != "\\" else quote
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            op = next((o for o in _COMPARISONS if expr.startswith(o, i)), None)
            if op is not None:
                parts.append(expr[start:i])
                i += len(op)
                if expr[i:].lstrip().startswith("bool"):
                    i = expr.index("bool", i) + len("bool")
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts]


def checked_parts(expr: str) -> list[str]:
    """What must return series on a healthy live pipeline (see the module docstring).

    Example::

        >>> checked_parts("sum(rate(a_total[5m])) / sum(rate(b_total[5m])) > 0.01")
        ['sum(rate(a_total[5m])) / sum(rate(b_total[5m]))']
        >>> checked_parts('absent(up{job="x"} == 1)')
        ['up{job="x"}']
    """
    expr = " ".join(expr.split())
    match = re.fullmatch(r"absent\((.*)\)", expr)
    if match:
        return checked_parts(match.group(1))
    return [p for p in _top_level_split(expr) if not _NUMBER.match(p)]


def metric_names(expr: str) -> set[str]:
    """``streamrank_*`` names in ``expr``, without histogram sample suffixes."""
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in _METRIC.findall(expr)}
