"""Upstream dialects: how each backend `type` is spoken to.

A dialect says which client APIs a backend type serves, the upstream path of each, the auth
headers, and (optionally) how to translate bodies for a backend that speaks a different wire
format. These are pass-throughs of the client's JSON; the Gemini dialect (native
`generateContent`, gemini/dialect.py) translates, and is put in place of the `gemini` entry of
this mapping by the app. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.client_headers import ClientHeaders

if TYPE_CHECKING:
    from continuum_common.config import Backend
    from continuum_ingress.state import RequestState
    from continuum_ingress.transport import Upstream

DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


class ResponseTranslator(Protocol):
    """Rewrites a backend's answer into the client's format (for translating dialects)."""

    def body(self, data: bytes) -> bytes: ...
    def chunk(self, data: bytes) -> bytes: ...
    def end(self) -> bytes: ...


class UpstreamDialect(Protocol):
    @property
    def name(self) -> str: ...

    def supports(self, api: Api) -> bool: ...
    def path(self, api: Api) -> str: ...
    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]: ...
    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        """The upstream body: `raw` unchanged when `body` is None (nothing was rewritten)."""
        ...

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None: ...


class DialectAttempt(Protocol):
    """One attempt's upstream call, prepared by an `AttemptDialect` for a request and a backend.
    `target` is the full request target (path and query)."""

    @property
    def target(self) -> str: ...

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]: ...
    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes: ...
    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None: ...


@runtime_checkable
class AttemptDialect(UpstreamDialect, Protocol):
    """A dialect whose target, body or translation depend on the request and the backend (Gemini
    native: the model and the stream flag are in the URL; usage is accounted per backend). The
    forwarder calls `bind` once per attempt, after the body rewriters ran, instead of `path`."""

    def bind(self, state: RequestState, backend: Backend, client: Upstream) -> DialectAttempt: ...


def _base_headers(client: ClientHeaders) -> list[tuple[str, str]]:
    # identity: streams are passed through byte for byte, never re-compressed or decoded.
    return [("content-type", "application/json"), ("accept-encoding", "identity"), *client.passthrough]


@dataclass(frozen=True)
class OpenAICompatible:
    """OpenAI wire format and Bearer auth (OpenAI, vLLM, SGLang, TRT-LLM, Gemini's compat API)."""

    name: str
    paths: Mapping[Api, str] = field(default_factory=dict)

    def supports(self, api: Api) -> bool:
        return api in self.paths

    def path(self, api: Api) -> str:
        return self.paths[api]

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]:
        out = _base_headers(client)
        key = backend_key or client.api_key
        if key:
            out.append(("authorization", f"Bearer {key}"))
        if api is Api.MESSAGES:
            out.append(("anthropic-version", client.anthropic_version or DEFAULT_ANTHROPIC_VERSION))
        return out

    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        return raw if body is None else orjson.dumps(body)

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        return None


@dataclass(frozen=True)
class AnthropicNative:
    """api.anthropic.com: `x-api-key` (or the caller's own Bearer token) and `anthropic-version`."""

    name: str = "anthropic"

    def supports(self, api: Api) -> bool:
        return api is Api.MESSAGES

    def path(self, api: Api) -> str:
        return "/v1/messages"

    def headers(self, api: Api, backend_key: str | None, client: ClientHeaders) -> list[tuple[str, str]]:
        out = _base_headers(client)
        if backend_key:
            out.append(("x-api-key", backend_key))
        elif client.x_api_key:
            out.append(("x-api-key", client.x_api_key))
        elif client.bearer:
            out.append(("authorization", f"Bearer {client.bearer}"))
        out.append(("anthropic-version", client.anthropic_version or DEFAULT_ANTHROPIC_VERSION))
        if client.anthropic_beta:
            out.append(("anthropic-beta", client.anthropic_beta))
        return out

    def encode(self, api: Api, body: dict[str, Any] | None, raw: bytes) -> bytes:
        return raw if body is None else orjson.dumps(body)

    def translator(self, api: Api, stream: bool) -> ResponseTranslator | None:
        return None


_OPENAI_PATHS = {
    Api.CHAT: "/v1/chat/completions",
    Api.COMPLETIONS: "/v1/completions",
    Api.EMBEDDINGS: "/v1/embeddings",
    Api.RESPONSES: "/v1/responses",
}


def default_dialects() -> dict[str, UpstreamDialect]:
    """Backend `type` -> dialect. `gemini` here is Google's OpenAI-compatible API; the app puts
    the native Gemini dialect (gemini/dialect.py) in its place."""
    return {
        "openai": OpenAICompatible("openai", _OPENAI_PATHS),
        "vllm": OpenAICompatible("vllm", {**_OPENAI_PATHS, Api.MESSAGES: "/v1/messages"}),
        "sglang": OpenAICompatible("sglang", _OPENAI_PATHS),
        "trtllm": OpenAICompatible("trtllm", {Api.CHAT: "/v1/chat/completions", Api.COMPLETIONS: "/v1/completions"}),
        "anthropic": AnthropicNative(),
        "gemini": OpenAICompatible(
            "gemini",
            {Api.CHAT: "/v1beta/openai/chat/completions", Api.EMBEDDINGS: "/v1beta/openai/embeddings"},
        ),
    }


def join_url(base: str, path: str) -> str:
    """`base` + `path`, without repeating a version prefix the base already ends with:
    ("https://api.openai.com/v1", "/v1/chat/completions") -> ".../v1/chat/completions"."""
    base = base.rstrip("/")
    parts = path.strip("/").split("/")
    for k in range(len(parts) - 1, 0, -1):
        if base.endswith("/" + "/".join(parts[:k])):
            return base + "/" + "/".join(parts[k:])
    return base + "/" + "/".join(parts)


__all__ = [
    "AnthropicNative",
    "AttemptDialect",
    "ClientHeaders",
    "DialectAttempt",
    "OpenAICompatible",
    "ResponseTranslator",
    "UpstreamDialect",
    "default_dialects",
    "join_url",
]
