"""The `conversations` workload generator, its Mooncake form, and the describe statistics (pure)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from continuum_bench.fleet.conversations import (
    MESSAGE_FOOTER,
    MESSAGE_HEADER,
    ConversationShape,
    ConversationsWorkload,
    mooncake_lines,
    mooncake_turns,
    plan_conversations,
    system_lengths,
)
from continuum_bench.fleet.conversations import main as conversations_main
from continuum_bench.fleet.describe import main as describe_main
from continuum_bench.fleet.describe import markdown_table, trace_stats
from continuum_bench.fleet.tokens import Texts, make_codec
from continuum_bench.fleet.trace import TRACE_BLOCK, TraceLine, TraceWorkload, load_trace, write_trace

SHAPE = ConversationShape()


def test_plans_are_deterministic_per_seed() -> None:
    a = plan_conversations(SHAPE, duration=300, seed=7)
    b = plan_conversations(SHAPE, duration=300, seed=7)
    c = plan_conversations(SHAPE, duration=300, seed=8)
    assert a == b and a != c
    assert mooncake_lines(a, SHAPE, 7) == mooncake_lines(b, SHAPE, 7)


def test_plan_shape_conversations_turns_think_times() -> None:
    plans = plan_conversations(SHAPE, duration=1800, seed=3)
    starts = [p.turns[0].at for p in plans]
    assert starts == sorted(starts) and starts[-1] <= 1800
    assert 0.7 * 1800 * SHAPE.rate < len(plans) < 1.3 * 1800 * SHAPE.rate, "Poisson starts at the configured rate"
    turns = [len(p.turns) for p in plans]
    assert 0.55 < turns.count(1) / len(turns) < 0.8, "most conversations are a single turn"
    assert max(turns) >= 4, "some go on for many turns"
    gaps = sorted(b.at - a.at for p in plans for a, b in itertools.pairwise(p.turns))
    assert all(g > 0 for g in gaps)
    assert 60 < gaps[len(gaps) // 2] < 250, "think times of minutes between turns"
    assert all(t.at <= 1800 for p in plans for t in p.turns), "turns after the duration are dropped"
    popular = [p.system for p in plans]
    assert popular.count(0) > popular.count(SHAPE.system_prompts - 1) * 2, "system prompts are Zipf-popular"


def test_max_context_ends_conversations_and_cuts_first_messages() -> None:
    plans = plan_conversations(SHAPE, duration=900, seed=5, max_context=8192)
    lengths = system_lengths(SHAPE, 5)
    for p in plans:
        context = lengths[p.system] + MESSAGE_HEADER + MESSAGE_FOOTER
        for t in p.turns:
            prompt = context + t.user_tokens + MESSAGE_HEADER + MESSAGE_FOOTER + MESSAGE_HEADER
            assert prompt + t.output_tokens <= 8192
            context = prompt + t.output_tokens + MESSAGE_FOOTER


def test_mooncake_lines_share_first_blocks_and_grow_turn_by_turn() -> None:
    plans = plan_conversations(SHAPE, duration=600, seed=2)
    lines = mooncake_lines(plans, SHAPE, 2)
    assert len(lines) == sum(len(p.turns) for p in plans)
    assert [x.timestamp_ms for x in lines] == sorted(x.timestamp_ms for x in lines)
    for x in lines:
        assert (len(x.hash_ids) - 1) * TRACE_BLOCK < x.input_length <= len(x.hash_ids) * TRACE_BLOCK
    firsts = [x.hash_ids[0] for x in lines]
    assert len(set(firsts)) <= SHAPE.system_prompts, "every request starts with a shared system-prompt block"
    by_conversation: dict[int, list[TraceLine]] = {}
    for plan, turn, x in mooncake_turns(plans, SHAPE, 2):
        assert x.input_length > plan.turns[turn].user_tokens and x.output_length == plan.turns[turn].output_tokens
        by_conversation.setdefault(plan.index, []).append(x)
    multi = [turns for turns in by_conversation.values() if len(turns) >= 2]
    assert len(multi) > 20
    for turns in multi:
        for before, after in itertools.pairwise(turns):
            full = before.input_length // TRACE_BLOCK
            assert after.hash_ids[:full] == before.hash_ids[:full], "the next turn resends the conversation"
            assert after.input_length > before.input_length + before.output_length
            assert after.hash_ids[full:] != before.hash_ids[full:]
    lengths = system_lengths(SHAPE, 2)
    own = [
        x.hash_ids[(lengths[plan.system] + MESSAGE_HEADER + MESSAGE_FOOTER) // TRACE_BLOCK]
        for plan, turn, x in mooncake_turns(plans, SHAPE, 2)
        if turn == 0
    ]
    assert len(set(own)) == len(plans), "a conversation's first block after its system prompt is its own"


def test_mooncake_round_trip(tmp_path: Path) -> None:
    plans = plan_conversations(SHAPE, duration=120, seed=4)
    lines = mooncake_lines(plans, SHAPE, 4)
    path = tmp_path / "conv.jsonl"
    write_trace(path, lines)
    assert load_trace(path) == lines
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"timestamp", "input_length", "output_length", "hash_ids"}
    assert load_trace(path, limit=3) == lines[:3]
    cut = lines[len(lines) // 2].timestamp_ms / 1000
    assert load_trace(path, duration_s=cut) == [x for x in lines if x.timestamp_ms <= cut * 1000]


def test_a_trace_window_starts_at_once_and_counts_from_its_start(tmp_path: Path) -> None:
    plans = plan_conversations(SHAPE, duration=120, seed=4)
    lines = mooncake_lines(plans, SHAPE, 4)
    path = tmp_path / "conv.jsonl"
    write_trace(path, lines)
    start_ms = lines[len(lines) // 3].timestamp_ms
    later = [x for x in lines if x.timestamp_ms >= start_ms]
    window = load_trace(path, start_s=start_ms / 1000, duration_s=30)
    assert window[0].timestamp_ms == 0 and window[0].hash_ids == later[0].hash_ids
    assert window == [
        replace(x, timestamp_ms=x.timestamp_ms - start_ms) for x in later if x.timestamp_ms - start_ms <= 30_000
    ]
    assert len(window) < len(later)  # the duration counts from the window's start
    assert load_trace(path, start_s=start_ms / 1000, limit=2) == window[:2]
    workload = TraceWorkload(Texts(make_codec("builtin")), path=path, start=start_ms / 1000, duration=30)
    assert (workload.total_requests, workload.describe()["start"]) == (len(window), start_ms / 1000)


def test_conversations_cli_writes_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    assert conversations_main(["--out", str(out), "--duration", "60", "--seed", "9"]) == 0
    shape = ConversationShape()
    assert load_trace(out) == mooncake_lines(plan_conversations(shape, duration=60, seed=9), shape, 9)


def test_load_trace_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a Mooncake trace line"):
        load_trace(path)


def line(t: float, blocks: list[int], length: int | None = None, out: int = 10) -> TraceLine:
    return TraceLine(int(t * 1000), length or len(blocks) * TRACE_BLOCK, out, tuple(blocks))


def test_describe_statistics_on_a_known_trace() -> None:
    # Block 0 is a system prompt shared by 20 conversations (fan-out 20 >= FANOUT); conversation
    # c's first turn is [0, c*10+1] (one full conversation block); c < 5 has a second turn 100 s
    # later that adds two blocks; conversation 0 a third one, 100 s after its second.
    lines = [line(c, [0, 1000 + c]) for c in range(20)]
    lines += [line(100 + c, [0, 1000 + c, 2000 + c, 3000 + c]) for c in range(5)]
    lines += [line(300, [0, 1000, 2000, 3000, 4000])]
    stats = trace_stats(lines)
    assert stats["requests"] == 26 and stats["span_s"] == 300
    assert stats["first_block_shared"] == 1.0
    assert stats["shared_root_blocks"] == 1.0
    assert stats["follow_up_share"] == pytest.approx(6 / 26)
    assert stats["turns_per_conversation"] == pytest.approx(26 / 20)
    assert stats["growth_per_turn_tokens"]["mean"] == pytest.approx((5 * 2 + 1) * TRACE_BLOCK / 6)
    assert stats["time_between_turns_s"]["p50"] == pytest.approx(100)
    # Second turns come 20 requests after their first turn; the third 5 after the second.
    assert stats["reuse_distance_requests"]["mean"] == pytest.approx((20 * 5 + 5) / 6)
    # Reusable: 19 requests reuse block 0 (512), 5 reuse 2 blocks, 1 reuses 4 blocks.
    total = sum(x.input_length for x in lines)
    assert stats["reusable_prefix"] == pytest.approx((19 * 1 + 5 * 2 + 4) * TRACE_BLOCK / total)
    table = markdown_table([("known", stats)])
    assert "| first block shared | 100.0% |" in table


def test_describe_does_not_take_new_conversations_for_follow_ups() -> None:
    # Many conversations on one system prompt, each a single partial block after it: nothing
    # extends anything beyond the shared root.
    lines = [line(c, [0, 1, 100 + c], length=2 * TRACE_BLOCK + 50) for c in range(30)]
    stats = trace_stats(lines)
    assert stats["shared_root_blocks"] == 2.0
    assert stats["follow_up_share"] == 0.0


def test_describe_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, [line(c, [0, 1000 + c]) for c in range(20)])
    assert describe_main([str(path), "--conversations", "--duration", "120", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"t.jsonl", "conversations (seed 1)"}
    assert doc["t.jsonl"]["requests"] == 20


def test_generated_statistics_resemble_production_conversations() -> None:
    """The defaults reproduce the structure they were fitted to (docs/benchmarks.md shows the
    real trace's figures next to these): a shared first block everywhere, a third of the
    requests follow-up turns, mean input around 12k tokens with a heavy tail, minutes between
    turns, reuse distances of millions of tokens."""
    plans = plan_conversations(SHAPE, duration=3600, seed=1)
    stats = trace_stats(mooncake_lines(plans, SHAPE, 1))
    assert stats["first_block_shared"] == 1.0
    assert 0.25 < stats["follow_up_share"] < 0.42
    assert 9_000 < stats["input_tokens"]["mean"] < 15_000
    assert stats["input_tokens"]["p99"] > 5 * stats["input_tokens"]["p50"]
    assert 300 < stats["growth_per_turn_tokens"]["p50"] < 800
    assert 60 < stats["time_between_turns_s"]["p50"] < 250
    assert stats["reuse_distance_tokens"]["p50"] > 1_000_000
    assert 2.8 < stats["requests_per_s"] < 4.0


async def test_live_sessions_follow_the_plan_and_resend_the_history() -> None:
    texts = Texts(make_codec("builtin"))
    workload = ConversationsWorkload(texts, duration=400, seed=11, max_model_len=32_768)
    session = next(s for s in workload.sessions() if len(s.plan.turns) >= 2)  # type: ignore[attr-defined]
    plan = session.plan  # type: ignore[attr-defined]
    first = session.next_request(None)
    assert first is not None and first.api == "chat"
    messages = first.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert first.max_tokens == plan.turns[0].output_tokens
    assert abs(len(first.prompt_ids) - (sum_plan := _planned_prompt(workload, plan, 0))) < 40, sum_plan
    assert session.think_time() == pytest.approx(plan.turns[1].at - plan.turns[0].at)
    answer = texts.text(plan.turns[0].output_tokens, random.Random(0))
    second = session.next_request(answer)
    assert second is not None
    assert second.body["messages"][:2] == messages and second.body["messages"][2]["content"] == answer
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids, "the next turn extends the previous prompt"
    again = next(s for s in ConversationsWorkload(texts, duration=400, seed=11).sessions() if s.plan == plan)  # type: ignore[attr-defined]
    assert again.next_request(None) == first, "deterministic per seed"


def _planned_prompt(workload: ConversationsWorkload, plan: object, turn: int) -> int:
    lengths = system_lengths(workload.shape, workload.seed)
    p = plan
    assert hasattr(p, "turns") and hasattr(p, "system")
    return lengths[p.system] + 2 * (MESSAGE_HEADER + MESSAGE_FOOTER) + MESSAGE_HEADER + p.turns[turn].user_tokens
