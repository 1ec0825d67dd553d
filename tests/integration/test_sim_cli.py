"""`continuum-sim-engine` as a real process: several engines, the info file, and a crash-like kill."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from continuum_bench.fleet.runner import RssSampler
from continuum_sim import EngineConfig, SimFleet, TimingConfig
from continuum_sim.cli import build_parser, configs_from_args
from continuum_sim.errors import SimConfigError


async def test_process_fleet_serves_and_can_be_killed() -> None:
    config = EngineConfig(num_gpu_blocks=2048, max_model_len=2048, timing=TimingConfig(time_scale=0.001))
    fleet = SimFleet(2, config=config, process=True)
    async with fleet:
        assert fleet.pid is not None and fleet.engines == []
        assert len({e.url for e in fleet.endpoints}) == 2
        assert len({e.kv_events_endpoint for e in fleet.endpoints}) == 2
        async with httpx.AsyncClient(timeout=10) as http:
            for endpoint in fleet.endpoints:
                resp = await http.post(
                    endpoint.openai_base_url + "/completions", json={"prompt": "hi", "max_tokens": 3}
                )
                assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
            await fleet.kill()
            with pytest.raises(httpx.ConnectError):
                await http.get(fleet.urls[0] + "/health")


async def test_fleet_with_a_process_per_engine(tmp_path: Path) -> None:
    config = EngineConfig(num_gpu_blocks=2048, max_model_len=2048, timing=TimingConfig(time_scale=0.001))
    fleet = SimFleet(3, config=config, process="each")
    async with fleet:
        assert len(set(fleet.pids)) == 3 and fleet.pid == fleet.pids[0] and fleet.engines == []
        assert [e.name for e in fleet.endpoints] == ["sim-0", "sim-1", "sim-2"]
        fleet.write_info(tmp_path / "fleet.json")
        info = json.loads((tmp_path / "fleet.json").read_text())
        assert info["pids"] == fleet.pids and info["pid"] == fleet.pids[0] and len(info["engines"]) == 3
        sampler = RssSampler(fleet.pids)
        sampler.sample()
        one = RssSampler(fleet.pids[:1])
        one.sample()
        assert sampler.samples[0] > 2 * one.samples[0]  # the sum over three processes of about one size
        async with httpx.AsyncClient(timeout=10) as http:
            for endpoint in fleet.endpoints:
                resp = await http.post(
                    endpoint.openai_base_url + "/completions", json={"prompt": "hi", "max_tokens": 2}
                )
                assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
            pids = fleet.pids
            await fleet.kill()
            assert fleet.pids == []
            for url in fleet.urls:
                with pytest.raises(httpx.ConnectError):
                    await http.get(url + "/health")
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_cli_port_layout() -> None:
    args = build_parser().parse_args(
        ["--count", "3", "--base-port", "8100", "--zmq-base-port", "5600", "--kv-events-era", "array"]
    )
    configs = configs_from_args(args)
    assert [c.port for c in configs] == [8100, 8101, 8102]
    assert [c.kv_events.endpoint for c in configs] == [
        "tcp://127.0.0.1:5600",
        "tcp://127.0.0.1:5602",
        "tcp://127.0.0.1:5604",
    ]
    assert [c.kv_events.replay_endpoint for c in configs] == [
        "tcp://127.0.0.1:5601",
        "tcp://127.0.0.1:5603",
        "tcp://127.0.0.1:5605",
    ]
    assert {c.kv_events.era for c in configs} == {"array"} and [c.name for c in configs] == ["sim-0", "sim-1", "sim-2"]
    bad = build_parser().parse_args(["--zmq-mode", "connect", "--zmq-base-port", "0"])
    with pytest.raises(SimConfigError):
        configs_from_args(bad)
    with pytest.raises(SimConfigError):
        EngineConfig(num_gpu_blocks=10, max_model_len=4096)


def test_cli_reports_a_port_in_use_and_exits() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "continuum_sim", "--base-port", "0", "--zmq-base-port", str(port)],
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot open its ZMQ sockets" in proc.stderr and "Address already in use" in proc.stderr
