"""OpenAI Responses API (`POST /v1/responses`) as vLLM serves it without a response store:
the request's prompt (continuum_common.hashing.responses_input: `instructions` and `input` as
chat messages), the response object and the typed stream events (provider-apis.md §3.4).

vLLM keeps earlier responses only when its store is enabled (off by default); the simulator
never stores, so `previous_response_id` is refused and a client sends the whole conversation in
`input`, as it must against such a vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_common.hashing.responses_input import ResponsesInputError, responses_messages
from continuum_sim.errors import InvalidRequest
from continuum_sim.protocol.chat_template import ChatMessage, parse_messages
from continuum_sim.protocol.requests import bool_field, cache_salt_field, int_field, resolve_model
from continuum_sim.protocol.responses import new_id, now


@dataclass(frozen=True)
class ResponsesParams:
    model: str
    max_output_tokens: int | None
    stream: bool
    cache_salt: str | None
    echo: dict[str, Any]  # request fields the response object repeats


def responses_params(body: Mapping[str, Any], served: Sequence[str]) -> ResponsesParams:
    model = resolve_model(body, served)
    if body.get("previous_response_id") is not None:
        raise InvalidRequest(
            "This engine does not store responses: send the whole conversation in 'input' "
            "instead of 'previous_response_id'.",
            param="previous_response_id",
        )
    limit = int_field(body, "max_output_tokens", minimum=1)
    stream = bool_field(body, "stream", False)
    salt = cache_salt_field(body)
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": limit,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "metadata": body.get("metadata") or {},
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
    }
    return ResponsesParams(model, limit, stream, salt, echo)


def prompt_messages(body: Mapping[str, Any]) -> list[ChatMessage]:
    """The messages the chat template renders (400 naming the bad field)."""
    try:
        messages = responses_messages(body)
    except ResponsesInputError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    if not messages:
        raise InvalidRequest("'input' must not be empty", param="input")
    return parse_messages(messages)


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

    def delta(self, text: str) -> tuple[str, dict[str, Any]]:
        self.text.append(text)
        return self._event(
            "response.output_text.delta", item_id=self.mid, output_index=0, content_index=0, delta=text, logprobs=[]
        )

    def finish(self, usage_body: dict[str, Any], finish_reason: str) -> list[tuple[str, dict[str, Any]]]:
        text = "".join(self.text)
        item = output_message(self.mid, text, "completed")
        part = item["content"][0]
        final = response_object(
            self.rid, self.params, self.created, status="completed", output=[item], usage_body=usage_body,
            finish_reason=finish_reason,
        )  # fmt: skip
        where = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(f"response.{final['status']}", response=final),
        ]
