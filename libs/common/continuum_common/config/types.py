"""Reusable field types for the configuration models."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer

from continuum_common.config.durations import format_duration, parse_duration

SOURCE_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# NATS subject tokens separated by dots, no wildcards.
_INBOX_PREFIX_RE = re.compile(r"^[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*$")
_GLOB_CHARS = set("*?[]")


def _check_source_id(value: str) -> str:
    if not SOURCE_ID_RE.match(value):
        raise ValueError(f"{value!r} is not a valid id: use 1-64 characters from [A-Za-z0-9_-]")
    return value


def _check_key_prefix(value: str) -> str:
    bad = sorted(_GLOB_CHARS.intersection(value))
    if bad:
        raise ValueError(f"key_prefix must not contain glob characters ({''.join(bad)})")
    if any(ch.isspace() for ch in value):
        raise ValueError("key_prefix must not contain whitespace")
    return value


def _check_inbox_prefix(value: str) -> str:
    if len(value) > 128 or not _INBOX_PREFIX_RE.match(value):
        raise ValueError(
            f"{value!r} is not a NATS subject prefix (dot-separated tokens of [A-Za-z0-9_$-], no wildcards)"
        )
    return value


def _check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
    return value.rstrip("/")


def _check_redis_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix") or (parts.scheme != "unix" and not parts.hostname):
        raise ValueError(f"{value!r} is not a redis://, rediss:// or unix:// URL")
    if parts.password:
        raise ValueError("put the Redis password in password_env or password_file, not in the URL")
    return value


def _check_nats_url(value: str) -> str:
    for one in value.split(","):
        parts = urlsplit(one.strip())
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise ValueError(f"{one!r} is not a nats://, tls://, ws:// or wss:// URL")
        if parts.password or parts.username:
            raise ValueError("put NATS credentials in the credentials fields, not in the URL")
    return value


SourceId = Annotated[str, AfterValidator(_check_source_id)]
KeyPrefix = Annotated[str, AfterValidator(_check_key_prefix)]
InboxPrefix = Annotated[str, AfterValidator(_check_inbox_prefix)]
HttpUrl = Annotated[str, AfterValidator(_check_http_url)]
RedisUrl = Annotated[str, AfterValidator(_check_redis_url)]
NatsUrl = Annotated[str, AfterValidator(_check_nats_url)]
# Seconds as float in Python, written back as "5m" style strings when dumped.
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors (they are usually typos), values
    are validated on assignment too, and sections are immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
