#!/usr/bin/env bash
# The Kafka stand-in's `kafka-broker-api-versions.sh --bootstrap-server HOST:PORT`, which the
# compose file's health check runs: sends the broker an ApiVersions request (Kafka protocol,
# version 0), the request the official tool makes, and exits 0 when the broker answers it
# without error. Plain bash over /dev/tcp: no JVM start every few seconds (the official tool,
# org.apache.kafka.tools, is not among the broker jars of scripts/kafka_fetch.sh anyway). It
# prints the answer's size and error code, not the API list. Other arguments are ignored.
set -euo pipefail

bootstrap=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bootstrap-server) bootstrap="${2:-}"; shift 2 ;;
        --bootstrap-server=*) bootstrap="${1#*=}"; shift ;;
        *) shift ;;
    esac
done
[[ "$bootstrap" == *:* ]] || { echo "usage: kafka-broker-api-versions.sh --bootstrap-server HOST:PORT" >&2; exit 2; }
host="${bootstrap%%,*}"
port="${host##*:}"
host="${host%:*}"

exec 3<>"/dev/tcp/$host/$port"
# size 11 | api_key 18 (ApiVersions) | api_version 0 | correlation_id 1 | client_id "h"
printf '\x00\x00\x00\x0b\x00\x12\x00\x00\x00\x00\x00\x01\x00\x01h' >&3
# size (4 bytes) | correlation_id (4) | error_code (2)
read -r -a answer < <(timeout 10 head -c 10 <&3 | od -An -v -tu1)
exec 3<&-
[[ ${#answer[@]} -eq 10 ]] || { echo "no ApiVersions answer from $bootstrap" >&2; exit 1; }
error=$((answer[8] * 256 + answer[9]))
size=$(((answer[0] << 24) + (answer[1] << 16) + (answer[2] << 8) + answer[3]))
echo "$bootstrap: ApiVersions answer of $size bytes, error code $error"
[[ "$answer" && "${answer[4]}${answer[5]}${answer[6]}${answer[7]}" == 0001 && $error -eq 0 ]]
