"""Hostile HTTP against a real ingress over loopback, in front of a real upstream stub.

One ingress (prefix routing, PrefixAwareHash, the in-memory response cache: the code a request
body travels through before it is forwarded) and one recording upstream serve every example of
this module. For every request:

* the answer is a 2xx only when the body is one the validator (`parse_request`) accepts for a
  served model, else a 4xx with an OpenAI-shaped (`/v1`) or Anthropic-shaped (`/anthropic`)
  JSON error body; never a 5xx;
* nothing reaches the upstream unless the validator accepts it: the upstream records the raw
  bytes of every POST, and each must pass `parse_request` for its path;
* the router keeps serving (a valid request still gets its 200 after each test).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest_asyncio
from hypothesis import event, example, given
from hypothesis import strategies as st

from continuum_ingress.asgi import Receive, Scope, Send
from continuum_ingress.errors import InvalidRequest
from continuum_ingress.protocol.apis import CLIENT_PATHS, Api
from continuum_ingress.protocol.requests import ParsedRequest, parse_request
from continuum_ingress.server import RunningServer
from continuum_testing.ingress_harness import RunningIngress, running_ingress
from continuum_testing.upstream_stub import StubUpstream
from tests.fuzz.strategies import (
    CLAUDE,
    MODEL,
    Deep,
    chat_bodies,
    completion_bodies,
    dump_json,
    embedding_bodies,
    fuzz_settings,
    json_values,
    message_bodies,
    mutated,
    response_bodies,
)

PATHS = {api: path for path, api in CLIENT_PATHS.items()}
BODIES = {
    Api.CHAT: chat_bodies,
    Api.COMPLETIONS: completion_bodies,
    Api.EMBEDDINGS: embedding_bodies,
    Api.RESPONSES: response_bodies,
    Api.MESSAGES: message_bodies,
}
# The upstream path of each client API on an OpenAI-compatible (vllm) backend.
UPSTREAM_APIS = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
    "/v1/responses": Api.RESPONSES,
    "/v1/messages": Api.MESSAGES,
}
VALID = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "still there?"}]})


@dataclass
class Reached:
    path: str
    raw: bytes


@dataclass
class RecordingUpstream:
    """The test upstream behind a recorder of the exact bytes of every POST it is sent."""

    stub: StubUpstream
    reached: list[Reached] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.stub(scope, receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.reached.append(Reached(scope["path"], raw))
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.stub(scope, replay, send)


@dataclass
class Rig:
    ingress: RunningIngress
    upstream: RecordingUpstream
    client: httpx.AsyncClient


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig() -> AsyncIterator[Rig]:
    upstream = RecordingUpstream(StubUpstream("a"))
    async with RunningServer(upstream) as server:
        every = {"url": server.url, "health_check_interval_ms": 1000}
        backends = [
            {"name": "a", "type": "vllm", "models": [MODEL], **every},
            {"name": "c", "type": "anthropic", "models": [CLAUDE], **every},  # cache_control injection
        ]
        config = {
            "prefix_routing": {"enabled": True},
            "selection_strategy": "PrefixAwareHash",
            "response_cache": {"enabled": True, "backend": "memory"},
            "server": {"max_body_bytes": 256 * 1024},
            "backends": backends,
        }
        async with (
            running_ingress(config) as ingress,
            httpx.AsyncClient(base_url=ingress.url, timeout=10) as client,
        ):
            yield Rig(ingress, upstream, client)


# -- the property -----------------------------------------------------------------------------


def expected(api: Api, raw: bytes) -> ParsedRequest | None:
    """What the validator says: the parsed request, or None when it refuses the body."""
    try:
        return parse_request(api, raw)
    except InvalidRequest:
        return None


def assert_error_shape(api: Api | None, path: str, response: httpx.Response) -> None:
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    anthropic = api is Api.MESSAGES or (api is None and path.startswith("/anthropic/"))
    if anthropic:
        assert body["type"] == "error" and isinstance(body["error"]["type"], str), body
        assert isinstance(body["error"]["message"], str), body
    else:
        error = body["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str), body
        assert "param" in error and "code" in error, body


def assert_reached_are_valid(reached: list[Reached]) -> None:
    for got in reached:
        api = UPSTREAM_APIS[got.path]
        assert expected(api, got.raw) is not None, f"an invalid {api.value} body reached the backend"


async def send(
    rig: Rig, path: str, raw: bytes, *, method: str = "POST", headers: dict[str, str] | list[Any] | None = None
) -> httpx.Response:
    before = len(rig.upstream.reached)
    response = await rig.client.request(
        method, path, content=raw, headers=headers or {"content-type": "application/json"}
    )
    await response.aread()
    path = response.request.url.path  # as sent: the client resolves dot segments
    reached = rig.upstream.reached[before:]
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, (response.status_code, response.text[:500])
    assert_reached_are_valid(reached)
    api = CLIENT_PATHS.get(path) if method == "POST" else None
    if api is None:
        assert not reached
        if response.status_code >= 400 and method != "HEAD":
            assert_error_shape(None, path, response)
        return response
    parsed = expected(api, raw)
    if parsed is not None and (parsed.model == MODEL or (parsed.model, api) == (CLAUDE, Api.MESSAGES)):
        assert response.status_code == 200, (response.status_code, response.text[:500])
        cached = response.headers.get("x-cache") == "HIT"
        assert len(reached) == (0 if cached else 1)
    else:
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
        assert not reached, "a refused request reached the backend"
        assert_error_shape(api, path, response)
    return response


async def assert_still_serving(rig: Rig) -> None:
    r = await rig.client.post("/v1/chat/completions", content=VALID, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


# -- bodies -----------------------------------------------------------------------------------

apis = st.sampled_from(list(BODIES))


@fuzz_settings(2.0)
@given(api=apis, data=st.data())
@example(api=Api.MESSAGES, data=None).via("anthropic role of an unhashable type")
async def test_mutated_bodies_on_every_api(rig: Rig, api: Api, data: st.DataObject | None) -> None:
    if data is None:
        body: Any = {"model": MODEL, "max_tokens": 5, "messages": [{"role": ["user"], "content": "hi"}]}
    else:
        body = data.draw(mutated(BODIES[api]), label="body")
    await send(rig, PATHS[api], dump_json(body))


@st.composite
def deep_inside(draw: st.DrawFn, api: Api) -> Any:
    """A valid body with a deeply nested value added to one of its objects, where unknown
    fields pass the validator: around its depth bound, orjson's encoder limit (255), Python's
    recursion limit (~1000) and the parser's (1024)."""
    body = copy.deepcopy(draw(BODIES[api]))  # st.just() values are shared between examples
    where = draw(st.sampled_from(_object_paths(body)))
    depth = draw(st.sampled_from([60, 100, 120, 124, 125, 126, 127, 128, 200, 255, 256, 600, 990, 1000, 1020]))
    deep = Deep(depth, draw(st.booleans()))
    node = body
    for key in where:
        node = node[key]
    node["x-deep"] = deep
    return body


