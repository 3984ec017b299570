#!/usr/bin/env bash
# Install the Debian tools the docker/ checks need, when missing (called by `make test`):
#   docker-compose  `docker-compose -f docker/compose.yaml config` parses the stack (no engine)
#   prometheus      the real server and promtool: scrape config, alert rules, and the PromQL of
#                   the dashboard against a live pipeline (tests/integration)
# Idempotent and quiet: returns at once when all are on PATH (see scripts/apt_install.sh).
#
# Usage: scripts/install_tools.sh
set -euo pipefail

exec "$(dirname "${BASH_SOURCE[0]}")/apt_install.sh" \
    docker-compose=docker-compose prometheus=prometheus promtool=prometheus
