"""Golden vectors for the hashing primitives, each computed step by step from the seed's
formulas with hashlib (never by calling the code under test to make the expectation)."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_common.hashing import (
    DOCUMENTED_OUTPUT_FIELDS,
    CacheKeyError,
    gemini_digest,
    request_prefix_key,
    response_cache_key,
    truncate_utf8,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# ---------------------------------------------------------------- prefix key


def test_prefix_key_with_system_prompt() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}],
    }
    expected = sha(MODEL.encode() + b"\x00" + b"S" + b"You are terse.")
    assert request_prefix_key(body, enabled=True) == expected
    assert expected.hex() == hashlib.sha256(b"meta-llama/Llama-3.1-8B-Instruct\x00SYou are terse.").hexdigest()


def test_prefix_key_known_constant() -> None:
    # sha256(b"m\x00Sabc"), worked out once by hand with hashlib and frozen here.
    body = {"model": "m", "messages": [{"role": "system", "content": "abc"}]}
    assert request_prefix_key(body, enabled=True) == sha(b"m\x00Sabc")
    assert sha(b"m\x00Sabc").hex() == hashlib.sha256(bytes([109, 0, 83, 97, 98, 99])).hexdigest()


def test_prefix_key_falls_back_to_first_message() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]}
    assert request_prefix_key(body, enabled=True) == sha(MODEL.encode() + b"\x00M" + b"Hello there")


def test_same_text_as_system_or_message_differs() -> None:
    as_system = {"model": "m", "messages": [{"role": "system", "content": "x"}]}
    as_user = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert request_prefix_key(as_system, enabled=True) != request_prefix_key(as_user, enabled=True)


def test_prefix_key_disabled_or_empty_is_none() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert request_prefix_key(body, enabled=False) is None
    assert request_prefix_key({"model": "m", "messages": []}, enabled=True) is None
    assert request_prefix_key({"model": "m", "messages": [{"role": "system", "content": ""}]}, enabled=True) is None
    assert request_prefix_key({"messages": [{"role": "user", "content": "x"}]}, enabled=True) is None


def test_content_parts_join_with_newline_and_skip_images() -> None:
    body = {
        "model": "m",
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "part one"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                    {"type": "text", "text": "part two"},
                ],
            }
        ],
    }
    assert request_prefix_key(body, enabled=True) == sha(b"m\x00Spart one\npart two")


def test_developer_role_counts_as_system() -> None:
    body = {"model": "m", "messages": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}]}
    assert request_prefix_key(body, enabled=True) == sha(b"m\x00Srules")


def test_anthropic_system_string_and_blocks() -> None:
    as_string = {"model": "claude", "system": "Be brief.", "messages": [{"role": "user", "content": "q"}]}
    as_blocks = {
        "model": "claude",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
    }
    expected = sha(b"claude\x00SBe brief.")
    assert request_prefix_key(as_string, enabled=True) == expected
    assert request_prefix_key(as_blocks, enabled=True) == expected
    no_system = {"model": "claude", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]}
    assert request_prefix_key(no_system, enabled=True) == sha(b"claude\x00Mq")


def test_truncation_is_at_max_prefix_length_bytes() -> None:
    long = "a" * 2000
    body = {"model": "m", "messages": [{"role": "system", "content": long}]}
    assert request_prefix_key(body, enabled=True, max_prefix_length=1024) == sha(b"m\x00S" + b"a" * 1024)
    # Everything past the limit is ignored.
    other = {"model": "m", "messages": [{"role": "system", "content": "a" * 1024 + "b" * 976}]}
    assert request_prefix_key(other, enabled=True) == request_prefix_key(body, enabled=True)


def test_truncation_respects_utf8_boundaries() -> None:
    # "é" is 2 bytes; 1023 ASCII + "é" would cut the é in half at 1024 bytes.
    text = "a" * 1023 + "é" + "z"
    body = {"model": "m", "messages": [{"role": "system", "content": text}]}
    assert request_prefix_key(body, enabled=True) == sha(b"m\x00S" + b"a" * 1023)
    # A 4-byte emoji straddling the limit is dropped whole.
    assert truncate_utf8("ab😀".encode(), 4) == b"ab"
    assert truncate_utf8("ab😀".encode(), 6) == "ab😀".encode()


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_truncation_always_yields_valid_utf8_prefix(text: str, limit: int) -> None:
    data = text.encode()
    cut = truncate_utf8(data, limit)
    assert len(cut) <= limit
    assert data.startswith(cut)
    cut.decode("utf-8")  # never raises
    # Maximal: adding the next character would exceed the limit.
    rest = data[len(cut) :].decode()
    if rest:
        assert len(cut) + len(rest[0].encode()) > limit


@given(st.text(min_size=1), st.integers(min_value=1, max_value=64))
def test_the_key_covers_the_first_max_prefix_length_bytes_of_the_whole_text(text: str, limit: int) -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": text}]}
    # Expected from the whole text's encoding, cut at a character boundary by hand.
    data = text.encode()
    kept = b""
    for char in text:
        if len(kept) + len(char.encode()) > limit:
            break
        kept += char.encode()
    assert data.startswith(kept)
    assert request_prefix_key(body, enabled=True, max_prefix_length=limit) == sha(b"m\x00S" + kept)


def test_completions_prompt_is_the_first_message() -> None:
    assert request_prefix_key({"model": "m", "prompt": "Once upon"}, enabled=True) == sha(b"m\x00MOnce upon")


# ---------------------------------------------------------------- gemini digest


def test_gemini_digest_hashes_the_whole_system_prompt() -> None:
    system = "x" * 50_000
    body = {
        "model": "gemini-2.5-flash",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
    }
    assert gemini_digest(body) == sha(b"gemini-2.5-flash\x00S" + system.encode())
    assert gemini_digest({"model": "g", "messages": [{"role": "user", "content": "q"}]}) is None


# ---------------------------------------------------------------- response cache key


def seed_key(
    model: str,
    conversation: object,
    temperature: float,
    max_tokens: int | None,
    top_p: float | None,
    tenant: str | None,
    extension: dict,
) -> str:
    """The seed's formula written out independently of the implementation."""
    canon = lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()  # noqa: E731
    parts = [
        model.encode(),
        b"\x00",
        sha(canon(conversation)),
        b"\x00",
        struct.pack("<d", temperature),
        b"\x00",
        b"\x00" if max_tokens is None else b"\x01" + struct.pack("<Q", max_tokens),
        b"\x00",
        b"\x00" if top_p is None else b"\x01" + struct.pack("<d", top_p),
        b"\x00",
        b"\x00" if tenant is None else b"\x01" + tenant.encode(),
        b"\x00",
        canon(extension),
    ]
    return hashlib.sha256(b"".join(parts)).hexdigest()


