"""Token ids an engine returns with its answer (vLLM's `return_token_ids`), taken out of what
the client receives (no I/O; used by kv/remote_tokens.py, docs/kv-scorer.md "Token ids from
the answer").

Why: without a local tokenizer, precise mode learns what a request's next turn (or a prompt
that repeats it) will be matched with from the engine's `/tokenize`, one off-path call per
request: the engine tokenizes every long prompt twice. vLLM can return the ids it already
computed (the prompt's, and the output's) with the answer itself. The ingress asks for them
(`AskForAnswerIds`, a body rewriter) and `AnswerIds` cuts them out of the answer on its way to
the client, so the client gets the answer it asked for and no call is made.

Shapes (vLLM 0.10.2 and later, the simulator alike): a chat answer carries `prompt_token_ids`
at the top level (a stream: in its first chunk) and `token_ids` in the choice (a stream: each
chunk's new ids); a completion carries both in the choice. The members are cut as bytes, not
by re-encoding the JSON: every chunk of every stream passes here. That is exact because
`"token_ids"` followed by a colon can only be a key (inside a JSON string its quotes would be
escaped), and an id list holds no brackets. A value that is neither a list nor null leaves the
line as it is, and the answer is not learnt from.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from continuum_ingress.hooks import ANSWER_FILTER
from continuum_ingress.kv.tokenize import token_ids
from continuum_ingress.protocol.apis import Api

if TYPE_CHECKING:
    from continuum_common.config import Backend
    from continuum_ingress.snapshot import RouterSnapshot
    from continuum_ingress.state import RequestState

ANSWER_IDS: Final = "answer_ids"  # state.extras: the request's AnswerIds (kv/remote_tokens.py)
ASKS: Final = frozenset({Api.CHAT, Api.COMPLETIONS})  # vLLM answers these with the ids

PROMPT_KEY: Final = b'"prompt_token_ids"'
OUTPUT_KEY: Final = b'"token_ids"'
_EITHER: Final = b'token_ids"'  # the end of both keys: one search finds either
# A stream line longer than this is passed on as it is, and the answer not learnt from (a
# prompt of MAX_TOKENS ids is ~30 MB of JSON; the engine's own limit comes far sooner).
MAX_LINE: Final = 64 << 20
_SPACE: Final = b" \t\r\n"
# `,"token_ids":[1,2]` as vLLM (pydantic) writes it; split() yields text, key, value, text...
_COMPACT_MAX: Final = 4096  # bytes: a stream's chunks of a few tokens, not the prompt's ids
_COMPACT: Final = re.compile(rb',"(prompt_token_ids|token_ids)":(\[[0-9,]*\]|null)')


def key_at(data: bytes, key: bytes, start: int = 0) -> int:
    """Where member `key` (a JSON key, quotes included) begins at or after `start`, or -1. The
    same bytes not followed by a colon are a string value, not a key."""
    at = data.find(key, start)
    while at >= 0:
        colon = _skip(data, at + len(key))
        if colon < len(data) and data[colon] == 0x3A:  # ':'
            return at
        at = data.find(key, at + len(key))
    return -1


def read_member(data: bytes, key: bytes, at: int) -> tuple[int, bytes | None] | None:
    """The member `key` that begins at `at`: (where its value ends, the value's bytes or None
    for null), or None when its value is neither an id list nor null."""
    begin = _skip(data, _skip(data, at + len(key)) + 1)
    if data.startswith(b"null", begin):
        return begin + 4, None
    if data.startswith(b"[", begin):
        close = data.find(b"]", begin)
        if close >= 0:
            return close + 1, data[begin : close + 1]
    return None


def remove_member(data: bytes, at: int, end: int) -> tuple[bytes, int]:
    """`data` without the member at [at, end) and one comma next to it, and where what
    followed it now begins."""
    head = data[:at].rstrip(_SPACE)
    tail = data[end:].lstrip(_SPACE)
    if head.endswith(b","):
        head = head[:-1]
    elif tail.startswith(b","):
        tail = tail[1:]
    return head + tail, len(head)


def _skip(data: bytes, i: int) -> int:
    while i < len(data) and data[i] in _SPACE:
        i += 1
    return i


def parse_ids(data: bytes) -> list[int] | None:
    """An id list's bytes as ints, or None when they are not a list of token ids."""
    try:
        ids = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return ids if token_ids(ids, data) else None


