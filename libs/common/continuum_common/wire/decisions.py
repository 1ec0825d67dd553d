"""Routing decisions shared between ingress replicas (core NATS, subject
`continuum.kv.decisions.<replica>`; every replica subscribes to `continuum.kv.decisions.*` and
skips its own subject without decoding it).

Each replica publishes, for every request it routes with the KV scorer, the chain of keys it
sent and where; every other replica records it as if it had routed the request itself
(approximate records, precise-mode speculative entries), so N replicas keep conversations
together as one router would. Fire and forget: a lost message costs at most one less sticky
decision. msgpack via msgspec, a tagged array:

    [replica, group, backend, kind, ts, keys, new_tokens]

`kind` 0 = speculative block entry (precise mode), 1 = approximate chunk record, 2 = what an
answer added to a conversation routed in approximate mode (recorded as 1, but not a request:
no demand; replicas that predate it drop it as undecodable, counted). `new_tokens` is the
uncached prompt the backend was given (the replicas' shared view of recent demand).

On their own subject, `continuum.kv.tokenized.<replica>`, replicas without a local tokenizer
share what an engine's `/tokenize` answered, so a turn that lands on another replica than the
one that asked is matched without a call on its path either (a separate subject: replicas that
do not know the message never receive it). Again a tagged array:

    [replica, group, kind, digest, chain, tokens, nbytes, chunks]

`kind` 0 = a chat message prefix (`digest`: its conversation digest), 1 = a completion prompt
(`digest`: the digest of its text, `chunks`: the chained hashes of its text chunks). `chain` is
the block hashes of the tokenization, `tokens` its length, `nbytes` the size of what it covered.
Digests and hashes only: no text and no token ids go on the bus.

The JetStream stream `CONTINUUM_KV_ROUTES` (`HISTORY_STREAM`) captures both subjects, so an
ingress process that starts replays what the replicas shared before it (the publishers still
publish on core NATS; a stream that does not exist changes nothing for them).
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from continuum_common.errors import ContinuumError
from continuum_common.wire.codec import StructCodec

SUBJECT_PREFIX: Final = "continuum.kv.decisions."
SUBJECT_WILDCARD: Final = "continuum.kv.decisions.*"
TOKENIZED_PREFIX: Final = "continuum.kv.tokenized."
TOKENIZED_WILDCARD: Final = "continuum.kv.tokenized.*"
HISTORY_STREAM: Final = "CONTINUUM_KV_ROUTES"
HISTORY_SUBJECTS: Final = (SUBJECT_WILDCARD, TOKENIZED_WILDCARD)
KIND_SPECULATIVE: Final = 0
KIND_APPROXIMATE: Final = 1
KIND_ANSWER: Final = 2
KIND_CHAT: Final = 0
KIND_TEXT: Final = 1
MAX_KEYS: Final = 1 << 17
MAX_CHUNKS: Final = 1 << 16

_U64 = Annotated[int, msgspec.Meta(ge=0)]


_REPLICA_RE = re.compile(r"[^A-Za-z0-9_-]")


def replica_id(host: str, pid: int, nonce: str) -> str:
    """A replica's id: safe as a NATS subject token."""
    return _REPLICA_RE.sub("_", f"{host}-{pid}-{nonce}")[:120]


def subject_for(replica: str) -> str:
    return SUBJECT_PREFIX + replica


def tokenized_subject_for(replica: str) -> str:
    return TOKENIZED_PREFIX + replica


class DecisionDecodeError(ContinuumError, ValueError):
    """A decision message that cannot be used (counted and dropped)."""


class Decision(msgspec.Struct, array_like=True, frozen=True):
    replica: str
    group: str
    backend: str
    kind: Annotated[int, msgspec.Meta(ge=0, le=KIND_ANSWER)]
    ts: float
    keys: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)]
    new_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    # the request opened a conversation (older senders leave it out: False)
    start: bool = False


_codec = StructCodec(Decision, DecisionDecodeError, "decision")
encode_decision = _codec.encode
decode_decision = _codec.decode


class Tokenized(msgspec.Struct, array_like=True, frozen=True):
    replica: str
    group: str
    kind: Annotated[int, msgspec.Meta(ge=0, le=1)]
    digest: Annotated[bytes, msgspec.Meta(min_length=1, max_length=64)]
    chain: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)]
    tokens: Annotated[int, msgspec.Meta(ge=0)]
    nbytes: Annotated[int, msgspec.Meta(ge=0)]
    chunks: Annotated[list[_U64], msgspec.Meta(max_length=MAX_CHUNKS)] = []


_tokenized_codec = StructCodec(Tokenized, DecisionDecodeError, "tokenization")
encode_tokenized = _tokenized_codec.encode
decode_tokenized = _tokenized_codec.decode
