"""Per-listener NATS credentials: a listener may publish only for the backends it announces.

nats-server runs with an `authorization` block made of the user entries that
`continuum-kv-listener --print-nats-user` prints for two listener files (listener A owns backend
`gpu-a1`, listener B owns `gpu-b1`) plus an unrestricted router user. Then:

* the real listener A, fed by a ZMQ engine stand-in, creates the stream, publishes its events
  and heartbeats with exactly those permissions, and the server reports no violation;
* a client holding A's credentials cannot publish events or heartbeats for `gpu-b1`, nor
  subscribe to the event stream (the server reports the permission violation and stores
  nothing), and can publish for `gpu-a1`; B's credentials can publish for `gpu-b1`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
import zmq
import zmq.asyncio
from nats.js.errors import KeyNotFoundError, NotFoundError

from continuum_common.bus import connect
from continuum_common.config.loader import load_listener_config
from continuum_common.events import LISTENERS_BUCKET, STREAM_NAME
from continuum_common.procs import NatsServer, free_port
from continuum_listener.__main__ import main as listener_main
from continuum_listener.app import running
from continuum_listener.config import settings_from
from continuum_testing.engines import EnginePublisher, batch, stored

ROUTER_PASSWORD = "router-password-1"
PASSWORDS = {"kv-listener-a": "listener-a-password", "kv-listener-b": "listener-b-password"}
PASSWORD_ENV = {"kv-listener-a": "CONTINUUM_TEST_NATS_A", "kv-listener-b": "CONTINUUM_TEST_NATS_B"}


def _listener_file(tmp: Path, user: str, backend: str, nats_url: str, zmq_port: int) -> Path:
    path = tmp / f"{user}.yaml"
    data: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "bus": {
            "embedded": False,
            "url": nats_url,
            "user": user,
            "password_env": PASSWORD_ENV[user],
            "inbox_prefix": f"_INBOX_{user}",
            "request_timeout_ms": 500,
        },
        "limits": {"coalesce_window_ms": 0},
        "sources": [
            {"backend_name": backend, "engine": "vllm", "zmq_endpoint": f"tcp://127.0.0.1:{zmq_port}", "topic": "kv"}
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _printed_entry(path: Path, user: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert listener_main(["--config", str(path), "--print-nats-user", user]) == 0
    out = capsys.readouterr().out
    assert f'user: "{user}"' in out
    return out


def _violations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "continuum.bus" and "permissions violation" in r.getMessage()
    ]


async def _heartbeat(nc: Any, backend: str) -> bytes | None:
    """The listener's heartbeat value for `backend`, or None while there is none yet."""
    try:
        heartbeats = await nc.jetstream().key_value(LISTENERS_BUCKET)
        value: bytes | None = (await heartbeats.get(backend)).value
        return value
    except NotFoundError:  # no bucket yet, or no key yet (KeyNotFoundError is a NotFoundError)
        return None


async def _stored_subjects(nats_url: str) -> list[str]:
    nc = await nats.connect(nats_url, user="continuum-router", password=ROUTER_PASSWORD, connect_timeout=2)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(STREAM_NAME, subjects_filter=">")
        except NotFoundError:  # the listener has not created it yet
            return []
        return sorted((info.state.subjects or {}).keys())
    finally:
        await nc.close()


