"""Can this tokenizer be run piece by piece? Checked once, when a PromptEncoder is built.

Piecewise encoding (continuum_common.tokenization.pieces) relies on three properties:

1. Added tokens are cut out of the raw text first (Hugging Face's AddedVocabulary does this for
   tokens with `normalized: false`), and none strips neighbouring whitespace (`lstrip`,
   `rstrip`) or needs word boundaries (`single_word`).
2. Inside the text between them, the tokenizer's pipeline never lets one token span a "safe cut"
   — a single space that follows a non-whitespace character and precedes a letter: the
   normalizer is character-local or Unicode normalization (NFC/NFD/NFKC/NFKD, lowercase,
   accent stripping), the pre-tokenizer always starts a new pre-token at such a space (the
   byte-level GPT-2/Llama-3/Qwen2 regexes, SentencePiece-style Metaspace with splitting, the
   whitespace and punctuation splitters), and the model (BPE, Unigram, WordPiece, WordLevel)
   works inside pre-tokens.
3. `add_special_tokens=True` only puts fixed ids before and/or after the text's ids.

The components are read from tokenizer.json; then a fixed probe corpus (prose, code, numbers,
non-Latin scripts, whitespace runs, the added tokens themselves) is encoded whole and piece by
piece, and any difference disables piecewise encoding. Unrecognised components disable it too:
the encoder then tokenizes whole texts (still cached by text) and says why in `reason`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_common.tokenization.errors import TokenizationError
from continuum_common.tokenization.local import LocalTokenizer

_CHAR_LOCAL_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"})
_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Metaspace", "Split", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits", "BertPreTokenizer",
     "UnicodeScripts"}
)  # fmt: skip
_MODELS = frozenset({"BPE", "Unigram", "WordPiece", "WordLevel"})
_PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog. It's 12:45, isn't it? Yes -- 3.14159 and 1,000,000!",
    "def encode(self, text: str) -> list[int]:\n    return [ord(c) for c in text]  # comment\n\n\tx = {'a': 1}",
    "  leading spaces, trailing spaces   \n\n\nthree newlines\r\nwindows line end\u00a0nbsp  double  spaces",
    "Ünïcödé wörds: café naïve façade; Ελληνικά κείμενα; русский текст; 中文字符 和 日本語 テキスト; 한국어 문장",
    "Combining: e\u0301 a\u0308 n\u0303 and precomposed \u00e9 \u00e4; emoji 😀 👍🏽 🇫🇷; math ∑ x² ≤ ½",
    "URLs https://example.com/a_b?c=d&e=f and emails a.b@c.io; paths /usr/lib/x86_64; tags <b>bold</b> @user #tag",
    "MiXeD CaSe WORDS and ALLCAPS, O'Neil's, don't, we'll, they've, I'm, you'd; snake_case camelCase kebab-case",
    "Numbers 0 7 42 123 4567 89012 345678 and 3rd 2nd 1st; versions v1.2.3-rc4; hex 0xdeadBEEF; 2024-01-31T12:00Z",
)


@dataclass(frozen=True)
class PiecewiseSupport:
    ok: bool
    reason: str  # why not (empty when ok)
    prefix_ids: tuple[int, ...] = ()  # what add_special_tokens=True puts before the text's ids
    suffix_ids: tuple[int, ...] = ()  # ... and after them


def check_piecewise(tokenizer: LocalTokenizer, encode_pieces: Callable[[str], list[int]]) -> PiecewiseSupport:
    """Static component check, special-token affixes, then the probe corpus through
    `encode_pieces` (the piecewise encoder under test: text → ids, no special tokens added)."""
    try:
        reason = _component_problem(tokenizer.config(), tokenizer.backend.encode_special_tokens)
        if reason:
            return PiecewiseSupport(False, reason)
        affixes = special_affixes(tokenizer)
        if affixes is None:
            return PiecewiseSupport(False, "add_special_tokens=True does more than add fixed ids around the text")
        reason = _probe_problem(tokenizer, encode_pieces)
    except TokenizationError as exc:
        return PiecewiseSupport(False, f"the self-check failed: {exc}")
    if reason:
        return PiecewiseSupport(False, reason)
    return PiecewiseSupport(True, "", *affixes)


def added_tokens_problem(tokenizer: LocalTokenizer) -> str:
    """Why the text between added tokens cannot be tokenized span by span ("" when it can):
    property 1 of the module docstring."""
    return _added_tokens_problem(tokenizer.config(), tokenizer.backend.encode_special_tokens)


def _added_tokens_problem(config: Mapping[str, Any], encode_special_tokens: bool) -> str:
    if encode_special_tokens:
        return "encode_special_tokens is set (added tokens are not split out of the text)"
    has_normalizer = config.get("normalizer") is not None
    for token in config.get("added_tokens") or ():
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            return "an added token strips whitespace or needs word boundaries (lstrip/rstrip/single_word)"
        if token.get("normalized") and has_normalizer:
            return "an added token is matched after normalization (normalized: true with a normalizer)"
    return ""


def _component_problem(config: Mapping[str, Any], encode_special_tokens: bool) -> str:
    problem = _added_tokens_problem(config, encode_special_tokens)
    if problem:
        return problem
    problem = _normalizer_problem(config.get("normalizer"))
    if problem:
        return problem
    pre = config.get("pre_tokenizer")
    if pre is None:
        return "no pre-tokenizer: the model sees whole texts, so tokens may span any cut"
    problem = _pre_tokenizer_problem(pre)
    if problem:
        return problem
    model = (config.get("model") or {}).get("type")
    if model not in _MODELS:
        return f"model {model!r} is not one this encoder knows to work inside pre-tokens"
    return ""


def _normalizer_problem(node: Mapping[str, Any] | None) -> str:
    if node is None:
        return ""
    kind = node.get("type")
    if kind == "Sequence":
        for child in node.get("normalizers") or ():
            problem = _normalizer_problem(child)
            if problem:
                return problem
        return ""
    if kind in _CHAR_LOCAL_NORMALIZERS:
        return ""
    if kind == "Replace":
        pattern = node.get("pattern") or {}
        text = pattern.get("String")
        if isinstance(text, str) and len(text) == 1:
            return ""  # one character for another string: character-local
    return f"normalizer {kind!r} may act across a cut"


def _pre_tokenizer_problem(node: Mapping[str, Any]) -> str:
    problem, splits = _walk_pre_tokenizer(node)
    if problem:
        return problem
    if not splits:
        return "the pre-tokenizer never splits: the model sees whole texts, so tokens may span any cut"
    return ""


def _walk_pre_tokenizer(node: Mapping[str, Any]) -> tuple[str, bool]:
    """(problem, whether some component splits the text into pre-tokens)."""
    kind = node.get("type")
    if kind == "Sequence":
        splits = False
        for child in node.get("pretokenizers") or ():
            problem, child_splits = _walk_pre_tokenizer(child)
            if problem:
                return problem, False
            splits = splits or child_splits
        return "", splits
    if kind not in _PRE_TOKENIZERS:
        return f"pre-tokenizer {kind!r} is not one this encoder recognises", False
    if kind == "ByteLevel":
        return "", node.get("use_regex", True) is not False  # without its regex it only maps bytes
    if kind == "Metaspace" and node.get("split") is False:
        return "", False
    if kind == "Split" and node.get("invert"):
        return "an inverted Split pre-tokenizer", False
    return "", True


def special_affixes(tokenizer: LocalTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The fixed ids add_special_tokens=True adds around every text, or None if it is not that."""
    found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for text in ("a", "Hello world", _PROBE_TEXTS[0]):
        plain = tokenizer.encode(text, add_special_tokens=False)
        full = tokenizer.encode(text, add_special_tokens=True)
        at = _find(full, plain)
        if at < 0:
            return None
        found.add((tuple(full[:at]), tuple(full[at + len(plain) :])))
    return found.pop() if len(found) == 1 else None


def _find(haystack: Sequence[int], needle: Sequence[int]) -> int:
    n = len(needle)
    for at in range(len(haystack) - n + 1):
        if list(haystack[at : at + n]) == list(needle):
            return at
    return -1


def _probe_problem(tokenizer: LocalTokenizer, encode_pieces: Callable[[str], list[int]]) -> str:
    added = list(tokenizer.added_tokens)[:4]
    texts = list(_PROBE_TEXTS)
    joined = " ".join(_PROBE_TEXTS)
    texts.append(joined)
    for token in added:  # added tokens at the start, in the middle, next to spaces and at the end
        texts.append(f"{token}system\n{_PROBE_TEXTS[0]}{token}\n{token} user {_PROBE_TEXTS[3]} {token}")
    for text in texts:
        if encode_pieces(text) != tokenizer.encode(text, add_special_tokens=False):
            return "the probe corpus tokenizes differently piece by piece than whole"
    return ""
