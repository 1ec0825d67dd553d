"""The engine's response store (vLLM with `VLLM_ENABLE_RESPONSES_API_STORE=1`): response id →
the conversation that response ended, as chat messages, so a later request can continue it with
`previous_response_id`.

A stored conversation is the request's whole prompt as chat messages (its `instructions` as a
system message, the conversation it continued, its input), followed by the answer as an
assistant message, as vLLM stores it. The store is bounded: beyond `capacity` responses the least recently used
one is forgotten, and a request that names it gets 404 as if it had never been stored here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from continuum_sim.protocol.chat_template import ChatMessage

Conversation = tuple[ChatMessage, ...]


class ResponseStore:
    """A least-recently-used map of response ids to conversations. `capacity` 0 stores nothing.

    Conversations are tuples of frozen messages, so the turns of one conversation share their
    earlier messages instead of copying them: memory grows with the turns, not their square.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("the response store's capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[str, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def get(self, response_id: str) -> Conversation | None:
        """The stored conversation, or None when unknown; a hit counts as a use."""
        conversation = self._entries.get(response_id)
        if conversation is not None:
            self._entries.move_to_end(response_id)
        return conversation

    def put(self, response_id: str, conversation: Sequence[ChatMessage]) -> None:
        if self.capacity == 0:
            return
        self._entries[response_id] = tuple(conversation)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
