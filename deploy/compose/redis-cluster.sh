#!/bin/sh
# Creates the Redis Cluster of the compose stack once, then keeps it formed.
#
# Redis Cluster nodes reach each other by IP address and keep their peers' addresses in
# nodes.conf. A container that restarts may come back with another address; after
# `docker compose stop && docker compose start` every node does, and no node can reach any
# other at the addresses it remembers. Every few seconds this loop resolves each node's service
# name and, where a node remembers a peer (named by its announced hostname) at another address,
# sends that node CLUSTER MEET with the current one: the node recognises the peer's ID at the
# new address and updates it.
#
# REDIS_NODES: the nodes' service names (port 6379), each started with
# --cluster-announce-hostname <its service name>.
set -u
NODES=${REDIS_NODES:?REDIS_NODES names the cluster nodes}
PORT=6379
INTERVAL=${REDIS_CLUSTER_INTERVAL:-2}

log() { echo "redis-cluster: $*"; }
address() { getent hosts "$1" | awk '{ print $1; exit }'; }
cli() { timeout 5 redis-cli -h "$@"; }

all_up() {
  for node in $NODES; do
    [ "$(cli "$node" ping 2>/dev/null)" = PONG ] || return 1
  done
}

# A node that holds no slots and knows no peer has never been part of a cluster.
all_empty() {
  for node in $NODES; do
    info=$(cli "$node" cluster info) || return 1
    echo "$info" | grep -q '^cluster_slots_assigned:0' || return 1
    echo "$info" | grep -q '^cluster_known_nodes:1' || return 1
  done
}

create() {
  targets=""
  for node in $NODES; do
    ip=$(address "$node")
    [ -n "$ip" ] || return 1
    targets="$targets $ip:$PORT"
  done
  log "creating the cluster:$targets"
  # shellcheck disable=SC2086
  redis-cli --cluster create $targets --cluster-replicas 0 --cluster-yes
}

# For every node: each peer it remembers at an address other than the peer's current one.
heal() {
  for node in $NODES; do
    view=$(cli "$node" cluster nodes 2>/dev/null) || continue
    for peer in $NODES; do
      [ "$peer" = "$node" ] && continue
      ip=$(address "$peer")
      [ -n "$ip" ] || continue
      # a line's second field is ip:port@cport,hostname
      known=$(echo "$view" | awk -v h="$peer" '{ n = split($2, a, ","); if (n > 1 && a[2] == h) { split(a[1], b, ":"); print b[1] } }')
      if [ -n "$known" ] && [ "$known" != "$ip" ]; then
        log "$node remembers $peer at $known, now $ip: CLUSTER MEET"
        cli "$node" cluster meet "$ip" "$PORT" >/dev/null || true
      fi
    done
  done
}

# PID 1 of its container: stop at once on `docker compose stop` (sleeps are waited for in the
# background, so the trap runs without waiting for them to end).
trap 'exit 0' TERM INT
pause() { sleep "$1" & wait $!; }

until all_up; do pause 1; done
if all_empty; then
  create || { log "cluster create failed"; exit 1; }
fi
while :; do
  heal
  pause "$INTERVAL"
done
