"""An OpenAI Responses request (`POST /v1/responses`) as the chat messages an engine templates.

vLLM serves the Responses API by turning `instructions` and `input` into chat messages and
applying the model's chat template, exactly as for a chat completion with those messages. The
simulated engine does the same with this module, and the ingress uses it to compute the
request's routing keys (prefix key, block hashes), so both sides see one prompt:

* `instructions` (a non-empty string) becomes the first message, role `system`;
* `input` as a string is one `user` message;
* `input` as an array of items: a message item (`type` "message" or no `type`, with `role` and
  `content`) keeps its role, its content as a string or the `text` of its text parts
  (`input_text`, `output_text`, `text`) joined with "\\n"; a `function_call` item becomes an
  assistant message carrying that tool call; a `function_call_output` item a `tool` message;
  items of other types (reasoning, references to stored items, built-in tool calls) carry no
  text the template renders and are left out;
* function tools (`{"type": "function", "name", "parameters", ...}`) become chat tools
  (`{"type": "function", "function": {...}}`); built-in tools are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_ROLES = frozenset({"user", "assistant", "system", "developer"})


class ResponsesInputError(ValueError):
    """The request's `input` or `instructions` is malformed; `param` names where."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses request body (raises ResponsesInputError)."""
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ResponsesInputError("'instructions' must be a string.", "instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    value = body.get("input")
    if value is None:
        return out
    if isinstance(value, str):
        out.append({"role": "user", "content": value})
        return out
    if not isinstance(value, list):
        raise ResponsesInputError("'input' must be a string or an array of input items.", "input")
    for index, item in enumerate(value):
        message = _item_message(item, f"input[{index}]")
        if message is not None:
            out.append(message)
    return out


def _item_message(item: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(item, Mapping):
        raise ResponsesInputError(f"'{where}' must be an object.", where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if type(role) is not str or role not in _ROLES:
            raise ResponsesInputError(f"'{where}.role' must be one of {sorted(_ROLES)}.", f"{where}.role")
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments", "")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ResponsesInputError(f"'{where}' needs a string 'name' and 'arguments'.", where)
        call = {
            "id": str(item.get("call_id", "")),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _content(output, f"{where}.output")
        return {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text}
    if not isinstance(kind, str):
        raise ResponsesInputError(f"'{where}.type' must be a string.", f"{where}.type")
    return None


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesInputError(f"'{where}' must be a string or an array of content parts.", where)
    texts: list[str] = []
    for index, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ResponsesInputError(f"'{where}[{index}]' must be an object.", f"{where}[{index}]")
        if part.get("type") in _TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise ResponsesInputError(f"'{where}[{index}].text' must be a string.", f"{where}[{index}].text")
            texts.append(text)
    return "\n".join(texts)


def responses_tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's function tools in chat form (built-in tools are not templated)."""
    tools = body.get("tools")
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        return []
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(tool.get("name"), str):
            function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": function})
    return out


def responses_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions-shaped body with the same prompt: model, messages, tools, salt."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": responses_messages(body)}
    tools = responses_tools(body)
    if tools:
        chat["tools"] = tools
    salt = body.get("cache_salt")
    if salt is not None:
        chat["cache_salt"] = salt
    return chat
