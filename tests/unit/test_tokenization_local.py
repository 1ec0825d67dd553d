"""LocalTokenizer: loading, Hugging Face-style chat template rendering, encode/decode, and the
errors every failure turns into (never anything but TokenizationError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuum_common.tokenization import (
    ChatTemplateError,
    LocalTokenizer,
    TokenizationError,
    TokenizerLoadError,
    UnlockedTokenizer,
    find_chat_template,
)
from continuum_common.tokenization.local import UNLOCKED_FROM
from continuum_sim.hf_tokenizer import CHATML_TEMPLATE, TokenizerFiles, train_tokenizer
from continuum_sim.protocol.chat_template import parse_messages, render

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "image_url"}, {"type": "text", "text": "two"}]},
    {"role": "assistant", "content": "Sure."},
    {"role": "user", "content": "Again?"},
]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(files: TokenizerFiles) -> LocalTokenizer:
    return LocalTokenizer(files.tokenizer, chat_template=files.chat_template)


def write_template(tmp_path: Path, text: str, name: str = "t.jinja") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the trained tokenizer -----------------------------------------------------------------------


def test_training_is_deterministic_and_specials_have_fixed_ids(tmp_path: Path, files: TokenizerFiles) -> None:
    again = train_tokenizer(tmp_path / "again")
    assert again.tokenizer.read_bytes() == files.tokenizer.read_bytes()
    assert again.chat_template.read_text() == CHATML_TEMPLATE
    other = train_tokenizer(tmp_path / "other", seed=1)
    assert other.tokenizer.read_bytes() != files.tokenizer.read_bytes()
    tok = LocalTokenizer(files.tokenizer)
    assert tok.added_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert tok.vocab_size > 1000


def test_round_trip_and_special_tokens(tok: LocalTokenizer) -> None:
    text = "<|im_start|>user\nCafé 😀 costs 12.50 — really?<|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids) == text  # special tokens kept, like vLLM's /detokenize
    assert tok.decode(ids, skip_special_tokens=True) == "user\nCafé 😀 costs 12.50 — really?\n"
    # No post-processor specials: add_special_tokens changes nothing for this tokenizer.
    assert tok.encode(text, add_special_tokens=True) == ids
    assert tok.id_to_token(1) == "<|im_start|>" and tok.token_to_id("<|im_end|>") == 2
    assert tok.id_to_token(-1) is None and tok.id_to_token(10**9) is None


def test_chatml_template_renders_exactly_like_the_builtin_one(tok: LocalTokenizer) -> None:
    expected = render(parse_messages(MESSAGES))
    assert tok.render_chat(MESSAGES) == expected
    assert tok.render_chat(MESSAGES, add_generation_prompt=False) == render(
        parse_messages(MESSAGES), add_generation_prompt=False
    )
    # content arrays: text parts joined with "\n", images ignored
    assert "<|im_start|>user\npart one\ntwo<|im_end|>\n" in expected


def test_continue_final_message_cuts_after_the_last_content(tok: LocalTokenizer) -> None:
    chat = [*MESSAGES, {"role": "assistant", "content": "The answer is"}]
    text = tok.render_chat(chat, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nThe answer is")
    assert text == render(parse_messages(chat), add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="both"):
        tok.render_chat(chat, add_generation_prompt=True, continue_final_message=True)


# -- Hugging Face's environment ------------------------------------------------------------------


def test_hf_globals_filters_and_block_trimming(tmp_path: Path, files: TokenizerFiles) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "  {% generation %}[{{ m.role }}:{{ m.content }}]{% endgeneration %}\n"
        "{% endfor %}{{ messages[0] | tojson }}|{{ tools }}|{{ extra }}|{{ eos_token }}"
    )
    config = {"chat_template": template, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    tok = LocalTokenizer(files.tokenizer, chat_template=path)
    text = tok.render_chat([{"role": "user", "content": "é"}, {"role": "x", "content": "y"}, {"role": "z"}], extra=7)
    # trim_blocks/lstrip_blocks drop the block lines' whitespace; tojson keeps "é" (ensure_ascii off)
    assert text == '<s>[user:é][x:y]{"role": "user", "content": "é"}|None|7|</s>'
    explicit = LocalTokenizer(files.tokenizer, chat_template=path, bos_token="<B>", eos_token="<E>")
    assert explicit.render_chat([{"role": "user", "content": "q"}]).startswith("<B>[user:q]")
    # Request-supplied variables (chat_template_kwargs) may use any name without breaking the call;
    # they override special tokens but not the messages.
    odd = {"messages": "nope", "special_tokens": 1, "variables": 2, "template": 3, "eos_token": "<X>", "extra": 8}
    assert tok.render_chat([{"role": "user", "content": "q"}], **odd).endswith("|8|<X>")


def test_named_template_list_uses_default(tmp_path: Path, files: TokenizerFiles) -> None:
    config = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    assert LocalTokenizer(files.tokenizer, chat_template=path).render_chat([]) == "D"


def test_model_directory_template_and_special_tokens(tmp_path: Path, files: TokenizerFiles) -> None:
    """Like a Hugging Face model directory: chat_template.jinja first, else tokenizer_config.json;
    the special tokens always come from tokenizer_config.json beside tokenizer.json."""
    assert find_chat_template(files.tokenizer) == files.chat_template
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes(files.tokenizer.read_bytes())
    assert find_chat_template(model / "tokenizer.json") is None
    config = {"chat_template": "{{ bos_token }}|{{ eos_token }}", "bos_token": "<|endoftext|>", "eos_token": "E"}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert find_chat_template(model / "tokenizer.json") == model / "tokenizer_config.json"
    (model / "chat_template.jinja").write_text("[{{ bos_token }}]")
    assert find_chat_template(model / "tokenizer.json") == model / "chat_template.jinja"
    tok = LocalTokenizer(model / "tokenizer.json", chat_template=model / "chat_template.jinja")
    assert tok.render_chat([]) == "[<|endoftext|>]"


# -- errors ----------------------------------------------------------------------------------------


def test_bad_tokenizer_files_raise_load_errors(tmp_path: Path, files: TokenizerFiles) -> None:
    with pytest.raises(TokenizerLoadError, match="not found"):
        LocalTokenizer(tmp_path / "missing.json")
    bad = write_template(tmp_path, "{not json", "tokenizer.json")
    with pytest.raises(TokenizerLoadError):
        LocalTokenizer(bad)
    with pytest.raises(TokenizerLoadError, match=r"not found|cannot read"):
        LocalTokenizer(files.tokenizer, chat_template=tmp_path / "nope.jinja")
    no_template = tmp_path / "tokenizer_config.json"
    no_template.write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(TokenizerLoadError, match="no chat_template"):
        LocalTokenizer(files.tokenizer, chat_template=no_template)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        LocalTokenizer(files.tokenizer, chat_template=write_template(tmp_path, "{% for %}"))


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{{ raise_exception('Conversation roles must alternate') }}", "roles must alternate"),
        ("{% set x = messages.append(1) %}", "SecurityError"),  # the sandbox is immutable
        ("{{ messages[0].content.nope.deeper }}", "UndefinedError"),
        ("{{ messages[0]['content'] + 1 }}", "TypeError"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),
    ],
)
def test_failing_templates_raise_chat_template_error(
    tmp_path: Path, files: TokenizerFiles, template: str, match: str
) -> None:
    tok = LocalTokenizer(files.tokenizer, chat_template=write_template(tmp_path, template))
    with pytest.raises(ChatTemplateError, match=match) as info:
        tok.render_chat([{"role": "user", "content": "secret prompt text"}])
    assert "secret prompt text" not in str(info.value)


def test_bad_messages_and_missing_template(tok: LocalTokenizer, files: TokenizerFiles) -> None:
    with pytest.raises(ChatTemplateError, match="array"):
        tok.render_chat("hello")  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]"):
        tok.render_chat([{"role": "user", "content": "x"}, "nope"])  # type: ignore[list-item]
    with pytest.raises(ChatTemplateError, match="no chat template"):
        LocalTokenizer(files.tokenizer).render_chat(MESSAGES)
    with pytest.raises(ChatTemplateError, match="final message"):
        tok.render_chat([{"role": "user", "content": ""}], add_generation_prompt=False, continue_final_message=True)


def test_encode_and_decode_failures_are_tokenization_errors(tok: LocalTokenizer) -> None:
    with pytest.raises(TokenizationError, match="encode"):
        tok.encode(None, add_special_tokens=False)  # type: ignore[arg-type]
    with pytest.raises(TokenizationError, match="decode"):
        tok.decode([-5])
    assert issubclass(ChatTemplateError, TokenizationError) and issubclass(TokenizerLoadError, TokenizationError)


def test_the_unlocked_tokenizer_gives_the_same_ids_and_text(files: TokenizerFiles, tok: LocalTokenizer) -> None:
    unlocked = UnlockedTokenizer(files.tokenizer, chat_template=files.chat_template)
    short = "Café 😀 costs 12.50 — really?"
    long = "<|im_start|>user\n" + " ".join(f"{short} {i}" for i in range(200)) + "<|im_end|>\n"
    assert len(short) < UNLOCKED_FROM <= len(long)
    for text in (short, long):
        for special in (False, True):
            assert unlocked.encode(text, add_special_tokens=special) == tok.encode(text, add_special_tokens=special)
    ids = tok.encode(long, add_special_tokens=False)
    assert len(ids) >= UNLOCKED_FROM
    for skip in (False, True):
        assert unlocked.decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    with pytest.raises(TokenizationError, match="decode"):
        unlocked.decode([*ids, -5])  # the batch form's failure too
    with pytest.raises(TokenizationError, match="encode"):
        unlocked.encode(long.encode(), add_special_tokens=False)  # type: ignore[arg-type]
