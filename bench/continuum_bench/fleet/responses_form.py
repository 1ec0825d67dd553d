"""A workload's chat request sent as an OpenAI Responses request (`bench ... --api responses`).

The conversation keeps its shape: the first system message becomes `instructions`, every other
message an input item (assistant turns as `output_text` message items, as a client replays an
earlier answer), `max_tokens` becomes `max_output_tokens`. An engine templates exactly the
same prompt (continuum_common.hashing.responses_input is the inverse), so the ideal cache and
every hit figure mean what they mean for chat. The stream's typed events give the first token
(`response.output_text.delta`) and the usage (`response.completed` / `response.incomplete`).

`--api responses-stored` sends a conversation's later turns as a client of a stateful Responses
server does: only the new messages as `input`, with `previous_response_id` naming the previous
turn's response (the id of its `response.created` event) and no `instructions` (the engine's
stored conversation holds them; vLLM puts a continuation's own instructions before the stored
history). The engine then templates the same messages as the whole conversation would, so the
ideal keeps its meaning; but only the engine that stored the previous turn can answer: any other
answers 404, which the report counts as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

API_FORMS = ("native", "responses", "responses-stored")


@dataclass
class StoredTurn:
    """One conversation's last answered turn (`responses-stored`): the messages its prompt held
    plus its answer, and the id of its response."""

    response_id: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def body(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The next request: a continuation when `chat` extends the last turn, else whole."""
        messages = list(chat.get("messages") or ())
        done = len(self.messages)
        if self.response_id is None or len(messages) <= done or messages[:done] != self.messages:
            return responses_body(chat)
        body = responses_body({**chat, "messages": messages[done:]})
        body.pop("instructions", None)  # only a system message could become them: none is new
        body["previous_response_id"] = self.response_id
        return body

    def answered(self, chat: dict[str, Any], response_id: str | None, answer: str) -> None:
        self.response_id = response_id
        self.messages = [*(chat.get("messages") or ()), {"role": "assistant", "content": answer}]


def responses_body(chat: dict[str, Any]) -> dict[str, Any]:
    messages = list(chat.get("messages") or ())
    body: dict[str, Any] = {key: value for key, value in chat.items() if key not in ("messages", "max_tokens")}
    if messages and messages[0].get("role") == "system":
        body["instructions"] = messages.pop(0)["content"]
    body["input"] = [_item(m) for m in messages]
    if "max_tokens" in chat:
        body["max_output_tokens"] = chat["max_tokens"]
    return body


def _item(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "assistant":
        part = {"type": "output_text", "text": message["content"]}
        return {"type": "message", "role": "assistant", "content": [part]}
    return {"role": message["role"], "content": message["content"]}


def event_text(event: dict[str, Any]) -> str | None:
    """The text a stream event adds, if it is a text delta."""
    if event.get("type") == "response.output_text.delta":
        delta = event.get("delta")
        return delta if isinstance(delta, str) else None
    return None


def event_response_id(event: dict[str, Any]) -> str | None:
    """The response id a stream's `response.created` event carries."""
    if event.get("type") != "response.created":
        return None
    rid = (event.get("response") or {}).get("id")
    return rid if isinstance(rid, str) else None


def event_usage(event: dict[str, Any]) -> dict[str, Any] | None:
    """The final event's usage in chat-completions terms (prompt, cached, completion tokens)."""
    if event.get("type") not in ("response.completed", "response.incomplete"):
        return None
    usage = (event.get("response") or {}).get("usage") or {}
    return {
        "prompt_tokens": usage.get("input_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)},
        "completion_tokens": usage.get("output_tokens", 0),
    }
