#!/usr/bin/env bash
# Stop or restart only the Kafka broker of a stack made by stack_up.sh, keeping its
# port and data dir (for fault tests: the broker goes away and comes back).
#
# Usage: scripts/kafka_ctl.sh stop|kill|start STACK_DIR
#   stop   SIGTERM (controlled shutdown), SIGKILL after 30 s
#   kill   SIGKILL at once (a crashed broker)
#   start  the same command line as stack_up.sh (STACK_DIR/kafka.cmd), on the same port
#          and data dir; returns once the broker accepts connections again
set -euo pipefail

die() { echo "kafka_ctl: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || die "usage: kafka_ctl.sh stop|kill|start STACK_DIR"
ACTION="$1"
STACK_DIR="$(cd "$2" && pwd)"
[[ -f "$STACK_DIR/ports" && -f "$STACK_DIR/kafka.cmd" ]] || die "$STACK_DIR is not a stack_up.sh dir"
# shellcheck disable=SC1091
source "$STACK_DIR/ports"
PIDFILE="$STACK_DIR/kafka.pid"

alive() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF kafka.Kafka
}

port_open() {
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5)' \
        "$KAFKA_PORT" 2>/dev/null
}

case "$ACTION" in
stop | kill)
    alive || { echo "kafka_ctl: broker not running"; exit 0; }
    pid="$(cat "$PIDFILE")"
    if [[ "$ACTION" == kill ]]; then kill -KILL "$pid"; else kill -TERM "$pid"; fi
    for ((i = 0; i < 150; i++)); do
        alive || break
        sleep 0.2
    done
    if alive; then
        kill -KILL "$pid"
        sleep 1
    fi
    alive && die "could not stop the broker (pid $pid)"
    echo "kafka_ctl: broker stopped (pid $pid)"
    ;;
start)
    alive && { echo "kafka_ctl: broker already running"; exit 0; }
    started_before="$(grep -cF "Kafka Server started" "$STACK_DIR/logs/server.log" 2>/dev/null || true)"
    # shellcheck disable=SC2016  # $$, $1 and $2 are expanded by the inner sh
    setsid nohup sh -c 'echo $$ >"$1"; eval "exec $2"' sh "$PIDFILE" "$(cat "$STACK_DIR/kafka.cmd")" \
        </dev/null >>"$STACK_DIR/kafka.out" 2>&1 9>&- &
    deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-120}))
    until [[ "$(grep -cF "Kafka Server started" "$STACK_DIR/logs/server.log" 2>/dev/null || true)" -gt "${started_before:-0}" ]] && port_open; do
        sleep 0.2
        if ((SECONDS > 3)) && ! alive; then die "broker exited during startup (see $STACK_DIR/kafka.out)"; fi
        ((SECONDS < deadline)) || die "broker not started after ${KAFKA_START_TIMEOUT:-120}s"
    done
    echo "kafka_ctl: broker started on 127.0.0.1:$KAFKA_PORT (pid $(cat "$PIDFILE"))"
    ;;
*) die "unknown action $ACTION (stop|kill|start)" ;;
esac
