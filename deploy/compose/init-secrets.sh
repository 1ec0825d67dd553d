#!/usr/bin/env sh
# Create the secrets the stack reads (files under secrets/, never committed) and the .env the
# NATS servers read their user passwords from.
set -eu
cd "$(dirname "$0")"
mkdir -p secrets
for name in nats-router-password nats-listener-password admin-token salt-secret; do
  [ -s "secrets/$name" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "secrets/$name"
done
printf 'NATS_ROUTER_PASSWORD=%s\nNATS_LISTENER_PASSWORD=%s\n' \
  "$(cat secrets/nats-router-password)" "$(cat secrets/nats-listener-password)" > .env
chmod 600 secrets/* .env
echo "secrets written to $(pwd)/secrets and .env"
