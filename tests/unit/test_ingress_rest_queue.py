"""The ingress's queue of prompt rests (continuum_ingress/kv/rests.py): one time budget per
event-loop turn shared by every queued rest, oldest first, a bounded number waiting, and a
failing rest reported and dropped without stopping the others."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from continuum_common.tokenization import PartialPrompt
from continuum_ingress.kv.rests import RestQueue


@dataclass
class _Prompt:
    """Stands in for a PartialPrompt that needs `steps` calls of extend() to be whole."""

    name: str
    steps: int
    log: list[str]
    fail_at: int | None = None
    done_steps: int = field(default=0)

    @property
    def done(self) -> bool:
        return self.done_steps >= self.steps

    def extend(self, pieces: int) -> None:
        self.done_steps += 1
        self.log.append(self.name)
        if self.fail_at is not None and self.done_steps == self.fail_at:
            raise ValueError("the tokenizer failed")

    def finish(self) -> Any:
        return type("Encoded", (), {"block_hashes": [self.steps]})()


def _partial(prompt: _Prompt) -> PartialPrompt:
    return cast(PartialPrompt, prompt)


async def _turns(queue: RestQueue[str], limit: int = 200) -> int:
    """Loop turns until nothing is pending."""
    for turn in range(limit):
        if not len(queue):
            return turn
        await asyncio.sleep(0)
    raise AssertionError("the queue never emptied")


async def test_rests_share_one_budget_per_turn_oldest_first() -> None:
    log: list[str] = []
    whole: list[tuple[str, list[int]]] = []
    turns: list[int] = []
    queue: RestQueue[str] = RestQueue(
        lambda item, chain: whole.append((item, chain)), lambda *_: None, slice_seconds=0.0
    )
    encode = queue._encode

    def counted() -> None:
        turns.append(len(log))
        encode()

    queue._encode = counted  # type: ignore[method-assign]
    assert queue.add("a", _partial(_Prompt("a", 3, log)))
    assert queue.add("b", _partial(_Prompt("b", 2, log)))
    assert not log, "nothing is encoded in the turn that queued it"
    await _turns(queue)
    assert log == ["a", "a", "a", "b", "b"], "oldest first, one slice per turn for the whole queue"
    assert len(turns) == 5, "with no time budget, one extend per turn across both rests"
    assert whole == [("a", [3]), ("b", [2])]


async def test_a_full_queue_refuses_and_a_failure_is_reported_and_dropped() -> None:
    log: list[str] = []
    whole: list[str] = []
    failed: list[tuple[str, str]] = []
    queue: RestQueue[str] = RestQueue(
        lambda item, _chain: whole.append(item),
        lambda item, exc: failed.append((item, str(exc))),
        limit=2,
        slice_seconds=1.0,
    )
    assert queue.add("bad", _partial(_Prompt("bad", 5, log, fail_at=2)))
    assert queue.add("good", _partial(_Prompt("good", 2, log)))
    assert not queue.add("third", _partial(_Prompt("third", 1, log))), "at the limit"
    assert len(queue) == 2
    await _turns(queue)
    assert failed == [("bad", "the tokenizer failed")]
    assert whole == ["good"] and log == ["bad", "bad", "good", "good"]
    assert queue.add("third", _partial(_Prompt("third", 1, log))), "room again once they are done"
    await _turns(queue)
    assert whole == ["good", "third"]


async def test_a_callback_that_raises_does_not_stall_the_rests_behind_it() -> None:
    log: list[str] = []
    whole: list[str] = []
    errors: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))

    def on_whole(item: str, _chain: list[int]) -> None:
        if item == "a":
            raise RuntimeError("recording failed")
        whole.append(item)

    # "a" takes two turns, so "b" is queued behind it when its callback raises
    queue: RestQueue[str] = RestQueue(on_whole, lambda *_: None, slice_seconds=0.0)
    assert queue.add("a", _partial(_Prompt("a", 2, log)))
    assert queue.add("b", _partial(_Prompt("b", 1, log)))
    await _turns(queue)
    assert whole == ["b"] and len(errors) == 1 and isinstance(errors[0], RuntimeError)
