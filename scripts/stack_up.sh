#!/usr/bin/env bash
# Start a local, throw-away stack for streamrank: a real single-node Apache
# Kafka 4.x broker (KRaft, combined broker+controller, jars from Maven Central)
# and a real Redis, both on free 127.0.0.1 ports. No Docker needed.
#
# Usage: scripts/stack_up.sh [STACK_DIR]
#   STACK_DIR defaults to $STREAMRANK_STACK_DIR, else <repo>/.stack.
#   Several stacks can run at once in different STACK_DIRs.
#
# On success STACK_DIR/env holds
#   export STREAMRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:<port>
#   export STREAMRANK_REDIS__URL=redis://127.0.0.1:<port>/0
#   export STREAMRANK_STACK_DIR=<STACK_DIR>
# so `source STACK_DIR/env` points the pipeline at the stack.
# Stop it with scripts/stack_down.sh [STACK_DIR].
#
# Idempotent: when STACK_DIR/env exists and both servers answer, it prints
# "stack already up" and exits 0. Otherwise leftovers are stopped and the
# stack is started from scratch (fresh Kafka data, new ports).
#
# Layout of STACK_DIR:
#   env, ports                 connection settings (shell syntax)
#   server.properties          Kafka config
#   kafka-data/                Kafka log.dirs (wiped on every start)
#   logs/server.log            Kafka log4j log; kafka.out = its stdout+stderr
#   redis/, redis.out          Redis working dir and output
#   kafka.pid, redis.pid       pids used by stack_down.sh
#   kafka.cmd                  the broker's command line (scripts/kafka_ctl.sh)
#
# Environment knobs (all optional):
#   STREAMRANK_CACHE_DIR            jar cache root (see kafka_fetch.sh)
#   STREAMRANK_KAFKA_START_TIMEOUT  seconds to wait for Kafka (default 90)
#   STREAMRANK_KAFKA_HEAP_OPTS      default "-Xms256m -Xmx768m"
#   JAVA_HOME                       Java 17+ to use (default: java on PATH)
set -euo pipefail

START_TS=$SECONDS
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
STACK_DIR="${1:-${STREAMRANK_STACK_DIR:-$REPO_ROOT/.stack}}"
mkdir -p "$STACK_DIR"
STACK_DIR="$(cd "$STACK_DIR" && pwd)"

KAFKA_START_TIMEOUT="${STREAMRANK_KAFKA_START_TIMEOUT:-90}"
REDIS_START_TIMEOUT=15
KAFKA_HEAP_OPTS="${STREAMRANK_KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
LOG4J_CONFIG="$SCRIPT_DIR/kafka/log4j2.properties"