def _object_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if isinstance(value, dict) else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out += _object_paths(item, (*prefix, key))
    return out


@fuzz_settings(0.5)
@given(api=apis, data=st.data())
@example(api=Api.MESSAGES, data=None).via("a deep value in a message sent to an Anthropic backend")
async def test_deep_values_where_unknown_fields_pass(rig: Rig, api: Api, data: st.DataObject | None) -> None:
    if data is None:
        block = {"type": "text", "text": "x", "x-deep": Deep(1000, as_object=True)}
        body: Any = {
            "model": CLAUDE,
            "max_tokens": 5,
            "system": "s",
            "messages": [{"role": "user", "content": [block]}],
        }
    else:
        body = data.draw(deep_inside(api), label="body")
    await send(rig, PATHS[api], dump_json(body))


@fuzz_settings(0.5)
@given(api=apis, value=json_values(40))
async def test_arbitrary_json_values(rig: Rig, api: Api, value: Any) -> None:
    await send(rig, PATHS[api], dump_json(value))


def _truncations(raw: bytes) -> st.SearchStrategy[bytes]:
    return st.integers(min_value=0, max_value=len(raw)).map(lambda n: raw[:n])


def _flips(raw: bytes) -> st.SearchStrategy[bytes]:
    def flip(spots: list[tuple[int, int]]) -> bytes:
        out = bytearray(raw)
        for at, bit in spots:
            out[at % len(out)] ^= 1 << bit
        return bytes(out)

    return st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 7)), min_size=1, max_size=4).map(flip)


@st.composite
def garbled(draw: st.DrawFn, api: Api) -> bytes:
    raw = dump_json(draw(BODIES[api]))
    how = draw(st.sampled_from(["truncate", "flip", "bom", "utf16", "trailing", "literal", "binary", "duplicate"]))
    if how == "truncate":
        return draw(_truncations(raw))
    if how == "flip":
        return draw(_flips(raw))
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "utf16":
        return raw.decode().encode("utf-16")
    if how == "trailing":
        return raw + draw(st.sampled_from([b"x", b"{}", b"\x00", b"\n\n", b",", b"]"]))
    if how == "literal":
        literal = draw(
            st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"01", b"0x10", b"'m'", b"undefined"])
        )
        return raw.replace(b'"model":', b'"max_tokens":' + literal + b',"model":', 1)
    if how == "duplicate":
        return raw[:-1] + b',"model":' + dump_json(draw(json_values(4))) + b"}" if raw.endswith(b"}") else raw
    return draw(st.binary(max_size=300))


