"""The OpenMP default of the command line: short spins unless the user chose how threads wait,
set before anything imports torch (libgomp reads it once, at load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli.openmp import SPIN_COUNT, openmp_defaults

REPO = Path(__file__).resolve().parents[3]


def test_an_unset_environment_gets_short_spins() -> None:
    environ: dict[str, str] = {}
    openmp_defaults(environ)
    assert environ == {"GOMP_SPINCOUNT": SPIN_COUNT}


@pytest.mark.parametrize(
    "user",
    [{"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}],
)
def test_a_users_choice_wins(user: dict[str, str]) -> None:
    environ = dict(user)
    openmp_defaults(environ)
    assert environ == user


def _import_cli(env: dict[str, str]) -> dict[str, object]:
    """Import the command line in a fresh interpreter: the OpenMP environment it leaves and
    whether torch was imported by then."""
    code = (
        "import json, os, sys\n"
        "import pipeline.cli\n"
        "print(json.dumps({'torch': 'torch' in sys.modules,"
        " 'spin': os.environ.get('GOMP_SPINCOUNT')}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **extra}


def test_the_command_line_sets_it_before_torch_is_loaded() -> None:
    assert _import_cli(_environment()) == {"torch": False, "spin": SPIN_COUNT}


def test_the_command_line_leaves_a_wait_policy_alone() -> None:
    assert _import_cli(_environment(OMP_WAIT_POLICY="PASSIVE")) == {"torch": False, "spin": None}
