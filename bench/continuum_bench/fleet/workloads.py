"""Fleet-benchmark workloads: sessions of requests with open-loop arrival times.

A workload yields `Session`s, each with a start time in simulated seconds; a session produces
its requests one after another (`next_request(previous_answer)`), so a multi-turn chat can send
the real answer of turn k back in turn k+1. Every request also carries the engine's token ids of
its prompt (the engines' tokenizer and chat template, bench/continuum_bench/fleet/tokens.py), for the ideal hit rate.

* `SharedPromptWorkload` (document QA): a few long documents as system prompts, Zipf-popular,
  many users each asking one short question; Poisson arrivals.
* `MultiTurnWorkload`: conversations over a handful of shared system prompts, each growing turn
  by turn with the previous answers; conversation starts are Poisson, think time exponential.
* `TraceWorkload` (bench/continuum_bench/fleet/trace.py): Mooncake JSONL replay at the trace's timestamps.
* `ConversationsWorkload` (bench/continuum_bench/fleet/conversations.py): production-shaped multi-turn chat.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from continuum_bench.fleet.tokens import Texts
from continuum_sim.protocol.chat_template import ChatMessage

Api = Literal["chat", "completions"]

__all__ = ["Api", "BenchRequest", "MultiTurnWorkload", "Session", "SharedPromptWorkload", "Texts", "Workload"]


@dataclass
class BenchRequest:
    api: Api
    body: dict[str, Any]  # without model / stream fields: the driver adds them
    prompt_ids: list[int]
    max_tokens: int


class Session(Protocol):
    start: float  # simulated seconds from the start of the run

    def next_request(self, previous_answer: str | None) -> BenchRequest | None: ...

    def think_time(self) -> float: ...


class Workload(Protocol):
    name: str

    def sessions(self) -> Iterator[Session]: ...

    def describe(self) -> dict[str, Any]: ...

    @property
    def total_requests(self) -> int: ...


def _chat_request(texts: Texts, messages: list[ChatMessage], max_tokens: int) -> BenchRequest:
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages], "max_tokens": max_tokens}
    return BenchRequest("chat", body, texts.chat_ids(messages), max_tokens)


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


@dataclass
class _OneShot:
    start: float
    request: BenchRequest
    done: bool = False

    def next_request(self, previous_answer: str | None) -> BenchRequest | None:
        if self.done:
            return None
        self.done = True
        return self.request

    def think_time(self) -> float:
        return 0.0


@dataclass
class SharedPromptWorkload:
    texts: Texts
    requests: int = 400
    rate: float = 8.0  # requests per simulated second
    docs: int = 16
    doc_tokens: int = 3000
    question_tokens: int = 30
    output_tokens: int = 64
    zipf: float = 0.8
    seed: int = 1
    name: str = "shared-prompt"

    @property
    def total_requests(self) -> int:
        return self.requests

    def describe(self) -> dict[str, Any]:
        keys = ("requests", "rate", "docs", "doc_tokens", "question_tokens", "output_tokens", "zipf", "seed")
        return {"workload": self.name, **{k: getattr(self, k) for k in keys}}

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        docs = [
            "You answer questions about the following document.\n\n"
            + self.texts.text(self.doc_tokens, random.Random(f"doc-{i}"))
            for i in range(self.docs)
        ]
        weights = _zipf_weights(self.docs, self.zipf)
        t = 0.0
        for _ in range(self.requests):
            t += rng.expovariate(self.rate)
            doc = rng.choices(docs, weights)[0]
            question = self.texts.text(self.question_tokens, rng).rstrip(".") + "?"
            messages = [ChatMessage("system", doc), ChatMessage("user", question)]
            yield _OneShot(t, _chat_request(self.texts, messages, self.output_tokens))


@dataclass
class _Conversation:
    texts: Texts
    start: float
    system: str
    turns: int
    user_tokens: int
    output_tokens: int
    think_mean: float
    rng: random.Random
    history: list[ChatMessage] = field(default_factory=list)
    sent: int = 0

    def next_request(self, previous_answer: str | None) -> BenchRequest | None:
        if self.sent >= self.turns:
            return None
        if not self.history:
            self.history.append(ChatMessage("system", self.system))
        elif previous_answer is None:
            return None  # the previous turn failed: the conversation ends
        else:
            self.history.append(ChatMessage("assistant", previous_answer))
        self.history.append(ChatMessage("user", self.texts.text(self.user_tokens, self.rng)))
        self.sent += 1
        return _chat_request(self.texts, list(self.history), self.output_tokens)

    def think_time(self) -> float:
        return self.rng.expovariate(1.0 / self.think_mean) if self.think_mean > 0 else 0.0


@dataclass
class MultiTurnWorkload:
    texts: Texts
    conversations: int = 64
    turns: int = 6
    rate: float = 1.0  # conversation starts per simulated second
    system_prompts: int = 4
    system_tokens: int = 1000
    user_tokens: int = 80
    output_tokens: int = 120
    think_time: float = 5.0  # mean, simulated seconds
    seed: int = 1
    name: str = "multi-turn"

    @property
    def total_requests(self) -> int:
        return self.conversations * self.turns

    def describe(self) -> dict[str, Any]:
        keys = (
            "conversations",
            "turns",
            "rate",
            "system_prompts",
            "system_tokens",
            "user_tokens",
            "output_tokens",
            "think_time",
            "seed",
        )
        return {"workload": self.name, **{k: getattr(self, k) for k in keys}}

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        systems = [
            "You are a support assistant.\n\n" + self.texts.text(self.system_tokens, random.Random(f"sys-{i}"))
            for i in range(self.system_prompts)
        ]
        t = 0.0
        for i in range(self.conversations):
            t += rng.expovariate(self.rate)
            yield _Conversation(
                self.texts, t, rng.choice(systems), self.turns, self.user_tokens, self.output_tokens, self.think_time,
                random.Random(f"conv-{self.seed}-{i}"),
            )  # fmt: skip
