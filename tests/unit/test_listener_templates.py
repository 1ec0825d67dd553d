"""Chat-template splitting: when a detokenized chain determines the ingress's prefix key."""

from __future__ import annotations

import pytest

from continuum_common.hashing import MESSAGE_TAG, SYSTEM_TAG, prefix_key_from_text, request_prefix_key
from continuum_listener.protocol.templates import AnchorStatus, split_anchor
from continuum_testing.engines import chatml_decode, chatml_tokens

D, P, N, U, A = (
    AnchorStatus.DETERMINED,
    AnchorStatus.PENDING,
    AnchorStatus.NONE,
    AnchorStatus.UNPARSEABLE,
    AnchorStatus.AMBIGUOUS,
)


def chatml(*messages: tuple[str, str], gen: bool = True) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return text + ("<|im_start|>assistant\n" if gen else "")


def test_chatml_system_complete() -> None:
    anchor = split_anchor("chatml", chatml(("system", "Be brief."), ("user", "hi")), 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, SYSTEM_TAG, "Be brief.")


def test_chatml_every_prefix_of_a_short_system_prompt_is_pending_until_its_end() -> None:
    full = chatml(("system", "Be brief."), ("user", "hi"))
    end = full.index("<|im_end|>") + len("<|im_end|>")
    for cut in range(end):
        assert split_anchor("sim", full[:cut], 1024).status is P, cut
    assert split_anchor("sim", full[:end], 1024).status is D


def test_chatml_long_system_prompt_is_determined_after_max_prefix_length_bytes() -> None:
    system = "é" * 40  # 80 bytes
    full = chatml(("system", system), ("user", "q"))
    head = "<|im_start|>system\n"
    assert split_anchor("chatml", head + "é" * 15, 32).status is P  # 30 bytes
    anchor = split_anchor("chatml", head + "é" * 16, 32)  # exactly 32 bytes
    assert anchor.status is D
    assert prefix_key_from_text("m", anchor.text, tag=anchor.tag, max_prefix_length=32) == request_prefix_key(
        {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}]},
        enabled=True,
        max_prefix_length=32,
    )
    # A character cut by the chain end decodes to U+FFFD and does not count.
    assert split_anchor("chatml", head + "é" * 15 + "a\ufffd", 32).status is P
    assert split_anchor("chatml", full, 32).status is D


def test_chatml_first_message_when_no_system_prompt() -> None:
    anchor = split_anchor("chatml", chatml(("user", "What is 2+2?")), 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, MESSAGE_TAG, "What is 2+2?")
    anchor = split_anchor("chatml", chatml(("developer", "rules"), ("user", "x")), 1024)
    assert (anchor.tag, anchor.text) == (SYSTEM_TAG, "rules")


def test_chatml_empty_system_prompt_falls_back_to_first_message() -> None:
    text = chatml(("system", ""), ("user", "hello"))
    anchor = split_anchor("chatml", text, 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, MESSAGE_TAG, "hello")
    assert split_anchor("chatml", text[: text.index("hello") + 2], 1024).status is P
    assert split_anchor("chatml", chatml(("system", ""), ("user", "")), 1024).status is N


def test_chatml_not_a_chat_prompt() -> None:
    assert split_anchor("chatml", "plain completion text", 1024).status is U
    assert split_anchor("chatml", "", 1024).status is P
    assert split_anchor("chatml", "<|im_st", 1024).status is P


def test_llama3_with_and_without_the_31_preamble() -> None:
    head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    pre = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    user = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
    anchor = split_anchor("llama3", head + pre + "You are a pirate." + user, 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, SYSTEM_TAG, "You are a pirate.")
    anchor = split_anchor("llama3", head + "You are a pirate." + user, 1024)
    assert anchor.text == "You are a pirate."
    # Llama 3.1 always renders a system turn; one holding only the preamble is "no system prompt".
    anchor = split_anchor("llama3", head + pre + user, 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, MESSAGE_TAG, "Hello")
    assert split_anchor("llama3", head + pre[:20], 1024).status is P
    assert split_anchor("llama3", head + pre + "x" * 10, 8).status is D


def test_mistral_system_prompt_and_inst() -> None:
    anchor = split_anchor("mistral", "<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT][INST] hi[/INST]", 1024)
    assert (anchor.tag, anchor.text) == (SYSTEM_TAG, "Be terse.")
    anchor = split_anchor("mistral", "<s>[INST] What is up?[/INST] Not much</s>", 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, MESSAGE_TAG, "What is up?")
    assert split_anchor("mistral", "<s>[INST] What is", 1024).status is P
    assert split_anchor("mistral", "<s>[SYSTEM_PR", 1024).status is P
    assert split_anchor("mistral", "<s>hello", 1024).status is U


def test_gemma_first_turn_and_ambiguity() -> None:
    anchor = split_anchor("gemma", "<bos><start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n", 1024)
    assert (anchor.status, anchor.tag, anchor.text) == (D, MESSAGE_TAG, "Why?")
    # Gemma merges a system prompt into the first turn as "{system}\n\n{user}": cannot split.
    merged = "<bos><start_of_turn>user\nBe kind.\n\nWhy?<end_of_turn>\n"
    assert split_anchor("gemma", merged, 1024).status is A
    assert split_anchor("gemma", "<bos><start_of_turn>user\n" + "x" * 50, 8).status is P


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "You are helpful. 🙂"}, {"role": "user", "content": "hello"}],
        [{"role": "user", "content": "only a user message"}],
        [{"role": "system", "content": "x" * 3000}, {"role": "user", "content": "long system"}],
        [{"role": "system", "content": "日本語のシステム" * 200}, {"role": "user", "content": "multibyte"}],
    ],
)
def test_sim_round_trip_gives_the_ingress_key_at_every_determining_depth(messages: list[dict[str, str]]) -> None:
    body = {"model": "sim-model", "messages": messages}
    want = request_prefix_key(body, enabled=True, max_prefix_length=1024)
    tokens = chatml_tokens(messages)
    first = None
    for depth in range(1, len(tokens) + 1):
        anchor = split_anchor("sim", chatml_decode(tokens[:depth]), 1024)
        if anchor.status is D:
            first = first or depth
            assert prefix_key_from_text("sim-model", anchor.text, tag=anchor.tag, max_prefix_length=1024) == want
        else:
            assert first is None, "determined must be monotonic along a chain"
            assert anchor.status is P
    assert first is not None
