"""Approximate mode: what a chat request's answer adds to its conversation, recorded where the
request went (docs/kv-scorer.md, "Approximate mode").

Why: the next turn resends the conversation with the answer in it, and the backend that
generated the answer holds it in its KV cache. Recording only the request's own text chunks
makes the next turn match up to the answer and count the answer as new work (about a third of
a typical turn's new tokens), which tips placement decisions that weigh recent new work.

`AnswerRoute` is the `ResponseRecorder` (hooks.ANSWER_RECORDER) the selector leaves on a chat
request routed in approximate mode: once the answer the client received can be read
(kv/answers.py), the chunk chain of the conversation followed by that answer is handed to
`learn` (the selector records it for the backend and tells the other replicas); an answer that
cannot be read is reported as None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from continuum_ingress.kv.answers import AnswerReader
from continuum_ingress.kv.chunks import chunk_chain, conversation_bytes
from continuum_ingress.protocol.apis import Api


def answered_chain(body: dict[str, Any], text: str, chunk_bytes: int) -> list[int]:
    """The chunk chain of a chat request's conversation followed by its answer."""
    messages = body.get("messages")
    history = messages if isinstance(messages, list) else []
    extended = {**body, "messages": [*history, {"role": "assistant", "content": text}]}
    return chunk_chain(conversation_bytes(Api.CHAT, extended), chunk_bytes)


class AnswerRoute:
    """Fed the answer of one chat request; calls `learn` once: with the chain, or None."""

    __slots__ = ("body", "chunk_bytes", "learn", "reader")

    def __init__(
        self, body: dict[str, Any], *, stream: bool, chunk_bytes: int, learn: Callable[[list[int] | None], None]
    ) -> None:
        self.body = body
        self.chunk_bytes = chunk_bytes
        self.learn = learn
        self.reader: AnswerReader | None = AnswerReader(stream=stream)

    def feed(self, chunk: bytes) -> None:
        if self.reader is not None:
            self.reader.feed(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        self._settle(status < 300)
        return None

    def abort(self) -> None:
        # a stream whose [DONE] reached the client is whole even if the client closed first
        self._settle(self.reader is not None and self.reader.stream)

    def _settle(self, usable: bool) -> None:
        reader, self.reader = self.reader, None
        if reader is None:  # settled already
            return
        text = reader.text() if usable else None
        self.learn(None if text is None else answered_chain(self.body, text, self.chunk_bytes))
