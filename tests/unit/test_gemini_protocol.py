"""The gemini-cache bus protocol and the Google wire helpers (pure)."""

from __future__ import annotations

import orjson
import pytest

from continuum_common.gemini_api import (
    GeminiFormatError,
    api_root,
    cache_resource,
    format_timestamp,
    format_ttl,
    is_stale_cache_reference,
    model_resource,
    parse_cached_content,
    parse_error,
    parse_timestamp,
    parse_ttl,
)
from continuum_common.hashing.gemini import gemini_digest, gemini_digest_from_text
from continuum_common.wire.gemini import (
    ClearReply,
    DropReply,
    DropRequest,
    EnsureOutcome,
    EnsureReply,
    EnsureRequest,
    GeminiProtocolError,
    LookupReply,
    LookupRequest,
    LookupResult,
    RequestOutcome,
    UsageAccumulator,
    UsageReport,
    decode_stats,
    entry_id,
    not_enabled_reply,
)

DIGEST = "ab" * 32


def test_lookup_round_trip_and_validation() -> None:
    req = LookupRequest("gem-a", "gemini-2.5-flash", DIGEST)
    assert LookupRequest.from_bytes(req.to_bytes()) == req
    for bad in (
        b"not json",
        b"[1]",
        orjson.dumps({"backend": "bad name", "model": "m", "digest": DIGEST}),
        orjson.dumps({"backend": "a", "model": "", "digest": DIGEST}),
        orjson.dumps({"backend": "a", "model": "m", "digest": "AB" * 32}),
        orjson.dumps({"backend": "a", "model": "m", "digest": DIGEST, "v": "1"}),
    ):
        with pytest.raises(GeminiProtocolError):
            LookupRequest.from_bytes(bad)


def test_lookup_replies() -> None:
    hit = LookupReply(LookupResult.HIT, cached_content="cachedContents/x", expire_at=1.5e9, token_count=7021)
    assert LookupReply.from_bytes(hit.to_bytes()) == hit and hit.hit
    miss = LookupReply(LookupResult.MISS, in_flight=True)
    assert LookupReply.from_bytes(miss.to_bytes()) == miss and not miss.hit
    neg = LookupReply(LookupResult.NEGATIVE, negative_until=1.6e9, min_total_token_count=1024)
    assert LookupReply.from_bytes(neg.to_bytes()) == neg
    assert orjson.loads(LookupReply(LookupResult.MISS).to_bytes()) == {"v": 1, "result": "miss"}
    with pytest.raises(GeminiProtocolError):
        LookupReply.from_bytes(b'{"result": "hit"}')  # a hit must carry the reference
    with pytest.raises(GeminiProtocolError):
        LookupReply.from_bytes(b'{"result": "maybe"}')


def test_ensure_request_digest_is_the_foundation_digest() -> None:
    system = "You are a careful assistant. " * 100
    req = EnsureRequest.build("gem-a", "gemini-2.5-flash", system, ttl_seconds=300)
    body = {"model": "gemini-2.5-flash", "messages": [{"role": "system", "content": system}]}
    digest = gemini_digest(body)
    assert digest is not None
    assert req.digest == digest.hex() == gemini_digest_from_text("gemini-2.5-flash", system).hex()
    assert req.digest_matches()
    back = EnsureRequest.from_bytes(req.to_bytes())
    assert back == req
    tampered = EnsureRequest(req.backend, req.model, req.digest, system + "x")
    assert not tampered.digest_matches()
    wire = orjson.loads(req.to_bytes())
    for key, value in (("system_instruction", ""), ("ttl_seconds", 5), ("ttl_seconds", "600")):
        with pytest.raises(GeminiProtocolError):
            EnsureRequest.from_bytes(orjson.dumps({**wire, key: value}))


def test_ensure_reply_drop_and_clear() -> None:
    reply = EnsureReply(EnsureOutcome.REJECTED, min_total_token_count=4096, error="rejected")
    assert EnsureReply.from_bytes(reply.to_bytes()) == reply
    with pytest.raises(GeminiProtocolError):
        EnsureReply.from_bytes(b'{"outcome": "perhaps"}')
    drop = DropRequest("gem-a", DIGEST, "cachedContents/abc")
    assert DropRequest.from_bytes(drop.to_bytes()) == drop
    with pytest.raises(GeminiProtocolError):
        DropRequest.from_bytes(orjson.dumps({"backend": "gem-a", "digest": DIGEST, "cached_content": "abc"}))
    assert DropReply.from_bytes(DropReply(True).to_bytes()).dropped
    clear = ClearReply(True, cleared_entries=4)
    assert orjson.loads(clear.to_bytes()) == {"success": True, "cleared_entries": 4, "cleared_negative_entries": 0}
    assert ClearReply.from_bytes(clear.to_bytes()) == clear
    assert not_enabled_reply() == {"success": False, "error": "Gemini context cache is not enabled"}
    assert ClearReply.from_bytes(orjson.dumps(not_enabled_reply())).error == "Gemini context cache is not enabled"
    assert decode_stats(b'{"enabled": true}') == {"enabled": True}
    assert entry_id("gem-a", DIGEST) == f"gem-a:{DIGEST}"


