"""A small real Hugging Face tokenizer for the simulator, trained locally (nothing downloaded).

    from continuum_sim.hf_tokenizer import train_tokenizer
    files = train_tokenizer(out_dir)               # TokenizerFiles(tokenizer=..., chat_template=...)
    EngineConfig(tokenizer=str(files.tokenizer), chat_template=str(files.chat_template))

    python -m continuum_sim.hf_tokenizer --out DIR [--vocab-size 4096] [--seed 0]

A byte-level BPE shaped like Qwen2's (NFC normalizer, the Qwen2/Llama-3 pre-tokenizer regex
followed by byte-level mapping, byte-level decoder) trained with `tokenizers`' BPE trainer on
English-like text from the simulator's own `TextGenerator` (plus its word list, numbers and
some punctuation), with the specials `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at ids 0-2.
The chat template is ChatML, the same text the built-in template renders. The same seed and
vocabulary size always give byte-identical files. Training takes about a second.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import ENDOFTEXT, IM_END, IM_START
from continuum_sim.protocol.tokenizer import Tokenizer as BuiltinTokenizer
from continuum_sim.protocol.words import COMMON_WORDS

SPECIALS = (ENDOFTEXT, IM_START, IM_END)
# Qwen2's pre-tokenizer regex (the Llama-3 one with 1-digit numbers).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '')"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer: Path  # tokenizer.json
    chat_template: Path  # the Jinja2 ChatML template text


def corpus(seed: int, paragraphs: int = 3000) -> Iterator[str]:
    """Training text: generated paragraphs, the word list, numbers and punctuation runs."""
    rng = random.Random(seed)
    builtin = BuiltinTokenizer(cache_size=0)
    generator = TextGenerator(builtin)
    for _ in range(paragraphs):
        yield builtin.decode(generator.tokens(rng.randint(20, 160), rng))
    words = list(COMMON_WORDS)
    for _ in range(200):
        rng.shuffle(words)
        yield " ".join(words[:60]) + ".\n" + " ".join(w.capitalize() for w in words[60:90]) + "?\n\n"
    for _ in range(200):
        numbers = " ".join(str(rng.randint(0, 100_000)) for _ in range(20))
        yield f"Values: {numbers}; total = {rng.random():.4f} (see #{rng.randint(1, 99)}).\n"
    yield "system\nuser\nassistant\n" * 50


def build_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    return tokenizer


def train_tokenizer(out_dir: str | Path, *, vocab_size: int = 4096, seed: int = 0) -> TokenizerFiles:
    """Train (deterministically) and write tokenizer.json, chat_template.jinja and a
    tokenizer_config.json (chat_template, eos_token) into `out_dir`."""
    if vocab_size < 256 + len(SPECIALS):
        raise ValueError("vocab_size must leave room for the 256 byte tokens and the specials")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, seed)
    files = TokenizerFiles(out / TOKENIZER_FILE, out / TEMPLATE_FILE)
    # pretty=False + sorted vocabulary keys in the Rust serializer: byte-identical for a seed.
    files.tokenizer.write_text(tokenizer.to_str(pretty=False))
    files.chat_template.write_text(CHATML_TEMPLATE)
    config = {"chat_template": CHATML_TEMPLATE, "eos_token": IM_END, "bos_token": None, "pad_token": ENDOFTEXT}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m continuum_sim.hf_tokenizer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", required=True, help="directory to write the files into")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        files = train_tokenizer(args.out, vocab_size=args.vocab_size, seed=args.seed)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    size = Tokenizer.from_file(str(files.tokenizer)).get_vocab_size()
    print(f"{files.tokenizer} ({size} tokens)\n{files.chat_template}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
