"""A capacity plan from the benchmarks' JSON: host cores, GPUs, ranks, ingest workers and
partitions for a target event rate (``streamrank plan-capacity``; docs/capacity.md).

Every input figure comes from one benchmark report, recognised by its keys, and the plan names
the file and the command that makes such a report. A figure no report gives is "not measured"
and everything that depends on it is too: the plan never guesses (in particular GPU rows/s
come only from a ``bench model`` report that ran on a GPU).

The arithmetic (R = events/s x candidates per event, u = the utilisation planned for):

- **GPUs** = ceil(R / (GPU forward rows/s x u)), one rank each;
- **host cores** = events/s x (non-model CPU per event + the rank's CPU per event) / u, the
  first from ``bench overhead`` (the ingest workers' cores), the second from ``bench ingest``
  on a GPU (CPU per event of the rank process that scores for its ingest workers; on a CPU
  that is the forward itself, so a CPU report does not count);
- **ingest workers** = ceil(events/s x non-model CPU per event / u): each one a process with
  one loop, about one core; **per GPU** = ceil(workers / GPUs);
- **partitions** >= workers, a multiple of the GPUs (each worker, a consumer-group member,
  owns at least one, and each GPU's workers the same number);
- **u** = the largest load fraction at which ``bench latency`` measured p99 within the target
  (on the device of that report), else the ``utilisation`` given (a planning choice, reported
  as such).

Each report names the model it measured (``model``: the built-in one or ``[model.module]``'s
factory, its version or ``untrained``); the plan says whose figures it plans from, and refuses
reports of different models (a plan from one model's forward and another's host work would be
nobody's).

Example::

    plan = capacity_plan([json.loads(Path("overhead.json").read_text())], CapacityTarget())
    print(render(plan))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CapacityTarget", "Figure", "Plan", "capacity_plan", "render"]

NOT_MEASURED = "not measured"

COMMANDS = {
    "overhead": "streamrank bench overhead --json > overhead.json",
    "model": "streamrank bench model --json > model-h200.json  (on the GPU: model.device=cuda)",
    "latency": "streamrank bench latency --json > latency.json",
    "ingest": "streamrank bench ingest --json > ingest.json",
}
"""The command that produces each kind of report."""


@dataclass(frozen=True)
class CapacityTarget:
    """What to plan for.

    Attributes:
        events_per_s: the peak event rate.
        candidates_per_event: mean candidates (rows) per event.
        p99_ms: the end-to-end p99 to hold.
        utilisation: the fraction of measured capacity to plan for when no ``bench latency``
            report says at which load p99 held (a choice, printed as one).
    """

    events_per_s: float = 120_000.0
    candidates_per_event: float = 60.0
    p99_ms: float = 100.0
    utilisation: float = 0.5

    def __post_init__(self) -> None:
        if min(self.events_per_s, self.candidates_per_event, self.p99_ms) <= 0:
            raise ValueError("the event rate, candidates per event and p99 must be positive")
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"utilisation is a fraction in (0, 1], got {self.utilisation}")


@dataclass(frozen=True)
class Figure:
    """One line of the plan: a value (``None``: not measured), how it was computed, and where
    its inputs came from."""

    name: str
    value: float | None
    unit: str
    how: str
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``value`` ``None`` where not measured)."""
        return {
            "value": self.value,
            "unit": self.unit,
            "how": self.how,
            "source": self.source,
        }


@dataclass
class Plan:
    """The plan: its target, the model its reports measured (report name -> ``model`` entry),
    its input figures and what follows from them."""

    target: CapacityTarget
    inputs: list[Figure] = field(default_factory=list)
    results: list[Figure] = field(default_factory=list)
    models: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """The value of the input or result ``name``."""
        return next(f.value for f in [*self.inputs, *self.results] if f.name == name)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "target": vars(self.target),
            "models": self.models,
            "inputs": {f.name: f.as_dict() for f in self.inputs},
            "plan": {f.name: f.as_dict() for f in self.results},
        }


def report_kind(report: dict[str, Any]) -> str | None:
    """Which benchmark wrote ``report`` (``overhead``, ``model``, ``latency``, ``ingest``), by
    its keys; ``None``: none of these."""
    if "non_model_cpu_us_per_event" in report:
        return "overhead"
    if "capacity_events_per_s" in report and "loads" in report:
        return "latency"
    if "same_batch_rows_per_s" in report or "replay_rows_per_s" in report:
        return "model"
    if "transport" in report and "median" in report:
        return "ingest"
    return None


