#!/usr/bin/env bash
# Stop the local Kafka + Redis stack started by scripts/stack_up.sh.
#
# Usage: scripts/stack_down.sh [STACK_DIR]
#   STACK_DIR defaults to $STREAMRANK_STACK_DIR, else <repo>/.stack.
#
# Stops Kafka (SIGTERM, up to 20 s for a clean shutdown, then SIGKILL) and
# Redis (SIGTERM, up to 10 s, then SIGKILL) using STACK_DIR/{kafka,redis}.pid,
# then removes the pid files, STACK_DIR/env and STACK_DIR/ports.
# Data and logs are left in STACK_DIR for inspection (stack_up.sh wipes them).
# Idempotent: nothing running is not an error.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
STACK_DIR="${1:-${STREAMRANK_STACK_DIR:-$REPO_ROOT/.stack}}"

if [[ ! -d "$STACK_DIR" ]]; then
    echo "stack_down: $STACK_DIR does not exist; nothing to stop"
    exit 0
fi
STACK_DIR="$(cd "$STACK_DIR" && pwd)"

# proc_alive PID PATTERN: true when PID runs and its command line contains
# PATTERN. Guards against signalling an unrelated process that reused a stale
# pid, and treats zombies (empty cmdline) as dead.
proc_alive() {
    local pid="$1" pattern="$2"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$pattern"
}

# stop_proc NAME PIDFILE PATTERN TIMEOUT_S
stop_proc() {
    local name="$1" pidfile="$2" pattern="$3" timeout_s="$4" pid waited
    if [[ ! -f "$pidfile" ]]; then
        return 0
    fi
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    if ! proc_alive "$pid" "$pattern"; then
        echo "stack_down: $name (pid ${pid:-?}) not running"
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    # Poll every 0.2 s up to TIMEOUT_S.
    for ((waited = 0; waited < timeout_s * 5; waited++)); do
        proc_alive "$pid" "$pattern" || break
        sleep 0.2
    done
    if proc_alive "$pid" "$pattern"; then
        echo "stack_down: $name (pid $pid) ignored SIGTERM for ${timeout_s}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((waited = 0; waited < 25; waited++)); do
            proc_alive "$pid" "$pattern" || break
            sleep 0.2
        done
    fi
    if proc_alive "$pid" "$pattern"; then
        echo "stack_down: could not stop $name (pid $pid)" >&2
        return 1
    fi
    echo "stack_down: stopped $name (pid $pid)"
    rm -f "$pidfile"
}

# Remove env first: its presence means "stack is up" to stack_up.sh and tests.
rm -f "$STACK_DIR/env"
rc=0
stop_proc kafka "$STACK_DIR/kafka.pid" kafka.Kafka 20 || rc=1
stop_proc redis "$STACK_DIR/redis.pid" redis-server 10 || rc=1
rm -f "$STACK_DIR/ports"
exit "$rc"