@fuzz_settings(1.0)
@given(data=st.data(), api=apis)
async def test_truncated_and_garbage_bodies(rig: Rig, data: st.DataObject, api: Api) -> None:
    await send(rig, PATHS[api], data.draw(garbled(api), label="raw"))


# -- headers, paths, methods ------------------------------------------------------------------

HEADER_NAMES = ["content-type", "x-session-id", "x-request-id", "authorization", "x-api-key", "anthropic-version",
                "anthropic-beta", "traceparent", "tracestate", "cache-control", "accept", "accept-encoding",
                "x-tenant", "x-cache-mode", "expect", "user-agent", "cookie", "x-forwarded-for", "forwarded"]  # fmt: skip
_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~", min_size=1, max_size=20)
# Values the HTTP client can put on the wire: latin-1 without control characters (those the
# HTTP layers on both sides refuse, before anything reaches the router).
_header_value = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=200),
    st.sampled_from(["Bearer ", "Bearer", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "2023-06-01", "a" * 129,
                     "text/event-stream", "100-continue", "gzip, br", "no-store", "application/x-www-form-urlencoded"]),
)  # fmt: skip


@fuzz_settings(0.7)
@given(
    api=apis,
    headers=st.lists(st.tuples(st.sampled_from(HEADER_NAMES) | _token, _header_value), max_size=8),
    data=st.data(),
)
async def test_random_headers(rig: Rig, api: Api, headers: list[tuple[str, str]], data: st.DataObject) -> None:
    raw = dump_json(data.draw(BODIES[api], label="body"))
    wire = [(k.encode(), v.encode("latin-1")) for k, v in headers if k not in ("content-length", "transfer-encoding")]
    try:
        await send(rig, PATHS[api], raw, headers=wire)
    except httpx.LocalProtocolError:
        pass  # refused by the client's own HTTP layer: never sent


_segments = st.one_of(
    st.sampled_from(["v1", "chat", "completions", "anthropic", "messages", "embeddings", "responses", "models", "admin",
                     "healthz", "readyz", "metrics", "..", ".", "%2e%2e", "%00", "%ff", "v1beta", "m", ""]),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#"), max_size=12),
)  # fmt: skip


@fuzz_settings(0.7)
@given(
    segments=st.lists(_segments, min_size=0, max_size=5),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "PROPFIND"]),
    body=st.sampled_from([b"", VALID, b"{", b"\x00\xff"]),
)
async def test_random_paths_and_methods(rig: Rig, segments: list[str], method: str, body: bytes) -> None:
    path = "/" + "/".join(segments)
    try:
        await send(rig, path, body, method=method)
    except httpx.InvalidURL:
        pass  # the client would not send it


# -- below HTTP ---------------------------------------------------------------------------------


async def raw_exchange(rig: Rig, data: bytes) -> bytes:
    """Write `data` on a fresh connection, half-close, and read until the router closes."""
    port = rig.ingress.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    body = dump_json(draw(chat_bodies))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    whole = head + body
    how = draw(st.sampled_from(["truncate", "flip", "binary", "smuggle", "lengths"]))
    if how == "truncate":
        return whole[: draw(st.integers(0, len(whole)))]
    if how == "flip":
        return draw(_flips(whole))
    if how == "smuggle":
        return head.replace(b"\r\n\r\n", b"\r\ntransfer-encoding: chunked\r\n\r\n") + body
    if how == "lengths":
        value = draw(st.sampled_from([b"-1", b"abc", b"1e3", b" 5", b"99999999999999999999", b"5, 6", b""]))
        return head.replace(b"content-length: %d" % len(body), b"content-length: " + value) + body
    return draw(st.binary(max_size=400))


@fuzz_settings(0.4)
@given(data=raw_requests())
async def test_garbage_on_the_socket(rig: Rig, data: bytes) -> None:
    before = len(rig.upstream.reached)
    answer = await raw_exchange(rig, data)
    event(f"answer {answer[:12]!r}")
    for head in answer.split(b"HTTP/1.1 ")[1:]:
        status = int(head[:3])
        assert status < 500, answer[:300]
    assert_reached_are_valid(rig.upstream.reached[before:])


async def test_the_router_kept_serving_and_counted_no_5xx(rig: Rig) -> None:
    await assert_still_serving(rig)
    metrics = (await rig.client.get("/metrics")).text
    served = [line for line in metrics.splitlines() if line.startswith("continuum_ingress_requests_total{")]
    assert served, "no request was counted"
    errors = [line for line in served if 'status="5xx"' in line and float(line.rpartition(" ")[2]) > 0]
    assert not errors, errors