def model_of(report: dict[str, Any]) -> dict[str, Any] | None:
    """The ``model`` entry of a report (``bench latency`` and ``pipeline`` also keep it under
    ``pipeline``); ``None`` when the report is older than that entry."""
    found = report.get("model") or report.get("pipeline", {}).get("model")
    return found if isinstance(found, dict) else None


def _check_one_model(models: dict[str, dict[str, Any] | None]) -> None:
    """Refuse reports of different models (by factory: an untrained stand-in of the same
    module, as ``bench overhead`` serves, is the same model's host work)."""
    factories = {name: m.get("factory") for name, m in models.items() if m is not None}
    if len(set(factories.values())) > 1:
        listed = ", ".join(f"{name}: {factory}" for name, factory in factories.items())
        raise ValueError(
            f"the reports measured different models ({listed}): plan from one model's reports"
        )


def _model_line(models: dict[str, dict[str, Any] | None]) -> str:
    """Whose figures: the factory and each report's version (``untrained`` where it was)."""
    known = {name: m for name, m in models.items() if m is not None}
    if not known:
        return "model: not recorded in the reports"
    factory = next(iter(known.values())).get("factory")
    versions = ", ".join(f"{name} {m.get('model_version')}" for name, m in known.items())
    unknown = [name for name, m in models.items() if m is None]
    missing = f"; not recorded in {', '.join(unknown)}" if unknown else ""
    return f"model: {factory} ({versions}{missing})"


def _source(name: str, kind: str) -> str:
    return f"{name} ({COMMANDS[kind]})"


def _gpu_report(
    found: tuple[str, dict[str, Any]] | None, figure: str, unit: str, kind: str
) -> tuple[str, dict[str, Any]] | Figure:
    """The report of ``kind`` when it ran on a GPU, else the "not measured" figure saying why."""
    if found is None:
        return Figure(figure, None, unit, f"{NOT_MEASURED}: no bench {kind} report")
    name, report = found
    device = str(report.get("device", ""))
    if not device.startswith("cuda"):
        why = f"{NOT_MEASURED} on a GPU: {name} ran on {device or 'an unnamed device'}"
        return Figure(figure, None, unit, why, _source(name, kind))
    return found


def _gpu_rows(reports: dict[str, tuple[str, dict[str, Any]]]) -> Figure:
    found = _gpu_report(reports.get("model"), "gpu_rows_per_s", "rows/s", "model")
    if isinstance(found, Figure):
        return found
    name, report = found
    rows = float(report.get("rows_per_s") or report["replay_rows_per_s"])
    gpu = report.get("device_name") or report["device"]
    how = f"bench model's forward rows/s on {gpu} at {report.get('batch_rows', '?')} rows"
    return Figure("gpu_rows_per_s", rows, "rows/s", how, _source(name, "model"))


def _host_us(reports: dict[str, tuple[str, dict[str, Any]]]) -> list[Figure]:
    figures = []
    found = reports.get("overhead")
    if found is None:
        figures.append(
            Figure("host_us_per_event", None, "us", f"{NOT_MEASURED}: no bench overhead report")
        )
    else:
        name, report = found
        value = float(report["non_model_cpu_us_per_event"])
        how = "bench overhead: the pipeline's CPU per event outside the forward (all threads)"
        figures.append(Figure("host_us_per_event", value, "us", how, _source(name, "overhead")))
    figures.append(_rank_us(reports.get("ingest")))
    return figures


def _rank_us(found: tuple[str, dict[str, Any]] | None) -> Figure:
    """The rank's CPU per event serving its ingest workers: a GPU rank's only (on a CPU the
    rank's CPU is the forward itself)."""
    gpu = _gpu_report(found, "rank_us_per_event", "us", "ingest")
    if isinstance(gpu, Figure):
        return gpu
    name, report = gpu
    with_workers = {int(k): v for k, v in report["median"].items() if int(k) > 0}
    if not with_workers:
        why = f"{NOT_MEASURED}: {name} has no run with ingest workers"
        return Figure("rank_us_per_event", None, "us", why, _source(name, "ingest"))
    most = max(with_workers)
    return Figure(
        "rank_us_per_event",
        float(with_workers[most]["rank_cpu_us_per_event"]),
        "us",
        f"bench ingest: CPU per event of the rank process serving {most} ingest workers",
        _source(name, "ingest"),
    )


