"""Pure cache policy: eligibility, tenant derivation, key separation, semantic partitions."""

from __future__ import annotations

from typing import Any

import pytest

from continuum_common.hashing import response_cache_key
from continuum_ingress.cache.policy.eligibility import CachePolicy, Reason, Route, request_reason, response_storable
from continuum_ingress.cache.policy.semantic import last_user_text, partition_digest, semantic_text
from continuum_ingress.cache.policy.tenant import derive_tenant

BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
POLICY = CachePolicy()


@pytest.mark.parametrize(
    ("extra", "route", "policy", "reason"),
    [
        ({}, Route.CHAT, POLICY, Reason.OK),
        ({"temperature": None}, Route.CHAT, POLICY, Reason.TEMPERATURE),  # omitted: sampled at 1.0
        ({"temperature": None}, Route.ANTHROPIC, CachePolicy(cache_omitted_temperature=True), Reason.OK),
        ({"temperature": 0.0}, Route.ANTHROPIC, POLICY, Reason.OK),
        ({"temperature": 0.7}, Route.CHAT, POLICY, Reason.TEMPERATURE),
        ({"temperature": False}, Route.CHAT, POLICY, Reason.TEMPERATURE),
        ({"temperature": "0"}, Route.CHAT, POLICY, Reason.TEMPERATURE),
        ({"stream": True}, Route.CHAT, POLICY, Reason.OK),
        ({"stream": True}, Route.ANTHROPIC, POLICY, Reason.OK),
        ({"stream": True}, Route.CHAT, CachePolicy(stream_buffering=False), Reason.STREAM_BUFFERING_OFF),
        ({"stream": True}, "gemini", POLICY, Reason.STREAM_UNSUPPORTED),
        ({}, Route.CHAT, CachePolicy(enabled=False), Reason.DISABLED),
    ],
)
def test_request_eligibility(extra: dict[str, Any], route: str, policy: CachePolicy, reason: Reason) -> None:
    assert request_reason({**BASE, **extra}, route=route, policy=policy) is reason


def test_non_object_bodies_are_not_eligible() -> None:
    assert request_reason([1, 2], route=Route.CHAT, policy=POLICY) is Reason.NOT_AN_OBJECT


def test_only_200s_within_the_size_limit_are_storable() -> None:
    policy = CachePolicy(max_response_size=10)
    assert response_storable(200, 10, policy)
    assert not response_storable(200, 11, policy)
    assert not response_storable(201, 1, policy)
    assert not response_storable(500, 1, policy)


def test_tenant_from_api_key_is_a_digest_never_the_key() -> None:
    key = "sk-secret-123"
    bearer = derive_tenant({"authorization": f"Bearer {key}"}, None)
    x_api = derive_tenant({"x-api-key": key}, None)
    assert bearer == x_api and bearer is not None and bearer.startswith("key:")
    assert key not in bearer and "secret" not in bearer
    assert derive_tenant({"authorization": "Bearer sk-other"}, None) != bearer
    assert derive_tenant({"x-goog-api-key": key}, None) == bearer
    assert derive_tenant({}, None) is None
    assert derive_tenant({"authorization": "Basic abc"}, None) is None


def test_trusted_tenant_header_wins_when_configured_and_present() -> None:
    headers = {"x-tenant": "acme", "authorization": "Bearer sk-1"}
    assert derive_tenant(headers, "X-Tenant") == "hdr:acme"
    assert derive_tenant(headers, None) == derive_tenant({"authorization": "Bearer sk-1"}, None)
    assert derive_tenant({"authorization": "Bearer sk-1"}, "x-tenant") == derive_tenant(headers, None)
    assert derive_tenant({"x-tenant": "  "}, "x-tenant") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("response_format", {"type": "json_object"}),
        ("stop", ["\n"]),
        ("seed", 7),
    ],
)
def test_requests_differing_in_one_output_field_never_share_a_key(field: str, value: Any) -> None:
    tenant = derive_tenant({"authorization": "Bearer sk-1"}, None)
    plain = response_cache_key(BASE, tenant_id=tenant, route=Route.CHAT)
    assert response_cache_key({**BASE, field: value}, tenant_id=tenant, route=Route.CHAT) != plain


