"""What scripts/compose-smoke asks from inside the stack: it runs in a Continuum container
(`docker compose exec -T ingress python - < compose_smoke_probe.py`), reaches the services by
their compose names, and prints one JSON object.

* `jetstream`: per stream (CONTINUUM_KV and the listeners' heartbeat bucket) the configured
  replica count, the leader and every follower's state (current, offline, seconds since the
  leader last heard from it), as the stream leader reports them;
* `heartbeats`: the backends whose listener heartbeat is in the bucket;
* `indexers`: HTTP status of each indexer's /healthz.

Standard library plus what the image installs (nats-py, PyYAML); every call has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import nats
import yaml

STREAMS = ("CONTINUUM_KV", "KV_continuum_listeners")
BUCKET = "continuum_listeners"
INDEXERS = ("indexer-1:9102", "indexer-2:9102")
ROUTER_CONFIG = Path("/etc/continuum/router.yaml")


def stream_state(info: Any) -> dict[str, Any]:
    cluster = info.cluster
    followers = [] if cluster is None else list(cluster.replicas or [])
    return {
        "replicas": info.config.num_replicas,
        "leader": None if cluster is None else cluster.leader,
        "followers": [
            # active: seconds since the leader last heard from the follower
            {"name": p.name, "current": bool(p.current), "offline": bool(p.offline), "active": (p.active or 0) / 1e9}
            for p in followers
        ],
        "messages": info.state.messages,
    }


def bus_settings() -> tuple[dict[str, Any], str]:
    """The router's `bus` section and its password (read before the event loop starts)."""
    bus = yaml.safe_load(ROUTER_CONFIG.read_text())["bus"]
    return bus, Path(bus["password_file"]).read_text().strip()


async def jetstream(out: dict[str, Any], bus: dict[str, Any], password: str) -> None:
    nc = await nats.connect(
        servers=bus["url"].split(","), user=bus["user"], password=password, connect_timeout=3, max_reconnect_attempts=2
    )
    try:
        js = nc.jetstream(timeout=3)
        streams: dict[str, Any] = {}
        for name in STREAMS:
            try:
                streams[name] = stream_state(await js.stream_info(name))
            except Exception as exc:  # reported, judged by the caller
                streams[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out["jetstream"] = streams
        try:
            kv = await js.key_value(BUCKET)
            out["heartbeats"] = sorted(await kv.keys())
        except Exception as exc:
            out["heartbeats_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await nc.close()


def indexers() -> dict[str, int | str]:
    status: dict[str, int | str] = {}
    for address in INDEXERS:
        try:
            with urllib.request.urlopen(f"http://{address}/healthz", timeout=3) as response:
                status[address] = response.status
        except urllib.error.HTTPError as exc:
            status[address] = exc.code
        except OSError as exc:
            status[address] = type(exc).__name__
    return status


async def main(out: dict[str, Any], bus: dict[str, Any], password: str) -> None:
    try:
        await asyncio.wait_for(jetstream(out, bus, password), 20)
    except Exception as exc:
        out["jetstream_error"] = f"{type(exc).__name__}: {exc}"
    json.dump(out, sys.stdout)


results: dict[str, Any] = {"indexers": indexers()}
asyncio.run(main(results, *bus_settings()))
