"""Shared hypothesis strategies of the fuzz suite: hostile JSON values, near-valid request bodies
of every client API with mutated fields, and ways to cut a byte stream into chunks."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson
from hypothesis import settings
from hypothesis import strategies as st

FUZZ = settings.get_profile("continuum-fuzz")


def fuzz_settings(share: float = 1.0) -> settings:
    """The suite's profile with `share` of its examples (heavier tests take fewer)."""
    return settings(FUZZ, max_examples=max(5, int(FUZZ.max_examples * share)))


# -- JSON values ------------------------------------------------------------------------------

# Values a validator must treat with care: int/bool confusion, the edges of the 32- and 64-bit
# ranges, integers beyond 64 bits (orjson reads them as floats), negative and fractional counts.
EDGE_NUMBERS = [0, -1, 1, 2, 127, 128, 255, 256, 2**16, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
                2**64 - 1, 2**64, 10**30, -(2**63), -(2**64), 0.5, -0.0, 1e308, -1e308, 5e-324, 1.0, 2.0000001]  # fmt: skip
EDGE_TEXT = ["", " ", "\x00", "\u0000m", "m\u200b", "\u202egnp.exe", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "é", "\ufeff", "\\", '"', "\n\r",
             "data: [DONE]\n\n", "user", "assistant", "system", "text", "m", "GPU", "a" * 3000, "🙂" * 200]  # fmt: skip

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from(EDGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=24),
    st.sampled_from(EDGE_TEXT),
)


def json_values(max_leaves: int = 20) -> st.SearchStrategy[Any]:
    return st.recursive(
        json_scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
        max_leaves=max_leaves,
    )


@dataclass(frozen=True, slots=True)
class Deep:
    """`depth` nested arrays (or objects) around 1: deep enough to hit a parser's or encoder's
    recursion limit. A leaf for the mutators; `dump_json` writes it out without recursing."""

    depth: int
    as_object: bool = False

    def text(self) -> bytes:
        opening, closing = (b'{"a":', b"}") if self.as_object else (b"[", b"]")
        return opening * self.depth + b"1" + closing * self.depth


hostile_values = st.one_of(
    json_scalars,
    json_values(),
    st.builds(Deep, st.integers(min_value=1, max_value=1100), st.booleans()),
    st.builds(Deep, st.sampled_from([254, 255, 256, 511, 512, 1023, 1024, 1025]), st.booleans()),
)


def dump_json(value: Any) -> bytes:
    """JSON text for `value`: Deep values spelled out, integers beyond 64 bits (which orjson
    cannot write) through the standard library."""
    deep: list[Deep] = []

    def swap(node: Any) -> Any:
        if isinstance(node, Deep):
            deep.append(node)
            return f"\x01deep{len(deep) - 1}\x01"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    plain = swap(value)
    try:
        text = orjson.dumps(plain)
    except (TypeError, orjson.JSONEncodeError):
        text = json.dumps(plain).encode()
    for i, node in enumerate(deep):
        text = text.replace(b'"\\u0001deep%d\\u0001"' % i, node.text())
    return text


# -- near-valid request bodies ------------------------------------------------------------------

MODEL = "m"  # served by an OpenAI-compatible backend, on every API
CLAUDE = "claude"  # served by an Anthropic backend (messages only)
texts = st.one_of(st.text(max_size=40), st.sampled_from(EDGE_TEXT))
token_ids = st.integers(min_value=0, max_value=2**31 - 1)


_openai_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries({"url": st.just("data:image/png;base64,AA==")}),
        }
    ),
)
_chat_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]),
        "content": st.one_of(texts, st.lists(_openai_part, max_size=3), st.none()),
    },
    optional={"name": texts, "tool_call_id": texts},
)
_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"])})}
)
_sampling = {
    "temperature": st.floats(min_value=0.0, max_value=2.0),
    "top_p": st.floats(min_value=0.0, max_value=1.0),
    "presence_penalty": st.floats(min_value=-2.0, max_value=2.0),
    "n": st.integers(min_value=1, max_value=4),
    "seed": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "stop": st.one_of(texts, st.lists(texts, max_size=3)),
    "user": texts,
    "stream": st.booleans(),
    "cache_salt": texts,
}

