"""`conversations`: production-shaped multi-turn chat traffic, and its Mooncake-format trace.

What real chat traffic looks like (a public Mooncake conversation trace, docs/benchmarks.md
"Fleet comparison" compares the statistics): long shared system prompts, Zipf-popular; many
concurrent conversations, two thirds of them a single turn; each next turn resends the whole
conversation plus the previous answer and a new user message (usually short, sometimes a long
paste or tool output); minutes of think time between turns; inputs with a heavy tail (median
~6k, mean ~12k tokens). A small synthetic workload whose prompts differ in their first block
hides what a router does with that; this one does not.

A `ConversationsWorkload` is planned up front from its seed (`plan_conversations`): every
conversation's start, system prompt, and per turn the user message length, the answer length
(`max_tokens`) and the think time. Live, each turn is a chat request whose history holds the
engine's real answers. Offline, `mooncake_lines` writes the plan as Mooncake JSONL (hash_ids of
512-token blocks; the answers are the planned lengths) so the same structure replays as a trace:

    python -m continuum_bench.fleet.conversations --out /tmp/conversations.jsonl --duration 3600
    python -m continuum_bench.fleet.describe /tmp/conversations.jsonl /path/to/real_trace.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from continuum_bench.fleet.trace import TRACE_BLOCK, TraceLine, write_trace
from continuum_bench.fleet.workloads import BenchRequest, Texts
from continuum_bench.fleet.workloads import Session as SessionProto
from continuum_sim.protocol.chat_template import ChatMessage

# ChatML: "<|im_start|>{role}\n" is 3 tokens, "<|im_end|>\n" 2; the generation prompt is the
# header of the next assistant message. Used to plan prompt lengths and trace blocks.
MESSAGE_HEADER = 3
MESSAGE_FOOTER = 2


@dataclass(frozen=True)
class ConversationShape:
    """The generator's distributions. Defaults are fitted to the public conversation trace's
    statistics (`python -m continuum_bench.fleet.describe`); lengths are in tokens, times in seconds."""

    rate: float = 2.3  # conversation starts per second (Poisson)
    system_prompts: int = 4
    system_tokens: tuple[int, int] = (400, 1600)  # each prompt's length, uniform in this range
    system_zipf: float = 2.0  # the trace: every conversation starts with one shared block
    first_user_median: float = 4500.0  # first user message: lognormal
    first_user_sigma: float = 1.35
    followup_median: float = 60.0  # a later user message: lognormal...
    followup_sigma: float = 1.0
    paste_share: float = 0.2  # ...or, this often, a long paste / tool output
    paste_median: float = 3000.0
    paste_sigma: float = 1.4
    short_answer_share: float = 0.12  # answers: a few very short, the rest around 380
    short_answer_median: float = 20.0
    answer_mean: float = 390.0
    answer_sd: float = 170.0
    answer_max: int = 2000
    # Probability that turn t is followed by another: first + step * (t - 1), at most `most`
    # (long conversations tend to go on).
    continue_first: float = 0.3
    continue_step: float = 0.1
    continue_most: float = 0.8
    think_median: float = 130.0  # between the starts of two turns: lognormal
    think_sigma: float = 1.1
    max_turns: int = 40

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TurnPlan:
    at: float  # planned start, seconds from the start of the run
    user_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ConversationPlan:
    index: int
    system: int  # which system prompt
    turns: tuple[TurnPlan, ...]


def system_lengths(shape: ConversationShape, seed: int) -> list[int]:
    rng = random.Random(f"system-lengths-{seed}")
    low, high = shape.system_tokens
    return [rng.randint(low, high) for _ in range(shape.system_prompts)]


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(median), sigma)


def _answer(rng: random.Random, shape: ConversationShape) -> int:
    if rng.random() < shape.short_answer_share:
        value = _lognormal(rng, shape.short_answer_median, 0.8)
    else:
        value = rng.gauss(shape.answer_mean, shape.answer_sd)
    return int(min(shape.answer_max, max(1, value)))


def _followup(rng: random.Random, shape: ConversationShape) -> int:
    if rng.random() < shape.paste_share:
        return max(1, int(_lognormal(rng, shape.paste_median, shape.paste_sigma)))
    return max(1, int(_lognormal(rng, shape.followup_median, shape.followup_sigma)))


def _plan_one(
    index: int, start: float, system: int, system_len: int, shape: ConversationShape, rng: random.Random,
    *, duration: float, max_context: int,
) -> ConversationPlan | None:  # fmt: skip
    """One conversation's turns: stops when the context would not fit `max_context` (a user
    would start a new chat), after `duration`, or by chance (the continuation probability)."""
    turns: list[TurnPlan] = []
    context = system_len + MESSAGE_HEADER + MESSAGE_FOOTER  # tokens before the next user message
    at = start
    for turn in range(1, shape.max_turns + 1):
        if turn == 1:
            user = max(1, int(_lognormal(rng, shape.first_user_median, shape.first_user_sigma)))
        else:
            user = _followup(rng, shape)
        answer = _answer(rng, shape)
        prompt = context + user + MESSAGE_HEADER + MESSAGE_FOOTER + MESSAGE_HEADER
        if prompt + answer > max_context:
            if turn > 1:
                break
            user = max(1, user - (prompt + answer - max_context))  # a first message is cut to fit
            prompt = context + user + MESSAGE_HEADER + MESSAGE_FOOTER + MESSAGE_HEADER
            if prompt + answer > max_context:
                return None
        turns.append(TurnPlan(at, user, answer))
        context = prompt + answer + MESSAGE_FOOTER
        go_on = min(shape.continue_most, shape.continue_first + shape.continue_step * (turn - 1))
        if rng.random() >= go_on:
            break
        at += _lognormal(rng, shape.think_median, shape.think_sigma)
        if at > duration:
            break
    return ConversationPlan(index, system, tuple(turns)) if turns else None


def plan_conversations(
    shape: ConversationShape, *, duration: float, seed: int, max_context: int = 131_072
) -> list[ConversationPlan]:
    """Every conversation that starts within `duration` seconds, turns after it dropped (like
    replaying the first `duration` seconds of a trace). Deterministic per seed."""
    rng = random.Random(seed)
    lengths = system_lengths(shape, seed)
    weights = [1.0 / (rank**shape.system_zipf) for rank in range(1, shape.system_prompts + 1)]
    cumulative = [sum(weights[: i + 1]) for i in range(len(weights))]
    plans: list[ConversationPlan] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.rate)
        if t > duration:
            return plans
        system = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
        conv_rng = random.Random(f"conversation-{seed}-{len(plans)}")
        plan = _plan_one(
            len(plans), t, system, lengths[system], shape, conv_rng, duration=duration, max_context=max_context
        )
        if plan is not None:
            plans.append(plan)


# -- the Mooncake form -----------------------------------------------------------------------


def _segments(plan: ConversationPlan, turn: int, system_len: int) -> list[tuple[tuple[Any, ...], int]]:
    """Turn `turn`'s prompt as (content key, tokens) segments: system, then user / assistant
    messages; the generation prompt is the first tokens of the next assistant message, so
    turn k's prompt is a prefix of turn k+1's, as with a real chat template."""
    segments: list[tuple[tuple[Any, ...], int]] = [
        (("system", plan.system), system_len + MESSAGE_HEADER + MESSAGE_FOOTER)
    ]
    for k, step in enumerate(plan.turns[: turn + 1]):
        segments.append((("user", plan.index, k), step.user_tokens + MESSAGE_HEADER + MESSAGE_FOOTER))
        length = MESSAGE_HEADER if k == turn else MESSAGE_HEADER + step.output_tokens + MESSAGE_FOOTER
        segments.append((("assistant", plan.index, k), length))
    return segments


class _BlockIds:
    """Mooncake hash ids: one per distinct chained block content, numbered in order of first
    appearance. A block's content is the pieces of segments it covers."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}

    def chain(self, segments: Sequence[tuple[tuple[Any, ...], int]]) -> list[int]:
        out: list[int] = []
        pieces: list[tuple[Any, ...]] = []
        room = TRACE_BLOCK
        for key, length in segments:
            offset = 0
            while offset < length:
                take = min(room, length - offset)
                pieces.append((key, offset, offset + take))
                offset += take
                room -= take
                if room == 0:
                    out.append(self._intern(out, pieces))
                    pieces, room = [], TRACE_BLOCK
        if pieces:
            out.append(self._intern(out, pieces))
        return out

    def _intern(self, chain: list[int], pieces: list[tuple[Any, ...]]) -> int:
        key = hash((chain[-1] if chain else -1, tuple(pieces)))
        return self._ids.setdefault(key, len(self._ids))


