"""A fake Google Generative Language API on a real loopback HTTP server, written from
provider-apis.md §1, for tests (Google is a paid external API; everything else in the tests
is real).

    async with FakeGemini(min_cache_tokens=1024) as fake:
        fake.url                    # http://127.0.0.1:<port>  (backend `url`, SDK base_url)
        fake.openai_base_url        # http://127.0.0.1:<port>/v1beta/openai/  (openai SDK)
        fake.count(Op.CREATE)       # calls recorded per operation (and status)
        fake.inject(Op.CREATE, status=503, times=2)   # the next 2 creates fail
        fake.inject(Op.CREATE, status=None, delay=1)  # the next create is slow
        fake.caches                 # live cachedContents by name

Served under both `/v1beta` and `/v1`: cachedContents create/list/get/patch/delete,
`models/{m}:generateContent`, `models/{m}:streamGenerateContent?alt=sse` (without `alt=sse`
the stream answer is one JSON array), and the OpenAI-compatible `openai/chat/completions`
(stream and non-stream). Every success is HTTP 200; errors are `google.rpc.Status` JSON with
Google's messages: 400 "Cached content is too small. total_token_count=N,
min_total_token_count=M", 403 "CachedContent not found (or permission denied)" for unknown or
expired caches (set `missing_cache_status=404` to imitate proxies), 400 when `cachedContent`
comes with systemInstruction/tools/toolConfig.

Auth: `x-goog-api-key` or `?key=` (native), `Authorization: Bearer` (compat). With `api_keys`
set, any other key is a 400 API_KEY_INVALID; a missing key is a 403. Caches belong to the key
that created them, as they belong to a Google project.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from continuum_common.asgi_server import EmbeddedServer
from continuum_common.gemini_api import (
    GeminiFormatError,
    cache_resource,
    format_timestamp,
    model_resource,
    parse_timestamp,
    parse_ttl,
)
from continuum_testing import fake_gemini_bodies as bodies

DEFAULT_TTL_S = 3600.0  # Google's default when neither ttl nor expireTime is sent
DEFAULT_REPLY = "This is a reply from the fake Gemini server."


class Op(StrEnum):
    CREATE = "create"
    GET = "get"
    LIST = "list"
    PATCH = "patch"
    DELETE = "delete"
    GENERATE = "generate"
    STREAM_GENERATE = "stream_generate"
    OPENAI_CHAT = "openai_chat"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class RecordedCall:
    op: Op
    method: str
    path: str
    query: dict[str, str]
    body: Any  # parsed JSON, or None
    api_key: str | None
    status: int = 0


@dataclass(slots=True)
class Fault:
    status: int | None  # None: only the delay, then the call proceeds normally
    body: Any = None
    delay: float = 0.0


@dataclass(slots=True)
class FakeCache:
    name: str
    model: str
    display_name: str
    create_time: float
    update_time: float
    expire_at: float
    token_count: int
    owner_key: str | None
    system_instruction: Any = None
    contents: Any = None

    def resource(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "createTime": format_timestamp(self.create_time),
            "updateTime": format_timestamp(self.update_time),
            "expireTime": format_timestamp(self.expire_at),
            "displayName": self.display_name,
            "usageMetadata": {"totalTokenCount": self.token_count},
        }


class _Fail(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def _fail(status: int, message: str) -> _Fail:
    return _Fail(status, bodies.google_error(status, message, bodies.STATUS_NAMES.get(status, "UNKNOWN")))


def _json(status: int, body: Any) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class FakeGemini:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        api_keys: Collection[str] | None = None,
        min_cache_tokens: int | Mapping[str, int] = 1024,
        reply_text: str = DEFAULT_REPLY,
        missing_cache_status: int = 403,
        implicit_cached_tokens: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.clock = clock
        self.api_keys = set(api_keys) if api_keys is not None else None
        self.min_cache_tokens = min_cache_tokens
        self.reply_text = reply_text
        self.reply_function_call: Mapping[str, Any] | None = None
        self.missing_cache_status = missing_cache_status
        self.implicit_cached_tokens = implicit_cached_tokens
        self.stream_chunk_delay = 0.0
        self.caches: dict[str, FakeCache] = {}
        self.calls: list[RecordedCall] = []
        self._faults: dict[Op, deque[Fault]] = defaultdict(deque)
        self._ids = itertools.count(1)
        self._server = EmbeddedServer(self._app(), host, port)

    # ------------------------------------------------------------------ lifecycle and helpers

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def openai_base_url(self) -> str:
        return f"{self._server.url}/v1beta/openai/"

    async def start(self) -> FakeGemini:
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop()

    async def __aenter__(self) -> FakeGemini:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def count(self, op: Op, *, status: int | None = None) -> int:
        return sum(1 for c in self.calls if c.op is op and (status is None or c.status == status))

    def calls_for(self, op: Op) -> list[RecordedCall]:
        return [c for c in self.calls if c.op is op]

    def inject(self, op: Op, status: int | None = 500, *, body: Any = None, delay: float = 0.0, times: int = 1) -> None:
        """Queue `times` faults for the next calls of `op`: answer `status` with `body` (a
        Google error body for that status by default) after `delay` seconds."""
        for _ in range(times):
            self._faults[op].append(Fault(status, body, delay))

    def live_caches(self) -> dict[str, FakeCache]:
        now = self.clock()
        return {n: c for n, c in self.caches.items() if c.expire_at > now}

    def min_tokens_for(self, model: str) -> int:
        if isinstance(self.min_cache_tokens, int):
            return self.min_cache_tokens
        return self.min_cache_tokens.get(model.removeprefix("models/"), 1024)

    # ------------------------------------------------------------------ routing

    def _app(self) -> Starlette:
        routes = [
            Route("/{version}/cachedContents", self._collection, methods=["GET", "POST"]),
            Route("/{version}/cachedContents/{cid}", self._item, methods=["GET", "PATCH", "DELETE"]),
            Route("/{version}/models/{target:path}", self._models, methods=["POST"]),
            Route("/{version}/openai/chat/completions", self._openai_chat, methods=["POST"]),
            Route("/{rest:path}", self._unknown, methods=["GET", "POST", "PATCH", "DELETE", "PUT"]),
        ]
        return Starlette(routes=routes)

    async def _record(self, request: Request, op: Op) -> RecordedCall:
        raw = await request.body()
        body: Any = None
        if raw:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = raw
        key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
        auth = request.headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        call = RecordedCall(op, request.method, request.url.path, dict(request.query_params), body, key)
        self.calls.append(call)
        return call

    async def _prelude(self, request: Request, op: Op, call: RecordedCall) -> None:
        """Apply an injected fault, check the version and the API key."""
        if self._faults[op]:
            fault = self._faults[op].popleft()
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status is not None:
                status = fault.status
                body = fault.body
                if body is None:
                    body = bodies.google_error(status, "injected failure", bodies.STATUS_NAMES.get(status, "UNKNOWN"))
                raise _Fail(status, body)
        if request.path_params.get("version") not in ("v1beta", "v1"):
            raise _fail(404, f"API version {request.path_params.get('version')!r} is not served")
        if not call.api_key:
            raise _fail(403, bodies.NO_KEY)
        if self.api_keys is not None and call.api_key not in self.api_keys:
            raise _Fail(400, bodies.key_invalid_body())

    async def _run(self, request: Request, op: Op, handler: Callable[[RecordedCall], Awaitable[Response]]) -> Response:
        call = await self._record(request, op)
        try:
            await self._prelude(request, op, call)
            response = await handler(call)
        except _Fail as fail:
            response = _json(fail.status, fail.body)
        call.status = response.status_code
        return response

    async def _unknown(self, request: Request) -> Response:
        call = await self._record(request, Op.UNKNOWN)
        call.status = 404
        return _json(404, bodies.google_error(404, f"Method not found: {request.url.path}", "NOT_FOUND"))

    async def _collection(self, request: Request) -> Response:
        if request.method == "POST":
            return await self._run(request, Op.CREATE, self._create)
        return await self._run(request, Op.LIST, self._list)

    async def _item(self, request: Request) -> Response:
        op = {"GET": Op.GET, "PATCH": Op.PATCH, "DELETE": Op.DELETE}[request.method]
        handler = {Op.GET: self._get, Op.PATCH: self._patch, Op.DELETE: self._delete}[op]
        return await self._run(request, op, handler)

    async def _models(self, request: Request) -> Response:
        target = request.path_params["target"]
        model, _, method = target.rpartition(":")
        if method == "generateContent":
            return await self._run(request, Op.GENERATE, lambda c: self._generate(c, model, stream=False))
        if method == "streamGenerateContent":
            return await self._run(request, Op.STREAM_GENERATE, lambda c: self._generate(c, model, stream=True))
        return await self._unknown(request)

    # ------------------------------------------------------------------ cachedContents

    def _find(self, name: str, call: RecordedCall) -> FakeCache:
        cache = self.caches.get(name)
        if cache is not None and cache.expire_at <= self.clock():
            del self.caches[name]  # Google removes expired caches
            cache = None
        if cache is None or (cache.owner_key is not None and cache.owner_key != call.api_key):
            raise _fail(self.missing_cache_status, bodies.NOT_FOUND)
        return cache

    @staticmethod
    def _object_body(call: RecordedCall) -> dict[str, Any]:
        if not isinstance(call.body, dict):
            raise _fail(400, "Invalid JSON payload received. Expected an object.")
        return call.body

    def _expiry(self, body: Mapping[str, Any], now: float) -> float:
        ttl, expire = body.get("ttl"), body.get("expireTime")
        if ttl is not None and expire is not None:
            raise _fail(400, "Only one of ttl and expire_time can be set.")
        try:
            if ttl is not None:
                return now + parse_ttl(ttl)
            if expire is not None:
                return parse_timestamp(expire)
        except GeminiFormatError as exc:
            raise _fail(400, f"Invalid value: {exc}") from None
        return now + DEFAULT_TTL_S

    async def _create(self, call: RecordedCall) -> Response:
        body = self._object_body(call)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _fail(400, "Model is required.")
        model = model_resource(model)
        display = body.get("displayName", "")
        if not isinstance(display, str) or len(display) > 128:
            raise _fail(400, "display_name must be at most 128 characters.")
        now = self.clock()
        expire_at = self._expiry(body, now)
        system = body.get("systemInstruction")
        contents = body.get("contents")
        tokens = bodies.count_tokens(bodies.parts_text(system) + bodies.contents_text(contents))
        minimum = self.min_tokens_for(model)
        if tokens < minimum:
            raise _fail(400, bodies.TOO_SMALL.format(total=tokens, minimum=minimum))
        name = f"cachedContents/fake{next(self._ids):06d}{secrets.token_hex(6)}"
        cache = FakeCache(name, model, display, now, now, expire_at, tokens, call.api_key, system, contents)
        self.caches[name] = cache
        return _json(200, cache.resource())

    async def _list(self, call: RecordedCall) -> Response:
        try:
            size = min(max(int(call.query.get("pageSize", "100")), 1), 1000)
            start = int(call.query.get("pageToken") or 0)
        except ValueError:
            raise _fail(400, "Invalid pageSize or pageToken.") from None
        mine = [c for c in self.live_caches().values() if c.owner_key is None or c.owner_key == call.api_key]
        page = mine[start : start + size]
        out: dict[str, Any] = {}
        if page:
            out["cachedContents"] = [c.resource() for c in page]
        if start + size < len(mine):
            out["nextPageToken"] = str(start + size)
        return _json(200, out)  # an empty list is `{}`, as Google sends it

    async def _get(self, call: RecordedCall) -> Response:
        return _json(200, self._find(call.path.split("/", 2)[2], call).resource())

    async def _patch(self, call: RecordedCall) -> Response:
        cache = self._find(call.path.split("/", 2)[2], call)
        body = self._object_body(call)
        mask = call.query.get("updateMask")
        allowed = {"ttl", "expireTime", "expire_time"}
        if mask is not None and not set(mask.split(",")) <= allowed:
            raise _fail(400, "Only expiration (ttl or expire_time) is updatable.")
        if set(body) - {"ttl", "expireTime", "name"}:
            raise _fail(400, "Only expiration (ttl or expire_time) is updatable.")
        if "ttl" not in body and "expireTime" not in body:
            raise _fail(400, "ttl or expire_time is required.")
        now = self.clock()
        cache.expire_at = self._expiry(body, now)
        cache.update_time = now
        return _json(200, cache.resource())

    async def _delete(self, call: RecordedCall) -> Response:
        cache = self._find(call.path.split("/", 2)[2], call)
        del self.caches[cache.name]
        return _json(200, {})

    # ------------------------------------------------------------------ generation

    def _cached_prefix(self, call: RecordedCall, body: Mapping[str, Any], model: str) -> FakeCache | None:
        ref = body.get("cachedContent")
        if ref is None:
            return None
        if not isinstance(ref, str) or not ref:
            raise _fail(400, "cached_content must be a cachedContents/{id} name.")
        if any(body.get(k) is not None for k in ("systemInstruction", "tools", "toolConfig")):
            raise _fail(400, bodies.CACHE_CONFLICT)
        cache = self._find(cache_resource(ref), call)
        if cache.model != model_resource(model):
            raise _fail(400, bodies.MODEL_MISMATCH.format(request=model_resource(model), cached=cache.model))
        return cache

    def _usage(self, prompt_text: str, cache: FakeCache | None, reply: bodies.Reply) -> bodies.Usage:
        fresh = bodies.count_tokens(prompt_text)
        if cache is not None:
            return bodies.Usage(fresh + cache.token_count, cache.token_count, reply.tokens)
        return bodies.Usage(fresh, min(self.implicit_cached_tokens, fresh), reply.tokens)

    async def _generate(self, call: RecordedCall, model: str, *, stream: bool) -> Response:
        body = self._object_body(call)
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise _fail(400, "* GenerateContentRequest.contents: contents is not specified")
        cache = self._cached_prefix(call, body, model)
        config = body.get("generationConfig") or {}
        max_tokens = config.get("maxOutputTokens") if isinstance(config, Mapping) else None
        reply = bodies.make_reply(self.reply_text, max_tokens, self.reply_function_call)
        prompt = bodies.parts_text(body.get("systemInstruction")) + bodies.contents_text(contents)
        usage = self._usage(prompt, cache, reply)
        response_id = secrets.token_hex(8)
        if not stream:
            return _json(200, bodies.generate_response(reply, usage, model, response_id))
        chunks = list(bodies.stream_chunks(reply, usage, model, response_id))
        if call.query.get("alt") != "sse":
            return _json(200, chunks)
        return StreamingResponse(self._frames(chunks), status_code=200, media_type="text/event-stream")

    async def _frames(self, chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        for chunk in chunks:
            if self.stream_chunk_delay:
                await asyncio.sleep(self.stream_chunk_delay)
            yield bodies.sse(chunk)

    async def _openai_chat(self, request: Request) -> Response:
        return await self._run(request, Op.OPENAI_CHAT, self._chat)

    @staticmethod
    def _compat_cache_ref(body: Mapping[str, Any]) -> str | None:
        for holder in (body.get("extra_body"), body):
            google = holder.get("google") if isinstance(holder, Mapping) else None
            if isinstance(google, Mapping) and isinstance(google.get("cached_content"), str):
                return str(google["cached_content"])
        return None

    async def _chat(self, call: RecordedCall) -> Response:
        body = self._object_body(call)
        model = body.get("model")
        messages = body.get("messages")
        if not isinstance(model, str) or not isinstance(messages, list) or not messages:
            raise _fail(400, "model and messages are required.")
        texts: list[str] = []
        has_system = False
        for message in messages:
            if not isinstance(message, Mapping):
                raise _fail(400, "Invalid message.")
            has_system = has_system or message.get("role") in ("system", "developer")
            content = message.get("content")
            if isinstance(content, list):
                texts.extend(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
            elif isinstance(content, str):
                texts.append(content)
        ref = self._compat_cache_ref(body)
        cache = None
        if ref is not None:
            # As on the native API, a system prompt may not be re-sent beside the cache.
            native: dict[str, Any] = {"cachedContent": ref, "systemInstruction": {"parts": []} if has_system else None}
            cache = self._cached_prefix(call, native, model)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        reply = bodies.make_reply(self.reply_text, limit if isinstance(limit, int) else None, self.reply_function_call)
        usage = self._usage("".join(texts), cache, reply)
        completion_id, created = f"chatcmpl-{secrets.token_hex(8)}", int(self.clock())
        if not body.get("stream"):
            return _json(200, bodies.chat_completion(reply, usage, model, completion_id, created))
        options = body.get("stream_options")
        include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
        frames = [
            f"data: {orjson.dumps(c).decode()}\n\n".encode()
            for c in bodies.chat_chunks(reply, usage, model, completion_id, created, include_usage=include_usage)
        ]
        frames.append(b"data: [DONE]\n\n")
        return StreamingResponse(self._raw(frames), status_code=200, media_type="text/event-stream")

    async def _raw(self, frames: list[bytes]) -> AsyncIterator[bytes]:
        for frame in frames:
            if self.stream_chunk_delay:
                await asyncio.sleep(self.stream_chunk_delay)
            yield frame


__all__ = ["FakeCache", "FakeGemini", "Fault", "Op", "RecordedCall"]
