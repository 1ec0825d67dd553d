"""The Redis key layout of the KV index (docs/kv-index.md has the full table).

Per prefix P (three keys in ONE cluster slot):

    <kp><P>                   sorted set   member backend, score token_count   (the contract key)
    <kp>w:{<kp><P>}           set          backends whose reported copy is storage_warm
    <kp>m:{<kp><P>}           hash         backend -> field stamps + tokens; "~t" -> last write

The contract key has no hash tag, so Redis Cluster hashes the whole name; the two companions
carry that whole name as their hash tag, so all three land in the same slot and one Lua
script can update them atomically. Per backend B and global (one key each, single-key ops):

    <kp>be:B      sorted set   reverse index: prefix -> last write (µs); walked by `cleared`
    <kp>clr:B     string       clear watermark (stamp of B's newest `cleared`)
    <kp>stats:B   hash         fleet-wide event counters for the admin `backends` view
    <kp>lru       sorted set   prefix -> last write (µs); max_entries evicts its oldest 10 %
    <kp>backends  set          every backend seen
    <kp>stats     hash         global counters (evictions, clears)
    <kp>lock:evict string      short lock so two replicas do not evict the same 10 % twice
"""

from __future__ import annotations

from dataclasses import dataclass

from continuum_common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class KeyLayout:
    prefix: str = "cr:kvidx:"

    def __post_init__(self) -> None:
        # A brace in the prefix would become the hash tag of every key and break the
        # one-slot-per-prefix layout above.
        if "{" in self.prefix or "}" in self.prefix:
            raise ConfigError("kv_cache_index.key_prefix must not contain '{' or '}' (Redis Cluster hash tags)")

    def holders(self, prefix_hash: str) -> str:
        return self.prefix + prefix_hash

    def warm(self, prefix_hash: str) -> str:
        return f"{self.prefix}w:{{{self.prefix}{prefix_hash}}}"

    def meta(self, prefix_hash: str) -> str:
        return f"{self.prefix}m:{{{self.prefix}{prefix_hash}}}"

    def entry_keys(self, prefix_hash: str) -> tuple[str, str, str]:
        return self.holders(prefix_hash), self.warm(prefix_hash), self.meta(prefix_hash)

    def reverse(self, backend: str) -> str:
        return f"{self.prefix}be:{backend}"

    def watermark(self, backend: str) -> str:
        return f"{self.prefix}clr:{backend}"

    def counters(self, backend: str) -> str:
        return f"{self.prefix}stats:{backend}"

    @property
    def lru(self) -> str:
        return self.prefix + "lru"

    @property
    def backends(self) -> str:
        return self.prefix + "backends"

    @property
    def global_counters(self) -> str:
        return self.prefix + "stats"

    @property
    def evict_lock(self) -> str:
        return self.prefix + "lock:evict"

    @property
    def match_all(self) -> str:
        """SCAN pattern for every key of the index (the prefix has no glob characters)."""
        return self.prefix + "*"
