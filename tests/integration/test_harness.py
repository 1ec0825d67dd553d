"""The harness starts real servers: JetStream answers, Redis answers, restarts keep ports."""

from __future__ import annotations

import nats
import pytest
import redis.asyncio as aioredis

from continuum_common.errors import HarnessError
from continuum_common.procs import NatsServer, RedisServer, find_binary


async def test_nats_server_has_jetstream(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="HARNESS", subjects=["harness.>"])
        ack = await js.publish("harness.x", b"payload", headers={"Nats-Msg-Id": "one"})
        dup = await js.publish("harness.x", b"payload", headers={"Nats-Msg-Id": "one"})
        assert ack.seq == 1 and dup.duplicate
        sub = await js.pull_subscribe("harness.>", durable="d")
        msgs = await sub.fetch(1, timeout=2)
        assert msgs[0].data == b"payload"
    finally:
        await nc.close()


async def test_streams_do_not_leak_between_tests(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        assert [s.config.name for s in await nc.jetstream().streams_info()] == []
    finally:
        await nc.close()


async def test_redis_server_answers_and_is_flushed(redis_server: RedisServer) -> None:
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        assert await client.dbsize() == 0
        await client.set("k", "v", ex=10)
        assert await client.get("k") == b"v"
    finally:
        await client.aclose()


async def test_redis_kill_and_restart_on_the_same_port(fresh_redis_server: RedisServer) -> None:
    client = aioredis.Redis(host=fresh_redis_server.host, port=fresh_redis_server.port, socket_timeout=1)
    try:
        await client.set("k", "v")
        await fresh_redis_server.kill()
        with pytest.raises(Exception):  # noqa: B017 - any connection error is right here
            await client.get("k")
        await fresh_redis_server.start()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_nats_restart_keeps_jetstream_data(fresh_nats_server: NatsServer) -> None:
    nc = await nats.connect(fresh_nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="KEEP", subjects=["keep.>"])
    await js.publish("keep.a", b"1")
    await nc.close()
    await fresh_nats_server.stop()
    await fresh_nats_server.start()
    nc = await nats.connect(fresh_nats_server.url)
    try:
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 1
    finally:
        await nc.close()


async def test_a_server_that_cannot_start_raises_with_its_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    broken = RedisServer(data_dir=tmp_path, extra_args=["--no-such-option", "1"])
    broken.wait_ready = _never_ready  # type: ignore[method-assign]
    with pytest.raises(HarnessError, match=r"(?s)did not become ready.*no-such-option"):
        await broken.start()
    assert not broken.running


async def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = RedisServer()
    await blocker.start()
    try:
        clash = RedisServer(data_dir=tmp_path, port=blocker.port)
        clash.wait_ready = _never_ready  # type: ignore[method-assign]
        with pytest.raises(HarnessError) as raised:
            await clash.start()
        assert str(raised.value) == f"cannot listen on 127.0.0.1:{blocker.port} (redis): address already in use"
        assert clash.pid is None  # no process was started
    finally:
        await blocker.close()


async def _never_ready() -> None:
    raise ConnectionError("not ready")


def test_binaries_are_found() -> None:
    assert find_binary("nats-server").endswith("nats-server")
    assert find_binary("redis-server").endswith("redis-server")
    with pytest.raises(HarnessError):
        find_binary("definitely-not-a-binary-xyz")