chat_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(_chat_message, min_size=1, max_size=4)},
    optional={
        **_sampling,
        "max_tokens": st.integers(min_value=1, max_value=4096),
        "max_completion_tokens": st.integers(min_value=1, max_value=4096),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(min_value=0, max_value=20),
        "tools": st.lists(_tool, max_size=2),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), _tool),
        "response_format": st.just({"type": "json_object"}),
        "stream_options": st.just({"include_usage": True}),
        "logit_bias": st.dictionaries(st.sampled_from(["1", "2"]), st.integers(-100, 100), max_size=2),
    },
)
_prompt = st.one_of(
    texts,
    st.lists(texts, min_size=1, max_size=3),
    st.lists(token_ids, min_size=1, max_size=8),
    st.lists(st.lists(token_ids, min_size=1, max_size=4), min_size=1, max_size=3),
)
completion_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": _prompt},
    optional={
        **_sampling,
        "max_tokens": st.integers(min_value=0, max_value=4096),
        "echo": st.booleans(),
        "best_of": st.integers(min_value=1, max_value=4),
        "logprobs": st.integers(min_value=0, max_value=5),
        "suffix": texts,
    },
)
embedding_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "input": _prompt},
    optional={
        "encoding_format": st.sampled_from(["float", "base64"]),
        "dimensions": st.integers(min_value=1, max_value=4096),
        "user": texts,
    },
)
response_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL)},
    optional={
        "input": st.one_of(texts, st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": texts}))),
        "instructions": texts,
        "stream": st.booleans(),
        "temperature": st.floats(min_value=0.0, max_value=2.0),
        "max_output_tokens": st.integers(min_value=1, max_value=4096),
        "tools": st.lists(_tool, max_size=2),
        "previous_response_id": texts,
        "user": texts,
    },
)
_anthropic_block = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("text"), "text": texts}, optional={"cache_control": st.just({"type": "ephemeral"})}
    ),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": texts, "content": texts}),
)
message_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from([MODEL, CLAUDE]),
        "max_tokens": st.integers(min_value=1, max_value=4096),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant"]),
                    "content": st.one_of(texts, st.lists(_anthropic_block, max_size=3)),
                }
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "system": st.one_of(
            texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2)
        ),
        "stream": st.booleans(),
        "temperature": st.floats(min_value=0.0, max_value=1.0),
        "top_k": st.integers(min_value=0, max_value=500),
        "stop_sequences": st.lists(texts, max_size=3),
        "metadata": st.fixed_dictionaries({}, optional={"user_id": texts}),
        "tools": st.lists(st.fixed_dictionaries({"name": texts, "input_schema": st.just({"type": "object"})})),
        "tool_choice": st.just({"type": "auto"}),
    },
)

# A field name a mutation may add: the known fields of every API and a few strangers.
FIELD_NAMES = ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n", "best_of", "stream",
               "temperature", "top_p", "top_k", "stop", "stop_sequences", "tools", "tool_choice", "system", "metadata",
               "user", "logprobs", "top_logprobs", "seed", "response_format", "stream_options", "logit_bias",
               "encoding_format", "dimensions", "instructions", "max_output_tokens", "role", "content", "type", "text",
               "cache_control", "cache_salt", "extra_body", "google", "__proto__", "", "\x00"]  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value (the root is the empty path)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Callable[[Any], Any]) -> Any:
    if not path:
        return new(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


_DELETE = object()


def _drop_deleted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_deleted(v) for k, v in value.items() if v is not _DELETE}
    if isinstance(value, list):
        return [_drop_deleted(v) for v in value if v is not _DELETE]
    return value


