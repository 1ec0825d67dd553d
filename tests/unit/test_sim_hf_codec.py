"""The simulator's Hugging Face codec: span-cached encoding equals whole-text encoding, and the
generated answers re-tokenize to their own ids."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from continuum_common.tokenization import LocalTokenizer
from continuum_sim.hf_tokenizer import TokenizerFiles, corpus, train_tokenizer
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.codec import HfCodec

FRAGMENTS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "user\n", "assistant\n", " ", "\n", "the", " cache", "é",
    "Hello", ".", "12", "😀", "  ", "\t", "<|im_", "|>",
]  # fmt: skip
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40).map("".join)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("codec"))


@pytest.fixture(scope="module")
def bos_tokenizer(files: TokenizerFiles, tmp_path_factory: pytest.TempPathFactory) -> LocalTokenizer:
    """The trained tokenizer with a post-processor that adds <|endoftext|> before every text."""
    tok = Tokenizer.from_file(str(files.tokenizer))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    path = tmp_path_factory.mktemp("bos") / "tokenizer.json"
    tok.save(str(path))
    return LocalTokenizer(path)


@pytest.fixture(scope="module")
def metaspace_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> LocalTokenizer:
    """SentencePiece-style: "▁" prepended to the first span only, so a span's ids depend on
    whether an added token precedes it."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<unk>", *FRAGMENTS[:3]], show_progress=False)
    tok.train_from_iterator(corpus(0, paragraphs=200), trainer=trainer)
    path = tmp_path_factory.mktemp("meta") / "tokenizer.json"
    tok.save(str(path))
    return LocalTokenizer(path)


@pytest.mark.parametrize("which", ["chatml", "bos", "metaspace"])
def test_span_cached_encoding_equals_whole_text(
    files: TokenizerFiles, bos_tokenizer: LocalTokenizer, metaspace_tokenizer: LocalTokenizer, which: str
) -> None:
    chatml = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    local = {"chatml": chatml, "bos": bos_tokenizer, "metaspace": metaspace_tokenizer}[which]
    codec = HfCodec(local)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=texts, add=st.booleans())
    def check(text: str, add: bool) -> None:
        assert codec.encode(text, add_special_tokens=add) == local.encode(text, add_special_tokens=add)

    check()
    if which == "bos":
        assert codec.encode("hi", add_special_tokens=True)[0] == 0


def test_generated_answers_retokenize_to_their_ids(files: TokenizerFiles) -> None:
    local = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    codec = HfCodec(local)
    for seed in range(30):
        ids = codec.generator.tokens(random.Random(seed).randint(20, 200), random.Random(seed))
        again = local.encode(codec.decode(ids), add_special_tokens=False)
        assert again[:-2] == ids[: len(again) - 2]  # all but a word cut at the end
        prompt = codec.encode(codec.render_chat([ChatMessage("user", "hello")]), add_special_tokens=False)
        assert codec.generator.answer(prompt, 30, seed) == codec.generator.answer(prompt, 30, seed)


def test_token_strings_and_vocabulary_bounds(files: TokenizerFiles, tmp_path: Path) -> None:
    codec = HfCodec(LocalTokenizer(files.tokenizer))
    ids = codec.encode("<|im_start|>user\nthe cache", add_special_tokens=False)
    assert codec.token_strings(ids)[:3] == ["<|im_start|>", "user", "Ċ"]
    assert codec.is_valid_id(codec.vocab_size - 1) and not codec.is_valid_id(codec.vocab_size)
    # No chat template: the built-in ChatML text.
    assert codec.render_chat([ChatMessage("user", "x")]) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
