"""`LocalTokenizer`: a Hugging Face `tokenizers` tokenizer.json plus an optional Jinja2 chat
template, used the way vLLM uses a model's tokenizer.

    tok = LocalTokenizer("tokenizer.json", chat_template="tokenizer_config.json")
    text = tok.render_chat(messages)                  # the prompt text (HF apply_chat_template)
    ids = tok.encode(text, add_special_tokens=False)  # chat prompts: no BOS added (the template has it)
    ids = tok.encode(prompt, add_special_tokens=True) # completions: the post-processor's specials
    tok.decode(ids)                                   # special tokens kept (skip_special_tokens=False)

`chat_template` is a file holding the template text, or a tokenizer_config.json carrying
`chat_template` (a string, or a list of named templates: "default" is used). The special tokens
the template sees (`bos_token`, `eos_token`, ... as strings or `{"content": ...}` objects) come
from the tokenizer_config.json beside tokenizer.json when there is one (as in a Hugging Face
model directory), then from a tokenizer_config.json given as `chat_template`, then from explicit
`bos_token` / `eos_token` arguments, each overriding the one before. `find_chat_template`
locates a model directory's template the way Hugging Face does. Truncation and padding stored in tokenizer.json are
switched off: vLLM never truncates a prompt silently.

Every failure is a TokenizationError subclass (TokenizerLoadError, ChatTemplateError) whose
message names no prompt text and no token id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from continuum_common.tokenization import chat
from continuum_common.tokenization.errors import ChatTemplateError, TokenizationError, TokenizerLoadError

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class LocalTokenizer:
    def __init__(
        self,
        tokenizer: str | Path,
        *,
        chat_template: str | Path | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self.path = Path(tokenizer)
        self.backend = _load_backend(self.path)
        self.special_tokens: dict[str, str | None] = _beside_specials(self.path)
        self._template: jinja2.Template | None = None
        if chat_template is not None:
            source, specials = _load_template(Path(chat_template))
            self.special_tokens.update(specials)
            self._template = chat.compile_template(source)
        if bos_token is not None:
            self.special_tokens["bos_token"] = bos_token
        if eos_token is not None:
            self.special_tokens["eos_token"] = eos_token
        decoder = self.backend.get_added_tokens_decoder()
        # Every added token (special or not) is split out of the text before normalization.
        self.added_tokens: dict[str, int] = {t.content: i for i, t in sorted(decoder.items())}
        self.vocab_size: int = self.backend.get_vocab_size(with_added_tokens=True)

    # -- chat ------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (ChatTemplateError when there is no template or it
        fails). `kwargs` become template variables (a request's `chat_template_kwargs`, `tools`);
        any name is accepted, `messages` and `add_generation_prompt` keep their own values."""
        if self._template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        return chat.render(
            self._template,
            messages,
            special_tokens=self.special_tokens,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables=kwargs,
        )

    # -- ids -------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        try:
            ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # tokenizers raises plain TypeError/ValueError/Exception
            raise TokenizationError(f"the tokenizer failed to encode: {type(exc).__name__}") from None
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids (no special tokens added) and each token's (start, end) character offsets."""
        try:
            encoding = self.backend.encode(text, add_special_tokens=False)
            return encoding.ids, encoding.offsets
        except Exception as exc:
            raise TokenizationError(f"the tokenizer failed to encode: {type(exc).__name__}") from None

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        try:
            text: str = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        except Exception as exc:
            raise TokenizationError(f"the tokenizer failed to decode: {type(exc).__name__}") from None
        return text

    def token_to_id(self, token: str) -> int | None:
        value: int | None = self.backend.token_to_id(token)
        return value

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of one id (e.g. "Ġthe"), None when unassigned."""
        if token_id < 0:
            return None
        value: str | None = self.backend.id_to_token(token_id)
        return value

    def config(self) -> dict[str, Any]:
        """tokenizer.json as a dict (for the piecewise-encoding analysis)."""
        try:
            data: dict[str, Any] = json.loads(self.backend.to_str())
        except Exception as exc:
            raise TokenizerLoadError(f"cannot serialise the tokenizer: {type(exc).__name__}") from None
        return data


# From this many characters (or ids) on, `UnlockedTokenizer` takes the batch forms; below, a
# call is shorter than the interpreter's switch interval anyway.
UNLOCKED_FROM = 2_000


class UnlockedTokenizer(LocalTokenizer):
    """A LocalTokenizer for use on a worker thread: `tokenizers` keeps the interpreter lock
    through `encode` and `decode` but releases it in `encode_batch` and `decode_batch`, so long
    texts go through those (the same ids and text: the batch forms run the same pipeline) and
    the event loop's thread runs meanwhile. A 12k-token prompt holds the lock for tens of
    milliseconds otherwise."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        if len(text) < UNLOCKED_FROM:
            return super().encode(text, add_special_tokens=add_special_tokens)
        try:
            ids: list[int] = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except Exception as exc:  # as LocalTokenizer.encode
            raise TokenizationError(f"the tokenizer failed to encode: {type(exc).__name__}") from None
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        if len(ids) < UNLOCKED_FROM:
            return super().decode(ids, skip_special_tokens=skip_special_tokens)
        try:
            texts: list[str] = self.backend.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)
        except Exception as exc:
            raise TokenizationError(f"the tokenizer failed to decode: {type(exc).__name__}") from None
        return texts[0]


def find_chat_template(tokenizer: str | Path) -> Path | None:
    """The chat template of a Hugging Face model directory: `chat_template.jinja` beside
    tokenizer.json, else a tokenizer_config.json beside it that has `chat_template`, else None."""
    path = Path(tokenizer)
    jinja = path.with_name("chat_template.jinja")
    if jinja.is_file():
        return jinja
    config = _read_config(path.with_name("tokenizer_config.json"))
    if config is not None and "chat_template" in config:
        return path.with_name("tokenizer_config.json")
    return None


def _read_config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _beside_specials(tokenizer: Path) -> dict[str, str | None]:
    config = _read_config(tokenizer.with_name("tokenizer_config.json"))
    return _config_specials(config) if config is not None else {}


def _load_backend(path: Path) -> Tokenizer:
    if not path.is_file():
        raise TokenizerLoadError(f"tokenizer file not found: {path}")
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as exc:  # invalid JSON, unknown component, ...
        raise TokenizerLoadError(f"cannot load tokenizer {path}: {exc}") from None
    backend.no_truncation()
    backend.no_padding()
    return backend


def _load_template(path: Path) -> tuple[str, dict[str, str | None]]:
    """(template source, special tokens) from a template file or a tokenizer_config.json."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read chat template {path}: {exc}") from None
    if path.suffix != ".json":
        return text, {}
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise TokenizerLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return _config_template(config, path), _config_specials(config)


def _config_template(config: Mapping[str, Any], path: Path) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default", next(iter(named.values()), None))
    if not isinstance(template, str):
        raise TokenizerLoadError(f"{path} has no chat_template")
    return template


def _config_specials(config: Mapping[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key in _SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if key in config and (isinstance(value, str) or value is None):
            out[key] = value
    return out
