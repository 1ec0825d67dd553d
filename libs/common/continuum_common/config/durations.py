"""Durations as the seed writes them: "500ms", "30s", "5m", "1h30m", "2d", or a bare number
of seconds. Parsed to float seconds; formatted back in the shortest exact form."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$")


def parse_duration(value: object) -> float:
    """Return the duration in seconds; raise ValueError with a readable message otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like '30s', '5m' or '1h', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("duration must not be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("expected a duration like '30s', '5m' or '1h'")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    if not text or not _WHOLE.match(text):
        raise ValueError(f"invalid duration {value!r}: expected forms like '500ms', '30s', '5m', '1h30m'")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """Shortest exact rendering: 300 -> "5m", 5400 -> "1h30m", 1.5 -> "1500ms"."""
    if seconds <= 0:
        return "0s"
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    total = millis // 1000
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return "".join(parts)
