#!/usr/bin/env bash
# Certificates and credentials for a secure local stack (scripts/stack_up.sh --secure).
#
# Usage: scripts/stack_tls.sh STACK_DIR
#
# Writes, fresh on every call (nothing is reused between stacks):
#   STACK_DIR/tls/ca.pem          a throw-away CA (clients trust it: ssl.ca.location,
#                                 redis ssl_ca_certs)
#   STACK_DIR/tls/ca.key          its key (kept only to inspect the chain; mode 600)
#   STACK_DIR/tls/server.pem      the servers' certificate, signed by the CA, for
#                                 IP:127.0.0.1 and DNS:localhost (hostnames are verified)
#   STACK_DIR/tls/server.key      its private key (PKCS#8, unencrypted, mode 600)
#   STACK_DIR/tls/kafka.pem       key + certificate in one file: Kafka's PEM keystore
#   STACK_DIR/secrets             shell syntax, mode 600: KAFKA_ADMIN_USER/_PASSWORD (the
#                                 broker's own SCRAM login), KAFKA_CLIENT_USER/_PASSWORD (the
#                                 pipeline's) and REDIS_PASSWORD; random, hex
# Only openssl is needed. Passwords never appear on a command line of this script.
set -euo pipefail

die() { echo "stack_tls: ERROR: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: stack_tls.sh STACK_DIR"
command -v openssl >/dev/null 2>&1 || die "openssl is required for a secure stack"
STACK_DIR="$(cd "$1" && pwd)"
TLS="$STACK_DIR/tls"
DAYS=30

umask 077
rm -rf "$TLS"
mkdir -p "$TLS"

openssl req -x509 -newkey rsa:2048 -nodes -days "$DAYS" -sha256 \
    -subj "/CN=streamrank local stack CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null ||
    die "could not create the CA"

openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" \
    -keyout "$TLS/server.key" -out "$TLS/server.csr" 2>/dev/null ||
    die "could not create the server key"
cat >"$TLS/server.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EOF
openssl x509 -req -in "$TLS/server.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" \
    -CAcreateserial -days "$DAYS" -sha256 -extfile "$TLS/server.ext" \
    -out "$TLS/server.pem" 2>/dev/null || die "could not sign the server certificate"
openssl verify -CAfile "$TLS/ca.pem" "$TLS/server.pem" >/dev/null ||
    die "the server certificate does not verify against the CA"
rm -f "$TLS/server.csr" "$TLS/server.ext" "$TLS/ca.srl"

# Kafka's PEM keystore: the private key (PKCS#8) followed by the certificate chain.
cat "$TLS/server.key" "$TLS/server.pem" "$TLS/ca.pem" >"$TLS/kafka.pem"
# The CA and certificates are public: let other users' clients read them.
chmod 644 "$TLS/ca.pem" "$TLS/server.pem"
chmod 755 "$TLS"

secret() { openssl rand -hex 24; }
cat >"$STACK_DIR/secrets" <<EOF
KAFKA_ADMIN_USER=admin
KAFKA_ADMIN_PASSWORD=$(secret)
KAFKA_CLIENT_USER=streamrank
KAFKA_CLIENT_PASSWORD=$(secret)
REDIS_PASSWORD=$(secret)
EOF
chmod 600 "$STACK_DIR/secrets"
