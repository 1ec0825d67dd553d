"""The simulator's tokenizer: deterministic, reversible for any UTF-8 text, ~4 characters/token.

How it works (also in docs/sim-engine.md):

1. Special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) are split out first and get
   fixed ids (Qwen2's: 151643, 151644, 151645), as a Hugging Face tokenizer does with
   `split_special_tokens=False`. The text between them is encoded segment by segment, so
   encoding a whole ChatML prompt equals encoding its pieces one by one (this is what lets the
   engine cache per-message token lists).
2. Each segment is pre-split with a GPT-2-style regex: contractions, an optional space + a run
   of letters, an optional space + a run of digits, an optional space + a run of other symbols,
   and whitespace runs. The pieces concatenate back to the segment exactly.
3. A piece found whole in the vocabulary is one token. Otherwise it is cut greedily, left to
   right, into the longest vocabulary entries of at most 3 characters (plus the leading space
   on the first chunk); a character with no entry (non-ASCII, control) falls back to one token
   per UTF-8 byte (ids 0-255).

The vocabulary is built by code from fixed lists, so ids never change between runs: bytes
0-255, whitespace and punctuation runs, every 1-3 digit number, every 1-3 letter lowercase string,
every 1-2 letter mixed-case string, and the word list in `words.py` (lower and capitalised),
each with and without a leading space. Decoding concatenates the token strings (bytes for the
byte tokens) and decodes UTF-8 with replacement, so any id sequence decodes; the round trip
`decode(encode(text)) == text` holds for every string.
"""

from __future__ import annotations

import re
import string
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import product

from continuum_sim.protocol.words import COMMON_WORDS

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: dict[str, int] = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
VOCAB_SIZE = 151936  # Qwen2's embedding size: ids below it are valid, unassigned ones decode to ""

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# Letters = word characters that are neither digits nor "_"; "other" = neither space nor word
# character, plus "_". The final catch-all keeps the pieces covering every character.
_PIECE_RE = re.compile(
    r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+|[\s\S]",
)
_MAX_CHUNK = 3
_CACHE_MIN_CHARS = 512


def _vocabulary_strings() -> list[str]:
    """Every non-byte, non-special vocabulary entry in id order (deduplicated, first wins)."""
    lower = string.ascii_lowercase
    letters = string.ascii_letters
    entries: list[str] = []
    entries += ["\n", "\n\n", "\n\n\n", "\t", "\t\t", "\r\n", " \n", "  \n"]
    entries += [" " * n for n in range(1, 17)]
    entries += [p for c in string.punctuation for p in (c, " " + c)]
    entries += [". ", "...", " ...", "?\n", ".\n", ":\n", "**", "```", " `", "--", " --", "->", "=>", "==", "!=", "()"]
    for width in (1, 2, 3):
        entries += ["".join(d) for d in product(string.digits, repeat=width)]
    for width in (1, 2, 3):
        entries += ["".join(c) for c in product(lower, repeat=width)]
    for width in (1, 2):
        entries += ["".join(c) for c in product(letters, repeat=width)]
    for word in COMMON_WORDS:
        entries += [word, word.capitalize(), word.upper()]
    with_space = [" " + e for e in entries if not e[:1].isspace() and e[:1] not in string.punctuation]
    seen: set[str] = set()
    ordered: list[str] = []
    for entry in entries + with_space:
        if entry not in seen:
            seen.add(entry)
            ordered.append(entry)
    return ordered


class Tokenizer:
    """Encode/decode with the fixed vocabulary. Stateless apart from a bounded segment cache."""

    def __init__(self, cache_size: int = 256) -> None:
        strings = _vocabulary_strings()
        first_id = 256
        if first_id + len(strings) > min(SPECIAL_TOKENS.values()):
            raise ValueError("vocabulary overlaps the special token ids")
        self._ids: dict[str, int] = {s: first_id + i for i, s in enumerate(strings)}
        self._bytes: list[bytes] = [bytes([b]) for b in range(256)] + [s.encode() for s in strings]
        self._special_by_id: dict[int, bytes] = {i: s.encode() for s, i in SPECIAL_TOKENS.items()}
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        self.vocab_size = VOCAB_SIZE

    # -- encoding -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special token strings become their special ids."""
        if "<|" not in text:
            return self.encode_ordinary(text)
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            special = SPECIAL_TOKENS.get(part)
            if special is not None:
                ids.append(special)
            elif part:
                ids += self.encode_ordinary(part)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text` treating special token strings as plain text."""
        if len(text) < _CACHE_MIN_CHARS:
            return self._encode_pieces(text)
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return list(cached)
        ids = self._encode_pieces(text)
        self._cache[text] = ids
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return list(ids)

    def clear_cache(self) -> None:
        """Forget the cached segments."""
        self._cache.clear()

    def _encode_pieces(self, text: str) -> list[int]:
        vocab = self._ids
        ids: list[int] = []
        append = ids.append
        for piece in _PIECE_RE.findall(text):
            token = vocab.get(piece)
            if token is not None:
                append(token)
            else:
                ids += self._encode_unknown(piece)
        return ids

    def _encode_unknown(self, piece: str) -> list[int]:
        vocab = self._ids
        out: list[int] = []
        i = 0
        # A leading space rides on the first chunk (" tok" + "eni" + "zat" + "ion").
        lead = 1 if piece[0] == " " and len(piece) > 1 else 0
        while i < len(piece):
            start = i + lead if i == 0 else i
            for width in range(_MAX_CHUNK, 0, -1):
                end = start + width
                if end > len(piece):
                    continue
                token = vocab.get(piece[i:end])
                if token is not None:
                    out.append(token)
                    i = end
                    break
            else:
                # No entry: the first character goes out as its UTF-8 bytes, then retry.
                char_end = i + 1
                out += piece[i:char_end].encode()
                i = char_end
        return out

    # -- decoding -------------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, special tokens included (like `skip_special_tokens=False`)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self._bytes
        size = len(table)
        specials = self._special_by_id
        parts: list[bytes] = []
        for token in ids:
            if 0 <= token < size:
                parts.append(table[token])
            else:
                special = specials.get(token)
                if special is not None:
                    parts.append(special)
                # Unassigned ids below VOCAB_SIZE decode to nothing, like reserved tokens.
        return b"".join(parts)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One string per id (byte tokens decode with replacement), for `return_token_strs`."""
        return [self.decode((token,)) for token in ids]

    def is_valid_id(self, token: int) -> bool:
        return 0 <= token < self.vocab_size

    def token_id(self, text: str) -> int | None:
        """The single id of `text` when it is one vocabulary entry (used by the generator)."""
        special = SPECIAL_TOKENS.get(text)
        return special if special is not None else self._ids.get(text)
