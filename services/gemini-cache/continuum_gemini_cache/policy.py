"""Pure decisions of the service: is an ensure eligible, what a failed create means, when a hit
should extend the TTL."""

from __future__ import annotations

from dataclasses import dataclass

from continuum_common.gemini_api import GoogleError
from continuum_common.wire.gemini import EnsureRequest
from continuum_gemini_cache.config import Settings
from continuum_gemini_cache.model import Entry

EXTEND_FRACTION = 0.2  # the seed: extend when ≤ 20 % of the TTL is left


def ineligible_reason(req: EnsureRequest, settings: Settings) -> str | None:
    """Why the service will not create a cache for this ensure (None: eligible). The ingress
    checks the same before publishing; this guards against a misconfigured or stale sender."""
    if req.backend not in settings.backends:
        return "backend is not a configured, enabled type: gemini backend"
    if len(req.system_instruction.encode("utf-8")) < settings.cache.min_prefix_bytes:
        return "system instruction is below min_prefix_bytes"
    if not req.digest_matches():
        return "digest does not match model and system_instruction"
    return None


@dataclass(frozen=True, slots=True)
class FailureVerdict:
    reason: str  # a metrics.CREATE_FAILURE_REASONS value
    negative: bool  # record a negative entry (no retries for negative_ttl_seconds)


def classify_create_failure(status: int, error: GoogleError | None, failure: str | None) -> FailureVerdict:
    """400 → negative (too small, invalid; the seed's rule), except an invalid API key, which is
    an operator problem that must not be hidden for negative_ttl_seconds. 404/405/501 on the
    create endpoint → negative too: the backend does not implement cachedContents (the seed's
    "proxies without cachedContents support end up in the negative cache"). Everything else is
    transient: counted, nothing recorded, retried by a later ensure."""
    if failure is not None:
        return FailureVerdict(failure, False)
    if status == 400:
        if error is not None and error.api_key_invalid:
            return FailureVerdict("auth", False)
        return FailureVerdict("rejected", True)
    if status in (404, 405, 501):
        return FailureVerdict("unsupported", True)
    if status in (401, 403):
        return FailureVerdict("auth", False)
    if status == 429:
        return FailureVerdict("rate_limited", False)
    if 400 <= status < 500:
        return FailureVerdict("http_4xx", False)
    return FailureVerdict("http_5xx", False)


def should_extend(entry: Entry, now: float) -> bool:
    remaining = entry.expire_at - now
    return 0 < remaining <= EXTEND_FRACTION * entry.ttl_seconds