def _utilisation(reports: dict[str, tuple[str, dict[str, Any]]], target: CapacityTarget) -> Figure:
    found = reports.get("latency")
    if found is not None:
        name, report = found
        held = [
            float(load["load"])
            for load in report["loads"]
            if load["latency_ms"].get("p99") is not None
            and load["latency_ms"]["p99"] <= target.p99_ms
        ]
        device = report.get("pipeline", {}).get("device", "an unnamed device")
        if held:
            how = (
                f"bench latency: the largest load fraction with p99 <= {target.p99_ms:g} ms "
                f"(measured on {device})"
            )
            return Figure("utilisation", max(held), "", how, _source(name, "latency"))
        how = (
            f"bench latency held p99 <= {target.p99_ms:g} ms at no load measured (on "
            f"{device}): the planned {target.utilisation:g} is a choice"
        )
        return Figure("utilisation", target.utilisation, "", how, _source(name, "latency"))
    how = "a choice (--utilisation): no bench latency report says at which load p99 held"
    return Figure("utilisation", target.utilisation, "", how)


def _times(*values: float | None) -> float | None:
    return None if any(v is None for v in values) else math.prod(v for v in values if v is not None)


def capacity_plan(named_reports: list[tuple[str, dict[str, Any]]], target: CapacityTarget) -> Plan:
    """The plan for ``target`` from benchmark reports (see the module docstring).

    Args:
        named_reports: ``(file name, parsed JSON)`` of each report; the last of each kind counts.
        target: what to plan for.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: a report no benchmark here writes, or reports of different models.
    """
    reports: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, report in named_reports:
        kind = report_kind(report)
        if kind is None:
            raise ValueError(
                f"{name} is not a report of bench overhead, model, latency or ingest (--json)"
            )
        reports[kind] = (name, report)
    plan = Plan(target, models={name: model_of(report) for name, report in reports.values()})
    _check_one_model(plan.models)
    gpu_rows = _gpu_rows(reports)
    host_us, rank_us = _host_us(reports)
    util = _utilisation(reports, target)
    plan.inputs = [gpu_rows, host_us, rank_us, util]
    u = util.value or target.utilisation
    rows = target.events_per_s * target.candidates_per_event
    plan.results.append(
        Figure(
            "rows_per_s",
            rows,
            "rows/s",
            f"{target.events_per_s:,.0f} events/s x {target.candidates_per_event:g} candidates",
        )
    )
    gpus = None if gpu_rows.value is None else math.ceil(rows / (gpu_rows.value * u))
    plan.results.append(Figure("gpus", gpus, "", "ceil(rows_per_s / (gpu_rows_per_s x u))"))
    plan.results.append(Figure("ranks", gpus, "", "one rank per GPU"))
    worker_cores = _times(target.events_per_s, host_us.value, 1e-6 / u)
    workers = None if worker_cores is None else math.ceil(worker_cores)
    plan.results.append(
        Figure("ingest_workers", workers, "", "ceil(events/s x host_us_per_event x 1e-6 / u)")
    )
    per_gpu = None if workers is None or gpus is None else math.ceil(workers / gpus)
    plan.results.append(
        Figure("ingest_workers_per_gpu", per_gpu, "", "ceil(ingest_workers / gpus)")
    )
    partitions = None if per_gpu is None or gpus is None else per_gpu * gpus
    plan.results.append(
        Figure(
            "partitions",
            partitions,
            "",
            "at least ingest_workers_per_gpu x gpus (one or more per consumer, equal per GPU)",
        )
    )
    plan.results.append(
        Figure(
            "worker_cores",
            None if worker_cores is None else round(worker_cores, 1),
            "cores",
            "events/s x host_us_per_event x 1e-6 / u",
        )
    )
    rank_cores = _times(target.events_per_s, rank_us.value, 1e-6 / u)
    cores = None if worker_cores is None or rank_cores is None else worker_cores + rank_cores
    plan.results.append(
        Figure(
            "host_cores",
            None if cores is None else round(cores, 1),
            "cores",
            "worker_cores + events/s x rank_us_per_event x 1e-6 / u",
        )
    )
    return plan


def _shown(figure: Figure) -> str:
    if figure.value is None:
        return NOT_MEASURED
    value = figure.value
    text = f"{value:,.0f}" if value >= 100 or float(value).is_integer() else f"{value:.3g}"
    return f"{text} {figure.unit}".rstrip()


def render(plan: Plan) -> str:
    """The plan as text: the target, each input with its source, each result with its formula."""
    t = plan.target
    lines = [
        f"capacity plan for {t.events_per_s:,.0f} events/s x {t.candidates_per_event:g} "
        f"candidates, p99 under {t.p99_ms:g} ms",
        _model_line(plan.models),
        "inputs:",
    ]
    for figure in plan.inputs:
        source = f"  [{figure.source}]" if figure.source else ""
        lines.append(f"  {figure.name} = {_shown(figure)}: {figure.how}{source}")
    lines.append("plan (u = utilisation):")
    for figure in plan.results:
        lines.append(f"  {figure.name} = {figure.how} = {_shown(figure)}")
    return "\n".join(lines)
