"""Hostile bus messages: KV events (version 1) and KV batches (wire format v2) as the indexer
takes them off JetStream, the ingress replicas' load reports and routing decisions, and the
gemini-cache protocol (lookup, ensure, drop, usage and their replies).

* Every decoder returns its message or raises its own documented error (BatchDecodeError,
  DroppedEvent, LoadReportDecodeError, DecisionDecodeError, GeminiProtocolError), never
  anything else, for arbitrary bytes and for valid messages mutated as msgpack / JSON trees.
* What the indexer's decoder accepts, the in-memory indexes apply without an error (through
  the indexer's own EventSink, which the JetStream and SSE transports call).
* The gemini-cache service, on a real NATS server, counts every message its decoders refuse
  (`continuum_gemini_context_cache_dropped_total{reason="bad_message"}`) and keeps answering.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import nats
import orjson
import pytest
import pytest_asyncio
from hypothesis import event, example, given
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex.block_memory import InMemoryBlockIndex
from continuum_common.kvindex.memory import InMemoryKvIndex
from continuum_common.procs import NatsServer
from continuum_common.wire.decisions import (
    KIND_ANSWER,
    Decision,
    DecisionDecodeError,
    Tokenized,
    decode_decision,
    decode_tokenized,
    encode_decision,
    encode_tokenized,
)
from continuum_common.wire.gemini import (
    SUBJECT_DROP,
    SUBJECT_ENSURE,
    SUBJECT_LOOKUP,
    SUBJECT_USAGE,
    ClearReply,
    DropReply,
    DropRequest,
    EnsureReply,
    EnsureRequest,
    GeminiProtocolError,
    LookupReply,
    LookupRequest,
    UsageReport,
    decode_stats,
)
from continuum_common.wire.kv import (
    AllCleared,
    BatchDecodeError,
    BlocksRemoved,
    BlocksStored,
    KvBatch,
    decode_bus_payload,
    encode_batch,
)
from continuum_common.wire.loads import (
    BackendLoad,
    LoadReport,
    LoadReportDecodeError,
    decode_load_report,
    encode_load_report,
)
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_indexer.app import IndexerApp
from continuum_indexer.errors import DroppedEvent
from continuum_indexer.event_sink import EventSink
from continuum_indexer.metrics import DROP_REASONS, IndexerMetrics
from continuum_indexer.protocol.bus_messages import decode_bus_message
from continuum_testing.fake_gemini import FakeGemini
from continuum_testing.fixtures import _purge_jetstream
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, router_config, system_prompt
from continuum_testing.indexer_harness import ensure_stream, running, wait_drained
from continuum_testing.indexer_harness import router_config as indexer_config
from continuum_testing.indexer_harness import settings as indexer_settings
from tests.fuzz.strategies import (
    Deep,
    byte_mutations,
    dump_json,
    fuzz_settings,
    hostile_values,
    msgpack_hostile,
    mutated,
    pack_msgpack,
)

U64 = (1 << 64) - 1
PREFIX = hashlib.sha256(b"p").hexdigest()
backends = st.sampled_from(["b", "b-2", "B_3", "x" * 64])
u64s = st.integers(min_value=0, max_value=U64)


# -- KV events and batches (indexer) ------------------------------------------------------------

block_events = st.one_of(
    st.builds(BlocksStored, st.lists(u64s, max_size=6), st.none() | u64s, st.integers(0, 256), st.sampled_from([0, 1])),
    st.builds(BlocksRemoved, st.lists(u64s, max_size=6), st.sampled_from([0, 1])),
    st.just(AllCleared()),
)
kv_batches = st.builds(
    KvBatch,
    backends,
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 36),
    st.floats(0, 2e9),
    st.lists(block_events, max_size=5),
)
kv_events = st.builds(
    KvEvent,
    backends,
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 40),
    st.floats(0, 2e9),
    st.sampled_from(list(EventType)),
    st.just(PREFIX),
    st.integers(0, 1 << 20),
    st.sampled_from(list(Tier)),
).map(lambda e: e if e.type is not EventType.CLEARED else KvEvent(e.backend, e.source_epoch, e.seq, e.ts, e.type, None))
BUS_NAMES = ["v", "backend", "source_epoch", "seq", "ts", "events", "type", "prefix_hash", "token_count", "tier", "x"]


@st.composite
def bus_payloads(draw: st.DrawFn) -> tuple[str, bytes]:
    """(subject, payload): valid v1/v2 messages mutated as msgpack (or JSON) trees or bytes."""
    item = draw(kv_batches | kv_events)
    subject = "continuum.kv.events." + draw(st.sampled_from([item.backend, item.backend, "other"]))
    valid = encode_batch(item) if isinstance(item, KvBatch) else item.encode()
    how = draw(st.sampled_from(["tree", "tree", "json", "bytes", "random"]))
    if how == "random":
        return subject, draw(st.binary(max_size=200))
    if how == "bytes":
        return subject, draw(byte_mutations(valid))
    tree = draw(mutated(st.just(msgpack.unpackb(valid, raw=False)), 3, hostile=msgpack_hostile, names=BUS_NAMES))
    if how == "json":
        return subject, dump_json(_jsonable(tree))
    return subject, pack_msgpack(tree)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return 0.5
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


DEEP_UNKNOWN_FIELD = b"\x82\xa1v\x02\xa1x" + b"\x91" * 3000 + b"\x01"  # {v: 2, x: [[[...]]]}
DEEP_UNKNOWN_JSON = b'{"v": 1, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"


@fuzz_settings(2.0)
@given(message=bus_payloads())
@example(message=("continuum.kv.events.b", DEEP_UNKNOWN_FIELD)).via("an unknown field nested past the recursion limit")
@example(message=("continuum.kv.events.b", DEEP_UNKNOWN_JSON)).via("the same in JSON")
async def test_indexer_decodes_or_drops_and_applies_what_it_accepts(message: tuple[str, bytes]) -> None:
    subject, payload = message
    try:
        decode_bus_payload(payload)
    except BatchDecodeError:
        pass
    try:
        item = decode_bus_message(subject, payload)
    except DroppedEvent as drop:
        assert drop.reason in DROP_REASONS, drop.reason
        event(f"dropped: {drop.reason}")
        return
    event(f"applied: {type(item).__name__}")
    cfg = KvCacheIndex()
    sink = EventSink(
        InMemoryKvIndex.from_config(cfg), IndexerMetrics(["b"]), blocks=InMemoryBlockIndex.from_config(cfg)
    )
    if isinstance(item, KvBatch):
        await sink.apply_blocks([item])
    else:
        await sink.apply([item])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def nats_url(_session_nats: NatsServer) -> str:
    """The session's NATS server, running and without streams (the JetStream state of earlier
    tests is not this module's)."""
    if not _session_nats.running:
        await _session_nats.start()
    await _purge_jetstream(_session_nats.url)
    return _session_nats.url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def indexer(nats_url: str) -> AsyncIterator[IndexerApp]:
    await ensure_stream(nats_url)
    app = IndexerApp(indexer_settings(indexer_config(nats_url, backend="memory")))
    async with running(app):
        yield app