async def test_a_listener_publishes_only_for_its_own_backends(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for user, variable in PASSWORD_ENV.items():
        monkeypatch.setenv(variable, PASSWORDS[user])
        monkeypatch.setenv("NATS_PASSWORD_" + user.upper().replace("-", "_"), PASSWORDS[user])  # read by nats-server
    monkeypatch.setenv("NATS_PASSWORD_CONTINUUM_ROUTER", ROUTER_PASSWORD)
    server = NatsServer(probe={"user": "continuum-router", "password": ROUTER_PASSWORD})
    zmq_port = free_port()
    file_a = _listener_file(tmp_path, "kv-listener-a", "gpu-a1", server.url, zmq_port)
    file_b = _listener_file(tmp_path, "kv-listener-b", "gpu-b1", server.url, free_port())
    entries = [
        '{ user: "continuum-router", password: $NATS_PASSWORD_CONTINUUM_ROUTER }\n',
        _printed_entry(file_a, "kv-listener-a", capsys),
        _printed_entry(file_b, "kv-listener-b", capsys),
    ]
    server.config = "authorization {\n  users = [\n" + "".join(entries) + "  ]\n}\n"  # newline-separated
    await server.start()
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(ctx, f"tcp://127.0.0.1:{zmq_port}", topic="kv")
    try:
        caplog.set_level(logging.WARNING, logger="continuum.bus")
        # 1. The real listener A works within its permissions.
        settings = settings_from(load_listener_config(file_a))
        async with running(settings, heartbeat_interval=0.2):
            await engine.wait_subscribed()
            await engine.send(batch([stored([1, 2], None, [5] * 32, 16)]))
            async with asyncio.timeout(10):
                while "continuum.kv.events.gpu-a1" not in await _stored_subjects(server.url):
                    await asyncio.sleep(0.05)
            # The heartbeat runs on its own cadence: wait for its first beat while the listener
            # still runs (the router's credentials read the bucket, as the ingress does).
            router = await nats.connect(server.url, user="continuum-router", password=ROUTER_PASSWORD)
            try:
                async with asyncio.timeout(10):
                    while not await _heartbeat(router, "gpu-a1"):
                        await asyncio.sleep(0.05)
            finally:
                await router.close()
        assert _violations(caplog) == []

        # 2. A's credentials cannot publish for B's backend, nor read the event stream.
        cfg_a = load_listener_config(file_a).bus
        assert cfg_a is not None
        nc = await connect(cfg_a, name="holder-of-a")
        try:
            js = nc.jetstream(timeout=1)
            with pytest.raises(TimeoutError):  # the server refuses it: no acknowledgement
                await js.publish("continuum.kv.events.gpu-b1", b"forged")
            with pytest.raises(TimeoutError):
                await js.publish(f"$KV.{LISTENERS_BUCKET}.gpu-b1", b"forged heartbeat")
            await nc.subscribe("continuum.kv.events.>")
            await nc.flush()
            async with asyncio.timeout(5):
                while len(_violations(caplog)) < 3:
                    await asyncio.sleep(0.02)
            seen = _violations(caplog)
            assert any('publish to "continuum.kv.events.gpu-b1"' in v for v in seen), seen
            # (nats-py lower-cases the server's error text)
            assert any(f'publish to "$kv.{LISTENERS_BUCKET}.gpu-b1"' in v.lower() for v in seen), seen
            assert any('subscription to "continuum.kv.events.>"' in v for v in seen), seen
            ack = await js.publish("continuum.kv.events.gpu-a1", b"own backend")
            assert ack.stream == STREAM_NAME
        finally:
            await nc.close()
        assert await _stored_subjects(server.url) == ["continuum.kv.events.gpu-a1"]
        router = await nats.connect(server.url, user="continuum-router", password=ROUTER_PASSWORD)
        try:
            with pytest.raises(KeyNotFoundError):
                await (await router.jetstream().key_value(LISTENERS_BUCKET)).get("gpu-b1")
        finally:
            await router.close()

        # 3. B's own credentials may publish for gpu-b1.
        cfg_b = load_listener_config(file_b).bus
        assert cfg_b is not None
        nc = await connect(cfg_b, name="holder-of-b")
        try:
            assert (await nc.jetstream(timeout=2).publish("continuum.kv.events.gpu-b1", b"own")).stream == STREAM_NAME
        finally:
            await nc.close()
        assert await _stored_subjects(server.url) == ["continuum.kv.events.gpu-a1", "continuum.kv.events.gpu-b1"]
    finally:
        await engine.close()
        ctx.destroy(linger=0)
        await server.close()
