#!/usr/bin/env bash
# Install the Debian packages that provide missing commands: quietly, once at a time, and
# without starting their services.
#
# Usage: scripts/apt_install.sh COMMAND=PACKAGE...
#   e.g. scripts/apt_install.sh redis-server=redis-server promtool=prometheus
# Returns at once when every COMMAND is on PATH; otherwise installs the PACKAGEs of the missing
# ones with apt-get (sudo when not root) and fails unless every COMMAND exists afterwards.
#
# Parallel runs (stack_up.sh, install_tools.sh, several test sessions) are serialised with
# $STREAMRANK_CACHE_DIR/.apt.lock so they do not race on dpkg. A temporary
# /usr/sbin/policy-rc.d (only when none exists) keeps packages such as redis-server or
# prometheus from starting system-wide servers on their default ports.
set -euo pipefail

CACHE_ROOT="${STREAMRANK_CACHE_DIR:-$HOME/.cache/streamrank}"

# missing_packages: the packages of the COMMAND=PACKAGE arguments whose command is missing.
missing_packages() {
    local pair
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null 2>&1 || echo "${pair#*=}"
    done | sort -u | tr '\n' ' '
}

[[ -z "$(missing_packages "$@")" ]] && exit 0

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "apt_install: not root and no sudo: apt-get install $(missing_packages "$@")" >&2
        exit 1
    }
    SUDO=(sudo)
fi
command -v apt-get >/dev/null 2>&1 || {
    echo "apt_install: no apt-get to install $(missing_packages "$@")" >&2
    exit 1
}
mkdir -p "$CACHE_ROOT"
(
    flock 7
    read -r -a packages <<<"$(missing_packages "$@")"
    [[ ${#packages[@]} -eq 0 ]] && exit 0
    echo "apt_install: apt-get install ${packages[*]} ..."
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
        trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
) 7>"$CACHE_ROOT/.apt.lock"

left="$(missing_packages "$@")"
if [[ -n "$left" ]]; then
    echo "apt_install: still missing after apt-get install: $left" >&2
    exit 1
fi
