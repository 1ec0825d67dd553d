"""Bad requests get the right status and body and never reach a backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import RunningStub, running_stubs

GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MSG = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

CASES = [
    # path, raw body, status, (OpenAI code | Anthropic type), param (OpenAI only)
    ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/chat/completions", b"", 400, "invalid_json", None),
    ("/v1/chat/completions", b'["a"]', 400, "invalid_json", None),
    ("/v1/chat/completions", b'{"messages": []}', 400, "missing_required_parameter", "model"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": 1}]}', 400, "invalid_type", "messages[0].role"),
    (
        "/v1/chat/completions",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
        400,
        "invalid_type",
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
        404,
        "model_not_found",
        "model",
    ),
    ("/v1/embeddings", b'{"model": "m", "input": {"a": 1}}', 400, "invalid_type", "input"),
    ("/v1/completions", b'{"model": "m"}', 400, "missing_required_parameter", "prompt"),
    ("/v1/responses", b'{"input": "x"}', 400, "missing_required_parameter", "model"),
    ("/v1/responses", b'{"model": "m", "input": [{"role": "robot", "content": "x"}]}', 400, None, "input[0].role"),
    (
        "/v1/responses",
        b'{"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}',
        400,
        None,
        "input[0].content[0].text",
    ),
    ("/v1/responses", b'{"model": "m", "input": "x", "instructions": ["x"]}', 400, "invalid_type", "instructions"),
    (
        "/v1/messages",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
        400,
        "invalid_request_error",
        None,
    ),
    ("/anthropic/v1/messages", b"{oops", 400, "invalid_request_error", None),
    (
        "/anthropic/v1/messages",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
        400,
        "invalid_request_error",
        None,
    ),
    (
        "/anthropic/v1/messages",
        b'{"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}',
        404,
        "not_found_error",
        None,
    ),
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def shared() -> AsyncIterator[tuple[RunningStub, RunningIngress]]:
    async with running_stubs("a") as stubs, running_ingress({"backends": stub_backends(stubs)}) as ing:
        yield stubs[0], ing


@pytest.mark.parametrize(("path", "raw", "status", "kind", "param"), CASES)
async def test_bad_requests_are_refused_before_any_backend(
    shared: tuple[RunningStub, RunningIngress], path: str, raw: bytes, status: int, kind: str, param: str | None
) -> None:
    stub, ing = shared
    async with httpx.AsyncClient(base_url=ing.url, verify=False) as c:
        r = await c.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status
    body = r.json()
    if path.startswith(("/anthropic", "/v1/messages")):
        assert body["type"] == "error" and body["error"]["type"] == kind and body["request_id"]
        assert r.headers["request-id"] == body["request_id"]
    else:
        assert body["error"]["code"] == kind and body["error"]["param"] == param
    assert stub.stub.requests == []


async def test_body_limit_is_413_with_or_without_content_length() -> None:
    async with running_stubs("a") as stubs:
        cfg = {"backends": stub_backends(stubs), "server": {"max_body_bytes": 2048}}
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, verify=False) as c:
            big = {**GOOD, "messages": [{"role": "user", "content": "x" * 4000}]}
            r = await c.post("/v1/chat/completions", json=big)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

            async def chunks():  # type: ignore[no-untyped-def]
                for _ in range(8):
                    yield b" " * 512  # chunked: no Content-Length to refuse early

            r = await c.post("/v1/chat/completions", content=chunks())
            assert r.status_code == 413
            r = await c.post("/anthropic/v1/messages", json={**MSG, "system": "y" * 4000})
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
            r = await c.post("/v1/chat/completions", json=GOOD)  # the service keeps serving
            assert r.status_code == 200
    assert len(stubs[0].stub.requests) == 1


async def test_unknown_paths_and_methods_get_json_errors() -> None:
    async with (
        running_stubs("a") as stubs,
        running_ingress({"backends": stub_backends(stubs)}) as ing,
        httpx.AsyncClient(base_url=ing.url, verify=False) as c,
    ):
        r = await c.get("/v1/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
        r = await c.post("/v1/nothing", json=GOOD)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
        r = await c.post("/anthropic/v1/nothing", json=GOOD)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = await c.get("/v1/messages")  # Anthropic's path at the root: Anthropic's error shape
        assert r.status_code == 405 and r.json()["type"] == "error"
        assert (await c.get("/healthz")).text == "ok"
        ready = await c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["m"]
    assert stubs[0].stub.requests == []


async def test_rejections_are_counted_by_reason() -> None:
    async with (
        running_stubs("a") as stubs,
        running_ingress({"backends": stub_backends(stubs)}) as ing,
        httpx.AsyncClient(base_url=ing.url, verify=False) as c,
    ):
        await c.post("/v1/chat/completions", content=b"{")
        await c.post("/v1/chat/completions", json={"model": "zzz", "messages": [{"role": "user", "content": "x"}]})
        await c.post("/v1/chat/completions", json={"model": "m"})
        metrics = (await c.get("/metrics")).text
    for reason in ("invalid_json", "unknown_model", "invalid_request"):
        assert (
            f'continuum_ingress_rejected_requests_total{{endpoint="chat_completions",reason="{reason}"}} 1.0' in metrics
        )
