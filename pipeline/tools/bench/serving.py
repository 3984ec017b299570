"""``streamrank bench quantize``, ``compile`` and ``precision``: serving options vs fp32 eager."""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np

from model.features.build import build_model_input
from model.features.model_input import ModelInput
from model.options import Precision
from model.ranker import Ranker
from model.serving import Scorer
from model.serving.compile import maybe_compile
from model.serving.quantize import compare_quantized, quantize_ranker
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import batch_of_rows, plain_scorer, time_forward_rows
from pipeline.tools.synthetic_io import build_world


def _baseline(settings: Settings, batch_rows: int) -> tuple[Scorer, ModelInput]:
    """The fp32 eager scorer and one batch of about ``batch_rows`` rows from the world."""
    scorer = plain_scorer(settings)
    cols = batch_of_rows(build_world(settings), scorer.spec, batch_rows)
    return scorer, build_model_input(cols, scorer.spec)


def bench_quantization(
    settings: Settings, batch_rows: int, seconds: float, dtypes: tuple[str, ...] = ("fp16", "int8")
) -> list[dict[str, Any]]:
    """Embedding bytes, max |score change| and forward rows/s of quantized tables vs fp32.

    The fp32 model and each quantized copy are timed in alternation on the same batch.

    Args:
        settings: the model (its fp32 eager form is the baseline).
        batch_rows: rows of the timed batch.
        seconds: timing per model and dtype.
        dtypes: embedding storage types to compare.

    Returns:
        One dict per dtype: bytes, bytes ratio, max score change, both rows/s.

    Example::

        bench_quantization(settings, 1024, 3.0)[0]["bytes_ratio"]
    """
    scorer, inp = _baseline(settings, batch_rows)
    ranker = scorer.module
    assert isinstance(ranker, Ranker)
    rows = []
    for dtype in dtypes:
        quantized = quantize_ranker(ranker, dtype)
        report = compare_quantized(ranker, quantized, inp, dtype)
        q_scorer = Scorer(quantized, scorer.spec, scorer.model_version, scorer.device)
        fp32_per_s = time_forward_rows(scorer, [inp], seconds)
        q_per_s = time_forward_rows(q_scorer, [inp], seconds)
        rows.append(
            {
                "dtype": dtype,
                "batch_rows": inp.num_rows,
                "fp32_bytes": report.fp32_bytes,
                "bytes": report.quant_bytes,
                "bytes_ratio": round(report.ratio, 3),
                "max_abs_score_diff": report.max_abs_score_diff,
                "fp32_rows_per_s": round(fp32_per_s, 1),
                "rows_per_s": round(q_per_s, 1),
            }
        )
    return rows


def bench_compile(
    settings: Settings, batch_rows: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Forward rows/s with and without ``torch.compile``, interleaved; compile time apart.

    Args:
        settings: the model (its fp32 eager form is the baseline).
        batch_rows: rows of the timed batch.
        seconds: timing per round and variant.
        rounds: interleaved rounds.

    Returns:
        First compile time, rows/s of both per round, their ratios and the max score change.

    Example::

        bench_compile(settings, 4096, 3.0, 3)["compiled_over_eager_median"]
    """
    eager, inp = _baseline(settings, batch_rows)
    compiled_module = maybe_compile(copy.deepcopy(eager.module), True)
    compiled = Scorer(compiled_module, eager.spec, eager.model_version, eager.device)
    start = time.perf_counter()
    compiled_probs = compiled.forward(inp)
    compile_s = time.perf_counter() - start
    max_diff = float((compiled_probs - eager.forward(inp)).abs().max())
    eager_rates, compiled_rates = [], []
    for _ in range(rounds):
        eager_rates.append(time_forward_rows(eager, [inp], seconds))
        compiled_rates.append(time_forward_rows(compiled, [inp], seconds))
    ratios = [c / e for c, e in zip(compiled_rates, eager_rates, strict=True)]
    return {
        "batch_rows": inp.num_rows,
        "first_compile_s": round(compile_s, 1),
        "eager_rows_per_s": [round(r, 1) for r in eager_rates],
        "compiled_rows_per_s": [round(r, 1) for r in compiled_rates],
        "compiled_over_eager": [round(r, 3) for r in ratios],
        "compiled_over_eager_median": round(float(np.median(ratios)), 3),
        "max_abs_score_diff": max_diff,
    }


def bench_precision(
    settings: Settings,
    batch_rows: int,
    seconds: float,
    rounds: int,
    compile_too: bool = False,
) -> dict[str, Any]:
    """Forward rows/s of every ``model.precision`` (and, with ``compile_too``, each compiled
    with ``model.compile_mode``), interleaved, with the largest score change against fp32.

    Args:
        settings: the model (its fp32 eager form is the reference).
        batch_rows: rows of the timed batch.
        seconds: timing per round and variant.
        rounds: interleaved rounds.
        compile_too: also time each precision compiled (compile times reported apart).

    Returns:
        Per variant (``fp32``, ``bf16+compile``...): rows/s per round and median, max score
        change vs fp32 eager, and compile seconds for compiled ones.

    Example::

        bench_precision(settings, 4096, 3.0, 3)["variants"]["bf16"]["max_abs_score_diff"]
    """
    reference, inp = _baseline(settings, batch_rows)
    expected = reference.forward(inp)
    variants: dict[str, Scorer] = {}
    compile_s: dict[str, float] = {}
    for precision in Precision:
        for compiled in (False, True) if compile_too else (False,):
            module = reference.module
            if compiled:
                module = maybe_compile(
                    copy.deepcopy(module), True, mode=settings.model.compile_mode
                )
            name = f"{precision.value}+compile" if compiled else precision.value
            variants[name] = Scorer(module, reference.spec, "bench", reference.device, precision)
            start = time.perf_counter()
            variants[name].forward(inp)  # compiles a compiled one
            compile_s[name] = time.perf_counter() - start
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, scorer in variants.items():
            rates[name].append(time_forward_rows(scorer, [inp], seconds))
    out: dict[str, dict[str, Any]] = {}
    for name, scorer in variants.items():
        diff = float((scorer.forward(inp) - expected).abs().max())
        out[name] = {
            "rows_per_s": [round(r, 1) for r in rates[name]],
            "rows_per_s_median": round(float(np.median(rates[name])), 1),
            "max_abs_score_diff": diff,
        }
        if name.endswith("+compile"):
            out[name]["compile_s"] = round(compile_s[name], 1)
    return {"batch_rows": inp.num_rows, "device": str(reference.device), "variants": out}
