"""Validation of request bodies (pure): OpenAI chat/completions, Anthropic messages, tokenize,
detokenize and embeddings, following vLLM's rules and messages where it has them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from continuum_sim.errors import InvalidRequest, ModelNotFound
from continuum_sim.protocol.chat_template import ChatMessage, parse_messages

_MAX_TOKEN_ID = (1 << 63) - 1


@dataclass(frozen=True)
class GenerateParams:
    model: str
    max_tokens: int | None
    stream: bool
    include_usage: bool
    cache_salt: str | None
    seed: int | None
    # vLLM's `return_token_ids`: the prompt's ids (first chunk) and each chunk's output ids
    token_ids: bool = False


def int_field(body: Mapping[str, Any], name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer", param=name)
    if value < minimum:
        raise InvalidRequest(f"'{name}' must be at least {minimum}, got {value}.", param=name)
    return value


def cache_salt_field(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    return salt


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=name)
    return value


def resolve_model(body: Mapping[str, Any], served: Sequence[str]) -> str:
    model = body.get("model")
    if model is None:
        return served[0]
    if not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", param="model")
    if model not in served:
        raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
    return model


def generate_params(body: Mapping[str, Any], served: Sequence[str], *, anthropic: bool = False) -> GenerateParams:
    model = resolve_model(body, served)
    if anthropic:
        max_tokens = int_field(body, "max_tokens", minimum=1)
        if max_tokens is None:
            raise InvalidRequest("max_tokens: Field required", param="max_tokens")
    else:
        max_tokens = int_field(body, "max_completion_tokens", minimum=1)
        if max_tokens is None:
            max_tokens = int_field(body, "max_tokens", minimum=1)
    n = int_field(body, "n", minimum=1)
    if n not in (None, 1):
        raise InvalidRequest("The simulator supports n=1 only.", param="n")
    stream = bool_field(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise InvalidRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
        if not isinstance(options, Mapping):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        include_usage = bool_field(options, "include_usage", False)
    salt = cache_salt_field(body)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest("'seed' must be an integer", param="seed")
    token_ids = bool_field(body, "return_token_ids", False) if not anthropic else False
    return GenerateParams(model, max_tokens, stream, include_usage, salt, seed, token_ids)


def chat_messages(body: Mapping[str, Any]) -> list[ChatMessage]:
    return parse_messages(body.get("messages"))


def anthropic_messages(body: Mapping[str, Any]) -> list[ChatMessage]:
    return parse_messages(body.get("messages"), system=body.get("system"))


def completion_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """A completions `prompt`: a string, a one-element list of strings, or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise InvalidRequest(
        "'prompt' must be a string, a list with one string, or a list of token ids (batches are not supported)",
        param="prompt",
    )


@dataclass(frozen=True)
class TokenizeRequest:
    text: str | None
    messages: list[ChatMessage] | None
    add_generation_prompt: bool
    continue_final_message: bool
    return_token_strs: bool
    add_special_tokens: bool = False


def tokenize_request(body: Mapping[str, Any]) -> TokenizeRequest:
    """vLLM's completion form `{prompt}` or chat form `{messages}` (spec §1.9)."""
    strs = bool_field(body, "return_token_strs", False)
    if "messages" in body:
        gen = bool_field(body, "add_generation_prompt", True)
        cont = bool_field(body, "continue_final_message", False)
        if gen and cont:
            raise InvalidRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        special = bool_field(body, "add_special_tokens", False)
        return TokenizeRequest(None, chat_messages(body), gen, cont, strs, special)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("'prompt' (string) or 'messages' (array) is required", param="prompt")
    special = bool_field(body, "add_special_tokens", True)
    return TokenizeRequest(prompt, None, False, False, strs, special)


def detokenize_tokens(body: Mapping[str, Any], vocab_size: int) -> list[int]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise InvalidRequest("'tokens' must be an array of integers", param="tokens")
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequest(f"tokens[{index}] must be an integer", param="tokens")
        if not 0 <= token <= _MAX_TOKEN_ID:
            raise InvalidRequest(f"tokens[{index}] must be between 0 and 2^63-1, got {token}", param="tokens")
        if token >= vocab_size:
            raise InvalidRequest(f"Token id {token} is out of vocabulary (size {vocab_size})", param="tokens")
    return tokens


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str | list[int]]
    encoding_format: str
    dimensions: int | None


def embedding_request(body: Mapping[str, Any], served: Sequence[str], max_dim: int) -> EmbeddingRequest:
    model = resolve_model(body, served)
    raw = body.get("input")
    inputs: list[str | list[int]]
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        inputs = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        inputs = [list(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        inputs = [list(x) for x in raw]
        if not all(isinstance(t, int) and not isinstance(t, bool) for x in inputs for t in x):
            raise InvalidRequest("'input' token arrays must hold integers", param="input")
    else:
        raise InvalidRequest("'input' must be a string, an array of strings or token arrays", param="input")
    if len(inputs) > 2048:
        raise InvalidRequest("'input' holds more than 2048 items", param="input")
    fmt = body.get("encoding_format", "float") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    dims = int_field(body, "dimensions", minimum=1)
    if dims is not None and dims > max_dim:
        raise InvalidRequest(f"'dimensions' must be at most {max_dim}", param="dimensions")
    return EmbeddingRequest(model, inputs, fmt, dims)
