#!/usr/bin/env bash
# `make test`: install, then the whole suite in .venv, then the model tests in .venv-compat.
#
# The two virtual environments and the Debian tools are independent, and building each is one
# single-threaded pip (unpacking some 5 GB of wheels) or apt: they are built side by side, one
# per core, instead of one after the other. The compat build's output is kept in a log and
# printed once it is done (or failed), so the two do not interleave.
#
# Usage: scripts/test.sh PYTEST_ARGS...   (the suite's, e.g. -n 3 --dist loadfile; the compat run
#                                          is `make test-compat`, with the Makefile's)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

compat_log="$(mktemp "${TMPDIR:-/tmp}/streamrank-install-compat.XXXXXX")"
scripts/install_compat.sh >"$compat_log" 2>&1 &
compat_pid=$!
# A failure below ends the script: the compat build is not left running behind it.
trap 'kill "$compat_pid" 2>/dev/null || true; wait "$compat_pid" 2>/dev/null || true; rm -f "$compat_log"' EXIT

scripts/install.sh
scripts/install_tools.sh
compat_rc=0
wait "$compat_pid" || compat_rc=$?
cat "$compat_log"
((compat_rc == 0)) || { echo "test: building .venv-compat failed (exit $compat_rc)" >&2; exit 1; }

.venv/bin/python -m pytest -q "$@" --durations=20 tests
make --no-print-directory test-compat  # .venv-compat is up to date: its tests only