def drops_by_reason(app: IndexerApp) -> Counter[str]:
    out: Counter[str] = Counter()
    for metric in app.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "continuum_kv_event_dropped_total":
                out[sample.labels["reason"]] += int(sample.value)
    return out


@fuzz_settings(0.15)
@given(messages=st.lists(bus_payloads(), min_size=1, max_size=8))
@example(messages=[("continuum.kv.events.b", DEEP_UNKNOWN_FIELD)]).via("nested past the recursion limit")
async def test_the_indexer_on_jetstream_counts_every_drop_and_drains(
    indexer: IndexerApp, nats_url: str, messages: list[tuple[str, bytes]]
) -> None:
    """Through the real consumer: every message is settled (nothing is redelivered for ever),
    and each one the decoder refuses is counted under its reason."""
    expected: Counter[str] = Counter()
    for subject, payload in messages:
        try:
            decode_bus_message(subject, payload)
        except DroppedEvent as drop:
            expected[drop.reason] += 1
    before = drops_by_reason(indexer)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for subject, payload in messages:
            await js.publish(subject, payload)
    finally:
        await nc.close()
    await wait_drained(nats_url, timeout=20)
    assert drops_by_reason(indexer) - before == expected


# -- replicas' load reports and routing decisions ------------------------------------------------

