"""The `continuum-kv-listener` console script as a real process: engine → listener →
JetStream and SSE, then SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import sysconfig
from pathlib import Path

import httpx
import nats
import yaml
import zmq
import zmq.asyncio

from continuum_common.events import STREAM_NAME, EventType, decode_event
from continuum_common.procs import NatsServer, free_port
from continuum_common.salt import make_salt
from continuum_testing.engines import EnginePublisher, batch, stored


def script() -> str:
    path = Path(sysconfig.get_path("scripts")) / "continuum-kv-listener"
    return str(path) if path.exists() else str(Path(sys.executable).parent / "continuum-kv-listener")


async def test_console_script_end_to_end(tmp_path: Path, nats_server: NatsServer) -> None:
    secret_file = tmp_path / "salt"
    secret_file.write_text("e2e-secret\n")
    zmq_port, http_port = free_port(), free_port()
    config = {
        "listen": f"127.0.0.1:{http_port}",
        "bus": {"embedded": False, "url": nats_server.url},
        "salt": {"secret_file": str(secret_file)},
        "limits": {"coalesce_window_ms": 20},
        "sources": [{"backend_name": "vllm-e2e", "engine": "vllm", "zmq_endpoint": f"tcp://127.0.0.1:{zmq_port}",
                     "topic": "kv-events", "prefix_key_mode": "salt_echo", "publish": "prefix"}],
    }  # fmt: skip
    path = tmp_path / "config.kv-listener.yaml"
    path.write_text(yaml.safe_dump(config))
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(ctx, f"tcp://127.0.0.1:{zmq_port}")
    proc = await asyncio.create_subprocess_exec(
        script(),
        "--config",
        str(path),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CONTINUUM_LOG_LEVEL": "INFO"},
    )
    try:
        await engine.wait_subscribed()
        prefix = bytes(range(32))
        salt = make_salt(b"e2e-secret", "vllm-e2e", prefix)
        await engine.send(batch([stored([1, 2, 3], None, [9] * 48, 16, salt=salt)]))
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            async with asyncio.timeout(15):
                while True:
                    try:
                        if (await js.stream_info(STREAM_NAME)).state.messages >= 2:
                            break
                    except Exception:
                        pass
                    await asyncio.sleep(0.05)
            first, second = [decode_event((await js.get_msg(STREAM_NAME, s)).data or b"") for s in (1, 2)]
            assert first.type is EventType.CLEARED and first.backend == "vllm-e2e"
            assert (second.type, second.prefix_hash, second.token_count) == (EventType.CREATED, prefix.hex(), 48)
        finally:
            await nc.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as client:
            assert (await client.get("/healthz")).json()["bus"]["connected"] is True
            async with client.stream("GET", "/events/vllm-e2e") as response:
                lines = response.aiter_lines()
                seen: list[str] = []
                async with asyncio.timeout(10):
                    async for line in lines:
                        seen.append(line)
                        if line == "event: cache_created":
                            break
                    proc.send_signal(signal.SIGTERM)
                    async for line in lines:
                        seen.append(line)
                assert "event: draining" in seen
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
        assert "e2e-secret" not in log and salt not in log  # secrets and salts never reach the log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await engine.close()
        ctx.destroy(linger=0)


async def test_console_script_reports_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"backend_name": "t", "engine": "trtllm", "publish": "prefix",
                                                 "trtllm_endpoint": "http://10.0.0.1:8000/kv_cache_events",
                                                 "allowed_publishers": ["10.0.0.1"]}]}))  # fmt: skip
    proc = await asyncio.create_subprocess_exec(script(), "--config", str(path), stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert b"sources[0].prefix_key_mode: salt echo needs salt.secret_env or salt.secret_file" in err


async def test_console_script_reports_a_taken_bind_endpoint(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    holder = ctx.socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{free_port()}",
        "sources": [{"backend_name": "v", "engine": "vllm", "zmq_endpoint": f"tcp://127.0.0.1:{port}",
                     "zmq_mode": "bind", "allowed_publishers": ["127.0.0.1"], "prefix_key_mode": "detokenize",
                     "publish": "prefix",
                     "detokenize_endpoint": "http://127.0.0.1:9/detokenize", "model": "m"}],
    }))  # fmt: skip
    try:
        proc = await asyncio.create_subprocess_exec(script(), "--config", str(path), stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 1
        assert b"cannot open a socket" in err and b"Traceback" not in err
    finally:
        holder.close(linger=0)
        ctx.destroy(linger=0)
