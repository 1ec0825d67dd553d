"""Which text of a request anchors it: the system prompt, else the first conversational message.

Pure functions over parsed JSON bodies; both OpenAI (`messages[].content` as a string or an
array of parts) and Anthropic (`system` as a string or a list of blocks) shapes are accepted.
The rules, also written in docs/hashing.md:

* system text: the top-level `system` field (Anthropic) when it holds text, else the first
  message whose role is `system` or `developer` (OpenAI);
* first-message text: the first message whose role is neither `system` nor `developer`;
* a content array contributes the `text` of its text parts (`type` "text" or "input_text"),
  joined with "\\n" — the same joining vLLM applies before templating — and ignores images,
  audio and tool blocks;
* `/v1/completions` bodies have no messages: the `prompt` string is the first-message text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PART_TYPES = frozenset({"text", "input_text"})


def content_text(content: Any) -> str:
    """Text of one `content` / `system` value; '' when it carries no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        texts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") in _TEXT_PART_TYPES:
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return "\n".join(texts)
    return ""


def _messages(body: Mapping[str, Any]) -> Sequence[Any]:
    messages = body.get("messages")
    if type(messages) is list:  # parsed JSON: skip the ABC check below (it shows per request)
        return messages
    if isinstance(messages, Sequence) and not isinstance(messages, str | bytes):
        return messages
    return ()


def system_text(body: Mapping[str, Any]) -> str:
    """The system prompt of a chat request, '' when there is none."""
    top = body.get("system")
    if top is not None:
        text = content_text(top)
        if text:
            return text
    for message in _messages(body):
        if (type(message) is dict or isinstance(message, Mapping)) and message.get("role") in _SYSTEM_ROLES:
            return content_text(message.get("content"))
    return ""


def first_message_text(body: Mapping[str, Any]) -> str:
    """The first non-system message's text, or a completions `prompt` string."""
    for message in _messages(body):
        if (type(message) is dict or isinstance(message, Mapping)) and message.get("role") not in _SYSTEM_ROLES:
            return content_text(message.get("content"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return ""


def truncate_utf8(data: bytes, limit: int) -> bytes:
    """First `limit` bytes of UTF-8 `data`, shortened so no character is cut in half."""
    if len(data) <= limit:
        return data
    end = limit
    # Back off over continuation bytes (0b10xxxxxx) to the start of the cut character.
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]
