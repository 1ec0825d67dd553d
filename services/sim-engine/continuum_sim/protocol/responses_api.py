"""OpenAI Responses API (`POST /v1/responses`) as vLLM serves it with its response store on
(`VLLM_ENABLE_RESPONSES_API_STORE=1`): the request's prompt
(continuum_common.hashing.responses_input: `instructions` and `input` as chat messages), the
response object and the typed stream events (provider-apis.md §3.4).

A finished response (completed, or cut by `max_output_tokens`) is kept in the engine's
`ResponseStore` unless the request says `"store": false`. A request with `previous_response_id`
continues it as vLLM does: its prompt is its own `instructions` (a system message), then the
stored conversation (with the system messages of the requests it continued: vLLM keeps them),
then its own input. An id this engine does not hold gets 404 `response_not_found`; a client can
always send the whole conversation in `input` instead.

A stored response can also be retrieved (`GET /v1/responses/{id}`: the response object as its
client received it), listed (`GET /v1/responses/{id}/input_items`: its prompt's messages as
message items) and deleted (`DELETE /v1/responses/{id}`); the shapes are built here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_common.hashing.responses_input import ResponsesInputError, responses_messages
from continuum_sim.errors import InvalidRequest, ResponseNotFound
from continuum_sim.protocol.chat_template import ChatMessage, parse_messages
from continuum_sim.protocol.requests import bool_field, cache_salt_field, int_field, resolve_model
from continuum_sim.protocol.response_store import Conversation, ResponseStore, StoredResponse
from continuum_sim.protocol.responses import new_id, now


@dataclass(frozen=True)
class ResponsesParams:
    model: str
    max_output_tokens: int | None
    stream: bool
    cache_salt: str | None
    previous_response_id: str | None
    store: bool  # keep the finished response for `previous_response_id` (OpenAI's default: true)
    echo: dict[str, Any]  # request fields the response object repeats


def responses_params(body: Mapping[str, Any], served: Sequence[str]) -> ResponsesParams:
    model = resolve_model(body, served)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest("'previous_response_id' must be a string", param="previous_response_id")
    limit = int_field(body, "max_output_tokens", minimum=1)
    stream = bool_field(body, "stream", False)
    store = bool_field(body, "store", True)
    salt = cache_salt_field(body)
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": limit,
        "previous_response_id": previous,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "metadata": body.get("metadata") or {},
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
    }
    return ResponsesParams(model, limit, stream, salt, previous, store, echo)


@dataclass(frozen=True)
class ResponsesPrompt:
    """What the chat template renders; stored with the answer appended."""

    conversation: Conversation

    @property
    def messages(self) -> list[ChatMessage]:
        return list(self.conversation)

    def answered(self, text: str) -> Conversation:
        return (*self.conversation, ChatMessage("assistant", text))


def prompt_messages(body: Mapping[str, Any], params: ResponsesParams, store: ResponseStore) -> ResponsesPrompt:
    """The request's prompt: 400 naming a bad field first (a malformed request is malformed on
    every engine), then 404 when `previous_response_id` is not in this engine's store."""
    # Converted apart because a continuation's instructions go before the stored history.
    system = _chat_messages({"instructions": body.get("instructions")})
    turn = _chat_messages({"input": body.get("input")})
    history: Conversation = ()
    if params.previous_response_id is not None:
        found = store.get(params.previous_response_id)
        if found is None:
            raise ResponseNotFound(params.previous_response_id, param="previous_response_id")
        history = found.conversation
    conversation = (*system, *history, *turn)
    if not conversation:
        raise InvalidRequest("'input' must not be empty", param="input")
    return ResponsesPrompt(conversation)


def _chat_messages(part: Mapping[str, Any]) -> list[ChatMessage]:
    try:
        messages = responses_messages(part)
    except ResponsesInputError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    return parse_messages(messages) if messages else []


def store_response(
    store: ResponseStore, params: ResponsesParams, prompt: ResponsesPrompt, response: Mapping[str, Any], text: str
) -> None:
    """Keep a finished response (completed or incomplete) under the id its client received:
    the conversation with the answer `text`, and the final `response` object as sent."""
    if params.store:
        store.put(response["id"], prompt.answered(text), response)


def stored_response(store: ResponseStore, response_id: str) -> StoredResponse:
    """The stored response a `/v1/responses/{id}` path names; 404 (`param` null) when unknown."""
    found = store.get(response_id)
    if found is None:
        raise ResponseNotFound(response_id)
    return found


def deleted_response(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def input_item(item_id: str, message: ChatMessage) -> dict[str, Any]:
    """A prompt message as a Responses message item: the answers of earlier turns (assistant)
    carry `output_text`, every other role `input_text`. The store keeps text only, so tool calls
    and array contents come back as the text the template rendered."""
    part: dict[str, Any] = {"type": "input_text", "text": message.content}
    if message.role == "assistant":
        part = {"type": "output_text", "text": message.content, "annotations": []}
    return {"type": "message", "id": item_id, "status": "completed", "role": message.role, "content": [part]}


def input_items(response_id: str, stored: StoredResponse) -> dict[str, Any]:
    """The list page of `GET /v1/responses/{id}/input_items`: the prompt's messages in order, in
    one page. The store keeps no item ids, so they are made from the response id and position:
    the same on every call."""
    base = response_id.removeprefix("resp_")
    data = [input_item(f"msg_{base}_{index}", m) for index, m in enumerate(stored.input_messages)]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": False}


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def output_message(mid: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}


def response_object(
    rid: str,
    params: ResponsesParams,
    created: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_body: dict[str, Any] | None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """`finish_reason` "length" marks the answer incomplete (`max_output_tokens`)."""
    if status == "completed" and finish_reason == "length":
        status = "incomplete"
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": params.model,
        "output": output,
        "usage": usage_body,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None,
        "text": {"format": {"type": "text"}},
        **params.echo,
    }


class ResponseEvents:
    """The typed events of one streamed response, numbered in order (`sequence_number`)."""

    def __init__(self, params: ResponsesParams) -> None:
        self.params = params
        self.rid = new_id("resp_")
        self.mid = new_id("msg_")
        self.created = now()
        self.seq = 0
        self.text: list[str] = []

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, event

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        pending = response_object(self.rid, self.params, self.created, status="in_progress", output=[], usage_body=None)
        item = output_message(self.mid, "", "in_progress")
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.created", response=pending),
            self._event("response.in_progress", response=pending),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", item_id=self.mid, output_index=0, content_index=0, part=part),
        ]

    @property
    def answer(self) -> str:
        """The text streamed so far: what the client assembled from the deltas."""
        return "".join(self.text)

    def delta(self, text: str) -> tuple[str, dict[str, Any]]:
        self.text.append(text)
        return self._event(
            "response.output_text.delta", item_id=self.mid, output_index=0, content_index=0, delta=text, logprobs=[]
        )

    def final_response(self, usage_body: dict[str, Any], finish_reason: str) -> dict[str, Any]:
        """The response object of the last event (`response.completed` or `.incomplete`)."""
        item = output_message(self.mid, self.answer, "completed")
        return response_object(
            self.rid, self.params, self.created, status="completed", output=[item], usage_body=usage_body,
            finish_reason=finish_reason,
        )  # fmt: skip

    def finish(self, final: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The closing events, ending with `final` (from `final_response`)."""
        text = self.answer
        item = final["output"][0]
        part = item["content"][0]
        where = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(f"response.{final['status']}", response=final),
        ]
