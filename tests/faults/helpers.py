"""Helpers of the fault suite: start/stop the pipeline CLI around a fault, read the DLQ, and
print what a test measured (``pytest -s``) for RELIABILITY.md."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message

from model.synthetic import SyntheticWorld
from pipeline.config import Settings
from tests.integration.conftest import WORLD, model_settings, seed_features, wait_for_outputs

Cli = Callable[..., subprocess.Popen]


def report(
    scenario: str, sent: set[str], recs: list[dict[str, Any]], recover_s: float, mode: str
) -> tuple[int, int]:
    """Print ``RELIABILITY scenario events missing duplicates recover_s mode``.

    Returns:
        (missing, duplicates): valid events with no recommendation, and extra recommendations.
    """
    counts = Counter(r["event_id"] for r in recs)
    missing = len(sent - set(counts))
    duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\nRELIABILITY scenario={scenario} events={len(sent)} missing={missing} "
        f"duplicates={duplicates} recover_s={recover_s:.1f} mode={mode}"
    )
    return missing, duplicates


def dead_letters(consumer: Consumer, expected: int, timeout_s: float = 60) -> list[Message]:
    """Records of the DLQ ``consumer`` reads, until ``expected`` arrived or ``timeout_s``."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        out += [m for m in consumer.consume(100, 0.5) if m.error() is None]
    return out


def seeded_settings(
    settings_factory: Callable[..., Settings],
    checkpoint: Path,
    world: SyntheticWorld,
    **sections: Any,
) -> Settings:
    """Fresh topics and the test model, with ``sections`` overridden and features seeded."""
    settings = settings_factory(model=model_settings(checkpoint), synthetic=WORLD, **sections)
    seed_features(settings, world)
    return settings


def signal_mid_stream(
    cli: Cli, settings: Settings, log: Path, env: dict[str, str], sig: signal.Signals
) -> float:
    """Start ``run``, send ``sig`` once 300 recommendations are out, wait for the exit.

    Returns:
        Seconds from the signal to the exit.
    """
    proc = cli(settings, "run", extra_env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    seen = wait_for_outputs(settings, at_least=300)
    sent_at = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(30)
    exit_s = time.monotonic() - sent_at
    if sig is not signal.SIGKILL:
        assert code == 0, log.read_text()[-3000:]
    assert seen < 6000, f"{sig.name} came too late ({seen} produced)"
    return exit_s


def run_until_idle(cli: Cli, settings: Settings, log: Path, env: dict[str, str]) -> float:
    """Run the pipeline until 4 s without input (it must exit 0). Returns its seconds."""
    started = time.monotonic()
    proc = cli(
        settings,
        "run",
        "--exit-when-idle",
        "4",
        extra_env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    assert proc.wait(300) == 0, log.read_text()[-3000:]
    return time.monotonic() - started
