#!/usr/bin/env bash
# Build .venv with everything streamrank needs. Idempotent: a stamp file records the hash of
# the inputs (and the accelerator), so a second run with nothing changed returns at once.
#
# Usage: scripts/install.sh [--dry-run]
#   --dry-run   print what would be installed (one line per step) and change nothing.
#
# Accelerator (STREAMRANK_ACCEL):
#   auto (default)  cuda when an NVIDIA GPU answers `nvidia-smi -L`, else cpu
#   cpu             fbgemm-gpu-cpu (FBGEMM's CPU kernels)
#   cuda            fbgemm-gpu, the CUDA build that pairs with the pinned torch (whose PyPI wheel
#                   already carries CUDA)
# The two FBGEMM packages share the import name `fbgemm_gpu`, so exactly one is ever installed:
# switching removes the other.
#
# Why not a plain `pip install -e .`: torchrec's wheel depends on the CUDA `fbgemm-gpu`, which
# would clash with fbgemm-gpu-cpu. pyproject.toml lists torchrec's real dependencies and the
# FBGEMM builds as extras (`cpu`, `cuda`); torchrec itself is installed here with --no-deps.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

TORCHREC_VERSION=1.8.0
FBGEMM_VERSION=1.8.0
VENV="${STREAMRANK_VENV:-$REPO_ROOT/.venv}"
STAMP="$VENV/.streamrank-installed"

die() { echo "install: $*" >&2; exit 2; }

dry_run=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        *) die "unknown argument '$arg' (usage: scripts/install.sh [--dry-run])" ;;
    esac
done

detect_accel() {
    case "${STREAMRANK_ACCEL:-auto}" in
        cpu | cuda) echo "$STREAMRANK_ACCEL" ;;
        auto)
            if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
                echo cuda
            else
                echo cpu
            fi
            ;;
        *) return 1 ;;
    esac
}
ACCEL="$(detect_accel)" || die "STREAMRANK_ACCEL must be auto, cpu or cuda, not '${STREAMRANK_ACCEL}'"
if [[ "$ACCEL" == cuda ]]; then
    FBGEMM=fbgemm-gpu OTHER_FBGEMM=fbgemm-gpu-cpu
else
    FBGEMM=fbgemm-gpu-cpu OTHER_FBGEMM=fbgemm-gpu
fi

find_python() {
    for candidate in "${PYTHON:-}" python3.11 python3; do
        [[ -n "$candidate" ]] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if ((dry_run)); then
    echo "accelerator: $ACCEL (STREAMRANK_ACCEL=${STREAMRANK_ACCEL:-auto})"
    echo "venv: $VENV"
    echo "pip install -e .[dev,$ACCEL]  # torch, $FBGEMM==$FBGEMM_VERSION, torchrec's deps, ours"
    echo "pip install --no-deps torchrec==$TORCHREC_VERSION"
    echo "pip uninstall $OTHER_FBGEMM  # only if present"
    exit 0
fi

inputs_hash="$( (cat pyproject.toml scripts/install.sh; echo "$ACCEL") | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$inputs_hash" ]]; then
    echo "install: $VENV is up to date ($ACCEL)"
    exit 0
fi

PY="$(find_python)" || die "Python 3.11 is required (set PYTHON=/path/to/python3.11)"
echo "install: building $VENV for $ACCEL with $PY ($("$PY" --version))"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# A switch of accelerator: the other FBGEMM build must go first (same import name).
if "${PIP[@]}" show "$OTHER_FBGEMM" >/dev/null 2>&1; then
    echo "install: removing $OTHER_FBGEMM (switching to $ACCEL)"
    "${PIP[@]}" uninstall -q -y "$OTHER_FBGEMM"
fi
"${PIP[@]}" install -q -e ".[dev,$ACCEL]"
"${PIP[@]}" install -q --no-deps "torchrec==$TORCHREC_VERSION"
if "${PIP[@]}" show "$OTHER_FBGEMM" >/dev/null 2>&1; then
    die "$OTHER_FBGEMM got installed next to $FBGEMM; remove $VENV and run again"
fi
"$VENV/bin/python" -c 'import torch, torchrec, fbgemm_gpu, confluent_kafka, fastavro, redis; print("install: torch", torch.__version__, "torchrec", torchrec.__version__, "cuda available:", torch.cuda.is_available())'
echo "$inputs_hash" >"$STAMP"
