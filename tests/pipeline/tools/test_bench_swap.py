"""``streamrank bench swap``: its windows and audit without servers (the real command runs on
the stack, with tiny sizes, in tests/pipeline/cli/test_readme_commands.py)."""

from __future__ import annotations

import pytest

from pipeline.tools.bench.swap import NEW, OLD, InputRecord, OutputRecord, swap_windows
from tests.pipeline.tools.bench_cli import assert_one_line_user_error

T0 = 1_800_000_000_000


def _stream(
    versions: list[str], latency_ms: list[int], every_ms: int = 100
) -> tuple[dict[str, InputRecord], dict[str, list[OutputRecord]]]:
    """One event per ``every_ms`` on partition ``i % 2``; event i scored by ``versions[i]``."""
    inputs, outputs = {}, {}
    for i, (version, latency) in enumerate(zip(versions, latency_ms, strict=True)):
        t = T0 + i * every_ms
        inputs[f"e{i}"] = InputRecord(i % 2, i // 2, t)
        outputs[f"e{i}"] = [OutputRecord(t + latency, version)]
    return inputs, outputs


def test_windows_split_the_events_around_the_first_output_of_the_new_version() -> None:
    # 100 events 100 ms apart; promoted at event 40; the new version answers from event 60
    # (scored 500 ms later: events 55-64 waited for the swap, the others took 10 ms).
    versions = [OLD] * 60 + [NEW] * 40
    latency = [10] * 55 + [500] * 10 + [10] * 35
    inputs, outputs = _stream(versions, latency)
    result = swap_windows(inputs, outputs, T0 + 4000, window_s=1.0, since_ms=T0 + 1000)
    windows = result["windows"]
    assert result["events"] == 90  # the first 10 were the warm-up
    # swap: event times within 1 s of the first new output (event 60's, at 6.5 s): 55..75
    assert [windows[w]["events"] for w in ("before", "loading", "swap", "after")] == [
        30, 15, 21, 24
    ]  # fmt: skip
    assert windows["before"]["p99_ms"] == 10 and windows["after"]["max_ms"] == 10
    assert windows["swap"]["max_ms"] == 500 and windows["swap"]["p50_ms"] == 10
    assert windows["swap"]["p99_ms"] > 490
    assert result["first_new_ms"] == 2500
    assert result["missing"] == result["duplicates"] == 0
    assert result["switched_once"] and result["versions"] == [OLD, NEW]


def test_the_audit_sees_losses_repeats_and_a_partition_switching_back() -> None:
    versions = [OLD] * 10 + [NEW, NEW, OLD] + [NEW] * 7  # partition 0: 10 NEW, then 12 OLD
    inputs, outputs = _stream(versions, [5] * 20)
    del outputs["e3"]
    outputs["e4"].append(OutputRecord(T0 + 999, OLD))
    result = swap_windows(inputs, outputs, T0 + 500, window_s=0.2, since_ms=T0)
    assert result["missing"] == 1 and result["duplicates"] == 1
    assert not result["switched_once"]
    none = swap_windows(inputs, {e: [OutputRecord(1, OLD)] for e in inputs}, T0, 1.0, T0)
    assert none["first_new_ms"] is None and not none["switched_once"]


@pytest.mark.parametrize("args", [("--swap-at", "40"), ("--rate", "0")])
def test_bad_options_are_one_line_user_errors(args: tuple[str, ...]) -> None:
    assert_one_line_user_error("swap", *args)
