"""Loading `config.kv-listener.yaml` and the checks that need more than the schema: secrets are
resolved here (never logged), and each source's prefix-key mode is checked against what it has."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from continuum_common.config.listener import ListenerConfig, ListenerSource
from continuum_common.config.loader import load_listener_config
from continuum_common.config.secrets import read_secret
from continuum_common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    config: ListenerConfig
    secret: bytes | None  # the salt-echo HMAC secret shared with the ingress


def uses_salt(source: ListenerSource) -> bool:
    return source.publishes_prefix and (source.engine == "trtllm" or source.prefix_key_mode == "salt_echo")


def uses_detokenize(source: ListenerSource) -> bool:
    """Prefix keys recovered through /detokenize (never for a blocks-only source: block batches
    carry the engine's own hashes and need no prompt text)."""
    return (
        source.publishes_prefix
        and source.prefix_key_mode in ("detokenize", "auto")
        and source.detokenize_endpoint is not None
    )


def problems(config: ListenerConfig, secret: bytes | None) -> list[str]:
    out: list[str] = []
    for index, source in enumerate(config.sources):
        where = f"sources[{index}]"
        if source.publishes_blocks and config.bus is None:
            out.append(
                f"{where}.publish: {source.publish} sends block batches to JetStream only; "
                "configure bus, or set publish: prefix for an SSE-only listener"
            )
        if uses_salt(source) and secret is None:
            out.append(f"{where}.prefix_key_mode: salt echo needs salt.secret_env or salt.secret_file")
        if uses_detokenize(source) and not source.model:
            out.append(f"{where}.model: required to compute prefix keys from detokenized prompts")
    return out


def settings_from(config: ListenerConfig, *, source: str = "config") -> ListenerSettings:
    raw = read_secret(config.salt.secret_env, config.salt.secret_file, what="salt.secret")
    secret = raw.encode("utf-8") if raw is not None else None
    found = problems(config, secret)
    if found:
        raise ConfigError(f"{source}: {len(found)} error(s)", found)
    return ListenerSettings(config, secret)


def load(path: str | Path) -> ListenerSettings:
    return settings_from(load_listener_config(path), source=str(path))