def mooncake_turns(
    plans: Sequence[ConversationPlan], shape: ConversationShape, seed: int
) -> list[tuple[ConversationPlan, int, TraceLine]]:
    """Every turn of the plan as a trace line, in time order, with its conversation and turn."""
    lengths = system_lengths(shape, seed)
    turns = sorted(((step.at, plan, k) for plan in plans for k, step in enumerate(plan.turns)), key=lambda x: x[0])
    ids = _BlockIds()
    out: list[tuple[ConversationPlan, int, TraceLine]] = []
    for at, plan, k in turns:
        segments = _segments(plan, k, lengths[plan.system])
        hash_ids = ids.chain(segments)
        tokens = sum(length for _, length in segments)
        out.append((plan, k, TraceLine(int(at * 1000), tokens, plan.turns[k].output_tokens, tuple(hash_ids))))
    return out


def mooncake_lines(plans: Sequence[ConversationPlan], shape: ConversationShape, seed: int) -> list[TraceLine]:
    """The plan as Mooncake trace lines (one per turn, in time order)."""
    return [line for _, _, line in mooncake_turns(plans, shape, seed)]


# -- the live workload -----------------------------------------------------------------------


@dataclass
class _Conversation:
    texts: Texts
    plan: ConversationPlan
    system_text: str
    max_model_len: int
    seed: int
    start: float = field(init=False)
    history: list[ChatMessage] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self.start = self.plan.turns[0].at

    def next_request(self, previous_answer: str | None) -> BenchRequest | None:
        if self.sent >= len(self.plan.turns):
            return None
        if not self.history:
            self.history.append(ChatMessage("system", self.system_text))
        elif previous_answer is None:
            return None  # the previous turn failed: the conversation ends
        else:
            self.history.append(ChatMessage("assistant", previous_answer))
        step = self.plan.turns[self.sent]
        rng = random.Random(f"user-{self.seed}-{self.plan.index}-{self.sent}")
        self.history.append(ChatMessage("user", self.texts.text(step.user_tokens, rng)))
        ids = self.texts.chat_ids(self.history)
        if len(ids) + step.output_tokens > self.max_model_len:
            return None  # real answers ran longer than planned: the context is full
        self.sent += 1
        body: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in self.history],
            "max_tokens": step.output_tokens,
        }
        return BenchRequest("chat", body, ids, step.output_tokens)

    def think_time(self) -> float:
        if self.sent >= len(self.plan.turns):
            return 0.0
        return self.plan.turns[self.sent].at - self.plan.turns[self.sent - 1].at


