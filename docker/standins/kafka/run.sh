#!/usr/bin/env bash
# Entry point of the Kafka stand-in image (Dockerfile here): a KRaft node configured by
# environment variables, as the official apache/kafka image does it:
#   KAFKA_<NAME> becomes the property <name> lower-cased, with `_` -> `.`, `__` -> `_` and
#   `___` -> `-` (KAFKA_NODE_ID=1 -> node.id=1; KAFKA_LISTENER_SECURITY_PROTOCOL_MAP ->
#   listener.security.protocol.map); the JVM's variables (KAFKA_HEAP_OPTS, KAFKA_OPTS, ...) are
#   not properties. log.dirs defaults to /var/lib/kafka/data, CLUSTER_ID to a fixed id; the
#   storage is formatted once (--ignore-formatted), then the broker runs in the foreground.
set -euo pipefail

LIBS='/opt/kafka/libs/*'
CONFIG=/tmp/server.properties
JVM_VARS=" KAFKA_HEAP_OPTS KAFKA_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_LOG4J_OPTS KAFKA_JMX_OPTS \
KAFKA_GC_LOG_OPTS KAFKA_DEBUG KAFKA_VERSION KAFKA_JMX_PORT KAFKA_JMX_HOSTNAME "

# property_name VAR: the property an environment variable KAFKA_... sets.
property_name() {
    local name="${1#KAFKA_}"
    name="${name,,}"
    name="${name//___/-}"
    name="${name//__/$'\x01'}"
    name="${name//_/.}"
    echo "${name//$'\x01'/_}"
}

: >"$CONFIG"
while IFS= read -r var; do
    [[ "$JVM_VARS" == *" $var "* ]] && continue
    echo "$(property_name "$var")=${!var}" >>"$CONFIG"
done < <(compgen -e | grep '^KAFKA_' | sort)
grep -q '^log\.dirs=' "$CONFIG" || echo "log.dirs=/var/lib/kafka/data" >>"$CONFIG"

JAVA_OPTS=(-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties)
java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC "${JAVA_OPTS[@]}" -cp "$LIBS" \
    kafka.tools.StorageTool format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$CONFIG" \
    --ignore-formatted
# shellcheck disable=SC2086  # lists of JVM flags
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} \
    ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35} \
    ${KAFKA_OPTS:-} -Djava.awt.headless=true "${JAVA_OPTS[@]}" -cp "$LIBS" kafka.Kafka "$CONFIG"
