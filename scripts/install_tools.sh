#!/usr/bin/env bash
# Install the Debian tools the docker/ checks need, when missing:
#   docker-compose  (`docker-compose -f docker/compose.yaml config` parses the stack; no engine)
#   prometheus      (the real server and promtool: config, rules and the PromQL of the dashboard)
# Idempotent and quiet: returns at once when both are on PATH. Serialised with the lock that
# scripts/stack_up.sh uses for apt, so parallel runs do not race on dpkg.
#
# Usage: scripts/install_tools.sh
set -euo pipefail

CACHE_ROOT="${STREAMRANK_CACHE_DIR:-$HOME/.cache/streamrank}"

missing() {
    local pkgs=()
    command -v docker-compose >/dev/null 2>&1 || pkgs+=(docker-compose)
    { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } ||
        pkgs+=(prometheus)
    echo "${pkgs[@]}"
}

[[ -z "$(missing)" ]] && exit 0

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "install_tools: need root or sudo to apt-get install $(missing)" >&2
        exit 1
    }
    SUDO=(sudo)
fi
mkdir -p "$CACHE_ROOT"
(
    flock 7
    read -r -a pkgs <<<"$(missing)"
    [[ ${#pkgs[@]} -eq 0 ]] && exit 0
    echo "install_tools: apt-get install ${pkgs[*]} ..."
    # The prometheus package would start a system-wide server on :9090; a temporary
    # policy-rc.d (only when none exists) keeps services from starting.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
        trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
) 7>"$CACHE_ROOT/.apt.lock"

left="$(missing)"
if [[ -n "$left" ]]; then
    echo "install_tools: still missing after apt-get: $left" >&2
    exit 1
fi