def test_keys_separate_tenants_routes_and_stream_mode() -> None:
    t1 = derive_tenant({"authorization": "Bearer sk-1"}, None)
    t2 = derive_tenant({"authorization": "Bearer sk-2"}, None)
    k = response_cache_key(BASE, tenant_id=t1, route=Route.CHAT)
    assert k == response_cache_key(dict(BASE), tenant_id=t1, route=Route.CHAT)
    assert k != response_cache_key(BASE, tenant_id=t2, route=Route.CHAT)
    assert k != response_cache_key(BASE, tenant_id=None, route=Route.CHAT)
    assert k != response_cache_key(BASE, tenant_id=t1, route=Route.ANTHROPIC)
    assert k != response_cache_key({**BASE, "stream": True}, tenant_id=t1, route=Route.CHAT)


def _chat(last: Any, system: str = "You are terse.", **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "reply"},
            {"role": "user", "content": last},
        ],
        "temperature": 0,
        **extra,
    }


def test_semantic_text_eligibility() -> None:
    assert semantic_text(_chat("what is up"), route=Route.CHAT, max_input_bytes=100) == "what is up"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert semantic_text(_chat(parts), route=Route.ANTHROPIC, max_input_bytes=100) == "a\nb"
    assert semantic_text(_chat("é" * 51), route=Route.CHAT, max_input_bytes=100) is None  # 102 bytes
    assert semantic_text(_chat("x", stream=True), route=Route.CHAT, max_input_bytes=100) is None
    assert semantic_text(_chat("x", temperature=0.2), route=Route.CHAT, max_input_bytes=100) is None
    # an omitted temperature samples at the provider's default: not eligible unless configured
    assert semantic_text(_chat("x", temperature=None), route=Route.CHAT, max_input_bytes=100) is None
    assert (
        semantic_text(
            _chat("x", temperature=None), route=Route.CHAT, max_input_bytes=100, omitted_temperature_is_zero=True
        )
        == "x"
    )
    assert semantic_text(_chat("x"), route=Route.COMPLETIONS, max_input_bytes=100) is None
    assert semantic_text(_chat("   "), route=Route.CHAT, max_input_bytes=100) is None
    image = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:"}}]
    assert semantic_text(_chat(image), route=Route.CHAT, max_input_bytes=100) is None
    assistant_last = {"model": "m", "messages": [{"role": "assistant", "content": "x"}]}
    assert last_user_text(assistant_last) is None


def test_partition_covers_identity_history_and_output_fields_but_not_the_question() -> None:
    def part(body: dict[str, Any], tenant: str | None = "key:1", emb: str = "e") -> str:
        return partition_digest(body, tenant_id=tenant, route=Route.CHAT, embedding_model=emb)

    base = part(_chat("what is the capital of france"))
    assert part(_chat("france capital city, please")) == base
    assert part(_chat("q", user="someone", metadata={"a": 1})) == part(_chat("q"))  # non-output fields
    different = [
        part(_chat("q"), tenant="key:2"),
        part(_chat("q"), tenant=None),
        part(_chat("q"), emb="other-embedder"),
        part(_chat("q", system="You are verbose.")),
        part({**_chat("q"), "model": "m2"}),
        part(_chat("q", tools=[{"type": "function", "function": {"name": "f"}}])),
        part(_chat("q", response_format={"type": "json_object"})),
        part(_chat("q", seed=1)),
        part(_chat("q", max_tokens=5)),
        part(_chat("q", temperature=None)),  # an omitted temperature (where it is cached) is its own partition
        part({**_chat("q"), "messages": [*_chat("q")["messages"][:2], {"role": "user", "content": "q"}]}),
        part({**_chat("q"), "messages": [*_chat("q")["messages"][:3], {"role": "user", "content": "q", "name": "n"}]}),
    ]
    assert base not in different
    assert len(set(different)) == len(different)
    assert partition_digest(_chat("q"), tenant_id="key:1", route=Route.ANTHROPIC, embedding_model="e") != base
