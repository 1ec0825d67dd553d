"""How an engine turns requests into token ids and ids back into text: its "codec".

* `BuiltinCodec` — the simulator's own tokenizer and ChatML template (the default).
* `HfCodec` — a Hugging Face tokenizer.json through continuum_common's `LocalTokenizer`
  (`--tokenizer`), with its Jinja2 chat template (`--chat-template`, or a tokenizer_config.json
  beside tokenizer.json, else the built-in ChatML text). Chat prompts are tokenized with
  `add_special_tokens=False` and completion prompts with True, as vLLM does.

`HfCodec` tokenizes the text between added tokens span by span (a chat prompt: message by
message) and keeps each span's ids in a bounded LRU, so a conversation's next turn tokenizes
only its new messages — exact, because Hugging Face cuts added tokens out of the text before
anything else (checked at load; otherwise every prompt is tokenized whole).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Protocol

from continuum_common.tokenization import LocalTokenizer, TokenizationError, UnlockedTokenizer
from continuum_common.tokenization.cache import ByteLRU
from continuum_common.tokenization.pieces import SPECIAL, START, TextSplitter
from continuum_common.tokenization.support import added_tokens_problem, special_affixes
from continuum_sim.errors import InvalidRequest
from continuum_sim.protocol import chat_template
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import Tokenizer

_NEVER_CUT = 1 << 62  # piece size for TextSplitter: spans are never cut inside


class _SpanMismatch(Exception):
    """The tokenizer did not split an added token out as assumed: tokenize the whole text."""


class PromptCodec(Protocol):
    vocab_size: int
    generator: TextGenerator
    # True when `encode` is safe to call from a worker thread and releases the interpreter lock
    # for long texts: the HTTP API then tokenizes prompts off its event loop, as vLLM does
    # (adapters/prompt_tokens.py).
    off_loop: bool

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_strings(self, ids: Sequence[int]) -> list[str]: ...

    def is_valid_id(self, token: int) -> bool: ...

    def clear_caches(self) -> None:
        """Forget every cached tokenization, as a freshly started engine has none."""
        ...


class BuiltinCodec:
    """The built-in tokenizer: it has no BOS/EOS to add, so `add_special_tokens` changes nothing.
    Pure Python: it keeps the interpreter lock, so a worker thread would gain nothing."""

    off_loop = False

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.generator = TextGenerator(tokenizer)

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        return chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.token_strings(ids)

    def is_valid_id(self, token: int) -> bool:
        return self.tokenizer.is_valid_id(token)

    def clear_caches(self) -> None:
        self.tokenizer.clear_cache()


class HfCodec:
    """`off_loop` when its tokenizer releases the interpreter lock on long texts
    (`UnlockedTokenizer`). `encode` may run on several threads at once (engines in one process
    share a codec, each with its own tokenizing thread): the span cache is behind a lock."""

    def __init__(self, tokenizer: LocalTokenizer, *, span_cache_bytes: int = 64 << 20) -> None:
        self.tokenizer = tokenizer
        self.off_loop = isinstance(tokenizer, UnlockedTokenizer)
        self._lock = threading.Lock()
        self.vocab_size = tokenizer.vocab_size
        self.generator = TextGenerator.from_encoder(lambda text: tokenizer.encode(text, add_special_tokens=False))
        self._spans: ByteLRU[tuple[object, str], list[int]] = ByteLRU(span_cache_bytes)
        self._splitter = TextSplitter(tokenizer.added_tokens, _NEVER_CUT)
        self._span_wise = not added_tokens_problem(tokenizer)
        self._affixes = special_affixes(tokenizer) if self._span_wise else None

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        if not self.tokenizer.has_chat_template:
            return chat_template.render(
                messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
            )
        try:
            return self.tokenizer.render_chat(
                [{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except TokenizationError as exc:
            raise InvalidRequest(str(exc), param="messages") from None

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        try:
            if not self._span_wise or (add_special_tokens and self._affixes is None):
                return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
            try:
                ids = self._encode_spans(text)
            except _SpanMismatch:
                return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
            if add_special_tokens and self._affixes is not None:
                prefix, suffix = self._affixes
                ids = [*prefix, *ids, *suffix]
            return ids
        except TokenizationError as exc:
            raise InvalidRequest(str(exc), param="prompt") from None

    def _encode_spans(self, text: str) -> list[int]:
        added = self.tokenizer.added_tokens
        ids: list[int] = []
        for context, span in self._splitter.pieces(text):
            if context == SPECIAL:
                ids.append(added[span])
                continue
            key = (context, span)
            with self._lock:
                cached = self._spans.get(key)
            if cached is None:
                cached = self._encode_span(context, span)
                with self._lock:
                    self._spans.put(key, cached, sys.getsizeof(span) + 8 * len(cached) + 100)
            ids += cached
        return ids

    def _encode_span(self, context: object, span: str) -> list[int]:
        if context == START:
            return self.tokenizer.encode(span, add_special_tokens=False)
        assert isinstance(context, str)
        # The span as the tokenizer sees it inside the text: right after its added token.
        ids = self.tokenizer.encode(context + span, add_special_tokens=False)
        if not ids or ids[0] != self.tokenizer.added_tokens[context]:
            raise _SpanMismatch
        return ids[1:]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.id_to_token(token) or "" for token in ids]

    def is_valid_id(self, token: int) -> bool:
        return 0 <= token < self.vocab_size

    def clear_caches(self) -> None:
        with self._lock:
            self._spans.clear()
