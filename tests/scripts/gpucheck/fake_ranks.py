"""Rank children for test_nccl, in a module that imports nothing heavy (each spawned child
imports it afresh): they stand in for NCCL ranks, which need GPUs."""

from __future__ import annotations

import os
import time
from typing import Any

LONG = 3600.0  # longer than any test may take: only the poll can end a wait on these


def report(rank: int, results: Any) -> None:
    results.put({"rank": rank, "max_abs_diff": 0.0})


def first_crashes(rank: int, results: Any) -> None:
    if rank == 0:
        os._exit(3)  # e.g. a CUDA fault: no result, no exception
    time.sleep(LONG)  # the peer, waiting in a collective


def second_fails(rank: int, results: Any) -> None:
    if rank == 1:
        results.put({"rank": 1, "error": "RuntimeError: NCCL error"})
        return
    time.sleep(LONG)


def both_hang(rank: int, results: Any) -> None:
    time.sleep(LONG)
