"""Tests for pipeline.cli.errors: which exceptions are user errors (one line, exit code 2)."""

from __future__ import annotations

import pytest
import torch

from model.serving.device import rank_device
from pipeline.cli.errors import USER_ERROR_EXIT_CODE, as_user_error


def test_a_rank_started_for_a_missing_gpu_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # --nproc 3 on a host with 2 GPUs: the third rank stops with one line, not a traceback.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError) as raised:
        rank_device(2)
    user_error = as_user_error(raised.value)
    assert user_error is not None and user_error.exit_code == USER_ERROR_EXIT_CODE
    assert str(user_error) == str(raised.value)
    assert "at most 2 rank(s) per host" in str(user_error)


def test_other_failures_keep_their_traceback() -> None:
    assert as_user_error(ValueError("a bug")) is None
    assert as_user_error(RuntimeError("CUDA error: out of memory")) is None
