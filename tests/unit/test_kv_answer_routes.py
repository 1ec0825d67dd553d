"""Approximate mode: the chunk chain of a conversation followed by its answer (kv/answer_routes.py)."""

from __future__ import annotations

from typing import Any

import orjson

from continuum_ingress.kv.answer_routes import AnswerRoute, answered_chain
from continuum_ingress.kv.chunks import chunk_chain, conversation_bytes
from continuum_ingress.protocol.apis import Api

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You answer questions about the report. " * 20},
        {"role": "user", "content": "What is on page one?"},
    ],
}
ANSWER = "A table of quarterly revenue, by region, with notes. " * 4


def test_the_answered_chain_extends_the_request_and_starts_the_next_turn() -> None:
    own = chunk_chain(conversation_bytes(Api.CHAT, BODY), 32)
    answered = answered_chain(BODY, ANSWER, 32)
    assert answered[: len(own)] == own and len(answered) > len(own)
    next_turn = {
        **BODY,
        "messages": [*BODY["messages"], {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "Why?"}],
    }
    assert chunk_chain(conversation_bytes(Api.CHAT, next_turn), 32)[: len(answered)] == answered
    assert BODY["messages"][-1]["role"] == "user"  # the request's body is left as it was


def test_a_route_learns_once_with_the_chain_or_none() -> None:
    learnt: list[list[int] | None] = []
    route = AnswerRoute(BODY, stream=False, chunk_bytes=32, learn=learnt.append)
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}}]}
    route.feed(orjson.dumps(body))
    route.abort()  # a whole body given up on is not replayed
    route.abort()
    assert learnt == [None]


async def test_a_committed_answer_is_learnt_and_a_stream_closed_after_done_too() -> None:
    learnt: list[list[int] | None] = []
    route = AnswerRoute(BODY, stream=False, chunk_bytes=32, learn=learnt.append)
    route.feed(orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}}]}))
    await route.commit(200, [])
    await route.commit(200, [])
    assert learnt == [answered_chain(BODY, ANSWER, 32)]
    streamed = AnswerRoute(BODY, stream=True, chunk_bytes=32, learn=learnt.append)
    chunk = {"choices": [{"index": 0, "delta": {"content": ANSWER}}]}
    streamed.feed(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
    streamed.abort()
    assert learnt[-1] == answered_chain(BODY, ANSWER, 32) and len(learnt) == 2
