#!/usr/bin/env bash
# The compose check (`make compose-check`): bring docker/compose.yaml up on a real Docker engine,
# prove what it does, and take everything down again.
#
# Usage: scripts/compose_check.sh
#
# 1. Docker: uses a daemon that answers; otherwise installs Debian's docker.io, docker-compose
#    and debootstrap (scripts/apt_install.sh), starts dockerd (niced, log in the state dir) and
#    stops it again at the end, removing what it left: the docker0 and compose bridges, the
#    iptables rules and chains it added (and the FORWARD policy), ip_forward as it was. Compose
#    v2 (`docker compose`) when the client has it, else v1 (`docker-compose`).
# 2. Images: each official image of docker/.env that is neither here nor pullable is replaced by
#    a local stand-in (docker/standins/) built FROM a Debian 12 base made with debootstrap
#    (`docker import`): Kafka from the broker jars of scripts/kafka_fetch.sh, Redis and
#    Prometheus from Debian's packages, Python 3.11 from Debian for the streamrank image
#    (docker/Dockerfile with PYTHON_IMAGE). Grafana has no stand-in: without its image the stack
#    runs without it, and the check says so. The streamrank image's packages come from a
#    wheelhouse downloaded once (scripts/wheelhouse.sh) and served to the build over HTTP on the
#    docker bridge. Images stay for the next run; the streamrank image is rebuilt only when
#    its sources change (a stamp next to the wheelhouse).
# 3. The stack, as written, with 2 scorer replicas of 2 ranks each (DELIVERY_GUARANTEE
#    exactly_once unless COMPOSE_CHECK_GUARANTEE says otherwise), the demo producer sending
#    COMPOSE_CHECK_RATE events/s; then, checked by scripts/compose_audit.py in a one-off
#    container on the compose network: the replicas' ranks own the input partitions; the
#    documented rollout (a new version from a one-off scorer container, `model promote`)
#    switches every rank; `docker kill` of one replica while events flow: the other owns every
#    partition, then the killed one is started again and rejoins; Prometheus has every rank's
#    target up and every dashboard query and alert expression returns data; the producer is
#    stopped, the group drains, and the topics are read back: every event the producer wrote
#    scored exactly once, every malformed message dead-lettered with its reason.
# 4. `down -v`: no container, network or volume of the check's compose project is left, and no
#    process of the check outlives it.
#
# Prints what it does with the wall time so far; the audit lines start with `audit:`. Logs (the
# daemon's, compose's, each service's) are in the state dir. Exit status 0 when everything
# held.
#
# Environment (all optional):
#   COMPOSE_CHECK_DIR        state dir (default <repo>/.compose-check)
#   COMPOSE_CHECK_PROJECT    compose project name (default streamrank-check)
#   COMPOSE_CHECK_GUARANTEE  exactly_once (default) or at_least_once (duplicates then allowed)
#   COMPOSE_CHECK_RATE       producer events/s (default 100)
#   COMPOSE_CHECK_NPROC      ranks per scorer replica (STREAMRANK_NPROC, default 2: the
#                            dashboard's collective-latency panel needs two)
#   COMPOSE_CHECK_PHASE_S    seconds of traffic between the steps (default 10)
#   COMPOSE_CHECK_TRAIN_EVENTS  synthetic training events of init's first model version
#                            (INIT_EVENTS) and of the rolled-out one (default 500)
#   COMPOSE_CHECK_WHEEL_PORT port of the wheelhouse server on the docker bridge (default 18461;
#                            a fixed port keeps the image build cached)
#   STREAMRANK_CACHE_DIR     cache root of the Kafka jars and the wheelhouse
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
STATE="${COMPOSE_CHECK_DIR:-$REPO_ROOT/.compose-check}"
PROJECT="${COMPOSE_CHECK_PROJECT:-streamrank-check}"
GUARANTEE="${COMPOSE_CHECK_GUARANTEE:-exactly_once}"
RATE="${COMPOSE_CHECK_RATE:-100}"
PHASE_S="${COMPOSE_CHECK_PHASE_S:-10}"
TRAIN_EVENTS="${COMPOSE_CHECK_TRAIN_EVENTS:-500}"
NPROC="${COMPOSE_CHECK_NPROC:-2}"
WHEEL_PORT="${COMPOSE_CHECK_WHEEL_PORT:-18461}"
REPLICAS=2
case "$GUARANTEE" in exactly_once | at_least_once) ;; *)
    echo "compose-check: COMPOSE_CHECK_GUARANTEE must be exactly_once or at_least_once" >&2
    exit 2 ;;
