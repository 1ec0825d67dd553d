"""`PromptEncoder`: a prompt text → its token count and the engine block hashes of its full
blocks, tokenizing and hashing only what it has not seen (docs/hashing.md, "Precise-mode
request encoding").

    encoder = PromptEncoder(LocalTokenizer(...), make_block_hasher("vllm", 16, hash_seed="0"))
    prompt = encoder.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    prompt.token_count, prompt.block_hashes   # u64s, the chain the block index is queried with

The text is cut into pieces (pieces.py). The encoder keeps a tree of **chain nodes**: the node
for piece k under parent node p holds what hashing the prompt up to the end of piece k left:
the token count, the wire hashes of the blocks completed inside piece k, the digest of the last
full block and the tokens of the unfinished block. A request walks the tree from the root of its
(add_special_tokens, cache_salt, lora_name) chain while its pieces are known; the first unknown
piece and everything after it are tokenized (chunks.py, one tokenizer pass) and hashed from the
last known node on. A conversation's next turn thus costs the splitting of its text, one
dictionary probe per known piece and the tokenizing and hashing of the new turn only.
`begin(text)` walks the known start the same way and leaves the rest to be encoded later, as
far as the caller needs it (`PartialPrompt`); `encode` is `begin(...).finish()`.

Memory is bounded: nodes (and whole-text results) in an LRU by bytes, word chunks in a
two-generation cache (together `max_cache_bytes`). Everything is synchronous, pure CPU and
single-threaded; errors are TokenizationError. When the tokenizer cannot be run piece by piece
(support.py), texts are tokenized whole and the result is cached by the whole text.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
from array import array
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeGuard

from continuum_common.hashing.blocks import BlockHasher, BlockHashError
from continuum_common.tokenization.cache import ByteLRU
from continuum_common.tokenization.chunks import ChunkStats, ChunkTokenizer, PieceMismatch
from continuum_common.tokenization.errors import TokenizationError
from continuum_common.tokenization.local import LocalTokenizer
from continuum_common.tokenization.pieces import Piece, TextSplitter
from continuum_common.tokenization.support import PiecewiseSupport, check_piecewise

log = logging.getLogger("continuum.tokenization")

_SUFFIX = ("\x00suffix",)
_NODE_OVERHEAD = 200  # bytes of a node object, its key tuple and the LRU slot, roughly


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    token_count: int
    block_hashes: list[int]  # wire u64 of every full block, in chain order


@dataclass(slots=True)
class EncoderStats:
    requests: int = 0
    node_hits: int = 0  # pieces answered by a cached chain node
    node_misses: int = 0  # pieces tokenized and hashed
    hashed_blocks: int = 0
    whole_text: int = 0  # requests tokenized whole (tokenizer not piecewise-safe)
    whole_text_hits: int = 0
    fallbacks: int = 0  # piecewise requests redone whole after a tokenizer surprise
    hash_seconds: float = 0.0
    chunks: ChunkStats = field(default_factory=ChunkStats)

    @property
    def tokenize_seconds(self) -> float:
        return self.chunks.tokenize_seconds

    @property
    def tokenizer_calls(self) -> int:
        return self.chunks.tokenizer_calls


# A chain node is a flat tuple of ints and bytes rather than an object holding lists: CPython's
# cyclic collector stops tracking a tuple whose items it does not track, at the first collection
# the tuple survives. The tens of thousands of cached nodes then cost the collector nothing,
# where node objects holding lists were walked, with every id in those lists, by each collection
# of an older generation (40–100 ms pauses of the ingress's event loop once the cache had
# filled). Ids and hashes are packed as u64 bytes, not tuples: a collection untracks only one
# level of nested tuples, so nested ones would linger into the older generations. Cache keys
# are flat tuples for the same reason.
_Node = tuple[int, int, int, bytes | None, bytes, bytes]
_ID: Final = 0
_COUNT: Final = 1  # tokens up to here
_BLOCKS: Final = 2  # full blocks up to here
_LAST: Final = 3  # digest of the last full block (None: none yet)
_TAIL: Final = 4  # tokens of the unfinished block, packed u64
_WIRE: Final = 5  # wire hashes of the blocks completed in this node's piece, packed u64
_EMPTY: _Node = (0, 0, 0, None, b"", b"")
_U64: Final = "Q"

_Whole = tuple[int, bytes]  # a whole text's token count and block hashes (packed u64)


def _piece_key(parent: _Node, piece: Piece | tuple[str] | None) -> Hashable:
    assert piece is not None, "a piece without a key of its own"
    return (parent[_ID], *piece)


def _is_node(value: object) -> TypeGuard[_Node]:
    return type(value) is tuple and len(value) == 6


def _is_whole(value: object) -> TypeGuard[_Whole]:
    return type(value) is tuple and len(value) == 2


class PromptEncoder:
    def __init__(
        self,
        tokenizer: LocalTokenizer,
        hasher: BlockHasher,
        *,
        max_cache_bytes: int = 64 << 20,
        piece_chars: int = 1024,
    ) -> None:
        self.tokenizer = tokenizer
        self.hasher = hasher
        self.stats = EncoderStats()
        self._splitter = TextSplitter(tokenizer.added_tokens, piece_chars)
        self._chunks = ChunkTokenizer(tokenizer, max_cache_bytes // 4, self.stats.chunks)
        self._nodes: ByteLRU[Hashable, object] = ByteLRU(max_cache_bytes - max_cache_bytes // 4)
        self._ids = itertools.count(1)
        probe = ChunkTokenizer(tokenizer, 1 << 20)
        self.support: PiecewiseSupport = check_piecewise(tokenizer, lambda text: _flat(probe, self._splitter, text))
        if not self.support.ok:
            log.warning(
                "tokenizer %s: piece-by-piece encoding is off (%s); every prompt is tokenized whole",
                tokenizer.path.name,
                self.support.reason,
            )

    @property
    def piecewise(self) -> bool:
        return self.support.ok

    @property
    def cache_bytes(self) -> int:
        return self._nodes.bytes + self._chunks.cache_bytes

    def clear(self) -> None:
        """Forget every cached node, result and chunk."""
        self._nodes.clear()
        self._chunks.clear()

    def encode(
        self,
        text: str,
        *,
        add_special_tokens: bool,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> EncodedPrompt:
        """Token count and block hashes of `text` as the engine will see it; TokenizationError
        when it cannot be computed (the caller falls back)."""
        prompt = self.begin(text, add_special_tokens=add_special_tokens, cache_salt=cache_salt, lora_name=lora_name)
        return prompt.finish()

    def begin(
        self,
        text: str,
        *,
        add_special_tokens: bool,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> PartialPrompt:
        """Start encoding `text` lazily: what the cache knows of its start is taken at once
        (no tokenizing), the rest only as `PartialPrompt.extend` / `finish` ask for it. A
        router needs no more of a prompt than some engine holds, and nothing holds text
        never seen before. TokenizationError as `encode`."""
        if not isinstance(text, str):
            raise TokenizationError("the prompt must be a string")
        self.stats.requests += 1
        options = (add_special_tokens, cache_salt, lora_name)
        with _hash_errors():
            if not self.support.ok:  # whole texts only: nothing to take lazily
                whole = self._encode_whole(text, add_special_tokens, cache_salt, lora_name)
                return PartialPrompt(self, text, [], None, options, result=whole)
            pieces = self._splitter.pieces(text)
            node = self._root(add_special_tokens, cache_salt, lora_name)
        return PartialPrompt(self, text, pieces, node, options)

    # -- piecewise ------------------------------------------------------------------------------

    def _root(self, add_special: bool, salt: str | None, lora: str | None) -> _Node:
        key = ("\x00root", add_special, salt, lora)
        root = self._nodes.get(key)
        if _is_node(root):
            return root
        prefix = list(self.support.prefix_ids) if add_special else []
        return self._extend(_EMPTY, [None], [key], [prefix], salt=salt, lora=lora, hashes=[])

    def _extend(
        self,
        parent: _Node,
        pieces: Sequence[Piece | tuple[str] | None],
        keys: Sequence[Hashable],
        id_lists: Sequence[list[int]],
        *,
        salt: str | None,
        lora: str | None,
        hashes: list[int],
    ) -> _Node:
        """Chain nodes for consecutive pieces under `parent`, hashed in one pass (appends their
        wire hashes to `hashes`); a None key means the usual flat (parent id, *piece) key."""
        tokens = array(_U64, parent[_TAIL]).tolist()
        tokens += itertools.chain.from_iterable(id_lists)
        started = time.perf_counter()
        digests = self.hasher.chain(
            tokens, parent=parent[_LAST], start_block=parent[_BLOCKS], cache_salt=salt, lora_name=lora
        )
        wires = [self.hasher.wire(d) for d in digests]
        self.stats.hash_seconds += time.perf_counter() - started
        self.stats.hashed_blocks += len(digests)
        size, node = self.hasher.block_size, parent
        end, done = len(parent[_TAIL]) // 8, 0  # tokens consumed, blocks handed out so far
        for piece, key, ids in zip(pieces, keys, id_lists, strict=True):
            end += len(ids)
            full = end // size
            wire = wires[done:full]
            tail = array(_U64, tokens[full * size : end]).tobytes()
            last = digests[full - 1] if full else parent[_LAST]
            child: _Node = (
                next(self._ids),
                node[_COUNT] + len(ids),
                parent[_BLOCKS] + full,
                last,
                tail,
                array(_U64, wire).tobytes(),
            )
            hashes += wire
            text_bytes = sys.getsizeof(piece[-1]) if piece else 0
            cost = _NODE_OVERHEAD + text_bytes + 40 * len(wire) + len(tail)
            self._nodes.put(key if key is not None else _piece_key(node, piece), child, cost)
            node, done = child, full
        return node

    # -- whole text -----------------------------------------------------------------------------

    def _encode_whole(self, text: str, add_special: bool, salt: str | None, lora: str | None) -> EncodedPrompt:
        self.stats.whole_text += 1
        key = ("\x00whole", add_special, salt, lora, text)
        cached = self._nodes.get(key)
        if _is_whole(cached):
            self.stats.whole_text_hits += 1
            return EncodedPrompt(cached[0], array(_U64, cached[1]).tolist())
        chunk_stats = self.stats.chunks
        started = time.perf_counter()
        ids = self.tokenizer.encode(text, add_special_tokens=add_special)
        chunk_stats.tokenize_seconds += time.perf_counter() - started
        chunk_stats.tokenizer_calls += 1
        chunk_stats.tokenized_chars += len(text)
        started = time.perf_counter()
        digests = self.hasher.chain(ids, cache_salt=salt, lora_name=lora)
        self.stats.hash_seconds += time.perf_counter() - started
        self.stats.hashed_blocks += len(digests)
        result = EncodedPrompt(len(ids), [self.hasher.wire(d) for d in digests])
        stored: _Whole = (result.token_count, array(_U64, result.block_hashes).tobytes())
        self._nodes.put(key, stored, _NODE_OVERHEAD + sys.getsizeof(text) + 8 * len(digests))
        return result


@contextlib.contextmanager
def _hash_errors() -> Iterator[None]:
    """A block hasher's refusal, as the TokenizationError callers fall back on."""
    try:
        yield
    except BlockHashError as exc:
        raise TokenizationError(f"cannot hash the prompt's blocks: {exc}") from None
    except OverflowError:  # an id past a full block that does not fit the node's packed u64
        raise TokenizationError("cannot hash the prompt's blocks: token ids must be in [0, 2**64)") from None


