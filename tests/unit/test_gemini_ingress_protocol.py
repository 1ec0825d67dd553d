"""Pure conversions of the ingress's Gemini dialect: OpenAI chat <-> generateContent, streams,
usage, errors, the compat cache placement, eligibility and the lookup memo."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.hashing import gemini_digest
from continuum_common.wire.gemini import LookupReply, LookupResult, digest_hex
from continuum_ingress.gemini.errors import ConversionError
from continuum_ingress.gemini.memo import LookupMemo
from continuum_ingress.gemini.policy import Candidate, Ineligible, cache_candidate
from continuum_ingress.gemini.protocol.chat_completion import (
    finish_reason,
    google_error_fields,
    openai_error,
    openai_usage,
    responses_usage,
    to_chat_completion,
)
from continuum_ingress.gemini.protocol.compat import CompatStreamTap, observe_body, with_cached_content
from continuum_ingress.gemini.protocol.request import to_generate_content
from continuum_ingress.gemini.protocol.responses_api import ResponsesStreamConverter, responses_to_chat, to_response
from continuum_ingress.gemini.protocol.stream import ChatStreamConverter
from continuum_testing.fake_gemini_bodies import Reply, Usage, sse, stream_chunks

MODEL = "gemini-2.5-flash"


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": list(messages), **extra}


USER = {"role": "user", "content": "hi"}


# --------------------------------------------------------------------------- request


def test_messages_media_and_system_prompts() -> None:
    body = chat(
        {"role": "system", "content": "rule one"},
        {"role": "developer", "content": [{"type": "text", "text": "rule two"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.webp?size=2"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
            ],
        },
    )
    out = to_generate_content(body)
    assert out["systemInstruction"] == {"parts": [{"text": "rule one"}, {"text": "rule two"}]}
    assert out["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "look"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                {"fileData": {"mimeType": "image/webp", "fileUri": "https://example.com/cat.webp?size=2"}},
                {"inlineData": {"mimeType": "audio/mp3", "data": "UklGRg=="}},
            ],
        }
    ]
    assert "generationConfig" not in out and "tools" not in out


def test_tool_round_trip_with_thought_signature_and_parallel_results() -> None:
    body = chat(
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "a", "arguments": '{"x": 1}'},
                    "extra_content": {"google": {"thought_signature": "sig=="}},
                },
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
        {"role": "tool", "tool_call_id": "c2", "content": "plain text"},
    )
    contents = to_generate_content(body)["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "a", "args": {"x": 1}}, "thoughtSignature": "sig=="},
            {"functionCall": {"name": "b", "args": {}}},
        ],
    }
    # Both answers in one user turn, as Gemini expects for parallel calls.
    assert contents[2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "a", "response": {"ok": True}}},
            {"functionResponse": {"name": "b", "response": {"content": "plain text"}}},
        ],
    }


def test_tools_tool_choice_and_legacy_functions() -> None:
    fn = {"name": "f", "description": "d", "parameters": {"type": "object"}}
    out = to_generate_content(chat(USER, tools=[{"type": "function", "function": fn}], functions=[{"name": "g"}]))
    assert out["tools"] == [
        {
            "functionDeclarations": [
                {"name": "f", "description": "d", "parametersJsonSchema": {"type": "object"}},
                {"name": "g"},
            ]
        }
    ]
    cases = {
        "none": {"mode": "NONE"},
        "auto": {"mode": "AUTO"},
        "required": {"mode": "ANY"},
    }
    for choice, config in cases.items():
        assert to_generate_content(chat(USER, tool_choice=choice))["toolConfig"] == {"functionCallingConfig": config}
    named = to_generate_content(chat(USER, tool_choice={"type": "function", "function": {"name": "f"}}))
    assert named["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}}
    allowed = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
    }
    assert to_generate_content(chat(USER, tool_choice=allowed))["toolConfig"]["functionCallingConfig"] == {
        "mode": "ANY",
        "allowedFunctionNames": ["f"],
    }


def test_generation_config_and_google_extras() -> None:
    body = chat(
        USER,
        temperature=0,
        top_p=0.5,
        top_k=3,
        n=2,
        max_tokens=10,
        max_completion_tokens=20,
        stop=["a", "b"],
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logprobs=True,
        top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        extra_body={"google": {"cached_content": "abc", "thinking_config": {"thinking_budget": 0}}},
        google={"safety_settings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]},
    )
    out = to_generate_content(body)
    assert out["generationConfig"] == {
        "temperature": 0,
        "topP": 0.5,
        "topK": 3,
        "candidateCount": 2,
        "presencePenalty": 0.1,
        "frequencyPenalty": 0.2,
        "maxOutputTokens": 20,
        "stopSequences": ["a", "b"],
        "responseLogprobs": True,
        "logprobs": 2,
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
        "thinkingConfig": {"thinkingBudget": 0},
    }
    assert out["cachedContent"] == "cachedContents/abc"
    assert out["safetySettings"][0]["threshold"] == "BLOCK_NONE"


def test_reasoning_effort_follows_googles_compat_mapping() -> None:
    budget = {
        e: to_generate_content(chat(USER, reasoning_effort=e))["generationConfig"]["thinkingConfig"]
        for e in ("none", "low", "medium", "high")
    }
    assert budget == {
        "none": {"thinkingBudget": 0},
        "low": {"thinkingBudget": 1024},
        "medium": {"thinkingBudget": 8192},
        "high": {"thinkingBudget": 24576},
    }
    three = {**chat(USER, reasoning_effort="medium"), "model": "gemini-3-pro-preview"}
    assert to_generate_content(three)["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "high"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0]"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"reasoning_effort": "low", "extra_body": {"google": {"thinking_config": {}}}}, "reasoning_effort"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
    ],
)
def test_what_gemini_cannot_express_is_a_400_naming_the_parameter(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ConversionError) as err:
        to_generate_content(chat(USER, **extra))
    assert err.value.status == 400 and err.value.param == param


def test_bad_messages_are_refused() -> None:
    with pytest.raises(ConversionError, match="tool call"):
        to_generate_content(chat(USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}))
    bad_args = {
        "role": "assistant",
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}],
    }
    with pytest.raises(ConversionError, match="JSON object"):
        to_generate_content(chat(USER, bad_args))
    with pytest.raises(ConversionError):
        to_generate_content(chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}))


# --------------------------------------------------------------------------- response


def test_response_with_thoughts_tool_calls_and_usage() -> None:
    response = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "thinking...", "thought": True},
                        {"text": "Let me check."},
                        {"functionCall": {"name": "f", "args": {"q": 1}}, "thoughtSignature": "s"},
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 7036,
            "candidatesTokenCount": 19,
            "thoughtsTokenCount": 5,
            "totalTokenCount": 7060,
            "cachedContentTokenCount": 7021,
        },
        "responseId": "r1",
    }
    out = to_chat_completion(response, model=MODEL, created=1, fallback_id="x")
    assert out["id"] == "chatcmpl-r1" and out["model"] == MODEL and out["object"] == "chat.completion"
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_r1_0_0",
            "type": "function",
            "function": {"name": "f", "arguments": '{"q":1}'},
            "extra_content": {"google": {"thought_signature": "s"}},
        }
    ]
    assert out["usage"] == {
        "prompt_tokens": 7036,
        "completion_tokens": 24,
        "total_tokens": 7060,
        "prompt_tokens_details": {"cached_tokens": 7021},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    assert responses_usage(response["usageMetadata"]) == {
        "input_tokens": 7036,
        "input_tokens_details": {"cached_tokens": 7021},
        "output_tokens": 24,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 7060,
    }


def test_finish_reasons_blocked_prompts_and_logprobs() -> None:
    assert [finish_reason(r, False) for r in ("STOP", "MAX_TOKENS", "SAFETY", "RECITATION", "OTHER", None)] == [
        "stop",
        "length",
        "content_filter",
        "content_filter",
        "stop",
        "stop",
    ]
    assert finish_reason("MAX_TOKENS", True) == "length"
    blocked = to_chat_completion({"promptFeedback": {"blockReason": "SAFETY"}}, model=MODEL, created=1, fallback_id="f")
    assert blocked["id"] == "chatcmpl-f" and blocked["choices"][0]["finish_reason"] == "content_filter"
    assert blocked["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    with_logprobs = {
        "candidates": [
            {
                "content": {"parts": [{"text": "Hi"}]},
                "finishReason": "STOP",
                "logprobsResult": {
                    "chosenCandidates": [{"token": "Hi", "logProbability": -0.1}],
                    "topCandidates": [
                        {
                            "candidates": [
                                {"token": "Hi", "logProbability": -0.1},
                                {"token": "Yo", "logProbability": -2.0},
                            ]
                        }
                    ],
                },
            }
        ]
    }
    logprobs = to_chat_completion(with_logprobs, model=MODEL, created=1, fallback_id="f")["choices"][0]["logprobs"]
    assert logprobs["content"][0]["token"] == "Hi" and [t["token"] for t in logprobs["content"][0]["top_logprobs"]] == [
        "Hi",
        "Yo",
    ]


def test_google_errors_become_openai_errors() -> None:
    body = {
        "error": {
            "code": 403,
            "message": "CachedContent not found (or permission denied)",
            "status": "PERMISSION_DENIED",
        }
    }
    assert (
        google_error_fields(body) == google_error_fields([body]) == (403, "PERMISSION_DENIED", body["error"]["message"])
    )
    assert openai_error(*google_error_fields(body)) == {
        "error": {
            "message": body["error"]["message"],
            "type": "permission_error",
            "param": None,
            "code": "permission_denied",
        }
    }
    assert google_error_fields({"candidates": []}) == (None, "", "")
    assert openai_usage({})["prompt_tokens_details"] == {"cached_tokens": 0}


# --------------------------------------------------------------------------- stream


def _gemini_stream(reply: Reply, usage: Usage) -> bytes:
    return b"".join(sse(c) for c in stream_chunks(reply, usage, MODEL, "rid"))


def _convert(data: bytes, pieces: list[bytes] | None = None, *, include_usage: bool = True) -> list[Any]:
    converter = ChatStreamConverter(model=MODEL, created=1, fallback_id="fb", include_usage=include_usage)
    out = b"".join(converter.feed(p) for p in (pieces or [data])) + converter.finish()
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    return [orjson.loads(e[6:]) for e in events[:-1]]


def test_stream_conversion() -> None:
    reply = Reply(("Hello", " there"), False)
    chunks = _convert(_gemini_stream(reply, Usage(100, 60, 3)))
    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": " there"},
        {},
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert {c["id"] for c in chunks} == {"chatcmpl-rid"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 60}
    assert chunks[-1]["usage"]["prompt_tokens"] == 100 and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])
    plain = _convert(_gemini_stream(reply, Usage(100, 0, 3)), include_usage=False)
    assert all("usage" not in c for c in plain) and plain[-1]["choices"][0]["finish_reason"] == "stop"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_stream_conversion_does_not_depend_on_chunking(cuts: list[int]) -> None:
    data = _gemini_stream(Reply(("A", " tool", "-free", " answer"), False), Usage(50, 0, 4))
    bounds = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]
    assert _convert(data, pieces) == _convert(data)


def test_stream_tool_calls_and_errors() -> None:
    reply = Reply((), False, {"name": "f", "args": {"a": 1}})
    chunks = _convert(_gemini_stream(reply, Usage(10, 0, 5)))
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls == [
        {"index": 0, "id": "call_rid_0_0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"

    converter = ChatStreamConverter(model=MODEL, created=1, fallback_id="fb", include_usage=False)
    first = converter.feed(sse(next(stream_chunks(Reply(("x", "y"), False), Usage(1, 0, 1), MODEL, "r"))))
    error = converter.feed(sse({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}))
    assert b'"content":"x"' in first
    assert orjson.loads(error[6:]) == {
        "error": {"message": "overloaded", "type": "api_error", "param": None, "code": "unavailable"}
    }
    assert converter.feed(b"data: {}\r\n\r\n") == b"" and converter.finish() == b""  # nothing after an error
    garbled = ChatStreamConverter(model=MODEL, created=1, fallback_id="fb", include_usage=False)
    assert b'"error"' in garbled.feed(b"data: {not json\n\n")


# --------------------------------------------------------------------------- compat and policy


def test_with_cached_content_drops_the_system_prompt_without_mutating() -> None:
    body = chat({"role": "system", "content": "S"}, USER, extra_body={"google": {"thinking_config": {}}, "x": 1})
    new = with_cached_content(body, "cachedContents/c1")
    assert new["messages"] == [USER]
    assert new["extra_body"] == {"google": {"thinking_config": {}, "cached_content": "cachedContents/c1"}, "x": 1}
    assert body["messages"][0]["role"] == "system" and "cached_content" not in body["extra_body"]["google"]
    # The native conversion maps the same placement to top-level cachedContent, no systemInstruction.
    native = to_generate_content(new)
    assert native["cachedContent"] == "cachedContents/c1" and "systemInstruction" not in native


def test_compat_usage_is_read_and_filled_in_on_a_hit() -> None:
    with_details = orjson.dumps({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}})
    assert observe_body(with_details, 7) == (with_details, 4)
    bare = orjson.dumps({"usage": {"prompt_tokens": 9}})
    assert observe_body(bare, None) == (bare, None)
    filled, cached = observe_body(bare, 7)
    assert cached == 7 and orjson.loads(filled)["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}

    tap = CompatStreamTap(fill=7)
    stream = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":9}}\n\ndata: [DONE]\n\n'
    out = b"".join(tap.feed(stream[i : i + 5]) for i in range(0, len(stream), 5)) + tap.finish()
    events = out.split(b"\n\n")
    assert events[0] == b'data: {"choices":[{"delta":{"content":"a"}}]}' and events[2] == b"data: [DONE]"
    assert orjson.loads(events[1][6:])["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    assert tap.saw_usage and tap.cached == 7


def test_eligibility() -> None:
    big = "x" * 2000
    system = {"role": "system", "content": big}
    assert cache_candidate(chat(system, USER), 1024, 1 << 20) == Candidate(big)
    # The digest the ingress sends is the foundation's Gemini digest of the request.
    assert digest_hex(MODEL, big) == (gemini_digest(chat(system, USER)) or b"").hex()
    parts = {"role": "developer", "content": [{"type": "text", "text": big}, {"type": "text", "text": "tail"}]}
    assert cache_candidate(chat(parts, USER), 1024, 1 << 20) == Candidate(big + "\ntail")
    cases = [
        (chat(USER), Ineligible.NO_SYSTEM),
        (chat(USER, system), Ineligible.NO_SYSTEM),
        (chat(system), Ineligible.SHAPE),
        (chat(system, USER, {"role": "system", "content": "again"}), Ineligible.SHAPE),
        (
            chat({"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, USER),
            Ineligible.SHAPE,
        ),
        (chat({"role": "system", "content": "short"}, USER), Ineligible.SMALL),
        (chat(system, USER, tools=[{"type": "function", "function": {"name": "f"}}]), Ineligible.TOOLS),
        (chat(system, USER, tool_choice="none"), Ineligible.TOOLS),
        (chat(system, USER, extra_body={"google": {"cached_content": "c"}}), Ineligible.CLIENT_CACHE),
    ]
    for body, reason in cases:
        assert cache_candidate(body, 1024, 1 << 20) == reason, body
    assert cache_candidate(chat(system, USER), 1024, 2048) == Ineligible.TOO_LARGE


def test_lookup_memo() -> None:
    now = [0.0]
    memo = LookupMemo(2.0, max_entries=2, clock=lambda: now[0])
    hit = LookupReply(LookupResult.HIT, cached_content="cachedContents/a", expire_at=1e12)
    memo.put(("b", "1"), hit)
    memo.put(("b", "2"), LookupReply(LookupResult.MISS), ttl_s=0.5)
    assert memo.get(("b", "1")) is hit
    now[0] = 1.0
    assert memo.get(("b", "2")) is None  # its own shorter lifetime
    memo.put(("b", "3"), hit)
    memo.put(("b", "4"), hit)  # bounded: the least recently used goes
    assert len(memo) == 2 and memo.get(("b", "1")) is None
    now[0] = 3.5
    assert memo.get(("b", "3")) is None
    disabled = LookupMemo(0.0)
    disabled.put(("b", "1"), hit)
    assert disabled.get(("b", "1")) is None


def test_lookup_memo_evicts_the_least_recently_used() -> None:
    memo = LookupMemo(60.0, max_entries=2, clock=lambda: 0.0)
    hit = LookupReply(LookupResult.HIT, cached_content="cachedContents/a", expire_at=1e12)
    memo.put(("b", "old"), hit)
    memo.put(("b", "new"), hit)
    assert memo.get(("b", "old")) is hit  # used again: now the most recent
    memo.put(("b", "third"), hit)
    assert memo.get(("b", "old")) is hit
    assert memo.get(("b", "new")) is None  # the least recently used went, not the oldest insert


# --------------------------------------------------------------------------- Responses API


def test_responses_request_conversion() -> None:
    body = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use metric units."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"c": "Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "summary": []},
        ],
        "max_output_tokens": 99,
        "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "w"},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
    }
    out = to_generate_content(responses_to_chat(body))
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief."}, {"text": "Use metric units."}]}
    assert out["contents"] == [
        {"role": "user", "parts": [{"text": "Weather?"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "w", "args": {"c": "Rome"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "w", "response": {"content": "sunny"}}}]},
    ]
    assert out["tools"] == [{"functionDeclarations": [{"name": "w", "parametersJsonSchema": {"type": "object"}}]}]
    assert out["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["w"]}}
    assert out["generationConfig"] == {
        "maxOutputTokens": 99,
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
        "thinkingConfig": {"thinkingBudget": 1024},
    }
    for bad, param in (
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ):
        with pytest.raises(ConversionError) as err:
            responses_to_chat({"model": MODEL, "input": "x", **bad})
        assert err.value.param == param


def test_responses_answer_conversion() -> None:
    request = {"model": MODEL, "input": "x", "max_output_tokens": 5}
    gemini = {
        "candidates": [
            {
                "content": {"parts": [{"text": "Partial"}, {"functionCall": {"name": "f", "args": {"a": 1}}}]},
                "finishReason": "MAX_TOKENS",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 10,
            "candidatesTokenCount": 5,
            "totalTokenCount": 15,
            "cachedContentTokenCount": 8,
        },
        "responseId": "r9",
    }
    out = to_response(gemini, request=request, created=5, fallback_id="f")
    assert out["id"] == "resp_r9" and out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"} and out["max_output_tokens"] == 5
    assert out["output"] == [
        {
            "type": "message",
            "id": "msg_r9",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Partial", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_r9_0",
            "call_id": "call_r9_0",
            "name": "f",
            "arguments": '{"a":1}',
            "status": "completed",
        },
    ]
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": 8} and out["usage"]["input_tokens"] == 10
    blocked = to_response({"promptFeedback": {"blockReason": "SAFETY"}}, request=request, created=5, fallback_id="f")
    assert blocked["status"] == "incomplete" and blocked["incomplete_details"] == {"reason": "content_filter"}


def _responses_events(data: bytes, pieces: list[bytes] | None = None) -> list[dict[str, Any]]:
    converter = ResponsesStreamConverter(request={"model": MODEL, "input": "x"}, created=1, fallback_id="fb")
    out = b"".join(converter.feed(p) for p in (pieces or [data])) + converter.finish()
    events = []
    for event in (e for e in out.split(b"\n\n") if e):
        kind, payload = event.split(b"\n", 1)
        parsed = orjson.loads(payload[6:])
        assert kind == b"event: " + parsed["type"].encode()
        events.append(parsed)
    return events


def test_responses_stream_conversion() -> None:
    data = _gemini_stream(Reply(("Hi", " you"), False), Usage(20, 12, 2))
    events = _responses_events(data)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[6]["text"] == "Hi you"
    final = events[-1]["response"]
    assert final["id"] == "resp_rid" and final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hi you"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 12}
    calls = _responses_events(_gemini_stream(Reply((), False, {"name": "f", "args": {}}), Usage(1, 0, 1)))
    assert [e["type"] for e in calls][2:6] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert calls[-1]["response"]["output"][0]["name"] == "f"
    pieces = [data[i : i + 7] for i in range(0, len(data), 7)]
    assert _responses_events(data, pieces) == events
    failing = ResponsesStreamConverter(request={"model": MODEL}, created=1, fallback_id="fb")
    error = failing.feed(sse({"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}))
    assert b"event: error" in error and b'"message":"boom"' in error and failing.finish() == b""
