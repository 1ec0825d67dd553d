"""TLS to NATS and to Redis for every service that connects, with a CA made in the test.

nats-server runs with TLS, client certificates required (`--tlsverify`) and a user/password;
redis-server runs with `--tls-port` only (no plaintext port), client certificates required,
an ACL user and the `default` user switched off. Then:

* the shared clients (`continuum_common.redis_client.make_redis`, `continuum_common.bus.connect`)
  connect with the configured CA, client certificate and credentials, and are refused without
  the CA, without the client certificate, without TLS or with a wrong password;
* the Tier 4 path runs over them: simulated engines -> listener -> NATS -> indexer -> Redis ->
  the ingress's scorer, with the ingress's response cache in the same Redis;
* the Gemini context cache runs over them: ingress -> NATS -> gemini-cache -> Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis import exceptions as rexc

from continuum_common.bus import connect
from continuum_common.config.router import Bus, Redis
from continuum_common.procs import NatsServer, RedisServer
from continuum_common.redis_client import make_redis
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, FakeClock, system_prompt
from continuum_testing.gemini_ingress_stack import ADMIN_ENV, ADMIN_TOKEN, gemini_stack
from continuum_testing.kv_stack import chat, key_of, kv_stack, words
from continuum_testing.tls_support import Pki, make_pki

REDIS_USER = "continuum-svc"
REDIS_PASSWORD = "redis-acl-password-7Qe"
NATS_USER = "continuum-router"
NATS_PASSWORD = "nats-password-Vx3"
REDIS_PASSWORD_ENV = "CONTINUUM_TEST_TLS_REDIS_PASSWORD"
NATS_PASSWORD_ENV = "CONTINUUM_TEST_TLS_NATS_PASSWORD"


class Servers:
    def __init__(self, pki: Pki, nats: NatsServer, redis: RedisServer) -> None:
        self.pki = pki
        self.nats = nats
        self.redis = redis

    def bus(self) -> dict[str, Any]:
        return {"user": NATS_USER, "password_env": NATS_PASSWORD_ENV, "tls": self.pki.client_files()}

    def redis_options(self) -> dict[str, Any]:
        return {"username": REDIS_USER, "password_env": REDIS_PASSWORD_ENV, "tls": self.pki.client_files()}

    def raw_redis(self) -> aioredis.Redis:
        return aioredis.Redis(
            host=self.redis.host,
            port=self.redis.port,
            ssl=True,
            username=REDIS_USER,
            password=REDIS_PASSWORD,
            **self.pki.redis_probe(),
        )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Servers]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    # The ACL docs/operations.md recommends: the services' keys only, no dangerous commands.
    acl = ["--user", REDIS_USER, "on", f">{REDIS_PASSWORD}", "~cr:*", "&*", "+@all", "-@dangerous"]
    acl += ["--user", "default", "off"]
    redis = RedisServer(
        tls=pki.server(),
        extra_args=acl,
        probe={"username": REDIS_USER, "password": REDIS_PASSWORD, **pki.redis_probe()},
    )
    nats = NatsServer(
        config=f'authorization {{ user: "{NATS_USER}", password: "{NATS_PASSWORD}" }}\n',
        tls=pki.server(),
        probe={"tls": pki.client_context(), "user": NATS_USER, "password": NATS_PASSWORD},
    )
    await redis.start()
    try:
        await nats.start()
    except BaseException:
        await redis.close()
        raise
    yield Servers(pki, nats, redis)
    await nats.close()
    await redis.close()


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(REDIS_PASSWORD_ENV, REDIS_PASSWORD)
    monkeypatch.setenv(NATS_PASSWORD_ENV, NATS_PASSWORD)
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    yield


# --------------------------------------------------------------------------- the shared clients


def _redis(servers: Servers, **fields: Any) -> Redis:
    base: dict[str, Any] = {"url": f"redis://{servers.redis.host}:{servers.redis.port}", **servers.redis_options()}
    base.update(connect_timeout_ms=2000, command_timeout_ms=2000)
    return Redis.model_validate({**base, **fields})


async def _redis_error(cfg: Redis) -> BaseException:
    client = make_redis(cfg)
    try:
        await client.ping()
    except rexc.RedisError as exc:
        return exc
    finally:
        await client.aclose()
    raise AssertionError("the connection was accepted")


async def test_redis_over_tls_with_an_acl_user(servers: Servers) -> None:
    client = make_redis(_redis(servers))
    try:
        assert await client.set("cr:tls-probe", b"v")
        assert await client.get("cr:tls-probe") == b"v"
        assert await client.execute_command("ACL", "WHOAMI") == REDIS_USER.encode()  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()
    # The same over a rediss:// url with the files in `tls`.
    client = make_redis(_redis(servers, url=servers.redis.url))
    try:
        assert await client.get("cr:tls-probe") == b"v"
    finally:
        await client.aclose()


async def test_redis_refuses_what_the_configuration_does_not_prove(servers: Servers) -> None:
    files = servers.pki.client_files()
    # tls: true trusts the system store only, which does not hold the test CA.
    assert "certificate verify failed" in str(await _redis_error(_redis(servers, tls=True)))
    no_client_cert = {"ca_file": files["ca_file"]}
    assert isinstance(await _redis_error(_redis(servers, tls=no_client_cert)), rexc.ConnectionError)
    assert isinstance(await _redis_error(_redis(servers, tls=False)), rexc.ConnectionError)
    wrong = Path(servers.pki.ca_file).parent / "wrong-password"
    wrong.write_text("not-the-password\n")
    bad_password = _redis(servers, password_env=None, password_file=str(wrong))
    assert isinstance(await _redis_error(bad_password), rexc.AuthenticationError)
    anonymous = _redis(servers, username=None, password_env=None)
    assert isinstance(await _redis_error(anonymous), rexc.AuthenticationError | rexc.ResponseError)


async def _nats_refused(servers: Servers, caplog: pytest.LogCaptureFixture, why: set[str], **fields: Any) -> None:
    """The connection never comes up (the client keeps retrying), for one of the reasons `why`
    (the error types the bus module logs)."""
    cfg = Bus.model_validate({"embedded": False, "url": servers.nats.url, **servers.bus(), **fields})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="continuum.bus"), pytest.raises(TimeoutError):
        nc = await asyncio.wait_for(connect(cfg, name="tls-test"), 2)
        await nc.close()
    logged = {r.getMessage().removeprefix("nats error: ") for r in caplog.records if r.name == "continuum.bus"}
    assert logged and logged <= why, logged


async def test_nats_over_tls_with_client_certificates(servers: Servers, caplog: pytest.LogCaptureFixture) -> None:
    cfg = Bus.model_validate({"embedded": False, "url": servers.nats.url, **servers.bus()})
    nc = await connect(cfg, name="tls-test")
    try:
        assert nc.is_connected
        sub = await nc.subscribe("tls.echo")
        await nc.publish("tls.echo", b"over tls")
        assert (await sub.next_msg(timeout=2)).data == b"over tls"
    finally:
        await nc.close()
    files = servers.pki.client_files()
    unverified = {"SSLCertVerificationError"}
    no_cert = {"SSLError", "ConnectionResetError", "BrokenPipeError"}
    await _nats_refused(
        servers, caplog, unverified, tls={"cert_file": files["cert_file"], "key_file": files["key_file"]}
    )
    await _nats_refused(servers, caplog, no_cert, tls={"ca_file": files["ca_file"]})
    await _nats_refused(servers, caplog, unverified, tls=None)  # the server requires TLS: system CAs only
    # nats.errors.Error is the server's "Authorization Violation"; the server then closes the
    # connection, which the client may see mid-write (BrokenPipeError) or mid-read (reset).
    closed = {"Error", "BrokenPipeError", "ConnectionResetError"}
    await _nats_refused(servers, caplog, closed, password_env=REDIS_PASSWORD_ENV)


# --------------------------------------------------------------------------- services


async def test_kv_path_and_response_cache_over_tls(servers: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    response_cache = {"response_cache": {"enabled": True, "backend": "redis"}}
    async with kv_stack(
        servers.nats,
        servers.redis,
        monkeypatch,
        engines=2,
        bus=servers.bus(),
        redis_options=servers.redis_options(),
        extra=response_cache,
    ) as s:
        e1 = s.name(1)
        system = "You are the TLS assistant. " + words("tls", 120)
        prefix = key_of(chat(system, "warm"))
        # engine -> listener -> NATS (TLS) -> indexer -> Redis (TLS) -> a reader over TLS
        await s.direct(1, chat(system, "warm", max_tokens=32))
        await s.wait_holders(prefix, lambda h: e1 in h)
        # the ingress's scorer reads the same index over TLS
        assert [await s.via_ingress(chat(system, f"question {i}")) for i in range(2)] == [e1, e1]
        assert s.decisions("kv_aware") == 2
        # the ingress's response cache is in the same Redis
        body = chat(system, "cache me")
        first = await s.http.post(s.ingress.url + "/v1/chat/completions", json=body)
        assert first.status_code == 200 and first.headers["x-cache"] == "MISS"
        raw = servers.raw_redis()
        try:
            async with asyncio.timeout(5):
                while not [k async for k in raw.scan_iter(match="cr:resp:*")]:
                    await asyncio.sleep(0.02)
        finally:
            await raw.aclose()
        second = await s.http.post(s.ingress.url + "/v1/chat/completions", json=body)
        assert second.headers["x-cache"] == "HIT" and second.json() == first.json()


async def test_gemini_context_cache_over_tls(servers: Servers) -> None:
    clock = FakeClock()
    async with (
        FakeGemini(clock=clock, api_keys={API_KEY}) as fake,
        gemini_stack(
            fake,
            clock,
            servers.nats.url,
            redis_url=f"redis://{servers.redis.host}:{servers.redis.port}",
            bus=servers.bus(),
            redis_options=servers.redis_options(),
        ) as s,
    ):
        system = system_prompt(77)
        await s.chat(system)  # a miss: the ingress asks gemini-cache over NATS to create it
        await s.wait_creates(1)
        await s.wait_stored(1)  # the service keeps the entry in Redis
        answer = await s.chat(system, "again")
        assert answer.usage.prompt_tokens_details.cached_tokens > 0
        assert fake.count(Op.CREATE) == 1
        raw = servers.raw_redis()
        try:
            assert [k async for k in raw.scan_iter(match="cr:gem:*")]
        finally:
            await raw.aclose()
