"""Anthropic `cache_control` injection (seed §"Anthropic Cache Control 주입"), exactly:

* only native Anthropic requests sent to a `type: anthropic` backend;
* on when the backend's `anthropic_auto_cache_control` (default true) is on, or when the
  fleet-wide `prefix_routing.anthropic_cache_control_injection` forces it;
* the marker `{"type": "ephemeral"}` goes on the LAST system block only (a string `system`
  becomes a one-block list first);
* skipped when the caller already put `cache_control` anywhere: top level, system, messages
  or tools (their intent wins).
"""

from __future__ import annotations

from typing import Any

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}


def should_inject(backend_type: str, backend_auto: bool, fleet_force: bool) -> bool:
    return backend_type == "anthropic" and (backend_auto or fleet_force)


def _mentions_cache_control(value: Any) -> bool:
    if isinstance(value, dict):
        if "cache_control" in value:
            return True
        return any(_mentions_cache_control(v) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return any(_mentions_cache_control(v) for v in value if isinstance(v, dict | list))
    return False


def has_cache_control(body: dict[str, Any]) -> bool:
    if "cache_control" in body:
        return True
    return any(_mentions_cache_control(body.get(key)) for key in ("system", "messages", "tools"))


def inject_cache_control(body: dict[str, Any]) -> dict[str, Any] | None:
    """A new body with the marker on the last system block, or None when the rules say skip.
    The caller's objects are never mutated (only copies on the changed path)."""
    system = body.get("system")
    if isinstance(system, str):
        if not system:
            return None
        blocks: list[Any] = [{"type": "text", "text": system}]
    elif isinstance(system, list) and system and isinstance(system[-1], dict):
        blocks = list(system)
    else:
        return None
    if has_cache_control(body):
        return None
    blocks[-1] = {**blocks[-1], "cache_control": dict(EPHEMERAL)}
    return {**body, "system": blocks}
