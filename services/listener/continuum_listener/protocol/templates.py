"""Split a detokenized, chat-templated prompt back into the text that anchors the prefix key.

The ingress keys a request by its system prompt (tag "S") or, without one, its first message
(tag "M"), truncated to `max_prefix_length` UTF-8 bytes (docs/hashing.md). A block chain covers
only the first N tokens of a prompt, so the decoded text may stop anywhere. The anchor is
*determined* by a chain as soon as either

* the anchor message is complete (its end marker is in the text), or
* at least `max_prefix_length` bytes of its content are present: the key only reads that many
  bytes, and a decoded prefix always ends on a character boundary once a trailing U+FFFD
  (a multi-byte character cut by the chain end) is dropped, so the truncation the ingress applies
  to the full text gives the same bytes.

Before that point the chain is *pending*: a deeper block may still determine it. Families:

* `chatml` / `sim`: `<|im_start|>{role}\\n{content}<|im_end|>\\n` (the sim engine uses exactly this);
* `llama3`: `<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>`; the Llama 3.1
  system preamble ("Cutting Knowledge Date: …\\nToday Date: …\\n\\n") is removed, and a system
  turn that is only the preamble counts as no system prompt;
* `mistral`: `[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT]` then `[INST] {content}[/INST]`;
* `gemma`: `<start_of_turn>{role}\\n{content}<end_of_turn>`; Gemma templates merge the system
  prompt into the first user turn as `{system}\\n\\n{user}`, which cannot be split back, so a first
  turn containing a blank line is *ambiguous* (use salt echo for such traffic).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from continuum_common.hashing import MESSAGE_TAG, SYSTEM_TAG

SYSTEM_ROLES = frozenset({"system", "developer"})
_REPLACEMENT = "\ufffd"


class AnchorStatus(Enum):
    DETERMINED = "determined"
    PENDING = "pending"  # more tokens needed
    NONE = "none"  # the request has no anchoring text (empty messages)
    UNPARSEABLE = "unparseable"  # the text does not follow the configured template
    AMBIGUOUS = "ambiguous"  # the template lost the system/user boundary (gemma)


@dataclass(frozen=True, slots=True)
class Anchor:
    status: AnchorStatus
    tag: bytes = b""
    text: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    complete: bool


PENDING = Anchor(AnchorStatus.PENDING)
UNPARSEABLE = Anchor(AnchorStatus.UNPARSEABLE)


class _Cursor:
    """A position in the decoded text with the few operations every template needs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    @property
    def rest(self) -> str:
        return self.text[self.pos :]

    def skip(self, *prefixes: str) -> None:
        for prefix in prefixes:
            if self.text.startswith(prefix, self.pos):
                self.pos += len(prefix)

    def expect(self, marker: str) -> bool | None:
        """True and advance when `marker` is next; None when the text ends inside it (needs
        more tokens); False when something else is next."""
        if self.text.startswith(marker, self.pos):
            self.pos += len(marker)
            return True
        return None if marker.startswith(self.rest) else False

    def until(self, marker: str) -> tuple[str, bool]:
        """Text up to `marker` (consumed) and whether the marker was found."""
        end = self.text.find(marker, self.pos)
        if end < 0:
            value, self.pos = self.rest, len(self.text)
            return value, False
        value, self.pos = self.text[self.pos : end], end + len(marker)
        return value, True


Parsed = tuple[list[Message], bool]  # (messages, the template matched so far)


def _chatml(text: str) -> Parsed:
    cur, out = _Cursor(text), list[Message]()
    cur.skip("<s>")
    while cur.rest:
        found = cur.expect("<|im_start|>")
        if not found:
            return out, found is None or bool(out)
        role, has_role = cur.until("\n")
        if not has_role:
            break
        content, done = cur.until("<|im_end|>")
        out.append(Message(role, content, done))
        if not done:
            break
        cur.skip("\n")
    return out, True


_LLAMA_PREAMBLE = re.compile(r"(?:Environment: ipython\n)?Cutting Knowledge Date: [^\n]*\nToday Date: [^\n]*\n\n")
_PREAMBLE_STARTS = ("Environment: ipython\n", "Cutting Knowledge Date: ")


