#!/bin/sh
# Entrypoint of the Continuum image.
#
# Started as a non-root user (the image's default, and every Kubernetes pod): runs the command.
# Started as root (the compose stack does so): copies each file under /run/host-secrets (Docker
# secrets bind-mounted with their host owner and mode, e.g. 0600 owned by whoever ran
# init-secrets.sh, which uid 10001 cannot read) to /run/secrets as a 0400 file of the service
# user, then runs the command as that user. Docker cannot give a file secret another owner or
# mode outside Swarm; a copy keeps the host files private and needs no host-side chown.
# /run/secrets is a tmpfs in the compose file, so the copies never touch a disk.
set -eu
SERVICE_USER=continuum
if [ "$(id -u)" = 0 ]; then
  if [ -d /run/host-secrets ]; then
    for src in /run/host-secrets/*; do
      [ -f "$src" ] || continue
      install -m 0400 -o "$SERVICE_USER" -g "$SERVICE_USER" "$src" "/run/secrets/$(basename "$src")"
    done
  fi
  exec setpriv --reuid="$SERVICE_USER" --regid="$SERVICE_USER" --init-groups --inh-caps=-all -- "$@"
fi
exec "$@"
