#!/usr/bin/env sh
# Create the secrets the stack reads (files under secrets/, never committed) and the two NATS
# passwords in .env (git-ignored), from which the NATS servers read them. Existing secrets are
# kept; other lines of .env are kept. Files stay private to you (mode 600): the Continuum
# containers copy their secrets for their own user when they start (continuum-entrypoint.sh).
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
for name in nats-router-password nats-listener-password admin-token salt-secret; do
  # A letter first: nats-server reads the passwords as config values from the environment, and
  # one starting with a digit ("5a3f...") fails to parse as a number.
  [ -s "secrets/$name" ] || { printf 'k'; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; } > "secrets/$name"
  chmod 600 "secrets/$name"
done
touch .env
{
  grep -v -e '^NATS_ROUTER_PASSWORD=' -e '^NATS_LISTENER_PASSWORD=' .env || true
  printf 'NATS_ROUTER_PASSWORD=%s\nNATS_LISTENER_PASSWORD=%s\n' \
    "$(cat secrets/nats-router-password)" "$(cat secrets/nats-listener-password)"
} > .env.new
mv .env.new .env
chmod 700 secrets
chmod 600 .env
echo "secrets written to $(pwd)/secrets and .env"
