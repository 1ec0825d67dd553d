"""Validation of client request bodies, one function per API (pure; no I/O).

Only what the router itself relies on, plus the common fields whose wrong type would otherwise
travel to a backend and come back as a confusing error, is checked; unknown fields pass through
untouched (vLLM and friends accept many extensions). Every failure is an InvalidRequest naming
the parameter, so a malformed request never reaches a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.hashing.responses_input import ResponsesInputError, responses_chat_body
from continuum_ingress.errors import InvalidRequest
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.checks import (
    MAX_CHOICES,
    MAX_JSON_DEPTH,
    MAX_TOKENS,
    MAX_TOP_LOGPROBS,
    array_of_objects,
    is_int,
    missing,
    nested_too_deep,
    opt_array,
    opt_bool,
    opt_int,
    opt_number,
    opt_object,
    opt_str,
    opt_str_or_object,
    opt_str_or_str_array,
    require_model,
    token_or_text_input,
    wrong_type,
)

OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
ANTHROPIC_ROLES = frozenset({"user", "assistant"})


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class ParsedRequest:
    api: Api
    body: dict[str, Any]
    model: str
    stream: bool
    # The caller-named session for ConsistentHash: OpenAI `user`, Anthropic `metadata.user_id`
    # (the X-Session-ID header, read by the HTTP layer, takes precedence).
    user: str | None
    # What the routing keys (prefix key, block hashes, text chunks, conversation start) are
    # computed from: an API whose rules apply, and the body in that API's shape. The request
    # itself, except for a Responses request, whose prompt is taken in chat form (the messages
    # the engine templates), or, when it continues a stored response, left keyless: its own
    # input is only the new turn, not the prompt the engine sees.
    key_api: Api
    key_body: dict[str, Any]


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or InvalidRequest (never a 500)."""
    if not raw:
        raise InvalidRequest("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    if nested_too_deep(raw, body):
        raise InvalidRequest(
            f"The request body nests JSON more than {MAX_JSON_DEPTH} levels deep.", code="invalid_json"
        )
    return body


Check = Callable[[dict[str, Any]], object]

# The optional fields a request may carry, each with its check. A request names a few of the
# fields, so validation walks the request's keys and checks those (not every known field).
SAMPLING_CHECKS: dict[str, Check] = {
    "temperature": lambda b: opt_number(b, "temperature", low=0.0, high=2.0),
    "top_p": lambda b: opt_number(b, "top_p", low=0.0, high=1.0),
    "presence_penalty": lambda b: opt_number(b, "presence_penalty", low=-2.0, high=2.0),
    "frequency_penalty": lambda b: opt_number(b, "frequency_penalty", low=-2.0, high=2.0),
    "n": lambda b: opt_int(b, "n", low=1, high=MAX_CHOICES),
    "seed": lambda b: opt_int(b, "seed"),
    "stop": lambda b: opt_str_or_str_array(b, "stop"),
    "stream_options": lambda b: opt_object(b, "stream_options"),
    "logit_bias": lambda b: opt_object(b, "logit_bias"),
    "cache_salt": lambda b: opt_str(b, "cache_salt"),
}


def _tools(body: dict[str, Any]) -> None:
    tools = opt_array(body, "tools")
    if tools:
        array_of_objects(tools, "tools")


CHAT_CHECKS: dict[str, Check] = {
    **SAMPLING_CHECKS,
    "max_tokens": lambda b: opt_int(b, "max_tokens", low=1, high=MAX_TOKENS),
    "max_completion_tokens": lambda b: opt_int(b, "max_completion_tokens", low=1, high=MAX_TOKENS),
    "logprobs": lambda b: opt_bool(b, "logprobs"),
    "top_logprobs": lambda b: opt_int(b, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS),
    "tools": _tools,
    "tool_choice": lambda b: opt_str_or_object(b, "tool_choice"),
    "response_format": lambda b: opt_object(b, "response_format"),
}
COMPLETIONS_CHECKS: dict[str, Check] = {
    **SAMPLING_CHECKS,
    "max_tokens": lambda b: opt_int(b, "max_tokens", low=0, high=MAX_TOKENS),
    "echo": lambda b: opt_bool(b, "echo"),
    "best_of": lambda b: opt_int(b, "best_of", low=1, high=MAX_CHOICES),
    "logprobs": lambda b: opt_int(b, "logprobs", low=0),
    "suffix": lambda b: opt_str(b, "suffix"),
}


def check_fields(body: dict[str, Any], checks: dict[str, Check]) -> None:
    """Run the check of every field of `checks` that `body` has (absent fields pass)."""
    for key in body:
        check = checks.get(key)
        if check is not None:
            check(body)


def _chat_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise InvalidRequest(
            "Invalid value for 'messages': must contain at least one message.", param="messages", code="invalid_value"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise wrong_type(f"messages[{i}]", "an object", message)
        role = message.get("role")
        if type(role) is not str or role not in OPENAI_ROLES:  # type() first: a list is unhashable
            _bad_role(i, role)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            if not isinstance(content, list):
                raise wrong_type(f"messages[{i}].content", "a string or an array of content parts", content)
            array_of_objects(content, f"messages[{i}].content")


def _bad_role(i: int, role: object) -> None:
    where = f"messages[{i}].role"
    if role is None:
        raise missing(where)
    if not isinstance(role, str):
        raise wrong_type(where, "a string", role)
    raise InvalidRequest(
        f"Invalid value for '{where}': {role!r} is not one of {sorted(OPENAI_ROLES)}.",
        param=where,
        code="invalid_value",
    )


def validate_chat(body: dict[str, Any]) -> ParsedRequest:
    model = require_model(body)
    _chat_messages(body)
    stream = opt_bool(body, "stream")
    check_fields(body, CHAT_CHECKS)
    user = opt_str(body, "user")
    return ParsedRequest(Api.CHAT, body, model, stream, user, Api.CHAT, body)


def validate_completions(body: dict[str, Any]) -> ParsedRequest:
    model = require_model(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise missing("prompt")
    token_or_text_input(prompt, "prompt")
    stream = opt_bool(body, "stream")
    check_fields(body, COMPLETIONS_CHECKS)
    user = opt_str(body, "user")
    return ParsedRequest(Api.COMPLETIONS, body, model, stream, user, Api.COMPLETIONS, body)


def validate_embeddings(body: dict[str, Any]) -> ParsedRequest:
    model = require_model(body)
    value = body.get("input")
    if value is None:
        raise missing("input")
    token_or_text_input(value, "input")
    fmt = opt_str(body, "encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise InvalidRequest(
            f"Invalid value for 'encoding_format': {fmt!r} is not 'float' or 'base64'.",
            param="encoding_format",
            code="invalid_value",
        )
    opt_int(body, "dimensions", low=1)
    if body.get("stream") is not None:
        raise InvalidRequest("Embeddings do not stream.", param="stream", code="invalid_value")
    user = opt_str(body, "user")
    return ParsedRequest(Api.EMBEDDINGS, body, model, False, user, Api.EMBEDDINGS, body)


def validate_responses(body: dict[str, Any]) -> ParsedRequest:
    model = require_model(body)
    value = body.get("input")
    if value is not None and not isinstance(value, str | list):
        raise wrong_type("input", "a string or an array of input items", value)
    opt_str(body, "instructions")
    stream = opt_bool(body, "stream")
    opt_number(body, "temperature", low=0.0, high=2.0)
    opt_number(body, "top_p", low=0.0, high=1.0)
    opt_int(body, "max_output_tokens", low=1, high=MAX_TOKENS)
    tools = opt_array(body, "tools")
    if tools:
        array_of_objects(tools, "tools")
    previous = opt_str(body, "previous_response_id")
    user = opt_str(body, "user")
    try:
        chat = responses_chat_body(body)
    except ResponsesInputError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    if previous is not None:
        return ParsedRequest(Api.RESPONSES, body, model, stream, user, Api.RESPONSES, body)
    return ParsedRequest(Api.RESPONSES, body, model, stream, user, Api.CHAT, chat)


def _anthropic_system(body: dict[str, Any]) -> None:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise wrong_type("system", "a string or an array of text blocks", system)
    for i, block in enumerate(system):
        if not isinstance(block, dict):
            raise wrong_type(f"system.{i}", "an object", block)
        if block.get("type") != "text":
            raise InvalidRequest(
                f"Invalid value for 'system.{i}.type': system blocks must be of type 'text'.",
                param=f"system.{i}.type",
            )
        if not isinstance(block.get("text"), str):
            raise wrong_type(f"system.{i}.text", "a string", block.get("text"))


def _anthropic_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise InvalidRequest("messages: at least one message is required", param="messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise wrong_type(where, "an object", message)
        role = message.get("role")
        if role is None:
            raise missing(f"{where}.role")
        if not isinstance(role, str):  # an array or object is not hashable: test it first
            raise wrong_type(f"{where}.role", "a string", role)
        if role not in ANTHROPIC_ROLES:
            raise InvalidRequest(
                f"Invalid value for '{where}.role': {role!r} is not 'user' or 'assistant'.", param=f"{where}.role"
            )
        content = message.get("content")
        if content is None:
            raise missing(f"{where}.content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise wrong_type(f"{where}.content.{j}", "a content block object with a 'type'", block)
        elif not isinstance(content, str):
            raise wrong_type(f"{where}.content", "a string or an array of content blocks", content)


def validate_messages(body: dict[str, Any]) -> ParsedRequest:
    model = require_model(body)
    if body.get("max_tokens") is None:
        raise missing("max_tokens")
    opt_int(body, "max_tokens", low=1, high=MAX_TOKENS)
    _anthropic_messages(body)
    _anthropic_system(body)
    stream = opt_bool(body, "stream")
    opt_number(body, "temperature", low=0.0, high=1.0)
    opt_number(body, "top_p", low=0.0, high=1.0)
    opt_int(body, "top_k", low=0)
    stops = opt_array(body, "stop_sequences")
    for i, item in enumerate(stops or ()):
        if not isinstance(item, str):
            raise wrong_type(f"stop_sequences.{i}", "a string", item)
    tools = opt_array(body, "tools")
    if tools:
        array_of_objects(tools, "tools")
    opt_object(body, "tool_choice")
    opt_object(body, "cache_control")
    metadata = opt_object(body, "metadata")
    user = opt_str(metadata, "user_id", "metadata.user_id") if metadata else None
    return ParsedRequest(Api.MESSAGES, body, model, stream, user, Api.MESSAGES, body)


VALIDATORS: dict[Api, Callable[[dict[str, Any]], ParsedRequest]] = {
    Api.CHAT: validate_chat,
    Api.COMPLETIONS: validate_completions,
    Api.EMBEDDINGS: validate_embeddings,
    Api.RESPONSES: validate_responses,
    Api.MESSAGES: validate_messages,
}


def parse_request(api: Api, raw: bytes) -> ParsedRequest:
    return VALIDATORS[api](parse_json_object(raw))


def conversation_start(request: ParsedRequest) -> bool:
    """A chat request with no earlier answer in it: the first turn of a conversation. Its
    backend is where the whole conversation will live, so the KV cost model places it for
    balance rather than following a shared system prompt (docs/kv-scorer.md). OpenAI chat,
    Anthropic messages and Responses input items carry turns; every other API says False."""
    if request.key_api is not Api.CHAT and request.key_api is not Api.MESSAGES:
        return False
    messages = request.key_body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    return not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)


def prompt_token_ids(request: ParsedRequest) -> list[int] | None:
    """The token ids of a completions request whose `prompt` is one array of them (validated:
    when the first item is an integer token id, every item is), else None. Such a prompt has no
    text to anchor a prefix key, but its ids are exactly what the engine hashes into blocks, so
    the KV selector matches it without any tokenizer (docs/kv-scorer.md)."""
    if request.api is not Api.COMPLETIONS:
        return None
    prompt = request.body.get("prompt")
    if isinstance(prompt, list) and prompt and is_int(prompt[0]):
        return prompt
    return None
