"""Sequence decisions, event numbering, SSE framing, and detokenize attribution (bisection)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import orjson

from continuum_common.events import EventType, Tier, decode_event
from continuum_common.hashing import request_prefix_key
from continuum_listener.attribution import Resolver
from continuum_listener.errors import DetokenizeError
from continuum_listener.policy.chains import Job, Outcome
from continuum_listener.policy.sequence import EventIdTracker, EventSequencer, IdAction, SeqAction, SeqTracker
from continuum_listener.protocol.sse import encode_control, encode_event, parse_event_id
from continuum_testing.engines import chatml_decode, chatml_tokens


def test_seq_tracker() -> None:
    seq = SeqTracker()
    assert seq.observe(0).action is SeqAction.APPLY
    first = seq.observe(5)
    assert (first.action, first.missing_from) == (SeqAction.JOIN, 0)
    seq.advance(5)
    assert seq.observe(6).action is SeqAction.APPLY
    gap = seq.observe(9)
    assert (gap.action, gap.missing_from) == (SeqAction.GAP, 6)
    assert seq.observe(5).action is SeqAction.RESTART
    assert seq.observe(0).action is SeqAction.RESTART


def test_event_id_tracker_per_rank() -> None:
    ids = EventIdTracker()
    assert ids.observe(0, 0, True) is IdAction.RESET
    assert ids.observe(0, 1, False) is IdAction.APPLY
    assert ids.observe(0, 1, False) is IdAction.DUPLICATE
    assert ids.observe(1, 7, False) is IdAction.APPLY  # first sight of rank 1
    assert ids.observe(0, 5, False) is IdAction.GAP
    assert ids.observe(0, 6, False) is IdAction.APPLY
    assert ids.observe(0, 0, False) is IdAction.RESET  # back at 0 without a created event
    assert ids.observe(0, 1, False) is IdAction.APPLY


def test_sequencer_epochs_increase_and_seq_restarts() -> None:
    now = [1000.0]
    seq = EventSequencer("b", clock=lambda: now[0])
    first = seq.new_epoch()
    event = seq.make(EventType.CREATED, b"\x01" * 32, Tier.GPU_HOT, 16)
    assert (event.source_epoch, event.seq, event.msg_id) == (first, 1, f"b:{first}:1")
    assert seq.make(EventType.CLEARED, None, Tier.GPU_HOT, 0).seq == 2
    second = seq.new_epoch()  # same clock reading: still strictly newer
    assert second == first + 1 and seq.make(EventType.CLEARED, None, Tier.GPU_HOT, 0).seq == 1
    assert decode_event(event.encode()) == event


def test_sse_framing() -> None:
    seq = EventSequencer("vllm-1", clock=lambda: 5.0)
    epoch = seq.new_epoch()
    event = seq.make(EventType.OFFLOADED, b"\xab" * 32, Tier.STORAGE_WARM, 64)
    text = encode_event(event).decode()
    lines = text.split("\n")
    assert lines[0] == f"id: {epoch}-1" and lines[1] == "event: cache_offloaded" and text.endswith("\n\n")
    data = orjson.loads(lines[2].removeprefix("data: "))
    assert data["event"] == "cache_offloaded" and data["prefix_hash"] == "ab" * 32 and data["tier"] == "storage_warm"
    assert not encode_event(event, with_id=False).startswith(b"id:")
    assert parse_event_id(f"{epoch}-1") == (epoch, 1)
    for bad in (None, "", "abc", "1-", "-1", "1-x"):
        assert parse_event_id(bad) is None
    assert encode_control("draining", "bye").startswith(b"event: draining\ndata: ")


def make_job(tokens: list[int], depths: list[int]) -> Job:
    return Job(1, 0, list(range(100, 100 + len(depths))), depths, None, array("I", tokens))


async def test_resolver_bisects_to_the_first_determining_block() -> None:
    messages = [{"role": "system", "content": "Short rules."}, {"role": "user", "content": "hello there"}]
    tokens = chatml_tokens(messages)
    depths = list(range(4, len(tokens) + 1, 4))
    calls: list[int] = []

    async def detokenize(ids: Sequence[int]) -> str:
        calls.append(len(ids))
        return chatml_decode(list(ids))

    resolver = Resolver(detokenize=detokenize, family="sim", model="m", max_prefix_length=1024)
    job = make_job(tokens[: depths[-1]], depths)
    resolution = await resolver.resolve(job)
    assert resolution.outcome is Outcome.DETERMINED
    end = len(b"<|im_start|>system\nShort rules.<|im_end|>") - len("<|im_start|><|im_end|>") + 2
    assert depths[resolution.index] >= end > (depths[resolution.index - 1] if resolution.index else 0)
    assert resolution.prefix == request_prefix_key({"model": "m", "messages": messages}, enabled=True)
    assert len(calls) <= 1 + len(depths).bit_length()
    # The same blocks again: answered from the cache.
    before = len(calls)
    assert (await resolver.resolve(job)).index == resolution.index and len(calls) == before


async def test_resolver_pending_failed_and_unattributable() -> None:
    async def text(value: str) -> str:
        return value

    async def broken(_ids: Sequence[int]) -> str:
        raise DetokenizeError("timeout")

    job = make_job([1, 2, 3], [3])
    resolver = Resolver(detokenize=lambda _ids: text("<|im_start|>system\nabc"), family="chatml", model="m",
                        max_prefix_length=1024)  # fmt: skip
    assert (await resolver.resolve(job)).outcome is Outcome.PENDING
    resolver = Resolver(detokenize=lambda _ids: text("no template here"), family="chatml", model="m",
                        max_prefix_length=1024)  # fmt: skip
    assert (await resolver.resolve(job)).outcome is Outcome.UNATTRIBUTABLE
    resolver = Resolver(detokenize=broken, family="chatml", model="m", max_prefix_length=1024)
    assert (await resolver.resolve(job)).outcome is Outcome.FAILED
    lora = Job(2, 0, [5], [3], "adapter-a", array("I", [1, 2, 3]))
    resolver = Resolver(detokenize=lambda _ids: text("<|im_start|>user\nhi<|im_end|>"), family="chatml", model="m",
                        max_prefix_length=1024)  # fmt: skip
    got = await resolver.resolve(lora)
    body = {"model": "adapter-a", "messages": [{"role": "user", "content": "hi"}]}
    assert got.prefix == request_prefix_key(body, enabled=True)  # a LoRA chain is keyed by the adapter name


def test_trace_headers_with_and_without_tracing() -> None:
    from continuum_common.config.router import TracingConfig
    from continuum_common.tracing import Tracing
    from continuum_listener.adapters.publisher import trace_headers

    attributes: dict[str, str | int] = {"continuum.backend": "b", "continuum.seq": 1}
    plain = trace_headers(None, "kv.batch publish", attributes)["traceparent"].split("-")
    assert [len(p) for p in plain] == [2, 32, 16, 2] and plain[3] == "01"
    # a fresh root each time
    assert trace_headers(None, "kv.batch publish", attributes) != trace_headers(None, "kv.batch publish", attributes)
    tracing = Tracing(TracingConfig(enabled=True, otlp_endpoint="http://127.0.0.1:9/v1/traces"), "test")
    try:
        headers = trace_headers(tracing, "kv.batch publish", attributes)
        context = tracing.extract(headers)
        with tracing.tracer.start_as_current_span("apply", context=context) as child:
            assert f"{child.get_span_context().trace_id:032x}" == headers["traceparent"].split("-")[1]
    finally:
        tracing.shutdown()
