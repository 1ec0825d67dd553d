"""Reading configuration files: YAML → validated model, readable errors, the seed's warnings.

Errors never surface as tracebacks: every problem becomes one line that starts with the
dotted path of the field (`kv_cache_index.scoring.overlap_weight: ...`, `backends[0].url: ...`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from continuum_common.config.listener import ListenerConfig
from continuum_common.config.router import RouterConfig, SelectionStrategy
from continuum_common.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
_AT_PATH = re.compile(r"^@([A-Za-z0-9_.\[\]]+): (.*)$")


def format_path(loc: tuple[int | str, ...]) -> str:
    """('backends', 0, 'url') -> 'backends[0].url'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(error: Any) -> str:
    kind = error.get("type", "")
    msg = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        return "unknown key (check the spelling against docs/configuration.md)"
    if kind == "missing":
        return "required field is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in ("literal_error", "enum"):
        given = error.get("input")
        return f"{msg} (got {given!r})"
    return msg


def validation_problems(exc: ValidationError) -> list[str]:
    """One line per problem, path first. Cross-section checks put several `path: message`
    lines into one root-level error; those are split back into separate problems."""
    problems: list[str] = []
    for error in exc.errors():
        loc = tuple(p for p in error["loc"] if not str(p).startswith("function-"))
        text = _describe(error)
        path = format_path(loc)
        for line in text.splitlines():
            where, message = path, line
            # "@sub.path: message" lines name a field below the failing model (or, at the root,
            # a cross-section path) so the report points at the exact key.
            match = _AT_PATH.match(line)
            if match:
                where = f"{path}.{match[1]}" if path else match[1]
                message = match[2]
            problems.append(f"{where}: {message}" if where else message)
    return problems


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping; an empty file is an empty mapping."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {type(data).__name__}")
    return data


def parse(model: type[M], data: dict[str, Any], *, source: str = "config") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise ConfigError(f"{source}: {len(problems)} error(s)", problems) from None


def load_router_config(path: str | Path) -> RouterConfig:
    return parse(RouterConfig, read_yaml(path), source=str(path))


def load_listener_config(path: str | Path) -> ListenerConfig:
    return parse(ListenerConfig, read_yaml(path), source=str(path))


def router_warnings(cfg: RouterConfig) -> list[str]:
    """The seed's configuration warnings and Continuum's own, path first (also logged at
    start-up and reload)."""
    warnings: list[str] = []
    if not any(b.enabled and not b.internal for b in cfg.backends):
        warnings.append(
            "backends: no enabled backend takes client traffic; every request will be answered 503 "
            "until one is configured"
        )
    if cfg.selection_strategy is SelectionStrategy.PREFIX_AWARE_HASH and not cfg.prefix_routing.enabled:
        warnings.append(
            "selection_strategy: PrefixAwareHash is set but prefix_routing.enabled is false; every "
            "request will hash the model name and stick to one backend with no load bound"
        )
    scoring = cfg.kv_cache_index.scoring
    if (
        cfg.prefix_routing.enabled
        and cfg.kv_cache_index.enabled
        and scoring.model == "seed"
        and scoring.gpu_tier_weight < scoring.min_overlap_threshold
    ):
        warnings.append(
            f"kv_cache_index.scoring.gpu_tier_weight: {scoring.gpu_tier_weight:g} is below "
            f"min_overlap_threshold {scoring.min_overlap_threshold:g}; no backend can pass the "
            "threshold and KV-aware routing will always fall back"
        )
    if cfg.kv_cache_index.enabled and not cfg.prefix_routing.enabled:
        warnings.append(
            "kv_cache_index.enabled: the KV index scorer only runs when prefix_routing.enabled is "
            "also true (it needs the prefix key)"
        )
    warnings.extend(_group_warnings(cfg))
    return warnings


def _group_warnings(cfg: RouterConfig) -> list[str]:
    """Match groups that will not do what their mode promises."""
    out: list[str] = []
    if not cfg.kv_cache_index.enabled:
        return out
    for i, group in enumerate(cfg.kv_cache_index.groups):
        members = [b for b in cfg.backends if cfg.match_group_of(b.name) is group]
        if not members:
            out.append(f"kv_cache_index.groups.{i}: group {group.name!r} matches no configured backend")
        if group.mode != "precise":
            continue
        odd = [b.name for b in members if b.type not in ("vllm", "sglang", "trtllm", "openai")]
        if odd:
            out.append(
                f"kv_cache_index.groups.{i}.mode: precise matching needs engines that report KV events; "
                f"{', '.join(odd)} cannot (use approximate)"
            )
        if group.engine == "sglang" and group.block_size < 16:
            out.append(
                f"kv_cache_index.groups.{i}.block_size: {group.block_size} tokens per page means one hash per "
                f"{group.block_size} token(s) for every request; precise matching costs grow with it (page_size "
                "16 or more, or approximate mode, is cheaper)"
            )
    return out