def test_usage_accumulator_drains_deltas() -> None:
    acc = UsageAccumulator()
    assert acc.drain() is None
    acc.record("gem-a", RequestOutcome.HIT, cached_tokens=7021)
    acc.record("gem-a", RequestOutcome.MISS)
    acc.record("gem-b", RequestOutcome.INELIGIBLE)
    acc.add_cached_tokens("gem-b", 100)
    report = acc.drain()
    assert report is not None
    back = UsageReport.from_bytes(report.to_bytes())
    assert back.backends["gem-a"] == {"hit": 1, "miss": 1, "negative": 0, "ineligible": 0, "cached_tokens": 7021}
    assert back.backends["gem-b"]["ineligible"] == 1 and back.backends["gem-b"]["cached_tokens"] == 100
    assert acc.drain() is None
    with pytest.raises(GeminiProtocolError):
        UsageReport.from_bytes(b'{"backends": {"x y": {}}}')
    with pytest.raises(GeminiProtocolError):
        UsageReport.from_bytes(b'{"backends": {"a": {"hit": -1}}}')


def test_durations_and_timestamps() -> None:
    assert format_ttl(600) == "600s" and format_ttl(3.5) == "3.5s" and format_ttl(0.000000001) == "0.000000001s"
    assert parse_ttl("300s") == 300 and parse_ttl("3.5s") == 3.5
    for bad in ("300", "5m", "-1s", "1.0000000001s"):
        with pytest.raises(GeminiFormatError):
            parse_ttl(bad)
    # Google's expireTime carries up to 9 fractional digits.
    assert parse_timestamp("2026-09-07T02:18:17.023637828Z") == pytest.approx(1788747497.023637828, abs=1e-6)
    assert parse_timestamp("2026-09-07T01:18:17Z") == 1788743897
    assert parse_timestamp("2026-09-07T03:18:17+02:00") == 1788743897
    assert parse_timestamp(format_timestamp(1788743897.4386)) == pytest.approx(1788743897.4386, abs=1e-6)
    for bad in ("yesterday", "2026-13-01T00:00:00Z", "2026-09-07T01:18:17"):
        with pytest.raises(GeminiFormatError):
            parse_timestamp(bad)


def test_resource_names_and_api_root() -> None:
    assert model_resource("gemini-2.5-flash") == "models/gemini-2.5-flash"
    assert model_resource("models/gemini-2.5-flash") == "models/gemini-2.5-flash"
    assert cache_resource("abc") == "cachedContents/abc" == cache_resource("cachedContents/abc")
    root = "https://generativelanguage.googleapis.com"
    for url in (root, root + "/", root + "/v1beta", root + "/v1beta/openai", root + "/v1beta/openai/", root + "/v1"):
        assert api_root(url) == root


def test_parse_cached_content_from_the_real_response() -> None:
    body = {
        "name": "cachedContents/ez2yh6u6my9gnjvyigtxvnuf6e5qc79vgd7cc668",
        "model": "models/gemini-3.5-flash-lite",
        "createTime": "2026-09-07T01:18:17.438678Z",
        "updateTime": "2026-09-07T01:18:17.438678Z",
        "expireTime": "2026-09-07T02:18:17.023637828Z",
        "displayName": "",
        "usageMetadata": {"totalTokenCount": 7021},
    }
    info = parse_cached_content(body)
    assert info.name == body["name"] and info.total_token_count == 7021
    assert info.expire_at == pytest.approx(parse_timestamp("2026-09-07T02:18:17.023637828Z"))
    for bad in ({}, {**body, "name": "abc"}, {k: v for k, v in body.items() if k != "expireTime"}, []):
        with pytest.raises(GeminiFormatError):
            parse_cached_content(bad)


def test_parse_error_reads_the_minimum_token_count() -> None:
    too_small = {
        "error": {
            "code": 400,
            "message": "Cached content is too small. total_token_count=896, min_total_token_count=1024",
            "status": "INVALID_ARGUMENT",
        }
    }
    err = parse_error(400, too_small)
    assert err.too_small and err.min_total_token_count == 1024 and err.total_token_count == 896
    assert err.status == "INVALID_ARGUMENT" and not err.api_key_invalid
    key = parse_error(
        400,
        {
            "error": {
                "code": 400,
                "message": "API key not valid. Please pass a valid API key.",
                "status": "INVALID_ARGUMENT",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}],
            }
        },
    )
    assert key.api_key_invalid and not key.too_small
    html = parse_error(502, "<html>bad gateway</html>")
    assert html.http_status == 502 and html.message == "" and html.min_total_token_count is None


def test_stale_reference_detection() -> None:
    gone = {
        "error": {
            "code": 403,
            "message": "CachedContent not found (or permission denied)",
            "status": "PERMISSION_DENIED",
        }
    }
    assert is_stale_cache_reference(403, gone)
    assert is_stale_cache_reference(404, None)
    conflict = {
        "error": {
            "code": 400,
            "message": "CachedContent can not be used with GenerateContent request setting system_instruction, "
            "tools or tool_config.",
            "status": "INVALID_ARGUMENT",
        }
    }
    assert not is_stale_cache_reference(400, conflict)
    assert not is_stale_cache_reference(429, gone)
    assert not is_stale_cache_reference(403, {"error": {"code": 403, "message": "quota project denied"}})