@dataclass
class ConversationsWorkload:
    texts: Texts
    duration: float = 600.0  # seconds of conversation starts (and of turns)
    seed: int = 1
    max_model_len: int = 32_768
    shape: ConversationShape = ConversationShape()
    name: str = "conversations"
    _plans: list[ConversationPlan] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._plans = plan_conversations(
            self.shape, duration=self.duration, seed=self.seed, max_context=self.max_model_len
        )
        if not self._plans:
            raise ValueError("the conversations workload planned no requests; raise --duration or the rate")

    @property
    def total_requests(self) -> int:
        return sum(len(p.turns) for p in self._plans)

    @property
    def plans(self) -> list[ConversationPlan]:
        return self._plans

    def describe(self) -> dict[str, Any]:
        planned = mooncake_lines(self._plans, self.shape, self.seed)
        return {
            "workload": self.name, "duration": self.duration, "seed": self.seed, "max_model_len": self.max_model_len,
            "conversations": len(self._plans), "requests": self.total_requests,
            "planned_mean_input_tokens": round(sum(x.input_length for x in planned) / len(planned)),
            "shape": self.shape.describe(),
        }  # fmt: skip

    def sessions(self) -> Iterator[SessionProto]:
        lengths = system_lengths(self.shape, self.seed)
        systems = [
            "You are a helpful assistant of a software company.\n\n"
            + self.texts.text(length, random.Random(f"system-{self.seed}-{i}"))
            for i, length in enumerate(lengths)
        ]
        for plan in self._plans:
            yield _Conversation(self.texts, plan, systems[plan.system], self.max_model_len, self.seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m continuum_bench.fleet.conversations",
        description="write the conversations workload as a Mooncake-format trace (JSONL)",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of conversation starts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=ConversationShape.rate, help="conversation starts per second")
    parser.add_argument("--max-context", type=int, default=131_072, help="tokens a conversation may reach")
    args = parser.parse_args(argv)
    shape = ConversationShape(rate=args.rate)
    plans = plan_conversations(shape, duration=args.duration, seed=args.seed, max_context=args.max_context)
    lines = mooncake_lines(plans, shape, args.seed)
    write_trace(Path(args.out), lines)
    print(f"wrote {len(lines)} requests of {len(plans)} conversations to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
