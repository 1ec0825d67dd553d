"""The route-history benchmark (bench/continuum_bench/route_history.py) on a small history: a
real nats-server, a real `continuum-router serve` process that replays every message."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from continuum_bench.route_history import config, fill, start_once
from continuum_common.procs import NatsServer


async def test_an_ingress_replays_the_whole_history_and_answers_meanwhile(tmp_path: Path) -> None:
    args = argparse.Namespace(conversations=30, turns=3, chunks_per_turn=5, blocks_per_turn=10, spread=60.0, seed=2)
    server = NatsServer(data_dir=tmp_path / "nats")
    await server.start()
    try:
        count, size = await fill(server.url, args)
        assert count == 2 * 30 * 3 and size > 0
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(config(server.url)))
        run = await start_once(path, {**os.environ, "CONTINUUM_LOG_LEVEL": "INFO"}, probe_ms=5.0)
    finally:
        await server.close()
    assert run["messages"] == count
    assert run["probes"] >= 1 and run["max_ms"] > 0
