"""Upstream dialects: paths, auth headers, URL joining; admin token comparison; header parsing."""

from __future__ import annotations

from continuum_ingress.admin import token_matches
from continuum_ingress.asgi import read_headers
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import ClientHeaders, default_dialects, join_url
from continuum_ingress.snapshot import split_tokens


def test_join_url_does_not_repeat_a_version_prefix() -> None:
    assert join_url("http://h:8000", "/v1/chat/completions") == "http://h:8000/v1/chat/completions"
    assert (
        join_url("https://api.openai.com/v1/", "/v1/chat/completions") == "https://api.openai.com/v1/chat/completions"
    )
    assert (
        join_url("https://generativelanguage.googleapis.com/v1beta/openai", "/v1beta/openai/chat/completions")
        == "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
    )
    assert join_url("http://h/prefix", "/v1/messages") == "http://h/prefix/v1/messages"


def test_which_backend_types_serve_which_apis() -> None:
    d = default_dialects()
    assert d["vllm"].supports(Api.MESSAGES) and d["vllm"].path(Api.MESSAGES) == "/v1/messages"
    assert not d["openai"].supports(Api.MESSAGES)
    assert d["anthropic"].supports(Api.MESSAGES) and not d["anthropic"].supports(Api.CHAT)
    assert d["gemini"].path(Api.CHAT) == "/v1beta/openai/chat/completions"
    assert not d["trtllm"].supports(Api.EMBEDDINGS)


def test_auth_headers() -> None:
    d = default_dialects()
    client = ClientHeaders(bearer="client-key", passthrough=(("traceparent", "00-x"),))
    assert ("authorization", "Bearer backend-key") in d["openai"].headers(Api.CHAT, "backend-key", client)
    # No key of its own: the caller's credential is passed on.
    assert ("authorization", "Bearer client-key") in d["vllm"].headers(Api.CHAT, None, client)
    assert ("traceparent", "00-x") in d["vllm"].headers(Api.CHAT, None, client)
    new_sdk = ClientHeaders(bearer="ak", anthropic_version="2026-10-21")
    anth = d["anthropic"].headers(Api.MESSAGES, "sk-ant", new_sdk)
    assert ("x-api-key", "sk-ant") in anth and ("anthropic-version", "2026-10-21") in anth
    assert not any(k == "authorization" for k, _ in anth)
    old_sdk = ClientHeaders(x_api_key="ak", anthropic_beta="b1")
    anth = d["anthropic"].headers(Api.MESSAGES, None, old_sdk)
    assert (
        ("x-api-key", "ak") in anth and ("anthropic-version", "2023-06-01") in anth and ("anthropic-beta", "b1") in anth
    )
    assert ("authorization", "Bearer g") in d["gemini"].headers(Api.CHAT, "g", ClientHeaders())


def test_admin_tokens() -> None:
    tokens = split_tokens("tok-one\ntok-two, tok-three")
    assert tokens == (b"tok-one", b"tok-two", b"tok-three")
    assert token_matches(b"tok-two", tokens)
    assert not token_matches(b"tok-tw", tokens)
    assert not token_matches(b"", tokens)
    assert not token_matches(b"anything", ())


def test_read_headers() -> None:
    info = read_headers(
        [
            (b"authorization", b"Bearer abc"),
            (b"x-api-key", b"k"),
            (b"anthropic-version", b"2026-10-21"),
            (b"x-session-id", b"sess-1"),
            (b"x-request-id", b"rid-7"),
            (b"content-length", b"12"),
            (b"traceparent", b"00-abc"),
        ]
    )
    assert info.client.bearer == "abc" and info.client.x_api_key == "k"
    assert info.client.anthropic_version == "2026-10-21"
    assert (info.session_id, info.request_id, info.content_length) == ("sess-1", "rid-7", 12)
    assert ("traceparent", "00-abc") in info.client.passthrough
    generated = read_headers([(b"x-request-id", b"x" * 500)])
    assert len(generated.request_id) == 24  # too long to trust: a fresh id instead
