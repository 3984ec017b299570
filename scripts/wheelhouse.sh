#!/usr/bin/env bash
# Download the Python packages of the streamrank image (docker/Dockerfile) once into a wheelhouse
# on the host, for image builds that cannot reach PyPI themselves (scripts/compose_check.sh
# serves it to `docker build` over HTTP: PIP_NO_INDEX, PIP_FIND_LINKS, PIP_TRUSTED_HOST).
#
# Usage: scripts/wheelhouse.sh PYTHON_IMAGE [cpu|cuda]
#   Prints the wheelhouse directory (one line on stdout; everything else goes to stderr),
#   e.g. ~/.cache/streamrank/wheelhouse-cpu
#
# The download runs in a container of PYTHON_IMAGE, the image's base, with its `python`:
# dependencies carry environment markers (redis needs async-timeout below Python 3.11.3, which
# is Debian 12's 3.11.2), and pip evaluates them for the interpreter it runs on. The host's pip
# settings go along: PIP_INDEX_URL and the certificate bundle (PIP_CERT, else pip's
# global.cert), for a network that re-signs TLS.
#
# What it holds: the project's dependencies with the FBGEMM build of the extra (`.[cpu]` or
# `.[cuda]`, as the Dockerfile installs them), torchrec (installed with --no-deps, see
# scripts/install.sh), the build backend of `pip install -e .` (setuptools, wheel), and PyYAML
# (the compose check's audit reads the alert rules with it; it is not installed in the image).
# PyPI's torch for Linux x86_64 is the CUDA build: its nvidia-* wheels come along (2.8 GB of
# wheels for the cpu extra).
#
# Idempotent: a stamp (a hash of pyproject.toml, this script, the Dockerfile's TORCHREC_VERSION,
# the extra and PYTHON_IMAGE's id) marks a complete download; when it matches nothing is
# downloaded, and files already there are not downloaded again. Concurrent callers are
# serialised with flock.
#
# Environment:
#   STREAMRANK_CACHE_DIR  cache root (default: $HOME/.cache/streamrank)
#   DOCKER                the docker client (default: docker)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
DOCKER="${DOCKER:-docker}"
PYTHON_IMAGE="${1:?usage: wheelhouse.sh PYTHON_IMAGE [cpu|cuda]}"
ACCEL="${2:-cpu}"
case "$ACCEL" in cpu | cuda) ;; *) echo "usage: wheelhouse.sh PYTHON_IMAGE [cpu|cuda]" >&2; exit 2 ;; esac

TORCHREC_VERSION="$(sed -n 's/^ARG TORCHREC_VERSION=//p' "$REPO_ROOT/docker/Dockerfile")"
[[ -n "$TORCHREC_VERSION" ]] || { echo "wheelhouse: no TORCHREC_VERSION in docker/Dockerfile" >&2; exit 1; }
image_id="$("$DOCKER" image inspect --format '{{.Id}}' "$PYTHON_IMAGE")" ||
    { echo "wheelhouse: no image $PYTHON_IMAGE" >&2; exit 1; }

CACHE_ROOT="${STREAMRANK_CACHE_DIR:-$HOME/.cache/streamrank}"
WHEELS="$CACHE_ROOT/wheelhouse-$ACCEL"
STAMP="$WHEELS/.complete"
inputs_hash="$( (cat "$REPO_ROOT/pyproject.toml" "${BASH_SOURCE[0]}"
    echo "torchrec==$TORCHREC_VERSION $ACCEL $image_id") | sha256sum | cut -d' ' -f1)"

mkdir -p "$WHEELS"
exec 8>"$WHEELS/.lock"
flock 8

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$inputs_hash" ]]; then
    echo "$WHEELS"
    exit 0
fi

# The host's pip settings that the container's pip needs.
pip_config() { python3 -m pip config get "$1" 2>/dev/null || true; }
cert="${PIP_CERT:-$(pip_config global.cert)}"
index="${PIP_INDEX_URL:-$(pip_config global.index-url)}"
settings=(-e PIP_NO_CACHE_DIR=1 -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_PROGRESS_BAR=off)
[[ -n "$index" ]] && settings+=(-e "PIP_INDEX_URL=$index")
if [[ -n "$cert" && -f "$cert" ]]; then
    settings+=(-v "$(realpath "$cert"):/etc/streamrank-pip-cert.pem:ro"
        -e PIP_CERT=/etc/streamrank-pip-cert.pem)
fi

echo "wheelhouse: downloading the image's packages ($ACCEL, for $PYTHON_IMAGE) into $WHEELS ..." >&2
started=$SECONDS
rm -f "$STAMP"
# The requirements are pyproject.toml's dependencies and the extra (the project itself is not
# built here); pip runs from a throw-away venv (the base may have no pip of its own).
# shellcheck disable=SC2016  # expanded by the container's sh
"$DOCKER" run --rm --user "$(id -u):$(id -g)" -e HOME=/tmp "${settings[@]}" \
    -v "$WHEELS:/wheels" -v "$REPO_ROOT/pyproject.toml:/src/pyproject.toml:ro" \
    -e ACCEL="$ACCEL" -e TORCHREC="torchrec==$TORCHREC_VERSION" \
    "$PYTHON_IMAGE" sh -euc '
        python -m venv /tmp/pip
        python -c "import os, tomllib
project = tomllib.load(open(\"/src/pyproject.toml\", \"rb\"))[\"project\"]
extra = project[\"optional-dependencies\"][os.environ[\"ACCEL\"]]
print(\"\n\".join(project[\"dependencies\"] + extra))" >/tmp/requirements.txt
        /tmp/pip/bin/python -m pip download -q -d /wheels -r /tmp/requirements.txt \
            "setuptools>=77" wheel pyyaml
        /tmp/pip/bin/python -m pip download -q -d /wheels --no-deps "$TORCHREC"' >&2
if compgen -G "$WHEELS/*.tar.gz" >/dev/null || compgen -G "$WHEELS/*.zip" >/dev/null; then
    echo "wheelhouse: source distributions downloaded (the image build cannot compile them):" >&2
    ls "$WHEELS"/*.tar.gz "$WHEELS"/*.zip 2>/dev/null >&2 || true
    exit 1
fi
echo "$inputs_hash" >"$STAMP"
echo "wheelhouse: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)," \
    "in $((SECONDS - started)) s" >&2
echo "$WHEELS"
