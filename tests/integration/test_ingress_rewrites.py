"""Per-attempt body rewrites (salt echo, Anthropic cache_control) as the backend receives them,
and the response-cache hook seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from continuum_common.hashing import request_prefix_key
from continuum_common.salt import verify_salt
from continuum_ingress.cache import CachedResponse, CacheLookup, CacheStatus, EntryKind
from continuum_ingress.hooks import ResponseRecorder
from continuum_ingress.state import RequestState
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "Shared system prompt"}, {"role": "user", "content": "q"}],
}


async def test_salt_echo_goes_to_vllm_and_trtllm_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTINUUM_TEST_SALT", "salt-secret")
    async with running_stubs("vllm-1", "trt-1", "oai-1") as stubs:
        backends = [
            *stub_backends(stubs[:1], type="vllm"),
            *stub_backends(stubs[1:2], type="trtllm"),
            *stub_backends(stubs[2:], type="openai"),
        ]
        cfg = {
            "backends": backends,
            "prefix_routing": {"enabled": True},
            "kv_cache_index": {
                "salt_echo": {"enabled": True, "secret_env": "CONTINUUM_TEST_SALT"},
                "default_mode": "prefix_key",
            },
        }
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, verify=False) as c:
            for _ in range(3):  # RoundRobin: one each
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            own = {**CHAT, "cache_salt": "callers-own"}
            assert (await c.post("/v1/chat/completions", json=own)).status_code == 200  # -> vllm-1 again
            no_prefix = {"model": "m", "messages": [{"role": "user", "content": ""}]}
            assert (await c.post("/v1/chat/completions", json=no_prefix)).status_code == 200  # -> trt-1
    key = request_prefix_key(CHAT, enabled=True)
    vllm, trt, oai = (s.stub.requests for s in stubs)
    assert verify_salt(b"salt-secret", "vllm-1", vllm[0].body["cache_salt"]) == key
    assert verify_salt(b"salt-secret", "trt-1", trt[0].body["cache_salt"]) == key
    assert verify_salt(b"salt-secret", "vllm-1", trt[0].body["cache_salt"]) is None  # bound to its backend
    assert "cache_salt" not in oai[0].body
    assert vllm[1].body["cache_salt"] == "callers-own"
    assert "cache_salt" not in trt[1].body
    # Everything else reaches the backend as the client sent it.
    assert {k: v for k, v in vllm[0].body.items() if k != "cache_salt"} == CHAT


def _anthropic(system: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(
    ("backend", "fleet", "sent", "expect_injected"),
    [
        ({"type": "anthropic"}, False, _anthropic("Be brief."), True),
        ({"type": "anthropic", "anthropic_auto_cache_control": False}, False, _anthropic("Be brief."), False),
        ({"type": "anthropic", "anthropic_auto_cache_control": False}, True, _anthropic("Be brief."), True),
        ({"type": "vllm"}, True, _anthropic("Be brief."), False),
        (
            {"type": "anthropic"},
            True,
            _anthropic("Be brief.", tools=[{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]),
            False,
        ),
    ],
    ids=["default-on", "backend-off", "fleet-forces", "not-native", "caller-set-one"],
)
async def test_anthropic_cache_control_injection(
    backend: dict[str, Any], fleet: bool, sent: dict[str, Any], expect_injected: bool
) -> None:
    async with running_stubs("claude") as stubs:
        cfg = {
            "backends": stub_backends(stubs, **backend),
            "prefix_routing": {"anthropic_cache_control_injection": fleet},
        }
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, verify=False) as c:
            r = await c.post("/anthropic/v1/messages", json=sent)
            assert r.status_code == 200
            blocks = {**sent, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}
            assert (await c.post("/anthropic/v1/messages", json=blocks)).status_code == 200
    first, second = (req.body for req in stubs[0].stub.requests)
    if expect_injected:
        assert first["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
        assert second["system"] == [
            {"type": "text", "text": "A"},
            {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}},
        ]
        assert first["messages"] == sent["messages"]
    else:
        assert first == sent


class DictCache:
    """A minimal ResponseCacheHook: exact body match, stores what the client was sent."""

    enabled = True

    def __init__(self) -> None:
        self.store: dict[str, CachedResponse] = {}

    async def lookup(self, state: RequestState) -> CacheLookup:
        if state.request.body.get("temperature", 0) != 0:
            return CacheLookup(CacheStatus.BYPASS)
        key = state.raw.hex()
        hit = self.store.get(key)
        tenant = state.headers().get("x-tenant", "")
        extra = (("X-Cache-Tenant", tenant),) if tenant else ()
        if hit:
            return CacheLookup(CacheStatus.HIT, hit, extra_headers=extra)
        return CacheLookup(CacheStatus.MISS, key=key, extra_headers=extra)

    def recorder(self, state: RequestState, lookup: CacheLookup) -> ResponseRecorder | None:
        assert lookup.key is not None
        return _Recorder(self, lookup.key, state.stream)


class _Recorder:
    def __init__(self, cache: DictCache, key: str, stream: bool) -> None:
        self.cache, self.key, self.stream = cache, key, stream
        self.parts: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        self.parts.append(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        if self.stream:
            self.cache.store[self.key] = CachedResponse(
                EntryKind.STREAM, status, tuple(headers), events=tuple(self.parts)
            )
        else:
            self.cache.store[self.key] = CachedResponse(
                EntryKind.RESPONSE, status, tuple(headers), body=b"".join(self.parts)
            )

    def abort(self) -> None:
        self.parts.clear()

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        self.parts.clear()


async def test_response_cache_hook_hit_miss_bypass_and_stream_replay() -> None:
    cache = DictCache()
    async with (
        running_stubs("a") as stubs,
        running_ingress({"backends": stub_backends(stubs)}, response_cache=cache) as ing,
        httpx.AsyncClient(base_url=ing.url, verify=False) as c,
    ):
        miss = await c.post("/v1/chat/completions", json=CHAT, headers={"x-tenant": "t1"})
        hit = await c.post("/v1/chat/completions", json=CHAT, headers={"x-tenant": "t1"})
        bypass = await c.post("/v1/chat/completions", json={**CHAT, "temperature": 0.7})
        stream = {**CHAT, "stream": True}
        s_miss = await c.post("/v1/chat/completions", json=stream)
        s_hit = await c.post("/v1/chat/completions", json=stream)
    assert [r.headers.get("x-cache") for r in (miss, hit, bypass, s_miss, s_hit)] == [
        "MISS",
        "HIT",
        "BYPASS",
        "MISS",
        "HIT",
    ]
    assert hit.json() == miss.json()
    assert miss.headers["x-cache-tenant"] == hit.headers["x-cache-tenant"] == "t1"  # hook headers reach the client
    assert s_hit.text == s_miss.text and s_hit.text.endswith("data: [DONE]\n\n")
    assert len(stubs[0].stub.requests) == 3  # the two hits never reached the backend