def _strip_preamble(message: Message) -> Message:
    content = message.content
    if message.role != "system" or not content.startswith(_PREAMBLE_STARTS):
        if not message.complete and any(p.startswith(content) for p in _PREAMBLE_STARTS):
            return Message(message.role, "", False)  # may still become a preamble
        return message
    match = _LLAMA_PREAMBLE.match(content)
    if match:
        return Message(message.role, content[match.end() :], message.complete)
    return message if message.complete else Message(message.role, "", False)


def _llama3(text: str) -> Parsed:
    cur, out = _Cursor(text), list[Message]()
    cur.skip("<|begin_of_text|>")
    while cur.rest:
        found = cur.expect("<|start_header_id|>")
        if not found:
            return out, found is None or bool(out)
        role, has_role = cur.until("<|end_header_id|>")
        if not has_role or cur.expect("\n\n") is not True:
            break
        content, done = cur.until("<|eot_id|>")
        out.append(_strip_preamble(Message(role, content, done)))
        if not done:
            break
    return out, True


def _mistral(text: str) -> Parsed:
    cur, out = _Cursor(text), list[Message]()
    cur.skip("<s>")
    if not cur.rest:
        return out, True
    system = cur.expect("[SYSTEM_PROMPT]")
    if system is None:
        return out, True
    if system:
        content, done = cur.until("[/SYSTEM_PROMPT]")
        out.append(Message("system", content, done))
        if not done:
            return out, True
    if not cur.rest:
        return out, True
    inst = cur.expect("[INST]")
    if inst is None:
        return out, True
    if not inst:
        return out, bool(out)
    content, done = cur.until("[/INST]")
    out.append(Message("user", content.removeprefix(" "), done))
    return out, True


def _gemma(text: str) -> Parsed:
    cur, out = _Cursor(text), list[Message]()
    cur.skip("<bos>")
    while cur.rest:
        found = cur.expect("<start_of_turn>")
        if not found:
            return out, found is None or bool(out)
        role, has_role = cur.until("\n")
        if not has_role:
            break
        content, done = cur.until("<end_of_turn>")
        out.append(Message(role, content, done))
        if not done:
            break
        cur.skip("\n")
    return out, True


PARSERS: dict[str, Callable[[str], Parsed]] = {
    "chatml": _chatml,
    "sim": _chatml,
    "llama3": _llama3,
    "mistral": _mistral,
    "gemma": _gemma,
}


def _decide(message: Message, tag: bytes, max_prefix_length: int) -> Anchor | None:
    """The anchor this message gives, or None when it is complete and empty."""
    if message.complete:
        return Anchor(AnchorStatus.DETERMINED, tag, message.content) if message.content else None
    content = message.content.rstrip(_REPLACEMENT)
    if len(content.encode("utf-8")) >= max_prefix_length:
        return Anchor(AnchorStatus.DETERMINED, tag, content)
    return PENDING


def split_anchor(family: str, text: str, max_prefix_length: int) -> Anchor:
    """Which text of the templated prompt `text` keys the request (see the module docstring).

    Assumes the system prompt, when present, is the first message (every supported template
    requires it)."""
    messages, matched = PARSERS[family](text)
    if not matched:
        return UNPARSEABLE
    if not messages:
        return PENDING
    first = messages[0]
    if family == "gemma" and first.role not in SYSTEM_ROLES:
        if "\n\n" in first.content:
            return Anchor(AnchorStatus.AMBIGUOUS)
        if not first.complete:
            return PENDING
    if first.role in SYSTEM_ROLES:
        anchor = _decide(first, SYSTEM_TAG, max_prefix_length)
        if anchor is not None:
            return anchor
        # An empty system prompt: the ingress falls back to the first non-system message.
        for message in messages[1:]:
            if message.role not in SYSTEM_ROLES:
                return _decide(message, MESSAGE_TAG, max_prefix_length) or Anchor(AnchorStatus.NONE)
            if not message.complete:
                return PENDING
        return PENDING
    return _decide(first, MESSAGE_TAG, max_prefix_length) or Anchor(AnchorStatus.NONE)
