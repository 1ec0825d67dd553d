"""Cutting a prompt text into pieces that tokenize independently (pure string work).

1. Added tokens (`<|im_start|>`, `<s>`, ...) are cut out first, leftmost-longest, exactly where
   Hugging Face's tokenizer cuts them. Each becomes a piece of its own.
2. The text between them (a "span": in a chat prompt, one message) is cut at **safe cuts**: a
   single space (U+0020) that follows a non-whitespace character and precedes a letter. At such
   a space every supported pre-tokenizer starts a new pre-token (the byte-level regexes start one
   at " word"; none lets a pre-token run from a non-space character into the following space;
   Metaspace splits before "▁"), and Unicode normalization never composes across a space, so the
   two sides tokenize to exactly the ids of the whole (support.py checks the tokenizer).
3. Pieces are about `piece_chars` long and content-defined: from the previous cut, the next one
   is the first sentence end (".!?;:" then " " + letter) in [n/2, 2n) characters, else the first
   safe cut in [n, 2n), else the first safe cut after that. A cut is decided only from text
   already present (the window must be complete), so appending to a text never moves earlier
   cuts: a conversation's next turn repeats the previous turn's pieces and adds new ones.

A piece is `(context, text)`: `context` is `START` (the text's first span), `CUT` (after a safe
cut), `SPECIAL` (the text *is* an added token) or the added token right before the span —
tokenizers treat a span differently at the start of the input than after an added token
(prefix-space rules), so a piece's ids depend on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

Context = int | str
Piece = tuple[Context, str]

SPECIAL: Final = -1
START: Final = -2
CUT: Final = -3

# Zero-width: the position right before a safe cut's space.
SAFE_CUT: Final = re.compile(r"(?<=\S)(?= [^\W\d_])")
_SENTENCE_CUT: Final = re.compile(r"(?<=[.!?;:])(?= [^\W\d_])")


class TextSplitter:
    """Pieces of a text for one tokenizer's added tokens."""

    __slots__ = ("_half", "_n", "_special")

    def __init__(self, added_tokens: Iterable[str], piece_chars: int = 1024) -> None:
        if piece_chars < 16:
            raise ValueError("piece_chars must be >= 16")
        tokens = sorted({t for t in added_tokens if t}, key=lambda t: (-len(t), t))
        # Longest first: at one position the longest added token wins (leftmost-longest).
        self._special = re.compile("(" + "|".join(map(re.escape, tokens)) + ")") if tokens else None
        self._n = piece_chars
        self._half = piece_chars // 2

    def pieces(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        parts = self._special.split(text) if self._special is not None else [text]
        context: Context = START
        for index, part in enumerate(parts):
            if index % 2:  # split() puts the captured added tokens at odd positions
                out.append((SPECIAL, part))
                context = part
            elif part:
                self._cut(part, context, out)
        return out

    def _cut(self, span: str, context: Context, out: list[Piece]) -> None:
        n, half, end = self._n, self._half, len(span)
        pos = 0
        while True:
            window_end = pos + 2 * n
            if window_end > end:
                break  # the window is not complete yet: deciding now could move the cut later
            match = _SENTENCE_CUT.search(span, pos + half, window_end) or SAFE_CUT.search(span, pos + n, window_end)
            if match is None:
                match = SAFE_CUT.search(span, window_end)
                if match is None:
                    break
            cut = match.start()
            out.append((context, span[pos:cut]))
            context = CUT
            pos = cut
        out.append((context, span[pos:]))


def chunks(piece_text: str) -> list[str]:
    """A piece cut at every safe cut (roughly one word each, its leading space included)."""
    return SAFE_CUT.split(piece_text)
