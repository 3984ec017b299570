#!/usr/bin/env bash
# Fetch the Apache Kafka broker classpath from Maven Central (no tarball, no
# Docker) and cache it for reuse across runs.
#
# Usage: scripts/kafka_fetch.sh
#   Prints the absolute path of the libs dir (one line on stdout; everything
#   else goes to stderr), e.g. ~/.cache/streamrank/kafka-4.1.1/libs
#
# Environment:
#   STREAMRANK_CACHE_DIR  cache root (default: $HOME/.cache/streamrank)
#   MAVEN_OPTS            passed to Maven as usual, e.g.
#                         MAVEN_OPTS=-Dmaven.repo.local=/some/m2 to use another
#                         local repository
#
# Idempotent: a stamp file (holding a hash of pom.xml) marks a complete fetch;
# when it matches, nothing is downloaded. A changed pom.xml triggers a refetch.
# Concurrent callers are serialised with flock.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/kafka/pom.xml"

# The Kafka version is the <kafka.version> property of pom.xml.
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n1)"
if [[ -z "$KAFKA_VERSION" ]]; then
    echo "kafka_fetch: cannot read <kafka.version> from $POM" >&2
    exit 1
fi

CACHE_ROOT="${STREAMRANK_CACHE_DIR:-$HOME/.cache/streamrank}"
KAFKA_HOME="$CACHE_ROOT/kafka-$KAFKA_VERSION"
LIBS_DIR="$KAFKA_HOME/libs"
STAMP="$KAFKA_HOME/.fetched"
POM_HASH="$(sha256sum "$POM" | cut -d' ' -f1)"

mkdir -p "$KAFKA_HOME"

# Serialise concurrent fetches (e.g. two stacks started at the same time).
exec 8>"$KAFKA_HOME/.lock"
flock 8

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$POM_HASH" && -d "$LIBS_DIR" ]]; then
    echo "$LIBS_DIR"
    exit 0
fi

if ! command -v mvn >/dev/null 2>&1; then
    echo "kafka_fetch: mvn (Apache Maven) is required but not on PATH" >&2
    exit 1
fi

echo "kafka_fetch: fetching Kafka $KAFKA_VERSION jars into $LIBS_DIR ..." >&2
# Copy into a scratch dir first, then swap it in, so an interrupted fetch
# never leaves a half-filled libs dir behind a valid stamp.
TMP_LIBS="$KAFKA_HOME/libs.tmp.$$"
rm -rf "$TMP_LIBS"
trap 'rm -rf "$TMP_LIBS"' EXIT
mvn -q -B -f "$POM" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$TMP_LIBS" >&2

if ! compgen -G "$TMP_LIBS/kafka_2.13-*.jar" >/dev/null; then
    echo "kafka_fetch: Maven finished but no kafka_2.13 jar in $TMP_LIBS" >&2
    exit 1
fi

rm -rf "$LIBS_DIR" "$STAMP"
mv "$TMP_LIBS" "$LIBS_DIR"
echo "$POM_HASH" >"$STAMP"
echo "kafka_fetch: $(find "$LIBS_DIR" -name '*.jar' | wc -l) jars cached" >&2
echo "$LIBS_DIR"
