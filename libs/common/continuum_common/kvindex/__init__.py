"""The KV cache index (Tier 4): which backend holds which prefix, in which tier, with how many
tokens. Shared by the indexer (the writer) and the ingress (the reader; in embedded mode also
the writer of its own InMemoryKvIndex). docs/kv-index.md describes the design.

    from continuum_common.kvindex import KvIndex, KvHolder, InMemoryKvIndex, open_kv_index

The block index (engine block hashes per backend, longest-prefix match of a request's chain):

    from continuum_common.kvindex import BlockMatch, MatchQuery, InMemoryBlockIndex, open_block_index
"""

from continuum_common.kvindex.api import KvIndex, KvIndexWriter
from continuum_common.kvindex.block_memory import InMemoryBlockIndex
from continuum_common.kvindex.blocks import (
    NO_MATCH,
    BlockApplyReport,
    BlockBackendStats,
    BlockIndexReader,
    BlockIndexStats,
    BlockIndexWriter,
    BlockMatch,
    MatchQuery,
)
from continuum_common.kvindex.entry import TierPolicy
from continuum_common.kvindex.factory import BlockIndexStore, KvIndexStore, open_block_index, open_kv_index
from continuum_common.kvindex.memory import InMemoryKvIndex
from continuum_common.kvindex.types import (
    ApplyReport,
    BackendCounters,
    ClearReport,
    IndexStats,
    KvHolder,
    KvIndexError,
)

__all__ = [
    "NO_MATCH",
    "ApplyReport",
    "BackendCounters",
    "BlockApplyReport",
    "BlockBackendStats",
    "BlockIndexReader",
    "BlockIndexStats",
    "BlockIndexStore",
    "BlockIndexWriter",
    "BlockMatch",
    "ClearReport",
    "InMemoryBlockIndex",
    "InMemoryKvIndex",
    "IndexStats",
    "KvHolder",
    "KvIndex",
    "KvIndexError",
    "KvIndexStore",
    "KvIndexWriter",
    "MatchQuery",
    "TierPolicy",
    "open_block_index",
    "open_kv_index",
]
