"""``streamrank bench model``: bare forward rows/s of the configured model (the built-in one,
or ``[model.module]``'s on batches of its own input: :mod:`pipeline.tools.bench.workload`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from model.serving import Scorer
from pipeline.tools.bench.common import time_forward_rows
from pipeline.tools.bench.workload import Workload


@dataclass
class ModelBench:
    """Bare forward throughput.

    Attributes:
        batch_rows: rows of the first batch (all hold whole events, at most the batch size).
        rows_per_s: over ``distinct_batches`` different batches scored in turn, as a stream
            presents them (different ids each time: the embedding rows are not cache-hot).
        same_batch_rows_per_s: one batch scored again and again (cache-hot best case).
        distinct_batches: how many different batches ``rows_per_s`` cycles through.
    """

    batch_rows: int
    rows_per_s: float
    same_batch_rows_per_s: float
    distinct_batches: int

    def as_dict(self) -> dict[str, Any]:
        """The numbers, rounded, for JSON output."""
        return {
            "batch_rows": self.batch_rows,
            "rows_per_s": round(self.rows_per_s, 1),
            "same_batch_rows_per_s": round(self.same_batch_rows_per_s, 1),
            "distinct_batches": self.distinct_batches,
        }


def bench_model(
    scorer: Scorer,
    load: Workload,
    batch_rows: int,
    seconds: float,
    distinct_batches: int = 16,
) -> ModelBench:
    """Bare forward throughput at (about) ``batch_rows`` rows per batch.

    Times :meth:`Scorer.forward` alone on ``distinct_batches`` prepared batches in turn
    (``seconds``), then on the first one repeated (``seconds``).

    Args:
        scorer: the model under test.
        load: where the batches come from (the synthetic world, or a configured model's
            synthesized events and Redis records).
        batch_rows: rows per batch (whole events, at most this many).
        seconds: measuring time of each of the two timings.
        distinct_batches: batches prepared for the first timing.

    Returns:
        The :class:`ModelBench` numbers.

    Example::

        bench_model(scorer, WorldWorkload(build_world(settings)), 4096, 5.0).as_dict()
    """
    model = scorer.spec if scorer.builtin else scorer.layout
    inputs = [b.model_input for b in load.batches(model, batch_rows, distinct_batches)]
    distinct = time_forward_rows(scorer, inputs, seconds)
    same = time_forward_rows(scorer, inputs[:1], seconds)
    return ModelBench(inputs[0].num_rows, distinct, same, distinct_batches)


def describe_device(device: torch.device) -> dict[str, Any]:
    """Where the forward ran, for the report (and for ``streamrank plan-capacity``, which takes
    GPU figures only from a report that ran on a GPU).

    Returns:
        ``device`` (``cpu``, ``cuda:0``...), ``device_name`` (the GPU's name, or ``None``) and
        ``torch_threads``.
    """
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"device": str(device), "device_name": name, "torch_threads": torch.get_num_threads()}