class AnswerIds:
    """One request's answer ids: a ResponseTranslator (protocol/dialects.py) the forwarder
    passes the answer through when the request's attempt asked for them (`asked`), which
    collects them and, with `strip`, removes them from what the client receives.

    The prompt's ids are kept as the bytes that came (parsed only when learnt from, off the
    client's path), the output's as one slice per chunk. More than one prompt list, or output
    lists of several choices, make `prompt()` / `answer()` None: not one conversation."""

    __slots__ = (
        "_outputs",
        "_pending",
        "_prompt",
        "_prompts",
        "asked",
        "broken",
        "complete",
        "output_tokens",
        "strip",
        "wants",
    )

    def __init__(self, wants: Callable[[str], bool]) -> None:
        self.wants = wants  # whether a backend (by name) is still asked for the ids
        self.asked = False  # the attempt that answered asked for the ids
        self.complete = False  # its answer went through here to its end
        self.output_tokens = 0  # set by answer()
        self.strip = True  # the client did not ask for them itself
        self.broken = False  # something could not be read: learn nothing from this answer
        self._prompt: bytes | None = None
        self._prompts = 0
        self._outputs: list[bytes] = []
        self._pending = b""  # a stream's unfinished line

    def begin(self, *, strip: bool) -> None:
        """A new attempt asks for the ids (a retry starts over)."""
        self.asked, self.strip, self.broken, self.complete = True, strip, False, False
        self._prompt, self._prompts, self._outputs, self._pending = None, 0, [], b""

    # -- ResponseTranslator ---------------------------------------------------------------
    def body(self, data: bytes) -> bytes:
        self.complete = True
        return self._cut_all(data)

    def chunk(self, data: bytes) -> bytes:
        # Line by line: a member cut from a line whose beginning already went out could leave
        # a dangling comma. A line arrives whole in one read but for long ones (the prompt's
        # ids), so holding an unfinished line rarely delays anything.
        if self._pending:
            data = self._pending + data
            self._pending = b""
        last = data.rfind(b"\n")
        if last < 0:
            return self._hold(data)
        tail = data[last + 1 :]
        if tail:
            data = data[: last + 1]
        if _EITHER in data:
            data = self._cut_all(data)
        return data + self._hold(tail) if tail else data

    def end(self) -> bytes:
        self.complete = True
        rest, self._pending = self._pending, b""
        return self._cut_all(rest) if rest else b""

    def _hold(self, data: bytes) -> bytes:
        if len(data) > MAX_LINE:
            # Passed on as it is, and so is the rest of the answer: cutting from a line whose
            # beginning went out could leave it malformed. Nothing is learnt from it.
            self.broken, self.strip = True, False
            return data
        self._pending = data
        return b""

    def _cut_all(self, data: bytes) -> bytes:
        if self.strip and len(data) <= _COMPACT_MAX:
            data = self._cut_compact(data)
            if _EITHER not in data:
                return data
        for key in (PROMPT_KEY, OUTPUT_KEY):
            start = 0
            while (at := key_at(data, key, start)) >= 0:
                member = read_member(data, key, at)
                if member is None:  # not an id list: left as it is, and nothing learnt
                    self.broken = True
                    break
                end, value = member
                self._keep(key, value)
                if self.strip:
                    data, start = remove_member(data, at, end)
                else:
                    start = end
        return data

    def _cut_compact(self, data: bytes) -> bytes:
        """The members as vLLM writes them (compact JSON, after another member), all cut in one
        C-level pass: about a third of the general path's time for a chunk of a few tokens.
        The regular expression tries every byte, though, where the general path's searches
        skip: longer data (the prompt's ids) goes the general path. What it leaves (a member
        written otherwise) the general path cuts."""
        parts = _COMPACT.split(data)
        if len(parts) == 1:
            return data
        for i in range(1, len(parts), 3):
            value = parts[i + 1]
            self._keep(
                PROMPT_KEY if parts[i] == b"prompt_token_ids" else OUTPUT_KEY, None if value == b"null" else value
            )
        return b"".join(parts[::3])

    def _keep(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return
        if key is PROMPT_KEY:
            self._prompts += 1
            self._prompt = value
        else:
            self._outputs.append(value)

    # -- what was collected ---------------------------------------------------------------
    def missing(self) -> bool:
        """Asked, answered to the end, and no prompt ids came: the backend does not return them."""
        return self.asked and self.complete and not self.broken and self._prompts == 0

    def prompt(self) -> list[int] | None:
        """The prompt's ids as the engine tokenized it, or None."""
        if self.broken or self._prompts != 1 or self._prompt is None:
            return None
        return parse_ids(self._prompt)

    def answer(self) -> list[int] | None:
        """The prompt's ids followed by the output's (what the engine holds once it answered),
        or None. `output_tokens` is then how many of them are the output's."""
        prompt = self.prompt()
        if prompt is None:
            return None
        parts = [part[1:-1].strip() for part in self._outputs]
        output = parse_ids(b"[" + b",".join(p for p in parts if p) + b"]")
        if output is None:
            return None
        self.output_tokens = len(output)
        return prompt + output


class AskForAnswerIds:
    """The body rewriter (hooks.BodyRewriter) that asks a vLLM backend for the token ids of a
    request that carries an `AnswerIds` (put there by kv/remote_tokens.py), and hands it to the
    forwarder as the attempt's answer filter. An attempt on another kind of backend, or on one
    no longer asked, goes unchanged and without the filter."""

    async def rewrite(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        ids = state.extras.get(ANSWER_IDS)
        if not isinstance(ids, AnswerIds):
            return None
        if backend.type != "vllm" or state.api not in ASKS or not ids.wants(backend.name):
            ids.asked = False
            state.extras.pop(ANSWER_FILTER, None)
            return None
        state.extras[ANSWER_FILTER] = ids
        if body.get("return_token_ids") is True:  # the client wants them too: read, not cut
            ids.begin(strip=False)
            return None
        ids.begin(strip=True)
        return {**body, "return_token_ids": True}
