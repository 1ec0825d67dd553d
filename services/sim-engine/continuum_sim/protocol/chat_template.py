"""ChatML, the simulator's one chat template.

    <|im_start|>{role}\\n{content}<|im_end|>\\n      for every message, then
    <|im_start|>assistant\\n                          the generation prompt

`content` arrays contribute the text of their text parts joined with "\\n" (the rule of
`continuum_common.hashing.request_text.content_text`, which is what vLLM does before templating);
an Anthropic `system` (string or blocks) becomes a leading system message. There is no BOS token
and no default system prompt, so the templated text is exactly what `/detokenize` returns for the
prompt's token ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_common.hashing.request_text import content_text
from continuum_sim.errors import InvalidRequest
from continuum_sim.protocol.tokenizer import IM_END, IM_START

GENERATION_PROMPT = f"{IM_START}assistant\n"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def parse_messages(raw: Any, *, system: Any = None) -> list[ChatMessage]:
    """OpenAI or Anthropic `messages` (plus an Anthropic top-level `system`) → ChatMessages."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    messages: list[ChatMessage] = []
    if system is not None:
        if not isinstance(system, str | list):
            raise InvalidRequest("'system' must be a string or an array of text blocks", param="system")
        text = content_text(system)
        if text:
            messages.append(ChatMessage("system", text))
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"messages[{index}] must be an object", param="messages")
        role = item.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"messages[{index}].role must be a non-empty string", param="messages")
        content = item.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(f"messages[{index}].content must be a string or an array", param="messages")
        messages.append(ChatMessage(role, content_text(content)))
    return messages


def render_message(message: ChatMessage) -> str:
    return f"{IM_START}{message.role}\n{message.content}{IM_END}\n"


def render(
    messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The templated prompt text. `continue_final_message` leaves the last message open."""
    if add_generation_prompt and continue_final_message:
        raise InvalidRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    parts = [render_message(m) for m in messages]
    if continue_final_message and messages:
        last = messages[-1]
        parts[-1] = f"{IM_START}{last.role}\n{last.content}"
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)
