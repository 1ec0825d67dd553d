"""The `gemini` upstream dialect (an AttemptDialect, protocol/dialects.py).

* Chat completions go to Google's OpenAI-compatible endpoint (`/v1beta/openai/chat/completions`,
  `Authorization: Bearer`) by default, or, with `gemini_context_cache.prefer_native_api: true`, to
  `models/{model}:generateContent` / `:streamGenerateContent?alt=sse` (`x-goog-api-key`), with
  the request and the answer converted (protocol/).
* Embeddings always use the compat endpoint (`/v1beta/openai/embeddings`).
* `/v1/responses` always uses the native API (Google's compat API has no Responses endpoint),
  converted both ways by protocol/responses_api.py.
* With the context cache enabled, every chat answer's cached tokens are reported to the cache
  (`usage_sink`): `usageMetadata.cachedContentTokenCount` on the native API, the compat usage's
  `prompt_tokens_details.cached_tokens` (filled in from the cache's size on a hit that does not
  report it).

The model is in the native URL, so targets are built per attempt (`bind`), from the API root of
the backend URL (`gemini_api.api_root`: a URL naming `/v1beta/openai` works for both APIs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import orjson

from continuum_common.config import Backend
from continuum_common.gemini_api import api_root, bare_model
from continuum_ingress.gemini.context_cache import CacheDecision, decision_for
from continuum_ingress.gemini.protocol.chat_completion import (
    cached_tokens,
    google_error_fields,
    openai_error,
    to_chat_completion,
)
from continuum_ingress.gemini.protocol.compat import CompatStreamTap, observe_body
from continuum_ingress.gemini.protocol.request import to_generate_content
from continuum_ingress.gemini.protocol.responses_api import ResponsesStreamConverter, responses_to_chat, to_response
from continuum_ingress.gemini.protocol.stream import ChatStreamConverter
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import (
    ClientHeaders,
    DialectAttempt,
    OpenAICompatible,
    ResponseTranslator,
)
from continuum_ingress.state import RequestState
from continuum_ingress.transport import Upstream

COMPAT_PATHS = {Api.CHAT: "/v1beta/openai/chat/completions", Api.EMBEDDINGS: "/v1beta/openai/embeddings"}
NATIVE_VERSION = "v1beta"


class UsageSink(Protocol):
    def cached_tokens(self, backend: str, tokens: int) -> None: ...


def compat_dialect() -> OpenAICompatible:
    """The dialect when neither the native API nor the context cache is on: a pass-through."""
    return OpenAICompatible("gemini", COMPAT_PATHS)


class GeminiDialect:
    def __init__(self, *, native: bool, usage: UsageSink | None) -> None:
        self.native = native
        self.usage = usage
        self._compat = compat_dialect()

    @property
    def name(self) -> str:
        return "gemini"

    # The UpstreamDialect surface (the forwarder binds instead; these describe the compat API).
    def supports(self, api: Api) -> bool:
        return api in COMPAT_PATHS or api is Api.RESPONSES

    def path(self, api: Api) -> str:
        return COMPAT_PATHS[api]

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]:
        return self._compat.headers(api, backend_key, client)

    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        return self._compat.encode(api, body, raw)

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        return None

    def bind(self, state: RequestState, backend: Backend, client: Upstream) -> DialectAttempt:
        decision = decision_for(state, backend.name) if self.usage is not None else None
        if (state.api is Api.CHAT and self.native) or state.api is Api.RESPONSES:
            return NativeAttempt(native_target(client.url, state.model, state.stream), state, backend.name, self.usage)
        target = client.target(COMPAT_PATHS[state.api])
        if state.api is Api.CHAT and self.usage is not None:
            return CompatAttempt(target, self._compat, backend.name, self.usage, decision)
        return PlainAttempt(target, self._compat)


def native_target(url: str, model: str, stream: bool) -> str:
    """`/v1beta/models/{model}:generateContent` (or the SSE stream) under the backend's API root."""
    prefix = urlsplit(api_root(url)).path.rstrip("/")
    name = quote(bare_model(model), safe="-._~")
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"{prefix}/{NATIVE_VERSION}/models/{name}:{method}"


@dataclass(slots=True)
class PlainAttempt:
    target: str
    compat: OpenAICompatible

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]:
        return self.compat.headers(api, backend_key, client)

    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        return self.compat.encode(api, body, raw)

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        return None


@dataclass(slots=True)
class CompatAttempt(PlainAttempt):
    backend: str
    usage: UsageSink
    decision: CacheDecision | None

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        decision = self.decision
        fill = decision.token_count if decision is not None and decision.hit else None
        return CompatTranslator(self.backend, self.usage, fill, stream)


