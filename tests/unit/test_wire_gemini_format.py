"""The Gemini bus messages and the gemini-cache's stored records keep the byte format running stacks exchange: compact JSON, the
documented keys in the documented order, `"v": 1` first, absent optionals left out (see
continuum_common.wire.gemini). The expected bytes are written out from that format."""

from __future__ import annotations

import dataclasses

import pytest

from continuum_common.wire.gemini import (
    EnsureOutcome,
    EnsureReply,
    Entry,
    GeminiRecordError,
    LookupReply,
    LookupRequest,
    LookupResult,
    NegativeEntry,
)

DIGEST = "ab" * 32


def test_lookup_request_bytes() -> None:
    request = LookupRequest("gem-a", "gemini-2.5-flash", DIGEST)
    expected = b'{"v":1,"backend":"gem-a","model":"gemini-2.5-flash","digest":"' + DIGEST.encode() + b'"}'
    assert request.to_bytes() == expected
    assert LookupRequest.from_bytes(expected) == request


def test_ensure_reply_bytes_leave_absent_fields_out() -> None:
    reply = EnsureReply(EnsureOutcome.CREATED, cached_content="cachedContents/c1", expire_at=1700000000.5)
    expected = b'{"v":1,"outcome":"created","cached_content":"cachedContents/c1","expire_at":1700000000.5}'
    assert reply.to_bytes() == expected
    assert EnsureReply.from_bytes(expected) == reply


def test_lookup_reply_round_trips() -> None:
    reply = LookupReply.from_bytes(LookupReply(LookupResult.MISS).to_bytes())
    assert reply.result is LookupResult.MISS and not reply.hit


def test_stored_records_bytes() -> None:
    """The state store's records: every key in the documented order, absent optionals as null."""
    entry = Entry("gem-a", DIGEST, "gemini-2.5-flash", "cachedContents/c1", 1700003600.0, 3600.0, 1700000000.0, 2048)
    expected = (
        b'{"backend":"gem-a","digest":"' + DIGEST.encode() + b'","model":"gemini-2.5-flash",'
        b'"name":"cachedContents/c1","expire_at":1700003600.0,"ttl_seconds":3600.0,'
        b'"created_at":1700000000.0,"token_count":2048}'
    )
    assert entry.to_json() == expected
    assert Entry.from_json(expected, last_use=5.0) == dataclasses.replace(entry, last_use=5.0)
    negative = NegativeEntry("gem-a", DIGEST, "gemini-2.5-flash", 1700000600.0, 1700000000.0, 4096)
    expected = (
        b'{"backend":"gem-a","digest":"' + DIGEST.encode() + b'","model":"gemini-2.5-flash",'
        b'"until":1700000600.0,"created_at":1700000000.0,"min_total_token_count":4096,"total_token_count":null}'
    )
    assert negative.to_json() == expected
    assert NegativeEntry.from_json(expected) == negative
    with pytest.raises(GeminiRecordError):
        Entry.from_json(b'{"backend": "gem-a"}')
    with pytest.raises(GeminiRecordError):
        NegativeEntry.from_json(b"[]")
