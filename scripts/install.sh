#!/usr/bin/env bash
# Build .venv with everything streamrank needs. Idempotent: a stamp file records the hash of
# the inputs, so a second run with nothing changed returns at once.
#
# Why not a plain `pip install -e .`: torchrec's wheel depends on the CUDA `fbgemm-gpu`, whose
# import name `fbgemm_gpu` clashes with `fbgemm-gpu-cpu`. pyproject.toml therefore lists
# fbgemm-gpu-cpu and torchrec's real dependencies, and torchrec itself is installed here with
# --no-deps.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

TORCHREC_VERSION=1.8.0
VENV="${STREAMRANK_VENV:-$REPO_ROOT/.venv}"
STAMP="$VENV/.streamrank-installed"

find_python() {
    for candidate in "${PYTHON:-}" python3.11 python3; do
        [[ -n "$candidate" ]] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "$candidate"
            return 0
        fi
    done
    echo "install: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

inputs_hash="$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$inputs_hash" ]]; then
    echo "install: $VENV is up to date"
    exit 0
fi

PY="$(find_python)"
echo "install: building $VENV with $PY ($("$PY" --version))"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# Everything except torchrec (torch 2.13.0, fbgemm-gpu-cpu 1.8.0, torchrec's real deps, ours).
"${PIP[@]}" install -q -e ".[dev]"
"${PIP[@]}" install -q --no-deps "torchrec==$TORCHREC_VERSION"
# A CUDA fbgemm-gpu next to fbgemm-gpu-cpu breaks `import torchrec`; refuse to go on with one.
if "${PIP[@]}" show fbgemm-gpu >/dev/null 2>&1; then
    echo "install: the CUDA fbgemm-gpu got installed; removing it" >&2
    "${PIP[@]}" uninstall -q -y fbgemm-gpu
    "${PIP[@]}" install -q --force-reinstall --no-deps fbgemm-gpu-cpu==1.8.0
fi
"$VENV/bin/python" -c 'import torch, torchrec, fbgemm_gpu, confluent_kafka, fastavro, redis; print("install: torch", torch.__version__, "torchrec", torchrec.__version__)'
echo "$inputs_hash" >"$STAMP"