class CompatTranslator:
    """Passes the compat endpoint's answer through, noting (and if missing on a hit, filling in)
    the cached tokens of its usage."""

    def __init__(self, backend: str, usage: UsageSink, fill: int | None, stream: bool) -> None:
        self.backend = backend
        self.usage = usage
        self.fill = fill
        self.tap = CompatStreamTap(fill) if stream else None

    def body(self, data: bytes) -> bytes:
        out, cached = observe_body(data, self.fill)
        self.usage.cached_tokens(self.backend, cached or 0)
        return out

    def chunk(self, data: bytes) -> bytes:
        return self.tap.feed(data) if self.tap is not None else data

    def end(self) -> bytes:
        if self.tap is None:
            return b""
        out = self.tap.finish()
        cached = self.tap.cached if self.tap.saw_usage else self.fill
        self.usage.cached_tokens(self.backend, cached or 0)
        return out


@dataclass(slots=True)
class NativeAttempt:
    target: str
    state: RequestState
    backend: str
    usage: UsageSink | None

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]:
        out = [("content-type", "application/json"), ("accept-encoding", "identity"), *client.passthrough]
        key = backend_key or client.api_key
        if key:
            out.append(("x-goog-api-key", key))
        return out

    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        request = body if body is not None else self.state.request.body
        if api is Api.RESPONSES:
            request = responses_to_chat(request)
        return orjson.dumps(to_generate_content(request))

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        created = int(time.time())
        fallback = os.urandom(12).hex()
        if api is Api.RESPONSES:
            return ResponsesTranslator(
                self.state.request.body, created, fallback, backend=self.backend, usage=self.usage, stream=stream
            )
        if not stream:
            return NativeBodyTranslator(self.state.model, created, fallback, self.backend, self.usage)
        options = self.state.request.body.get("stream_options")
        include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
        converter = ChatStreamConverter(
            model=self.state.model, created=created, fallback_id=fallback, include_usage=include_usage
        )
        return NativeStreamTranslator(converter, self.backend, self.usage)


def error_body(data: bytes) -> bytes | None:
    """An OpenAI error body for a Google error body, None when `data` is not one."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    code, status, message = google_error_fields(obj)
    if code is None and not status and not (isinstance(obj, dict) and "error" in obj):
        return None
    return orjson.dumps(openai_error(code, status, message))


class NativeBodyTranslator:
    def __init__(self, model: str, created: int, fallback_id: str, backend: str, usage: UsageSink | None) -> None:
        self.model = model
        self.created = created
        self.fallback_id = fallback_id
        self.backend = backend
        self.usage = usage

    def body(self, data: bytes) -> bytes:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return orjson.dumps(openai_error(None, "", "The Gemini API sent an unreadable answer."))
        code, status, message = google_error_fields(obj)
        if not isinstance(obj, dict) or code is not None or status or "error" in obj:
            return orjson.dumps(openai_error(code, status, message))
        if self.usage is not None:
            self.usage.cached_tokens(self.backend, cached_tokens(obj.get("usageMetadata")))
        completion = to_chat_completion(obj, model=self.model, created=self.created, fallback_id=self.fallback_id)
        return orjson.dumps(completion)

    def chunk(self, data: bytes) -> bytes:  # pragma: no cover - bodies only
        return data

    def end(self) -> bytes:  # pragma: no cover - bodies only
        return b""


class NativeStreamTranslator:
    def __init__(self, converter: ChatStreamConverter, backend: str, usage: UsageSink | None) -> None:
        self.converter = converter
        self.backend = backend
        self.usage = usage

    def body(self, data: bytes) -> bytes:
        """A stream request answered with an error status: the error, in OpenAI's shape."""
        return error_body(data) or data

    def chunk(self, data: bytes) -> bytes:
        return self.converter.feed(data)

    def end(self) -> bytes:
        out = self.converter.finish()
        if self.usage is not None:
            self.usage.cached_tokens(self.backend, cached_tokens(self.converter.usage))
        return out


class ResponsesTranslator:
    """`/v1/responses` answers: a `response` object, or the Responses event stream."""

    def __init__(
        self,
        request: dict[str, Any],
        created: int,
        fallback_id: str,
        *,
        backend: str,
        usage: UsageSink | None,
        stream: bool,
    ) -> None:
        self.request = request
        self.created = created
        self.fallback_id = fallback_id
        self.backend = backend
        self.usage = usage
        self.converter = (
            ResponsesStreamConverter(request=request, created=created, fallback_id=fallback_id) if stream else None
        )

    def body(self, data: bytes) -> bytes:
        error = error_body(data)
        if error is not None or self.converter is not None:
            return error or data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            return orjson.dumps(openai_error(None, "", "The Gemini API sent an unreadable answer."))
        if self.usage is not None:
            self.usage.cached_tokens(self.backend, cached_tokens(obj.get("usageMetadata")))
        return orjson.dumps(to_response(obj, request=self.request, created=self.created, fallback_id=self.fallback_id))

    def chunk(self, data: bytes) -> bytes:
        return self.converter.feed(data) if self.converter is not None else data

    def end(self) -> bytes:
        if self.converter is None:
            return b""
        out = self.converter.finish()
        if self.usage is not None:
            self.usage.cached_tokens(self.backend, cached_tokens(self.converter.usage))
        return out
