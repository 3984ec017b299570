#!/usr/bin/env bash
# Start a local, throw-away stack for streamrank: a real single-node Apache
# Kafka 4.x broker (KRaft, combined broker+controller, jars from Maven Central)
# and a real Redis, both on free 127.0.0.1 ports. No Docker needed.
#
# Usage: scripts/stack_up.sh [--secure] [STACK_DIR]
#   STACK_DIR defaults to $STREAMRANK_STACK_DIR, else <repo>/.stack.
#   Several stacks can run at once in different STACK_DIRs.
#   --secure (make stack-up SECURE=1): Kafka speaks only SASL_SSL (SCRAM-SHA-512 over TLS;
#   its controller listener TLS), Redis only TLS with a password; a throw-away CA, the
#   servers' certificate and random passwords are made by scripts/stack_tls.sh.
#
# On success STACK_DIR/env holds
#   export STREAMRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:<port>
#   export STREAMRANK_REDIS__URL=redis://127.0.0.1:<port>/0
#   export STREAMRANK_STACK_DIR=<STACK_DIR>
# and with --secure (the file is then mode 600: it holds the passwords)
#   export STREAMRANK_KAFKA__SECURITY_PROTOCOL=SASL_SSL
#   export STREAMRANK_KAFKA__SASL_MECHANISM=SCRAM-SHA-512
#   export STREAMRANK_KAFKA__SASL_USERNAME=streamrank
#   export STREAMRANK_KAFKA__SASL_PASSWORD=<random>
#   export STREAMRANK_KAFKA__SSL_CA_LOCATION=<STACK_DIR>/tls/ca.pem
#   export STREAMRANK_REDIS__URL=rediss://:<random>@127.0.0.1:<port>/0
#   export STREAMRANK_REDIS__SSL_CA_CERTS=<STACK_DIR>/tls/ca.pem
# so `source STACK_DIR/env` points the pipeline at the stack.
# Stop it with scripts/stack_down.sh [STACK_DIR].
#
# Idempotent: when STACK_DIR/env exists and both servers answer (in the mode
# asked for), it prints "stack already up" and exits 0. Otherwise leftovers are
# stopped and the stack is started from scratch (fresh Kafka data, new ports,
# with --secure new certificates and passwords).
#
# Layout of STACK_DIR:
#   env, ports                 connection settings (shell syntax)
#   server.properties          Kafka config
#   kafka-data/                Kafka log.dirs (wiped on every start)
#   logs/server.log            Kafka log4j log; kafka.out = its stdout+stderr
#   redis/, redis.out          Redis working dir and output
#   kafka.pid, redis.pid       pids used by stack_down.sh
#   kafka.cmd                  the broker's command line (scripts/kafka_ctl.sh)
#   --secure only: tls/ (CA, certificates, keys), secrets (passwords, mode 600),
#   redis.conf (mode 600: holds the Redis password)
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
SECURE=0
if [[ "${1:-}" == "--secure" ]]; then
    SECURE=1
    shift
fi
if [[ "${2:-}" == "--secure" ]]; then
    SECURE=1
    set -- "$1"