log() { echo "stack_up: $*"; }
die() { echo "stack_up: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- helpers --

# proc_alive PID PATTERN: PID runs and its command line contains PATTERN
# (guards against reused pids; zombies have an empty cmdline => dead).
proc_alive() {
    local pid="$1" pattern="$2"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$pattern"
}

# pidfile_alive PIDFILE PATTERN
pidfile_alive() {
    [[ -f "$1" ]] && proc_alive "$(cat "$1" 2>/dev/null || true)" "$2"
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# redis_ping PORT: the Redis on PORT answers PING with PONG.
redis_ping() {
    if command -v redis-cli >/dev/null 2>&1; then
        [[ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == "PONG" ]]
    else
        # Plain RESP over bash's /dev/tcp: "PING" -> "+PONG".
        # shellcheck disable=SC2016  # expanded by the inner bash
        timeout 2 bash -c '
            exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
            printf "PING\r\n" >&3
            IFS= read -r line <&3
            [[ "$line" == "+PONG"* ]]' _ "$1" 2>/dev/null
    fi
}

# launch PIDFILE OUTFILE CMD...: run CMD detached (own session, immune to
# SIGHUP/Ctrl-C of the caller, no inherited stdio or lock fd). The wrapper
# writes its own pid before exec'ing CMD, so the pid file holds CMD's pid
# whether or not setsid had to fork.
launch() {
    local pidfile="$1" outfile="$2"
    shift 2
    rm -f "$pidfile"
    # shellcheck disable=SC2016  # $$, $1 and $@ are expanded by the inner sh
    setsid nohup sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$pidfile" "$@" \
        </dev/null >"$outfile" 2>&1 9>&- &
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.1
    done
    die "could not launch $*"
}

# kafka_failed MESSAGE: report a Kafka start failure with the last log lines.
kafka_failed() {
    {
        echo "stack_up: ERROR: $1"
        for f in "$STACK_DIR/logs/server.log" "$STACK_DIR/kafka.out"; do
            if [[ -s "$f" ]]; then
                echo "---- last 40 lines of $f ----"
                tail -n 40 "$f"
            fi
        done
    } >&2
    exit 1
}

print_summary() {
    # shellcheck disable=SC1091
    source "$STACK_DIR/ports"
    cat <<EOF
  kafka  127.0.0.1:$KAFKA_PORT (controller :$CONTROLLER_PORT, pid $(cat "$STACK_DIR/kafka.pid"), log $STACK_DIR/logs/server.log)
  redis  127.0.0.1:$REDIS_PORT (pid $(cat "$STACK_DIR/redis.pid"), log $STACK_DIR/redis.out)
use it:  source $STACK_DIR/env
stop it: $SCRIPT_DIR/stack_down.sh $STACK_DIR
EOF
}

# ------------------------------------------------------------ lock + check --

# One stack_up at a time per STACK_DIR. fd 9 is closed for the servers (see
# launch) so the lock is released when this script exits.
exec 9>"$STACK_DIR/.lock"
flock 9

if [[ -f "$STACK_DIR/env" && -f "$STACK_DIR/ports" ]]; then
    # shellcheck disable=SC1091
    source "$STACK_DIR/ports"
    if pidfile_alive "$STACK_DIR/kafka.pid" kafka.Kafka &&
        pidfile_alive "$STACK_DIR/redis.pid" redis-server &&
        port_open "${KAFKA_PORT:-0}" && redis_ping "${REDIS_PORT:-0}"; then
        echo "stack already up in $STACK_DIR"
        print_summary
        exit 0
    fi
    log "stack in $STACK_DIR is not healthy; restarting it"
fi

# ---------------------------------------------------------- prerequisites --

command -v python3 >/dev/null 2>&1 || die "python3 is required (to pick free ports)"
command -v "$JAVA" >/dev/null 2>&1 || die "java (17+) not found; set JAVA_HOME or install openjdk-17-jre-headless"
java_major="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
[[ "${java_major:-0}" -ge 17 ]] || die "Kafka 4.x needs Java 17+, $JAVA is version ${java_major:-unknown}"

# Kafka jars (cached across runs; the first run downloads ~40 MB via Maven).
LIBS_DIR="$("$SCRIPT_DIR/kafka_fetch.sh")"
KAFKA_CP="$LIBS_DIR/*"
KAFKA_VERSION="$(basename "$(dirname "$LIBS_DIR")")"

# Redis from Debian (scripts/apt_install.sh: serialised, without starting a system-wide
# redis on :6379 that we do not need).
"$SCRIPT_DIR/apt_install.sh" redis-server=redis-server || die "could not install redis-server"

# ------------------------------------------------------------- fresh start --

# Stop whatever an earlier run left behind in this STACK_DIR.
"$SCRIPT_DIR/stack_down.sh" "$STACK_DIR" >/dev/null ||
    die "could not stop the previous stack in $STACK_DIR"

# From here on, a failure must not leave half a stack running.
started_ok=0
cleanup_on_failure() {
    if [[ "$started_ok" -ne 1 ]]; then
        "$SCRIPT_DIR/stack_down.sh" "$STACK_DIR" >/dev/null 2>&1 || true
    fi
}
trap cleanup_on_failure EXIT

# Three distinct free loopback ports, held open together so they differ.
ports="$(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
')"
read -r KAFKA_PORT CONTROLLER_PORT REDIS_PORT <<<"$ports"

# A used KRaft data dir cannot be formatted again: always start empty.
rm -rf "$STACK_DIR/kafka-data" "$STACK_DIR/logs" "$STACK_DIR/redis" \
    "$STACK_DIR/kafka.out" "$STACK_DIR/redis.out"
mkdir -p "$STACK_DIR/kafka-data" "$STACK_DIR/logs" "$STACK_DIR/redis"

cat >"$STACK_DIR/server.properties" <<EOF
# Generated by scripts/stack_up.sh: single-node KRaft test broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$STACK_DIR/kafka-data

# Topics. Everything is replication factor 1: with a higher RF the internal
# topics cannot be created on one node and consumer groups hang silently.
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
delete.topic.enable=true
message.max.bytes=2097152
replica.fetch.max.bytes=2097152
log.retention.hours=24

# Internal topics: RF 1 and few partitions (fast startup).
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1

# Consumer groups: no join delay; allow short session timeouts in tests.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000

# Small footprint for a test box.
num.network.threads=2
num.io.threads=4
background.threads=4
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=16777216
log.index.size.max.bytes=1048576
EOF

# JVM flags for the short-lived admin tool runs: start fast, and keep their
# config dump out of the broker's server.log.
TOOL_OPTS=(-XX:TieredStopAtLevel=1 -XX:+UseSerialGC
    "-Dlog4j2.configurationFile=$LOG4J_CONFIG" "-Dkafka.logs.dir=$STACK_DIR/logs/tools")

# Format the storage with a fresh cluster id (static voters => no --standalone).
cluster_id="$("$JAVA" "${TOOL_OPTS[@]}" -cp "$KAFKA_CP" kafka.tools.StorageTool random-uuid | tail -n1)"
[[ "$cluster_id" =~ ^[A-Za-z0-9_-]{22}$ ]] || die "StorageTool random-uuid returned '$cluster_id'"
if ! "$JAVA" "${TOOL_OPTS[@]}" -cp "$KAFKA_CP" kafka.tools.StorageTool format \
    -t "$cluster_id" -c "$STACK_DIR/server.properties" >"$STACK_DIR/logs/format.out" 2>&1; then
    cat "$STACK_DIR/logs/format.out" >&2
    die "kafka storage format failed"
fi

# ----------------------------------------------------------------- launch --

# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of flags
KAFKA_CMD=("$JAVA" $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent
    -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$LOG4J_CONFIG" "-Dkafka.logs.dir=$STACK_DIR/logs"
    -cp "$KAFKA_CP" kafka.Kafka "$STACK_DIR/server.properties")
# kafka_ctl.sh restarts the broker with the same command, port and data dir.
printf '%q ' "${KAFKA_CMD[@]}" >"$STACK_DIR/kafka.cmd"
launch "$STACK_DIR/kafka.pid" "$STACK_DIR/kafka.out" "${KAFKA_CMD[@]}"

# Redis starts in milliseconds; launch it while Kafka boots.
launch "$STACK_DIR/redis.pid" "$STACK_DIR/redis.out" \
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --daemonize no --dir "$STACK_DIR/redis"

# Wait for Kafka: the readiness line, then the listener.
deadline=$((SECONDS + KAFKA_START_TIMEOUT))
until grep -qsF "Kafka Server started" "$STACK_DIR/logs/server.log" "$STACK_DIR/kafka.out"; do
    pidfile_alive "$STACK_DIR/kafka.pid" kafka.Kafka || kafka_failed "kafka exited during startup"
    ((SECONDS < deadline)) || kafka_failed "kafka not started after ${KAFKA_START_TIMEOUT}s"
    sleep 0.2
done
until port_open "$KAFKA_PORT"; do
    ((SECONDS < deadline)) || kafka_failed "kafka port $KAFKA_PORT not accepting connections"
    sleep 0.2
done

# Wait for Redis to answer PING.
deadline=$((SECONDS + REDIS_START_TIMEOUT))
until redis_ping "$REDIS_PORT"; do
    if ! pidfile_alive "$STACK_DIR/redis.pid" redis-server || ((SECONDS >= deadline)); then
        tail -n 40 "$STACK_DIR/redis.out" >&2 || true
        die "redis did not answer PING on port $REDIS_PORT"
    fi
    sleep 0.1
done

# ------------------------------------------------------------ env + report --

cat >"$STACK_DIR/ports" <<EOF
KAFKA_PORT=$KAFKA_PORT
CONTROLLER_PORT=$CONTROLLER_PORT
REDIS_PORT=$REDIS_PORT
EOF
# Written last and atomically: env existing means the stack is usable.
cat >"$STACK_DIR/env.tmp" <<EOF
export STREAMRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:$KAFKA_PORT
export STREAMRANK_REDIS__URL=redis://127.0.0.1:$REDIS_PORT/0
export STREAMRANK_STACK_DIR=$STACK_DIR
EOF
mv "$STACK_DIR/env.tmp" "$STACK_DIR/env"
started_ok=1

echo "stack up in $STACK_DIR ($KAFKA_VERSION, $(redis-server --version | cut -d' ' -f1-3)) in $((SECONDS - START_TS))s"
print_summary
