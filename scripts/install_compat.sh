#!/usr/bin/env bash
# Build .venv-compat: the versions of the offline GPU machine (torch 2.11, TorchRec 1.6.1,
# FBGEMM 1.6.0; CPU build of FBGEMM here), so the model code is tested on both TorchRec
# releases it must run on. Idempotent: a stamp records the inputs.
#
# Usage: scripts/install_compat.sh   (then: make test-compat)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${STREAMRANK_COMPAT_VENV:-$REPO_ROOT/.venv-compat}"
STAMP="$VENV/.streamrank-installed"
PINS=(torch==2.11.0 fbgemm-gpu-cpu==1.6.0 tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath)
TORCHREC=torchrec==1.6.1

inputs_hash="$( (cat scripts/install_compat.sh pyproject.toml) | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$inputs_hash" ]]; then
    echo "install_compat: $VENV is up to date"
    exit 0
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
echo "install_compat: building $VENV (${PINS[0]}, $TORCHREC)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# The project's other dependencies as pyproject lists them, without its torch/FBGEMM pins.
deps=$("$VENV/bin/python" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
skip = ("torch", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchmetrics", "tensordict", "tqdm", "pyre-extensions")
deps = project["dependencies"] + project["optional-dependencies"]["dev"]
print(" ".join(d for d in deps if not d.split("=")[0].split(">")[0].split("[")[0] in skip))
PY
)
# shellcheck disable=SC2086  # one word per requirement
"${PIP[@]}" install -q "${PINS[@]}" $deps
"${PIP[@]}" install -q --no-deps "$TORCHREC"
"$VENV/bin/python" -c 'import torch, torchrec, fbgemm_gpu; print("install_compat: torch", torch.__version__, "torchrec", torchrec.__version__)'
echo "$inputs_hash" >"$STAMP"
