"""OpenAI Responses API (`/v1/responses`) <-> Gemini `generateContent` (pure).

Google's OpenAI-compatible API has no Responses endpoint, so `/v1/responses` requests to
`type: gemini` backends always go to the native API:

* request: Responses -> an equivalent chat completion request (`instructions` and
  system/developer items -> system messages, input items -> messages, `function_call` /
  `function_call_output` items -> assistant tool calls / tool messages, flat function tools ->
  chat tools, `text.format` -> `response_format`, `reasoning.effort` -> `reasoning_effort`,
  `max_output_tokens` -> `max_completion_tokens`), then protocol.request's chat conversion;
* answer: a `response` object (`output` message and `function_call` items, `status`
  `completed` or `incomplete`), usage with `input_tokens_details.cached_tokens` =
  `cachedContentTokenCount`;
* stream: the Responses event sequence (`response.created` ... `response.output_text.delta` ...
  `response.completed` with the full response and its usage), each as `event: <type>` + `data:`.

The router keeps no response state, so `previous_response_id` / `conversation` are refused
(400), as are non-function tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from continuum_common.sse import SseEvent
from continuum_ingress.gemini.errors import ConversionError
from continuum_ingress.gemini.protocol.chat_completion import google_error_fields, responses_usage, split_parts
from continuum_ingress.gemini.protocol.sse import SseConverter

_CHAT_ROLES = frozenset({"user", "assistant", "system", "developer"})
_INCOMPLETE = {
    "MAX_TOKENS": "max_output_tokens",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p", "metadata")


# --------------------------------------------------------------------------- request


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise ConversionError(f"'{name}' is not supported for Gemini backends (no stored responses).", param=name)
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _input_item(item, f"input[{i}]", messages)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for src, dst in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_output_tokens", "max_completion_tokens"),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(body.get("tools") or [])]
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping):
        if fmt.get("type") == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
        elif fmt.get("type") == "json_object":
            chat["response_format"] = {"type": "json_object"}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    for key in ("extra_body", "google"):
        if key in body:
            chat[key] = body[key]
    return chat


def _input_item(item: Any, where: str, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, Mapping):
        raise ConversionError("Input items must be objects.", param=where)
    kind = item.get("type", "message")
    if kind == "message" and item.get("role") in _CHAT_ROLES:
        messages.append({"role": item["role"], "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _content(output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
    elif kind != "reasoning":
        raise ConversionError(f"Input items of type {kind!r} are not supported for Gemini backends.", param=where)


def _content(content: Any, where: str) -> Any:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise ConversionError("content must be a string or an array of parts.", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        at = f"{where}.content[{j}]"
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "input_file" and isinstance(part.get("file_data"), str):
            parts.append({"type": "file", "file": {"file_data": part["file_data"]}})
        elif kind == "input_audio":
            parts.append({"type": "input_audio", "input_audio": part.get("input_audio")})
        elif kind != "refusal":
            raise ConversionError(f"Content parts of type {kind!r} are not supported for Gemini backends.", param=at)
    return parts


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise ConversionError("Only function tools are supported by the Gemini API.", param=where)
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        tools = [{"type": "function", "function": {"name": t.get("name")}} for t in choice.get("tools") or []]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": tools}}
    raise ConversionError("Unsupported tool_choice.", param="tool_choice")


# --------------------------------------------------------------------------- answer


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(part: Mapping[str, Any], item_id: str, call_id: str) -> dict[str, Any]:
    fn = part["functionCall"]
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": fn["id"] if isinstance(fn.get("id"), str) and fn["id"] else call_id,
        "name": str(fn.get("name", "")),
        "arguments": orjson.dumps(fn.get("args") or {}).decode(),
        "status": "completed",
    }


def envelope(
    request: Mapping[str, Any],
    response_id: str,
    created: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: Mapping[str, Any] | None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    """The `response` object (also the payload of response.created / completed events)."""
    out: dict[str, Any] = {
        "id": f"resp_{response_id}",
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": request.get("model"),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": responses_usage(usage) if usage is not None else None,
    }
    for key in _ECHOED:
        out[key] = request.get(key)
    return out


def _finish(candidate: Mapping[str, Any] | None, blocked: bool) -> tuple[str, str | None]:
    if blocked:
        return "incomplete", "content_filter"
    finish = candidate.get("finishReason") if candidate is not None else None
    reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    return ("incomplete", reason) if reason else ("completed", None)


def to_response(
    response: Mapping[str, Any], *, request: Mapping[str, Any], created: int, fallback_id: str
) -> dict[str, Any]:
    rid = response.get("responseId")
    rid = rid if isinstance(rid, str) and rid else fallback_id
    candidates = response.get("candidates")
    first = (
        candidates[0] if isinstance(candidates, list) and candidates and isinstance(candidates[0], Mapping) else None
    )
    content = first.get("content") if first is not None else None
    text, calls = split_parts(content.get("parts") if isinstance(content, Mapping) else None)
    output = [message_item(f"msg_{rid}", text)] if text else []
    output += [function_call_item(p, f"fc_{rid}_{n}", f"call_{rid}_{n}") for n, p in enumerate(calls)]
    status, incomplete = _finish(first, first is None)
    meta = response.get("usageMetadata")
    usage = meta if isinstance(meta, Mapping) else {}
    return envelope(request, rid, created, status=status, output=output, usage=usage, incomplete=incomplete)


# --------------------------------------------------------------------------- stream


class ResponsesStreamConverter(SseConverter):
    """streamGenerateContent SSE -> Responses stream events (first candidate only: the
    Responses API has no `n`). `usage` is the last usage snapshot (for accounting)."""

    def __init__(self, *, request: Mapping[str, Any], created: int, fallback_id: str) -> None:
        super().__init__()
        self.request = request
        self.created = created
        self.rid = fallback_id
        self.usage: Mapping[str, Any] | None = None
        self._seq = 0
        self._started = False
        self._output: list[dict[str, Any]] = []
        self._text: str | None = None  # the open message item's text so far
        self._reason: Mapping[str, Any] | None = None
        self._blocked = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _envelope(self, status: str, incomplete: str | None = None) -> dict[str, Any]:
        usage = self.usage if status != "in_progress" else None
        return envelope(
            self.request, self.rid, self.created, status=status, output=list(self._output), usage=usage,
            incomplete=incomplete,
        )  # fmt: skip

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = self._envelope("in_progress")
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _fail(self, code: int | None, status: str, message: str) -> bytes:
        self.failed = True
        error = {"message": message, "type": "api_error", "code": status.lower() or None}
        return self._event("error", code=error["code"], message=message, param=None, error=error)

    def finish(self) -> bytes:
        if self.failed:
            return b""
        out = self._convert_rest()
        if self.failed:
            return out
        out = self._start() + out + self._close_text()
        status, incomplete = _finish(self._reason, self._blocked)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=self._envelope(status, incomplete))

    def _convert(self, event: SseEvent) -> bytes:
        data = event.data
        if data is None:
            return b""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._fail(None, "UNAVAILABLE", "The Gemini stream sent an unreadable event.")
        code, status, message = google_error_fields(obj)
        if not isinstance(obj, dict) or code is not None or status or "error" in obj:
            return self._fail(code, status, message or "The Gemini stream reported an error.")
        if not self._started and isinstance(obj.get("responseId"), str) and obj["responseId"]:
            self.rid = obj["responseId"]
        out = self._start()
        if isinstance(obj.get("usageMetadata"), Mapping):
            self.usage = obj["usageMetadata"]
        candidates = obj.get("candidates")
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], Mapping):
            feedback = obj.get("promptFeedback")
            self._blocked = self._blocked or (isinstance(feedback, Mapping) and bool(feedback.get("blockReason")))
            return out
        first = candidates[0]
        content = first.get("content")
        text, calls = split_parts(content.get("parts") if isinstance(content, Mapping) else None)
        if text:
            out += self._text_delta(text)
        for part in calls:
            out += self._close_text() + self._call(part)
        if first.get("finishReason"):
            self._reason = first
        return out

    def _text_delta(self, delta: str) -> bytes:
        out = b""
        index = len(self._output)
        item_id = f"msg_{self.rid}_{index}"
        if self._text is None:
            self._text = ""
            out += self._event(
                "response.output_item.added", output_index=index, item=message_item(item_id, "", "in_progress")
            )
            out += self._event(
                "response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )  # fmt: skip
        self._text += delta
        return out + self._event(
            "response.output_text.delta", item_id=item_id, output_index=index, content_index=0, delta=delta, logprobs=[]
        )

    def _close_text(self) -> bytes:
        if self._text is None:
            return b""
        index = len(self._output)
        item_id = f"msg_{self.rid}_{index}"
        text, self._text = self._text, None
        item = message_item(item_id, text)
        self._output.append(item)
        part = item["content"][0]
        return (
            self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            + self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    def _call(self, part: Mapping[str, Any]) -> bytes:
        index = len(self._output)
        item = function_call_item(part, f"fc_{self.rid}_{index}", f"call_{self.rid}_{index}")
        self._output.append(item)
        added = {**item, "arguments": "", "status": "in_progress"}
        args = item["arguments"]
        return (
            self._event("response.output_item.added", output_index=index, item=added)
            + self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=args)
            + self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=args,
                name=item["name"],
            )
            + self._event("response.output_item.done", output_index=index, item=item)
        )