esac

STARTED=$SECONDS
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
rm -f "$STATE"/*.log

# What the check says goes to its own stdout (fd 3), also from the EXIT trap, which can run
# while a command's output is redirected to a log.
exec 3>&1
say() { printf 'compose-check: [%4ds] %s\n' "$((SECONDS - STARTED))" "$*" >&3; }
die() {
    say "FAILED: $*"
    exit 1
}

# interruptible CMD...: run CMD in the background and wait for it, so that INT/TERM reach the
# EXIT trap at once (a foreground child would delay them until it ends); cleanup stops it.
CHILD=""
interruptible() {
    "$@" 3>&- &
    CHILD=$!
    local rc=0
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

# ------------------------------------------------------------------------------ docker engine

"$SCRIPT_DIR/apt_install.sh" dockerd=docker.io docker-compose=docker-compose \
    debootstrap=debootstrap iptables-save=iptables || die "could not install Docker"
# Debian's client (another one may come first on PATH, without compose v2 or the classic builder).
DOCKER=docker
[[ -x /usr/bin/docker ]] && DOCKER=/usr/bin/docker
export DOCKER

DOCKERD_PID=""
WHEEL_PID=""
HELPER=""
UP=0
PASSED=0

# Host state before our dockerd, to put back after it.
# engine_pids: the processes of a Docker engine (containerd-shim-runc-v2's name is cut at 15).
engine_pids() {
    ps -e -o pid=,comm= |
        awk '$2 ~ /^(dockerd|containerd|containerd-shim.*|docker-proxy)$/ {print $1}' | sort
}
links_now() { ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort; }
# iptables_rules: the rules and chains of an iptables-save dump (stdin), counters and
# comments left out, built-in chains only when their policy is not ACCEPT.
iptables_rules() {
    grep -E '^(-A |:)' | sed 's/ \[[0-9]*:[0-9]*\]$//' | grep -v -E '^:[A-Z]+ ACCEPT$' | sort
}
snapshot_host() {
    cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.before"
    iptables-save >"$STATE/iptables.before"
    links_now >"$STATE/links.before"
    engine_pids >"$STATE/pids.before"
}

start_dockerd() {
    [[ ! -S /var/run/docker.sock ]] || [[ -z "$(engine_pids)" ]] ||
        die "a dockerd runs but does not answer ($DOCKER info); not starting another"
    snapshot_host
    say "starting dockerd (log $STATE/dockerd.log)"
    setsid nice -n 10 dockerd </dev/null >"$STATE/dockerd.log" 2>&1 3>&- &
    DOCKERD_PID=$!
    local i
    for ((i = 0; i < 150; i++)); do
        "$DOCKER" info >/dev/null 2>&1 && return 0
        kill -0 "$DOCKERD_PID" 2>/dev/null || die "dockerd exited: $(tail -n 5 "$STATE/dockerd.log")"
        sleep 0.2
    done
    die "dockerd did not answer in 30 s"
}

# remove_added_iptables: delete the rules and chains that are there now and were not before
# dockerd started, and put back the built-in chains' policies.
remove_added_iptables() {
    local table now before line chain policy
    for table in filter nat mangle raw; do
        now="$(iptables-save -t "$table" 2>/dev/null)" || continue
        before="$(awk -v t="*$table" '$0 == t {f = 1; next} /^COMMIT/ {f = 0} f' "$STATE/iptables.before")"
        {
            echo "*$table"
            while IFS= read -r line; do
                [[ "$line" == "-A "* ]] && ! grep -qxF -- "$line" <<<"$before" && echo "-D ${line#-A }"
            done <<<"$now"
            while IFS= read -r line; do
                [[ "$line" == :* ]] || continue
                chain="${line%% *}"
                [[ "${line#* }" == -* ]] || continue # built-in chains have a policy
                grep -q "^$chain " <<<"$before" || printf -- '-F %s\n-X %s\n' "${chain#:}" "${chain#:}"
            done <<<"$now"
            echo COMMIT
        } | iptables-restore --noflush
        while IFS= read -r line; do
            [[ "$line" == :* && "${line#* }" != -* ]] || continue
            chain="${line%% *}" && chain="${chain#:}" && policy="$(cut -d' ' -f2 <<<"$line")"
            local was
            was="$(grep "^:$chain " <<<"$before" | cut -d' ' -f2)"
            [[ "$policy" == "${was:-ACCEPT}" ]] || iptables -t "$table" -P "$chain" "${was:-ACCEPT}"
        done <<<"$now"
    done
}

stop_dockerd() {
    local i pid link left
    say "stopping dockerd (pid $DOCKERD_PID)"
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        kill -0 "$DOCKERD_PID" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
        say "dockerd ignored SIGTERM for 30 s: SIGKILL"
        kill -KILL "$DOCKERD_PID" 2>/dev/null || true
    fi
    wait "$DOCKERD_PID" 2>/dev/null || true
    # Its containerd stops with it; anything of the engine that is new and still there is ours.
    for ((i = 0; i < 50; i++)); do
        left="$(comm -13 "$STATE/pids.before" <(engine_pids))"
        [[ -z "$left" ]] && break
        sleep 0.2
    done
    for link in $(comm -13 "$STATE/links.before" <(links_now)); do
        case "$link" in docker0 | br-* | veth*) ip link delete "$link" 2>/dev/null || true ;; esac
    done
    remove_added_iptables
    cat "$STATE/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
    say "dockerd stopped; removed what it added (bridges, iptables rules and chains;" \
        "ip_forward back to $(cat /proc/sys/net/ipv4/ip_forward))"
    if [[ -n "$left" ]]; then
        say "FAILED: engine processes left: $(ps -o pid=,args= -p "${left//$'\n'/,}" || true)"
        return 1
    fi
    local links_left rules_left
    links_left="$(comm -13 "$STATE/links.before" <(links_now) | tr '\n' ' ')"
    rules_left="$(comm -13 <(iptables_rules <"$STATE/iptables.before") \
        <(iptables-save | iptables_rules) | tr '\n' ' ')"
    if [[ -n "$links_left$rules_left" ]]; then
        say "FAILED: left behind: links '$links_left', iptables '$rules_left'"
        return 1
    fi
}

compose() {
    "${COMPOSE[@]}" "$@"
}

# project_leftovers: containers, networks and volumes of the check's compose project.
project_leftovers() {
    local label="label=com.docker.compose.project=$PROJECT"
    echo "$("$DOCKER" ps -aq --filter "$label" | wc -l) containers," \
        "$("$DOCKER" network ls -q --filter "$label" | wc -l) networks," \
        "$("$DOCKER" volume ls -q --filter "$label" | wc -l) volumes"
}

cleanup() {
    local rc=$? ok=1
    trap - EXIT INT TERM
    if [[ -n "$CHILD" ]]; then
        kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
    fi
    [[ -z "$HELPER" ]] || "$DOCKER" rm -f "$HELPER" >/dev/null 2>&1 || true
    if ((UP)); then
        ((PASSED)) || compose logs --no-color >"$STATE/services.log" 2>&1 || true
        say "down -v"
        compose down -v --remove-orphans >>"$STATE/compose.log" 2>&1 || ok=0
        left="$(project_leftovers)"
        say "down -v left: $left"
        [[ "$left" == "0 containers, 0 networks, 0 volumes" ]] || ok=0
    fi
    if [[ -n "$WHEEL_PID" ]]; then
        kill "$WHEEL_PID" 2>/dev/null || true
        wait "$WHEEL_PID" 2>/dev/null || true
    fi
    if [[ -n "$DOCKERD_PID" ]]; then
        stop_dockerd || ok=0
    fi
    if ((rc == 0 && ok)); then
        say "PASSED in $((SECONDS - STARTED)) s"
    else
        say "FAILED (logs in $STATE) after $((SECONDS - STARTED)) s"
        ((rc)) || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A command that fails outside a check of its own says where (set -e then ends the check).
trap 'say "FAILED: line $LINENO: $BASH_COMMAND (exit status $?)"' ERR

if "$DOCKER" info >/dev/null 2>&1; then
    say "using the Docker daemon that answers ($("$DOCKER" version --format '{{.Server.Version}}'))"
else
    start_dockerd
fi
if "$DOCKER" compose version >/dev/null 2>&1; then
    COMPOSE=("$DOCKER" compose)
else
    COMPOSE=(docker-compose)
fi
say "engine $("$DOCKER" version --format '{{.Server.Version}}'), compose: ${COMPOSE[*]}" \
    "$("${COMPOSE[@]}" version --short 2>/dev/null || true)"
COMPOSE+=(-f "$REPO_ROOT/docker/compose.yaml" -p "$PROJECT")
if [[ -n "$(project_leftovers | grep -v '^0 containers, 0 networks, 0 volumes$' || true)" ]]; then
    say "a previous run left $(project_leftovers): down -v first"
    compose down -v --remove-orphans >>"$STATE/compose.log" 2>&1
fi

# ------------------------------------------------------------------------------------- images

env_default() { sed -n "s/^$1=//p" "$REPO_ROOT/docker/.env"; }

# have_image NAME: present here, or pulled now.
have_image() {
    "$DOCKER" image inspect "$1" >/dev/null 2>&1 && return 0
    local why
    if why="$(timeout 120 "$DOCKER" pull -q "$1" 2>&1)"; then
        return 0
    fi
    PULL_ERROR="$(tail -n 1 <<<"$why")"
    return 1
}

BASE=local/debian:bookworm
build_base() {
    "$DOCKER" image inspect "$BASE" >/dev/null 2>&1 && return 0
    local mirror root
    mirror="$(sed -n 's/^URIs: *\([^ ]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 1p)"
    [[ -n "$mirror" ]] ||
        mirror="$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    root="$STATE/rootfs"
    rm -rf "$root"
    say "building $BASE: debootstrap --variant=minbase bookworm from $mirror"
    nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$STATE/debootstrap.log" 2>&1 ||
        die "debootstrap failed (see $STATE/debootstrap.log)"
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$BASE" >/dev/null
    rm -rf "$root"
}

# standin NAME TAG [CONTEXT...]: docker/standins/NAME built FROM the base as TAG.
standin() {
    local name="$1" tag="$2"
    build_base
    if [[ "$name" == kafka ]]; then
        local libs
        libs="$("$SCRIPT_DIR/kafka_fetch.sh")"
        tar -C "$REPO_ROOT/docker/standins/kafka" -c . -C "$(dirname "$libs")" libs |
            "$DOCKER" build --force-rm --build-arg "BASE_IMAGE=$BASE" -t "$tag" - \
                >>"$STATE/build.log" 2>&1
    else
        interruptible "$DOCKER" build --force-rm --build-arg "BASE_IMAGE=$BASE" -t "$tag" \
            "$REPO_ROOT/docker/standins/$name" >>"$STATE/build.log" 2>&1
    fi || die "building the $name stand-in failed (see $STATE/build.log)"
}

images_started=$SECONDS
GRAFANA=1
declare -A STANDIN_TAG=([KAFKA_IMAGE]=local/kafka:standin [REDIS_IMAGE]=local/redis:standin
    [PROMETHEUS_IMAGE]=local/prometheus:standin [PYTHON_IMAGE]=local/python:standin)
declare -A STANDIN_DIR=([KAFKA_IMAGE]=kafka [REDIS_IMAGE]=redis [PROMETHEUS_IMAGE]=prometheus
    [PYTHON_IMAGE]=python)
for var in KAFKA_IMAGE REDIS_IMAGE PROMETHEUS_IMAGE PYTHON_IMAGE GRAFANA_IMAGE; do
    official="${!var:-$(env_default "$var")}"
    PULL_ERROR=""
    if have_image "$official"; then
        export "$var=$official"
        say "$var=$official (here)"
    elif [[ "$var" == GRAFANA_IMAGE ]]; then
        GRAFANA=0
        say "grafana: NOT STARTED: $official cannot be pulled ($PULL_ERROR) and has no stand-in;" \
            "its provisioning is checked without it (the datasource URL from the compose" \
            "network, every dashboard query against the stack's Prometheus)"
    else
        standin "${STANDIN_DIR[$var]}" "${STANDIN_TAG[$var]}"
        export "$var=${STANDIN_TAG[$var]}"
        say "$var=${!var}: stand-in for $official, which cannot be pulled ($PULL_ERROR)"
    fi
done
# The streamrank image: named after its base, so a stand-in build never replaces the real one.
STREAMRANK_IMAGE="$(env_default STREAMRANK_IMAGE)"
[[ "$PYTHON_IMAGE" == "$(env_default PYTHON_IMAGE)" ]] || STREAMRANK_IMAGE=local/streamrank
export STREAMRANK_IMAGE

WHEELS="$(DOCKER="$DOCKER" "$SCRIPT_DIR/wheelhouse.sh" "$PYTHON_IMAGE" cpu)"
# build_inputs: a hash of what the streamrank image is built from (the files its build context
# lets in, the Dockerfile, the base image's id). Even a fully cached build of it takes ~30 s
# here (the classic builder hashes the 6 GB venv for `COPY --from`); an image built from the
# same inputs (recorded next to the wheelhouse) is used as it is.
build_inputs() {
    (
        cd "$REPO_ROOT"
        find pyproject.toml README.md pipeline model schemas docker/init.sh docker/Dockerfile \
            docker/Dockerfile.dockerignore \
            -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
        "$DOCKER" image inspect --format '{{.Id}}' "$PYTHON_IMAGE"
    ) | sha256sum | cut -d' ' -f1
}
BUILD_STAMP="$WHEELS/.image-$(tr '/:' '__' <<<"$STREAMRANK_IMAGE")"
inputs="$(build_inputs)"
image_id="$("$DOCKER" image inspect --format '{{.Id}}' "$STREAMRANK_IMAGE:cpu" 2>/dev/null || true)"
build_started=$SECONDS
if [[ -n "$image_id" && "$(cat "$BUILD_STAMP" 2>/dev/null)" == "$image_id $inputs" ]]; then
    say "$STREAMRANK_IMAGE:cpu is built from these sources already (${image_id:7:12})"
else
    # The host's address on the default bridge, where `docker build`'s containers run.
    bridge="$("$DOCKER" network inspect bridge \
        --format '{{index .Options "com.docker.network.bridge.name"}}')"
    gateway="$(ip -4 -o addr show dev "${bridge:-docker0}" | awk '{print $4}' | cut -d/ -f1 | sed -n 1p)"
    [[ -n "$gateway" ]] || die "no IPv4 address on the docker bridge ${bridge:-docker0}"
    python3 -m http.server "$WHEEL_PORT" --bind "$gateway" --directory "$WHEELS" \
        >"$STATE/wheelhouse-server.log" 2>&1 3>&- &
    WHEEL_PID=$!
    say "building $STREAMRANK_IMAGE:cpu FROM $PYTHON_IMAGE (packages from $WHEELS," \
        "served on http://$gateway:$WHEEL_PORT/)"
    # v1's classic builder keeps the containers of failed steps unless told (v2 removes them).
    force_rm=()
    [[ "${COMPOSE[0]}" == docker-compose ]] && force_rm=(--force-rm)
    interruptible "${COMPOSE[@]}" build "${force_rm[@]}" --build-arg PIP_NO_INDEX=1 \
        --build-arg "PIP_FIND_LINKS=http://$gateway:$WHEEL_PORT/" \
        --build-arg "PIP_TRUSTED_HOST=$gateway:$WHEEL_PORT" scorer >>"$STATE/build.log" 2>&1 ||
        die "building the streamrank image failed (see $STATE/build.log)"
    kill "$WHEEL_PID" && wait "$WHEEL_PID" 2>/dev/null || true
    WHEEL_PID=""
    echo "$("$DOCKER" image inspect --format '{{.Id}}' "$STREAMRANK_IMAGE:cpu") $inputs" >"$BUILD_STAMP"
fi
say "streamrank image ready in $((SECONDS - build_started)) s; all images in" \
    "$((SECONDS - images_started)) s:"
for image in "$KAFKA_IMAGE" "$REDIS_IMAGE" "$PROMETHEUS_IMAGE" "$PYTHON_IMAGE" \
    "$STREAMRANK_IMAGE:cpu" "$BASE"; do
    "$DOCKER" image inspect "$image" >/dev/null 2>&1 || continue
    printf '    %-32s %s MB\n' "$image" \
        "$(($("$DOCKER" image inspect --format '{{.Size}}' "$image") / 1000000))"
done

# ------------------------------------------------------------------------------------ the stack

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export PROMETHEUS_HOST_PORT GRAFANA_HOST_PORT
PROMETHEUS_HOST_PORT="$(free_port)"
GRAFANA_HOST_PORT="$(free_port)"
export DELIVERY_GUARANTEE="$GUARANTEE" PRODUCER_RATE="$RATE" PRODUCER_EVENTS=1000000
export PRODUCER_MALFORMED=$((PRODUCER_EVENTS / 1000)) # one in 1,000: under the DLQ alert's 1%
export STREAMRANK_NPROC="$NPROC" INIT_EVENTS="$TRAIN_EVENTS"
services=()
((GRAFANA)) || services=(kafka redis init scorer producer prometheus)

say "up -d --scale scorer=$REPLICAS ($NPROC ranks each, $GUARANTEE, producer at $RATE events/s;" \
    "Prometheus on 127.0.0.1:$PROMETHEUS_HOST_PORT)"
UP=1
up_started=$SECONDS
up_started_at="$(date +%s.%N)"
interruptible "${COMPOSE[@]}" up -d --scale "scorer=$REPLICAS" "${services[@]}" \
    >>"$STATE/compose.log" 2>&1 ||
    die "up failed: $(tail -n 5 "$STATE/compose.log")"
say "up in $((SECONDS - up_started)) s: $(compose ps --services --filter status=running 2>/dev/null |
    tr '\n' ' ' || true)"

# audit ARGS: scripts/compose_audit.py in a one-off container of the init service (the
# streamrank image and settings, on the compose network, the repository at /src), started once.
start_helper() {
    HELPER="$PROJECT-audit"
    "$DOCKER" rm -f "$HELPER" >/dev/null 2>&1 || true
    interruptible "${COMPOSE[@]}" run -d --no-deps --name "$HELPER" -v "$REPO_ROOT:/src:ro" \
        -v "$WHEELS:/wheels:ro" -e PYTHONPATH=/src:/tmp/deps -e PYTHONDONTWRITEBYTECODE=1 \
        --entrypoint sleep init infinity >>"$STATE/compose.log" 2>&1 ||
        die "could not start the audit container"
    # PyYAML for tests/docker/promql.py (the alert rules), from the wheelhouse; not in the image.
    "$DOCKER" exec "$HELPER" pip install -q --target /tmp/deps --no-index --find-links /wheels \
        pyyaml >>"$STATE/audit.log" 2>&1 || die "could not install PyYAML in the audit container"
}
audit() {
    interruptible "$DOCKER" exec "$HELPER" python /src/scripts/compose_audit.py "$@" \
        2>>"$STATE/audit.log"
}

replica_ids() { compose ps -q scorer; }
replica_ips() {
    local id
    for id in $(replica_ids); do
        "$DOCKER" inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$id"
    done
}
replica_args() {
    local ip
    printf -- '--ranks %s ' "$NPROC"
    for ip in $(replica_ips); do printf -- '--replica %s ' "$ip"; done
}

start_helper
# Generous: niced under other engineers' load (load average 26), 4 ranks took 311 s to start.
audit group --members $((REPLICAS * NPROC)) --since "$up_started_at" --timeout 600 ||
    die "the replicas never shared the partitions"
sleep "$PHASE_S"

# The rollout of docs/compose.md.
C=(run --rm --no-deps -T scorer)
first="$(compose "${C[@]}" model list --json 2>>"$STATE/compose.log")"
current() { python3 -c 'import json, sys; print(json.load(sys.stdin)["current"])'; }
v1="$(current <<<"$first")"
# shellcheck disable=SC2046  # one --replica IP per replica
audit versions --expect "$v1" $(replica_args) || die "the replicas do not serve $v1"
say "rollout: init-model --events $TRAIN_EVENTS --seed 7 in a one-off scorer container"
rollout_started=$SECONDS
interruptible "${COMPOSE[@]}" "${C[@]}" init-model --events "$TRAIN_EVENTS" --seed 7 \
    >>"$STATE/compose.log" 2>&1 ||
    die "init-model failed (see $STATE/compose.log)"
v2="$(compose "${C[@]}" model list --json 2>>"$STATE/compose.log" | python3 -c '
import json, sys
listing = json.load(sys.stdin)
names = [v["version"] for v in listing["versions"]]  # oldest first
print(next(n for n in reversed(names) if n != listing["current"]))')"
say "rollout: trained $v2 in $((SECONDS - rollout_started)) s; model promote $v2"
promoted="$(date +%s.%N)"
compose "${C[@]}" model promote "$v2" >>"$STATE/compose.log" 2>&1 || die "promote failed"
# shellcheck disable=SC2046
audit versions --expect "$v2" --since "$promoted" $(replica_args) ||
    die "not every replica switched to $v2"
say "versions switched: $v1 -> $v2 on $REPLICAS/$REPLICAS replicas"
sleep "$PHASE_S"

# One replica killed while events flow.
victim="$(replica_ids | sed -n 1p)" # sed reads it all: no SIGPIPE under pipefail
victim_name="$("$DOCKER" inspect --format '{{.Name}}' "$victim")"
say "kill: docker kill ${victim_name#/} (SIGKILL to every process of the replica)"
killed="$(date +%s.%N)"
"$DOCKER" kill "$victim" >/dev/null
audit group --members "$NPROC" --since "$killed" --timeout 120 ||
    die "the other replica did not take the partitions"
sleep "$PHASE_S"
say "kill: docker start ${victim_name#/} (same container: same client id, transactional.id)"
restarted="$(date +%s.%N)"
"$DOCKER" start "$victim" >/dev/null
audit group --members $((REPLICAS * NPROC)) --since "$restarted" --timeout 400 ||
    die "the killed replica did not rejoin"
sleep "$PHASE_S"

# Prometheus, with traffic flowing.
# shellcheck disable=SC2046
audit prometheus $(replica_args) || die "Prometheus checks"
ready="$(timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$1; printf "GET /-/ready HTTP/1.0\r\n\r\n" >&3; head -n 1 <&3' \
    _ "$PROMETHEUS_HOST_PORT" | tr -d '\r' || true)"
say "Prometheus from the host (127.0.0.1:$PROMETHEUS_HOST_PORT/-/ready): ${ready:-no answer}"
[[ "$ready" == *" 200 "* ]] || die "the published Prometheus port does not answer"
if ((!GRAFANA)); then
    datasource="$(sed -n 's/^ *url: *//p' "$REPO_ROOT/docker/grafana/provisioning/datasources/prometheus.yml")"
    "$DOCKER" exec "$HELPER" python -c \
        "import urllib.request; urllib.request.urlopen('$datasource/-/ready', timeout=10)" \
        >>"$STATE/audit.log" 2>&1 || die "Grafana's datasource $datasource does not answer"
    say "grafana (not started): its datasource $datasource answers on the compose network"
fi

# The end: the producer stops, the group drains, the topics are read back.
say "stopping the producer; waiting for the group to drain"
compose stop producer >>"$STATE/compose.log" 2>&1
audit drained --timeout 300 || die "the group did not drain the input"
audit final --guarantee "$GUARANTEE" || die "the audit found events lost, repeated or misrouted"
PASSED=1
