"""The Redis key layout of the block index (docs/kv-index.md, "Block index in Redis").

Per backend B, five keys sharing the hash tag `{B}` (one Redis Cluster slot per backend, so
one script call covers everything a batch of B changes):

    <kp>blk:{B}:m    hash   ep (20-digit epoch), wm (clear watermark), gen, tmax (newest
                            tombstone stamp), rot (last tombstone rotation, ms), seen (last
                            batch, ms), c_* counters
    <kp>blk:{B}:g    zset   GPU-present blocks: member = 8-byte hash, score = stamp of its store
    <kp>blk:{B}:s    zset   storage-present blocks, the same
    <kp>blk:{B}:t0   hash   tombstones of the current window: 'g'|'s' + 8-byte hash -> stamp
    <kp>blk:{B}:t1   hash   tombstones of the previous window

and one global key, touched only by single-key commands:

    <kp>blk:backends  set   every backend seen (for stats, cleanup, clear)
"""

from __future__ import annotations

from continuum_common.errors import ConfigError


class BlockKeys:
    def __init__(self, prefix: str) -> None:
        if "{" in prefix or "}" in prefix:
            raise ConfigError("kv_cache_index.key_prefix must not contain '{' or '}' (Redis Cluster hash tags)")
        self.prefix = prefix

    def backend(self, name: str) -> tuple[str, str, str, str, str]:
        """meta, gpu, storage, tombstones (current), tombstones (previous)."""
        base = f"{self.prefix}blk:{{{name}}}:"
        return base + "m", base + "g", base + "s", base + "t0", base + "t1"

    @property
    def registry(self) -> str:
        return self.prefix + "blk:backends"