load_reports = st.builds(
    LoadReport,
    st.text(min_size=1, max_size=20),
    st.integers(0, (1 << 63) - 1),
    st.integers(1, 3_600_000),
    st.lists(
        st.builds(BackendLoad, st.text(min_size=1, max_size=8), st.integers(0, 1000), st.integers(0, 10**9)), max_size=4
    ),
    st.booleans(),
)
decisions = st.builds(
    Decision, st.text(max_size=20), st.text(max_size=8), st.text(max_size=8), st.integers(0, KIND_ANSWER), st.floats(allow_nan=False),
    st.lists(u64s, max_size=8), st.integers(0, 10**9), st.booleans(),
)  # fmt: skip

tokenizations = st.builds(
    Tokenized, st.text(max_size=20), st.text(max_size=8), st.integers(0, 1), st.binary(min_size=1, max_size=16),
    st.lists(u64s, max_size=8), st.integers(0, 10**9), st.integers(0, 10**9), st.lists(u64s, max_size=4),
)  # fmt: skip


@st.composite
def replica_payloads(draw: st.DrawFn, valid: st.SearchStrategy[Any], encode: Any) -> bytes:
    packed = encode(draw(valid))
    how = draw(st.sampled_from(["tree", "tree", "bytes", "random"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "bytes":
        return draw(byte_mutations(packed))
    return pack_msgpack(draw(mutated(st.just(msgpack.unpackb(packed, raw=False)), 3, hostile=msgpack_hostile)))


@fuzz_settings(1.0)
@given(payload=replica_payloads(load_reports, encode_load_report))
def test_load_report_decoder_raises_only_its_error(payload: bytes) -> None:
    try:
        report = decode_load_report(payload)
    except LoadReportDecodeError:
        return
    assert isinstance(report, LoadReport)


@fuzz_settings(1.0)
@given(payload=replica_payloads(decisions, encode_decision))
def test_decision_decoder_raises_only_its_error(payload: bytes) -> None:
    try:
        decision = decode_decision(payload)
    except DecisionDecodeError:
        return
    assert isinstance(decision, Decision)


@fuzz_settings(1.0)
@given(payload=replica_payloads(tokenizations, encode_tokenized))
def test_tokenization_decoder_raises_only_its_error(payload: bytes) -> None:
    try:
        learnt = decode_tokenized(payload)
    except DecisionDecodeError:
        return
    assert isinstance(learnt, Tokenized)
    assert learnt.digest and learnt.kind in (0, 1)


# -- gemini-cache protocol -------------------------------------------------------------------------

DIGEST = "ab" * 32
GEMINI_MESSAGES: list[tuple[str, Any]] = [
    ("lookup", LookupRequest("gem-a", "gemini-2.5-flash", DIGEST)),
    ("ensure", EnsureRequest("gem-a", "gemini-2.5-flash", DIGEST, "be brief", 3600.0)),
    ("drop", DropRequest("gem-a", DIGEST, "cachedContents/abc")),
    ("usage", UsageReport({"gem-a": {"hit": 1, "miss": 2, "negative": 0, "ineligible": 3, "cached_tokens": 9}})),
]
GEMINI_REPLIES: list[Any] = [
    LookupReply.from_bytes(
        b'{"result": "hit", "cached_content": "cachedContents/x", "expire_at": 5, "token_count": 3}'
    ),
    EnsureReply.from_bytes(b'{"outcome": "created", "cached_content": "cachedContents/x", "expire_at": 5}'),
    DropReply(True),
    ClearReply(True, 3, 1),
]
DECODERS: dict[str, Any] = {
    "lookup": LookupRequest.from_bytes,
    "ensure": EnsureRequest.from_bytes,
    "drop": DropRequest.from_bytes,
    "usage": UsageReport.from_bytes,
}
REPLY_DECODERS = [
    LookupReply.from_bytes,
    EnsureReply.from_bytes,
    DropReply.from_bytes,
    ClearReply.from_bytes,
    decode_stats,
]
GEMINI_NAMES = ["v", "backend", "model", "digest", "system_instruction", "ttl_seconds", "cached_content", "backends",
                "hit", "miss", "cached_tokens", "result", "expire_at", "outcome", "in_flight", "success", "gem-a"]  # fmt: skip


@st.composite
def gemini_payloads(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> bytes:
    base = orjson.loads(draw(valid).to_bytes())
    how = draw(st.sampled_from(["tree", "tree", "tree", "bytes", "random"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "bytes":
        return draw(byte_mutations(orjson.dumps(base)))
    return dump_json(draw(mutated(st.just(base), 3, hostile=hostile_values, names=GEMINI_NAMES)))


@fuzz_settings(1.0)
@given(payload=gemini_payloads(st.sampled_from([m for _, m in GEMINI_MESSAGES] + GEMINI_REPLIES)))
@example(payload=b'{"v": 1, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}").via("nested past the parser's limit")
def test_gemini_decoders_raise_only_their_error(payload: bytes) -> None:
    for decode in [*DECODERS.values(), *REPLY_DECODERS]:
        try:
            decode(payload)
        except GeminiProtocolError:
            pass


@dataclass
class GeminiRig:
    app: GeminiCacheApp
    nc: NatsClient

    def dropped(self) -> float:
        labels = {"reason": "bad_message"}
        return self.app.metrics.registry.get_sample_value("continuum_gemini_context_cache_dropped_total", labels) or 0.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gemini(nats_url: str) -> AsyncIterator[GeminiRig]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, API_KEY)
        async with FakeGemini(api_keys={API_KEY}) as fake:
            app = GeminiCacheApp(router_config(fake.url, nats_url), state="memory")
            await app.start()
            nc = await nats.connect(nats_url)
            try:
                yield GeminiRig(app, nc)
            finally:
                await nc.close()
                await app.stop()


SUBJECTS = {"lookup": SUBJECT_LOOKUP, "ensure": SUBJECT_ENSURE, "drop": SUBJECT_DROP, "usage": SUBJECT_USAGE}


@fuzz_settings(0.4)
@given(kind=st.sampled_from(sorted(SUBJECTS)), data=st.data())
async def test_gemini_service_counts_every_refused_message(gemini: GeminiRig, kind: str, data: st.DataObject) -> None:
    valid = dict(GEMINI_MESSAGES)[kind]
    payload = data.draw(gemini_payloads(st.just(valid)), label="payload")
    try:
        DECODERS[kind](payload)
        bad = 0
    except GeminiProtocolError:
        bad = 1
    before = gemini.dropped()
    await gemini.nc.publish(SUBJECTS[kind], payload)
    # A lookup always gets an answer, also after a refused message: the service keeps serving.
    reply = await gemini.nc.request(SUBJECT_LOOKUP, GEMINI_MESSAGES[0][1].to_bytes(), timeout=5)
    assert LookupReply.from_bytes(reply.data).result.value in ("hit", "miss", "negative")
    for _ in range(100):
        if gemini.dropped() == before + bad:
            break
        await asyncio.sleep(0.01)
    assert gemini.dropped() == before + bad


def test_the_gemini_messages_are_valid() -> None:
    for kind, message in GEMINI_MESSAGES:
        assert DECODERS[kind](message.to_bytes()) == message
    assert EnsureRequest.build("gem-a", "m", system_prompt()).digest_matches()
    assert Deep(3).text() == b"[[[1]]]"