class PartialPrompt:
    """A prompt encoded as far as asked (`PromptEncoder.begin`): `block_hashes` and
    `token_count` cover its first `chars_done` characters; `estimated_tokens` extrapolates the
    rest. `extend(pieces)` encodes that many more pieces (about `piece_chars` each), `finish()`
    the whole prompt, which gives exactly what `PromptEncoder.encode` gives. Not thread-safe;
    meant to be finished soon (it holds the text)."""

    __slots__ = ("_done_pieces", "_encoder", "_node", "_options", "_pieces", "_result", "block_hashes", "chars_done",
                 "text", "token_count")  # fmt: skip

    def __init__(
        self,
        encoder: PromptEncoder,
        text: str,
        pieces: list[Piece],
        root: _Node | None,
        options: tuple[bool, str | None, str | None],
        *,
        result: EncodedPrompt | None = None,
    ) -> None:
        """`root` and the `pieces` under it to walk; or `result`, already whole (a tokenizer
        that cannot work piece by piece)."""
        self._encoder = encoder
        self.text = text
        self._pieces = pieces
        self._options = options
        self._result: EncodedPrompt | None = None
        self.block_hashes: list[int] = []
        self.token_count = 0
        self.chars_done = 0
        self._node = root if root is not None else _EMPTY
        self._done_pieces = 0
        if result is not None:
            self._finished(result)
        else:
            self._walk_known()

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def estimated_tokens(self) -> int:
        """The whole prompt's tokens: exact once done, else the encoded part's tokens per
        character carried over the rest (at least one token per four characters unknown)."""
        if self._result is not None:
            return self._result.token_count
        rest = len(self.text) - self.chars_done
        per_char = self.token_count / self.chars_done if self.chars_done else 0.25
        return self.token_count + max(1, round(rest * per_char))

    def _walk_known(self) -> None:
        nodes = self._encoder._nodes
        node, known = self._node, 0
        wires: list[bytes] = []
        for piece in self._pieces:
            child = nodes.get((node[_ID], *piece))
            if not _is_node(child):
                break
            wires.append(child[_WIRE])
            self.chars_done += len(piece[1])
            node = child
            known += 1
        self.block_hashes += array(_U64, b"".join(wires)).tolist()
        self._encoder.stats.node_hits += known
        self._node, self._done_pieces = node, known
        self.token_count = node[_COUNT]
        if known == len(self._pieces):
            self._finish_suffix()

    def extend(self, pieces: int) -> None:
        """Encode up to `pieces` more pieces (the last ones finish the prompt)."""
        if self._result is not None or pieces <= 0:
            return
        missing = self._pieces[self._done_pieces : self._done_pieces + pieces]
        encoder = self._encoder
        encoder.stats.node_misses += len(missing)
        _, salt, lora = self._options
        try:
            ids = encoder._chunks.encode_pieces(missing)
            with _hash_errors():
                self._node = encoder._extend(
                    self._node, missing, [None] * len(missing), ids, salt=salt, lora=lora, hashes=self.block_hashes
                )
        except PieceMismatch:
            encoder.stats.fallbacks += 1
            self._whole()
            return
        self.chars_done += sum(len(piece[1]) for piece in missing)
        self.token_count = self._node[_COUNT]
        self._done_pieces += len(missing)
        if self._done_pieces == len(self._pieces):
            self._finish_suffix()

    def finish(self) -> EncodedPrompt:
        """The whole prompt's token count and block hashes (as `PromptEncoder.encode`)."""
        while self._result is None:
            self.extend(len(self._pieces) - self._done_pieces)
        return self._result

    def _finish_suffix(self) -> None:
        add_special, salt, lora = self._options
        encoder, node = self._encoder, self._node
        suffix = encoder.support.suffix_ids
        hashes = self.block_hashes
        if add_special and suffix:
            cached = encoder._nodes.get((node[_ID], *_SUFFIX))
            if _is_node(cached):
                node = cached
                hashes += array(_U64, node[_WIRE]).tolist()
            else:
                with _hash_errors():
                    node = encoder._extend(node, [_SUFFIX], [None], [list(suffix)], salt=salt, lora=lora, hashes=hashes)
        self._node = node
        self._finished(EncodedPrompt(node[_COUNT], hashes))

    def _whole(self) -> None:
        add_special, salt, lora = self._options
        with _hash_errors():
            result = self._encoder._encode_whole(self.text, add_special, salt, lora)
        self._finished(result)

    def _finished(self, result: EncodedPrompt) -> None:
        self._result = result
        self.block_hashes = result.block_hashes
        self.token_count = result.token_count
        self.chars_done = len(self.text)
        self._pieces = []  # nothing more to encode; the text stays for callers that log sizes


def _flat(chunker: ChunkTokenizer, splitter: TextSplitter, text: str) -> list[int]:
    """Piecewise ids of a whole text (the self-check's side of the comparison)."""
    return [token for ids in chunker.encode_pieces(splitter.pieces(text)) for token in ids]