fi
[[ $# -le 1 && "${1:-}" != -* ]] || { echo "usage: stack_up.sh [--secure] [STACK_DIR]" >&2; exit 2; }
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

# redis_ping PORT: the Redis on PORT answers PING with PONG (in --secure mode over TLS,
# with the password from STACK_DIR/secrets, passed in the environment, not the command line).
redis_ping() {
    if [[ "$SECURE" -eq 1 ]]; then
        [[ "$(REDISCLI_AUTH="$(secret_value REDIS_PASSWORD)" timeout 2 redis-cli --tls \
            --cacert "$STACK_DIR/tls/ca.pem" -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == "PONG" ]]
    elif command -v redis-cli >/dev/null 2>&1; then
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

# secret_value NAME: NAME's value in STACK_DIR/secrets (written by stack_tls.sh).
secret_value() {
    sed -n "s/^$1=//p" "$STACK_DIR/secrets" 2>/dev/null
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
    local kafka_mode="PLAINTEXT" redis_mode="plain"
    if [[ "${SECURE:-0}" -eq 1 ]]; then
        kafka_mode="SASL_SSL, SCRAM-SHA-512"
        redis_mode="TLS + password"
    fi
    cat <<EOF
  kafka  127.0.0.1:$KAFKA_PORT $kafka_mode (controller :$CONTROLLER_PORT, pid $(cat "$STACK_DIR/kafka.pid"), log $STACK_DIR/logs/server.log)
  redis  127.0.0.1:$REDIS_PORT $redis_mode (pid $(cat "$STACK_DIR/redis.pid"), log $STACK_DIR/redis.out)
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
    wanted_secure="$SECURE"
    SECURE=0 # a ports file of an older stack_up.sh names no mode: it was plain
    # shellcheck disable=SC1091
    source "$STACK_DIR/ports"
    running_secure="${SECURE:-0}"
    SECURE="$wanted_secure"
    if [[ "$running_secure" == "$wanted_secure" ]] &&
        pidfile_alive "$STACK_DIR/kafka.pid" kafka.Kafka &&
        pidfile_alive "$STACK_DIR/redis.pid" redis-server &&
        port_open "${KAFKA_PORT:-0}" && redis_ping "${REDIS_PORT:-0}"; then
        echo "stack already up in $STACK_DIR"
        print_summary
        exit 0
    fi
    if [[ "$running_secure" != "$wanted_secure" ]]; then
        log "stack in $STACK_DIR runs in the other mode (secure=$running_secure); restarting it"
    else
        log "stack in $STACK_DIR is not healthy; restarting it"
    fi
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
    "$STACK_DIR/kafka.out" "$STACK_DIR/redis.out" "$STACK_DIR/tls" "$STACK_DIR/secrets" \
    "$STACK_DIR/redis.conf" "$STACK_DIR/scram.args"
# server.properties (the broker's SCRAM login), redis.conf and env hold passwords in
# --secure mode: nobody else may read what this script writes.
if [[ "$SECURE" -eq 1 ]]; then
    umask 077
fi
mkdir -p "$STACK_DIR/kafka-data" "$STACK_DIR/logs" "$STACK_DIR/redis"

if [[ "$SECURE" -eq 1 ]]; then
    "$SCRIPT_DIR/stack_tls.sh" "$STACK_DIR" || die "could not make certificates and passwords"
    TLS="$STACK_DIR/tls"
    LISTENERS="$(cat <<EOF
listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL
inter.broker.listener.name=SASL_SSL

# SASL_SSL: SCRAM-SHA-512 logins over TLS (the broker logs in to itself as the admin user;
# the users' SCRAM credentials are written into the metadata by the storage format below).
# The controller listener is TLS only (loopback: the broker talking to its own controller).
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$(secret_value KAFKA_ADMIN_USER)" password="$(secret_value KAFKA_ADMIN_PASSWORD)";
ssl.keystore.type=PEM
ssl.keystore.location=$TLS/kafka.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
ssl.client.auth=none
ssl.endpoint.identification.algorithm=https
EOF
)"
else
    LISTENERS="$(cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
EOF
)"
fi

cat >"$STACK_DIR/server.properties" <<EOF
# Generated by scripts/stack_up.sh: single-node KRaft test broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
$LISTENERS
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
# --secure: the SCRAM users go in with the format, through a java @argfile (mode 600) so
# their passwords never show on a command line.
format_args=()
if [[ "$SECURE" -eq 1 ]]; then
    for user in ADMIN CLIENT; do
        printf -- '--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' \
            "$(secret_value "KAFKA_${user}_USER")" "$(secret_value "KAFKA_${user}_PASSWORD")"
    done >"$STACK_DIR/scram.args"
    format_args=("@$STACK_DIR/scram.args")
fi
if ! "$JAVA" "${TOOL_OPTS[@]}" -cp "$KAFKA_CP" kafka.tools.StorageTool format \
    -t "$cluster_id" -c "$STACK_DIR/server.properties" "${format_args[@]}" \
    >"$STACK_DIR/logs/format.out" 2>&1; then
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

rm -f "$STACK_DIR/scram.args"

# Redis starts in milliseconds; launch it while Kafka boots. --secure: TLS only (no plain
# port), clients need no certificate of their own, a password; all in a mode-600 config
# file (a password on the command line would show in ps).
if [[ "$SECURE" -eq 1 ]]; then
    cat >"$STACK_DIR/redis.conf" <<EOF
port 0
tls-port $REDIS_PORT
bind 127.0.0.1
tls-cert-file $TLS/server.pem
tls-key-file $TLS/server.key
tls-ca-cert-file $TLS/ca.pem
tls-auth-clients no
requirepass $(secret_value REDIS_PASSWORD)
save ""
appendonly no
daemonize no
dir $STACK_DIR/redis
EOF
    launch "$STACK_DIR/redis.pid" "$STACK_DIR/redis.out" redis-server "$STACK_DIR/redis.conf"
else
    launch "$STACK_DIR/redis.pid" "$STACK_DIR/redis.out" \
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
        --appendonly no --daemonize no --dir "$STACK_DIR/redis"
fi

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
SECURE=$SECURE
EOF
# Written last and atomically: env existing means the stack is usable.
if [[ "$SECURE" -eq 1 ]]; then
    cat >"$STACK_DIR/env.tmp" <<EOF
export STREAMRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:$KAFKA_PORT
export STREAMRANK_KAFKA__SECURITY_PROTOCOL=SASL_SSL
export STREAMRANK_KAFKA__SASL_MECHANISM=SCRAM-SHA-512
export STREAMRANK_KAFKA__SASL_USERNAME=$(secret_value KAFKA_CLIENT_USER)
export STREAMRANK_KAFKA__SASL_PASSWORD=$(secret_value KAFKA_CLIENT_PASSWORD)
export STREAMRANK_KAFKA__SSL_CA_LOCATION=$TLS/ca.pem
export STREAMRANK_REDIS__URL=rediss://:$(secret_value REDIS_PASSWORD)@127.0.0.1:$REDIS_PORT/0
export STREAMRANK_REDIS__SSL_CA_CERTS=$TLS/ca.pem
export STREAMRANK_STACK_DIR=$STACK_DIR
EOF
else
    cat >"$STACK_DIR/env.tmp" <<EOF
export STREAMRANK_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:$KAFKA_PORT
export STREAMRANK_REDIS__URL=redis://127.0.0.1:$REDIS_PORT/0
export STREAMRANK_STACK_DIR=$STACK_DIR
EOF
fi
mv "$STACK_DIR/env.tmp" "$STACK_DIR/env"
started_ok=1

echo "stack up in $STACK_DIR ($KAFKA_VERSION, $(redis-server --version | cut -d' ' -f1-3)) in $((SECONDS - START_TS))s"
print_summary
