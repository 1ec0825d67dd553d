"""Chat templates rendered the way Hugging Face's `apply_chat_template` renders them (what vLLM
does for a model with a Hugging Face tokenizer).

* Environment: Jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks`,
  the `loopcontrols` extension and a `{% generation %}` block tag that renders its body.
* Globals: `raise_exception(message)`, `strftime_now(format)`; filter `tojson` with
  `ensure_ascii=False` (HF's override).
* Variables: `messages`, `tools` (None), `documents` (None), `add_generation_prompt`, the
  special tokens (`bos_token`, `eos_token`, ... as strings), then the caller's keyword arguments.
* Message `content` arrays become their text parts joined with "\\n" (the rule of
  continuum_common.hashing.request_text.content_text), like vLLM's "string" content format.
* `continue_final_message` cuts the text right after the last message's content, with HF's rule
  for templates that trim that content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from continuum_common.hashing.request_text import content_text
from continuum_common.tokenization.errors import ChatTemplateError


class _TemplateRaised(Exception):
    """What `raise_exception` raises inside the template (turned into ChatTemplateError)."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: HF marks assistant text with it; renders the body."""

    tags = {"generation"}  # Jinja2 declares a (mutable) set here

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once; ChatTemplateError when it does not parse."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not parse (line {exc.lineno}): {exc.message}") from None


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Copies of the messages with `content` arrays flattened to their text."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise ChatTemplateError("messages must be an array of objects")
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{index}] must be an object")
        copy = dict(message)
        content = copy.get("content")
        if content is not None and not isinstance(content, str):
            copy["content"] = content_text(content)
        out.append(copy)
    return out


def render(
    template: jinja2.Template,
    messages: Any,
    *,
    special_tokens: Mapping[str, str | None],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text of `messages`; ChatTemplateError for anything that goes wrong.
    `variables` (the caller's extra template variables) override the special tokens."""
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
    chat = normalize_messages(messages)
    if continue_final_message and not chat:
        raise ChatTemplateError("continue_final_message needs at least one message")
    context: dict[str, Any] = {"tools": None, "documents": None}
    context.update(special_tokens)
    context.update(variables or {})
    context["messages"] = chat
    context["add_generation_prompt"] = add_generation_prompt
    try:
        text = template.render(context)
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"the chat template refused the messages: {exc}") from None
    except jinja2.TemplateError as exc:  # undefined names, sandbox violations, ...
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # a template can raise anything (TypeError on None + str, ...)
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}") from None
    if continue_final_message:
        return _cut_after_final(text, chat[-1].get("content"))
    return text


def _cut_after_final(text: str, final: Any) -> str:
    """HF's `continue_final_message`: end the prompt right after the last message's content."""
    if not isinstance(final, str) or not final.strip():
        raise ChatTemplateError("continue_final_message needs text in the final message")
    stripped = final.strip()
    at = text.rfind(stripped)
    if at < 0:
        raise ChatTemplateError("continue_final_message: the final message does not appear in the rendered chat")
    if text[at : at + len(final.lstrip())] == final:  # HF compares with the unstripped text
        return text[: at + len(final.lstrip())]
    return text[: at + len(stripped)]
