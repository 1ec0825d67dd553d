"""The tokenizer the benchmark shares with the engines (`--tokenizer builtin|hf`).

The workloads need the token ids the engine will see for every prompt (the ideal hit rate is
computed on them) and text of a given token length. `TokenCodec` is the small protocol both
need; `EngineCodec` implements it on the simulator's own codecs, so the benchmark tokenizes
exactly as the engine does:

* `builtin`: the simulator's tokenizer and ChatML template (`continuum_sim.Tokenizer`), the
  engines' default.
* `hf`: a Hugging Face `tokenizer.json` and a Jinja2 chat template file — the pair
  `continuum_sim.hf_tokenizer.train_tokenizer(out_dir)` writes — through
  `continuum_common.tokenization.LocalTokenizer`; the engines are then started with
  `EngineConfig(tokenizer=..., chat_template=...)` on the same files.

Chat prompts are tokenized without added special tokens (the template writes them), completion
prompts with them, as vLLM does.

The load driver tokenizes on a worker thread beside its event loop (fleet/driver.py). The
`tokenizers` library keeps the interpreter lock through `encode` and `decode` but releases it in
`encode_batch` and `decode_batch`, so the benchmark's tokenizer sends long texts through those:
a 12k-token prompt otherwise holds the loop's thread for tens of milliseconds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from continuum_common.tokenization import UnlockedTokenizer
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.codec import BuiltinCodec, HfCodec, PromptCodec
from continuum_sim.protocol.tokenizer import Tokenizer

TOKENIZER_CHOICES = ("builtin", "hf")


class TokenCodec(Protocol):
    name: str
    # encode(decode(ids)) == ids for every id sequence the text generator makes, so text of an
    # exact token count can be made from ids (the builtin tokenizer); otherwise prompts are
    # re-encoded after they are cut.
    exact: bool

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids, as the engine tokenizes it."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """A chat request's prompt ids: the messages rendered with the engine's chat template
        (generation prompt included), then tokenized."""
        ...

    def generate(self, count: int, rng: random.Random, *, leading_space: bool = False) -> list[int]:
        """`count` token ids of English-like text (the engine's own answer generator)."""
        ...


class EngineCodec:
    """A `TokenCodec` on one of the simulator's `PromptCodec`s."""

    def __init__(self, name: str, codec: PromptCodec, *, exact: bool) -> None:
        self.name = name
        self.codec = codec
        self.exact = exact

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text, add_special_tokens=True)

    def decode(self, ids: Sequence[int]) -> str:
        return self.codec.decode(ids)

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return self.codec.render_chat(messages)

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.codec.encode(self.codec.render_chat(messages), add_special_tokens=False)

    def generate(self, count: int, rng: random.Random, *, leading_space: bool = False) -> list[int]:
        return self.codec.generator.tokens(count, rng, leading_space=leading_space)


@dataclass(frozen=True)
class HfTokenizerFiles:
    tokenizer: Path  # tokenizer.json
    chat_template: Path  # the Jinja2 template text


def train_hf_tokenizer(out_dir: Path) -> HfTokenizerFiles:
    """Train the simulator's small byte-level BPE tokenizer into `out_dir` (no download;
    deterministic, about a second)."""
    from continuum_sim.hf_tokenizer import train_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    files = train_tokenizer(out_dir)
    return HfTokenizerFiles(Path(files.tokenizer), Path(files.chat_template))


def make_codec(kind: str, files: HfTokenizerFiles | None = None) -> EngineCodec:
    if kind == "builtin":
        return EngineCodec("builtin", BuiltinCodec(Tokenizer()), exact=True)
    if kind == "hf":
        if files is None:
            raise ValueError("--tokenizer hf needs the tokenizer files")
        local = UnlockedTokenizer(files.tokenizer, chat_template=files.chat_template)
        return EngineCodec("hf", HfCodec(local), exact=False)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZER_CHOICES)}")


class Texts:
    """Deterministic English-like text of a given token length under `codec` (shared by the
    workloads): exact with the builtin tokenizer, to within a token or two with a Hugging Face
    one (the generator's last word can be cut)."""

    def __init__(self, codec: TokenCodec) -> None:
        self.codec = codec

    def text(self, count: int, rng: random.Random, *, leading_space: bool = False) -> str:
        return self.codec.decode(self.codec.generate(count, rng, leading_space=leading_space))

    def chat_ids(self, messages: list[ChatMessage]) -> list[int]:
        return self.codec.chat_ids(messages)
