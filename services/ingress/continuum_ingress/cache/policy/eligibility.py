"""Which requests and responses the response cache may serve and store (seed "캐시 적격성").

A request is eligible when its temperature is 0 (or omitted, where `cache_omitted_temperature`
allows it: an omitted temperature samples at the provider's default, 1.0) and, for a stream,
when stream buffering is on and the route's stream format has a terminal event this cache can recognise.
A response is storable when it is a 200 whose size fits `max_response_size` (whole bodies) or
`max_stream_buffer_size` (streams; enforced while recording).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from continuum_common.config.router import ResponseCacheConfig
from continuum_ingress.cache.protocol.sse import SseDialect


class Route(StrEnum):
    """The API a body belongs to; also the `route` slot of the cache key."""

    CHAT = "chat"  # POST /v1/chat/completions
    COMPLETIONS = "completions"  # POST /v1/completions
    ANTHROPIC = "anthropic"  # POST /anthropic/v1/messages (and /v1/messages)
    RESPONSES = "responses"  # POST /v1/responses


STREAM_DIALECTS: Final[Mapping[str, SseDialect]] = {
    Route.CHAT: SseDialect.OPENAI,
    Route.COMPLETIONS: SseDialect.OPENAI,
    Route.ANTHROPIC: SseDialect.ANTHROPIC,
    Route.RESPONSES: SseDialect.RESPONSES,
}


class Reason(StrEnum):
    OK = "ok"
    DISABLED = "disabled"
    NOT_AN_OBJECT = "body_not_an_object"
    TEMPERATURE = "temperature"
    STREAM_BUFFERING_OFF = "stream_buffering_off"
    STREAM_UNSUPPORTED = "stream_unsupported_route"
    UNKEYABLE = "unkeyable"


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """A snapshot of the hot-reloadable `response_cache` fields the decisions read."""

    enabled: bool = True
    ttl: float = 300.0
    max_response_size: int = 1_048_576
    max_stream_buffer_size: int = 10_485_760
    stream_buffering: bool = True
    tenant_header: str | None = None
    cache_omitted_temperature: bool = False

    @classmethod
    def from_config(cls, cfg: ResponseCacheConfig) -> CachePolicy:
        return cls(
            enabled=cfg.enabled,
            ttl=cfg.ttl,
            max_response_size=cfg.max_response_size,
            max_stream_buffer_size=cfg.max_stream_buffer_size,
            stream_buffering=cfg.stream_buffering,
            tenant_header=cfg.tenant_header.lower() if cfg.tenant_header else None,
            cache_omitted_temperature=cfg.cache_omitted_temperature,
        )


def is_zero_temperature(body: Mapping[str, Any], *, omitted_is_zero: bool = False) -> bool:
    """An explicit temperature 0; an omitted one only when `omitted_is_zero` (it samples at the
    provider's default, 1.0, so its answer is not the answer)."""
    value = body.get("temperature")
    if value is None:
        return omitted_is_zero
    # type() rather than isinstance(): True is an int, and `temperature: false` is not zero.
    return type(value) in (int, float) and value == 0


def is_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def request_reason(body: object, *, route: str, policy: CachePolicy) -> Reason:
    """Why a request may (Reason.OK) or may not use the response cache."""
    if not policy.enabled:
        return Reason.DISABLED
    if not isinstance(body, Mapping):
        return Reason.NOT_AN_OBJECT
    if not is_zero_temperature(body, omitted_is_zero=policy.cache_omitted_temperature):
        return Reason.TEMPERATURE
    if is_stream(body):
        if not policy.stream_buffering:
            return Reason.STREAM_BUFFERING_OFF
        if route not in STREAM_DIALECTS:
            return Reason.STREAM_UNSUPPORTED
    return Reason.OK


def response_storable(status: int, size: int, policy: CachePolicy) -> bool:
    return status == 200 and size <= policy.max_response_size
