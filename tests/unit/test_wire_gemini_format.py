"""The Gemini bus records keep the byte format running stacks exchange: compact JSON, the
documented keys in the documented order, `"v": 1` first, absent optionals left out (see
continuum_common.wire.gemini). The expected bytes are written out from that format."""

from __future__ import annotations

from continuum_common.wire.gemini import EnsureOutcome, EnsureReply, LookupReply, LookupRequest, LookupResult

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