@st.composite
def mutated(
    draw: st.DrawFn,
    bodies: st.SearchStrategy[Any],
    max_mutations: int = 3,
    *,
    hostile: st.SearchStrategy[Any] = hostile_values,
    names: list[str] = FIELD_NAMES,
) -> Any:
    """A value from `bodies` with up to `max_mutations` changes: a value replaced by a hostile
    one (wrong type, huge, negative, unicode, deep nesting), a key or an element deleted, or a
    key (from `names`) added."""
    body: Any = draw(bodies)
    for _ in range(draw(st.integers(min_value=0, max_value=max_mutations))):
        path = draw(st.sampled_from(_paths(body)))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace" or (not path and action == "delete"):
            replacement = draw(hostile)
            body = _replace(body, path, lambda _old, r=replacement: r)
        elif action == "delete":
            body = _drop_deleted(_replace(body, path, lambda _old: _DELETE))
        else:
            key, extra = draw(st.sampled_from(names)), draw(hostile)
            body = _replace(body, path, lambda old, k=key, x=extra: {**old, k: x} if isinstance(old, dict) else old)
    return body


# -- msgpack ------------------------------------------------------------------------------------

# What msgpack can carry that JSON cannot: raw bytes, NaN and infinities, the full int64/uint64
# range (nothing beyond), and non-string map keys.
msgpack_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([n for n in EDGE_NUMBERS if not isinstance(n, int) or -(2**63) <= n < 2**64]),
    st.floats(),
    st.text(max_size=16),
    st.sampled_from(EDGE_TEXT),
    st.binary(max_size=70),
)
msgpack_hostile = st.one_of(
    msgpack_scalars,
    st.recursive(
        msgpack_scalars,
        lambda inner: (
            st.lists(inner, max_size=5)
            | st.dictionaries(st.text(max_size=10) | st.integers(-5, 5) | st.binary(max_size=4), inner, max_size=5)
        ),
        max_leaves=16,
    ),
    st.builds(Deep, st.integers(min_value=1, max_value=1100), st.booleans()),
    st.builds(Deep, st.sampled_from([511, 512, 513, 1023, 1024, 1025, 2000]), st.booleans()),
)


def pack_msgpack(value: Any) -> bytes:
    """msgpack for `value`, Deep values spelled out (the packer itself refuses deep nesting)."""
    deep: list[Deep] = []

    def swap(node: Any) -> Any:
        if isinstance(node, Deep):
            deep.append(node)
            return f"\x01deep{len(deep) - 1}\x01"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    packed: bytes = msgpack.packb(swap(value), use_bin_type=True)
    for i, node in enumerate(deep):
        marker: bytes = msgpack.packb(f"\x01deep{i}\x01")
        opening = b"\x81\xa1a" if node.as_object else b"\x91"
        packed = packed.replace(marker, opening * node.depth + b"\x01")
    return packed


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` truncated, with bits flipped, bytes inserted or a range deleted."""
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "append"]))
    if how == "truncate" or not data:
        return data[: draw(st.integers(min_value=0, max_value=len(data)))]
    at = draw(st.integers(min_value=0, max_value=len(data) - 1))
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            out[draw(st.integers(min_value=0, max_value=len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=9)) + data[at:]
    if how == "delete":
        return data[:at] + data[at + draw(st.integers(min_value=1, max_value=16)) :]
    return data + draw(st.binary(min_size=1, max_size=9))


# -- chunking -----------------------------------------------------------------------------------


@st.composite
def chunkings(draw: st.DrawFn, data: bytes, max_cuts: int = 24) -> list[bytes]:
    """`data` cut at random places (single bytes and empty chunks included)."""
    if not data:
        return [data]
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=len(data)), max_size=max_cuts)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


line_ends = st.sampled_from([b"\n", b"\r", b"\r\n"])
