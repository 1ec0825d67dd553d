"""The engine's response store (vLLM with `VLLM_ENABLE_RESPONSES_API_STORE=1`): response id →
the conversation that response ended, as chat messages, so a later request can continue it with
`previous_response_id`, and the response object its client received, for
`GET /v1/responses/{id}`.

A stored conversation is the request's whole prompt as chat messages (its `instructions` as a
system message, the conversation it continued, its input), followed by the answer as an
assistant message, as vLLM stores it. The store is bounded: beyond `capacity` responses the least recently used
one is forgotten, and a request that names it gets 404 as if it had never been stored here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_sim.protocol.chat_template import ChatMessage

Conversation = tuple[ChatMessage, ...]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    conversation: Conversation  # the prompt's messages, then the answer as an assistant message
    # The final response object as sent (non-stream body, or the stream's last event's
    # `response`). Not copied: nothing changes it once it has been serialized for the client.
    response: Mapping[str, Any]

    @property
    def input_messages(self) -> Conversation:
        """The prompt's messages: the conversation without its last message, the answer."""
        return self.conversation[:-1]


class ResponseStore:
    """A least-recently-used map of response ids to stored responses. `capacity` 0 stores nothing.

    Conversations are tuples of frozen messages, so the turns of one conversation share their
    earlier messages instead of copying them: memory grows with the turns, not their square.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("the response store's capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown; a hit counts as a use."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, conversation: Sequence[ChatMessage], response: Mapping[str, Any]) -> None:
        if self.capacity == 0:
            return
        self._entries[response_id] = StoredResponse(tuple(conversation), response)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not stored."""
        return self._entries.pop(response_id, None) is not None
