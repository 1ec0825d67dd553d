"""Tokenizer round trip, ratio and special tokens; ChatML rendering; generated text is canonical."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_sim.protocol.chat_template import parse_messages, render
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import SPECIAL_TOKENS, Tokenizer

TOK = Tokenizer()
ENGLISH = (
    "Prefix caching lets an inference engine reuse the key and value tensors computed for a prompt "
    "prefix that an earlier request already processed. When many users ask questions about the same "
    "long document, the router should send them to the engine that already holds the document, so "
    "the time to first token drops and the fleet serves more requests per second."
)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_any_text(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text


def test_round_trip_samples() -> None:
    for text in [
        "",
        " ",
        "\n\n\n\n",
        "café 한국어 😀",
        "__init__ x_y",
        "a\u0301",
        "\x00\ud7ff",
        "x" * 5000,
        "<|im_start|",
    ]:
        assert TOK.decode(TOK.encode(text)) == text


def test_about_four_characters_per_token_on_english() -> None:
    ratio = len(ENGLISH) / len(TOK.encode(ENGLISH))
    assert 3.3 <= ratio <= 5.0


def test_special_tokens_have_fixed_ids() -> None:
    ids = TOK.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == SPECIAL_TOKENS["<|im_start|>"] == 151644
    assert SPECIAL_TOKENS["<|im_end|>"] in ids
    assert TOK.decode([151644]) == "<|im_start|>"
    assert TOK.encode_ordinary("<|im_start|>")[0] != 151644


def test_unassigned_ids_decode_to_nothing_and_cache_is_transparent() -> None:
    assert TOK.decode([120000]) == ""
    long = ENGLISH * 4
    assert TOK.encode(long) == TOK.encode(long) == Tokenizer(cache_size=0).encode(long)


def test_chatml_render_and_split_encoding() -> None:
    messages = parse_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
            }
        ],
        system=[{"type": "text", "text": "sys"}],
    )
    text = render(messages)
    assert text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
    assert render(messages, add_generation_prompt=False, continue_final_message=True).endswith("user\na\nb")
    pieces = [TOK.encode("<|im_start|>system\nsys<|im_end|>\n"), TOK.encode("<|im_start|>user\na\nb<|im_end|>\n")]
    assert TOK.encode(text)[: len(pieces[0]) + len(pieces[1])] == pieces[0] + pieces[1]


def test_generated_text_reencodes_to_the_same_ids() -> None:
    gen = TextGenerator(TOK)
    for seed in range(50):
        ids = gen.tokens(200, random.Random(seed))
        assert TOK.encode(TOK.decode(ids)) == ids
        spaced = gen.tokens(50, random.Random(seed), leading_space=True)
        assert TOK.encode(TOK.decode(ids) + TOK.decode(spaced)) == ids + spaced
    prompt = TOK.encode("hello there")
    assert gen.answer(prompt, 20) == gen.answer(prompt, 20) != gen.answer(prompt, 20, seed=1)