def test_cache_key_golden_minimal() -> None:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    body = {"model": "m", "messages": messages, "temperature": 0}
    expected = seed_key(
        "m", messages, 0.0, None, None, None, {"fields": {}, "route": "chat", "stream": False, "temperature_set": True}
    )
    assert response_cache_key(body, tenant_id=None) == expected


def test_cache_key_golden_full() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "héllo"}]
    body = {
        "model": "m",
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": 64,
        "top_p": 0.9,
        "seed": 7,
        "user": "alice",
        "stream": True,
    }
    expected = seed_key(
        "m",
        messages,
        0.0,
        64,
        0.9,
        "tenant-1",
        {"fields": {"seed": 7}, "route": "chat", "stream": True, "temperature_set": True},
    )
    assert response_cache_key(body, tenant_id="tenant-1") == expected


def test_key_ignores_whitespace_and_key_order_of_messages() -> None:
    a = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    b = {"messages": [{"content": "x", "role": "user"}], "model": "m"}
    assert response_cache_key(a, tenant_id=None) == response_cache_key(b, tenant_id=None)


def test_none_and_zero_do_not_collide() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert response_cache_key(base, tenant_id=None) != response_cache_key({**base, "max_tokens": 0}, tenant_id=None)
    assert response_cache_key(base, tenant_id=None) != response_cache_key({**base, "top_p": 0}, tenant_id=None)
    assert response_cache_key(base, tenant_id=None) != response_cache_key(base, tenant_id="")
    assert response_cache_key(base, tenant_id=None) != response_cache_key({**base, "temperature": 0}, tenant_id=None)


def test_tenants_never_share_keys() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert response_cache_key(base, tenant_id="a") != response_cache_key(base, tenant_id="b")


CHANGED_VALUES: dict[str, object] = {
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": "required",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "response_format": {"type": "json_object"},
    "stop": ["\n"],
    "stop_sequences": ["END"],
    "seed": 42,
    "n": 2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 3,
    "reasoning_effort": "high",
    "reasoning": {"effort": "low"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "max_completion_tokens": 100,
    "parallel_tool_calls": False,
    "stream_options": {"include_usage": True},
    "top_k": 5,
    "min_p": 0.1,
    "system": "be terse",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "verbosity": "low",
    "chat_template_kwargs": {"enable_thinking": False},
    "guided_json": {"type": "object"},
    "structured_outputs": {"json": {"type": "object"}},
    "echo": True,
    "suffix": "end",
    "best_of": 3,
}


def test_every_documented_field_has_a_test_value() -> None:
    assert set(CHANGED_VALUES) == set(DOCUMENTED_OUTPUT_FIELDS)


@pytest.mark.parametrize("field", DOCUMENTED_OUTPUT_FIELDS)
def test_each_output_field_changes_the_key(field: str) -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0}
    assert response_cache_key(base, tenant_id="t") != response_cache_key(
        {**base, field: CHANGED_VALUES[field]}, tenant_id="t"
    )


@pytest.mark.parametrize("field", ["model", "messages", "temperature", "max_tokens", "top_p"])
def test_each_seed_field_changes_the_key(field: str) -> None:
    base = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0,
        "max_tokens": 10,
        "top_p": 1.0,
    }
    changed = {
        "model": "m2",
        "messages": [{"role": "user", "content": "y"}],
        "temperature": 0.5,
        "max_tokens": 11,
        "top_p": 0.5,
    }
    assert response_cache_key(base, tenant_id=None) != response_cache_key(
        {**base, field: changed[field]}, tenant_id=None
    )


def test_stream_and_route_separate_keys() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert response_cache_key(base, tenant_id=None) != response_cache_key({**base, "stream": True}, tenant_id=None)
    assert response_cache_key(base, tenant_id=None, route="chat") != response_cache_key(
        base, tenant_id=None, route="anthropic"
    )


def test_unknown_fields_change_the_key_but_billing_fields_do_not() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert response_cache_key(base, tenant_id=None) != response_cache_key(
        {**base, "some_future_knob": 1}, tenant_id=None
    )
    for field in ("user", "metadata", "store", "cache_salt"):
        assert response_cache_key(base, tenant_id=None) == response_cache_key({**base, field: "v"}, tenant_id=None)


@pytest.mark.parametrize(
    "bad",
    [
        {"messages": []},
        {"model": 3, "messages": []},
        {"model": "m", "messages": [], "temperature": "hot"},
        {"model": "m", "messages": [], "max_tokens": -1},
    ],
)
def test_unkeyable_bodies_raise(bad: dict) -> None:
    with pytest.raises(CacheKeyError):
        response_cache_key(bad, tenant_id=None)
