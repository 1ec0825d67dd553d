"""The tokenizer the benchmark shares with the engines (`--tokenizer builtin|hf`).

The workloads need the token ids the engine will see for every prompt (the ideal hit rate is
computed on them) and text of a given token length. `TokenCodec` is the small protocol both
sides of that need:

* `BuiltinCodec`: the simulator's own tokenizer and ChatML template (`continuum_sim.Tokenizer`);
  the engines' default.
* `HfCodec`: a Hugging Face `tokenizer.json` and a Jinja2 chat template file, the pair
  `continuum_sim.hf_tokenizer.train_tokenizer(out_dir)` writes; the engines are then started
  with `EngineConfig(tokenizer=..., chat_template=...)` and tokenize with the same files.

Chat prompts are tokenized without added special tokens (the template writes them, as vLLM
does); completion prompts with them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from continuum_sim.protocol.chat_template import ChatMessage, render
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import Tokenizer

TOKENIZER_CHOICES = ("builtin", "hf")


class TokenCodec(Protocol):
    name: str
    # encode(decode(ids)) == ids for every id sequence the text generator makes, so text of an
    # exact token count can be made from ids (the builtin tokenizer); else text is cut by
    # re-encoding.
    exact: bool

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids, as the engine tokenizes it."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """A chat request's prompt ids: the messages rendered with the engine's chat template
        (generation prompt included), then tokenized."""
        ...


class BuiltinCodec:
    name = "builtin"
    exact = True

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer or Tokenizer()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.tokenizer.encode(render(list(messages)))


@dataclass(frozen=True)
class HfTokenizerFiles:
    tokenizer: Path  # tokenizer.json
    chat_template: Path  # the Jinja2 template text


def train_hf_tokenizer(out_dir: Path) -> HfTokenizerFiles:
    """Train the simulator's small byte-level BPE tokenizer into `out_dir` (no download)."""
    try:
        from continuum_sim.hf_tokenizer import train_tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise RuntimeError(
            "--tokenizer hf needs continuum_sim.hf_tokenizer.train_tokenizer, which this installation lacks"
        ) from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    files = train_tokenizer(out_dir)
    return HfTokenizerFiles(Path(files.tokenizer), Path(files.chat_template))


class HfCodec:
    """A Hugging Face tokenizer plus a chat template, rendered like transformers'
    `apply_chat_template` (sandboxed Jinja2, `raise_exception`, `bos_token`/`eos_token`)."""

    name = "hf"
    exact = False

    def __init__(self, files: HfTokenizerFiles) -> None:
        import jinja2.sandbox
        from tokenizers import Tokenizer as HfTokenizer

        self.files = files
        self._tok = HfTokenizer.from_file(str(files.tokenizer))
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        self._template = env.from_string(files.chat_template.read_text(encoding="utf-8"))
        self._specials = {name: self._special(name) for name in ("bos_token", "eos_token")}

    def _special(self, name: str) -> str:
        # The trained tokenizer has <|endoftext|> and no BOS; tokenizer_config.json would say.
        return "<|endoftext|>" if name == "eos_token" and self._tok.token_to_id("<|endoftext|>") is not None else ""

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=True).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tok.decode(list(ids), skip_special_tokens=False)
        return text

    def render(self, messages: Sequence[ChatMessage]) -> str:
        rendered: str = self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            **self._specials,
        )
        return rendered

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        ids: list[int] = self._tok.encode(self.render(messages), add_special_tokens=False).ids
        return ids


def _raise_exception(message: str) -> Any:
    raise ValueError(f"chat template error: {message}")


def make_codec(kind: str, files: HfTokenizerFiles | None = None) -> TokenCodec:
    if kind == "builtin":
        return BuiltinCodec()
    if kind == "hf":
        if files is None:
            raise ValueError("--tokenizer hf needs the tokenizer files")
        return HfCodec(files)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZER_CHOICES)}")


class Texts:
    """Deterministic English-like text of a given token length under `codec` (shared by the
    workloads): exact with the builtin tokenizer; with another, words are drawn the same way
    and the text is cut at the wanted token count by re-encoding."""

    def __init__(self, codec: TokenCodec) -> None:
        self.codec = codec
        self._builtin = codec.tokenizer if isinstance(codec, BuiltinCodec) else Tokenizer()
        self.generator = TextGenerator(self._builtin)

    def text(self, count: int, rng: random.Random, *, leading_space: bool = False) -> str:
        words = self._builtin.decode(self.generator.tokens(count, rng, leading_space=leading_space))
        if self.codec.exact:
            return words
        return self.cut(words, count, rng)

    def cut(self, text: str, count: int, rng: random.Random | None = None) -> str:
        """`text` cut (or, with `rng`, extended) to about `count` tokens of the codec."""
        ids = self.codec.encode(text)
        while rng is not None and len(ids) < count:
            more = self._builtin.decode(self.generator.tokens(count - len(ids) + 8, rng, leading_space=True))
            text += more
            ids = self.codec.encode(text)
        return text if len(ids) <= count else self.codec.decode(ids[:count])

    def chat_ids(self, messages: list[ChatMessage]) -> list[int]:
        return self.codec.chat_ids(messages)
