"""The hot-reloadable configuration holder.

`ConfigHolder.current` is the live RouterSnapshot. A reload (SIGHUP, a change of the file seen
by the polling watcher, or POST /admin/config/reload) parses and validates the file, builds a
complete new snapshot and swaps one reference; a bad file is logged with every error and the
running snapshot stays. Requests hold the snapshot they started with (acquire/release), so
nothing in flight notices; snapshots retired by a reload are handed to `retired_idle()` once their
last request has finished, which is when their obsolete HTTP clients can be closed.

Only the seed's hot-reloadable fields take effect on reload (backends, selection_strategy,
prefix_routing.*, server.max_body_bytes, admin tokens, response_cache.* but its backend, the
Redis connection); a change to a restart-only section is
logged as a warning and otherwise ignored until restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from continuum_common.config import RouterConfig, load_router_config, router_warnings
from continuum_common.errors import ConfigError
from continuum_ingress.snapshot import RouterSnapshot

log = logging.getLogger(__name__)

# `response_cache` (all but its `backend`, which the cache itself warns about) and the shared
# `redis` connection hot-reload through their components (cache/hook.py, adapters/shared_redis.py).
RESTART_ONLY = (
    "kv_cache_index",
    "gemini_context_cache",
    "bus",
    "load_sharing",
    "tracing",
)
RESTART_ONLY_SERVER = (
    "host",
    "port",
    "workers",
    "max_header_bytes",
    "header_timeout",
    "body_timeout",
    "keepalive_timeout",
    "max_connections_per_client",
)

Builder = Callable[[RouterConfig, int], RouterSnapshot]


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def restart_only_changes(old: RouterConfig, new: RouterConfig) -> list[str]:
    changed = [name for name in RESTART_ONLY if getattr(old, name) != getattr(new, name)]
    changed += [f"server.{f}" for f in RESTART_ONLY_SERVER if getattr(old.server, f) != getattr(new.server, f)]
    return changed


class ConfigHolder:
    def __init__(self, source: str | Path | RouterConfig, build: Builder, initial: RouterConfig | None = None) -> None:
        """`initial`: the configuration already loaded from `source` (not read again)."""
        self._build = build
        self.path: Path | None = None if isinstance(source, RouterConfig) else Path(source)
        cfg = initial or (source if isinstance(source, RouterConfig) else load_router_config(source))
        self._signature = _file_signature(self.path) if self.path else None
        self._generation = 1
        self.current: RouterSnapshot = build(cfg, self._generation)
        self._retired: list[RouterSnapshot] = []
        self.reloads_ok = 0
        self.reloads_failed = 0
        # Called after every reload attempt (True: accepted) / with each accepted configuration.
        self.on_reload: list[Callable[[bool], None]] = []
        self.on_config: list[Callable[[RouterConfig], None]] = []
        for warning in router_warnings(cfg):
            log.warning("config warning: %s", warning)

    # -- request side ----------------------------------------------------------------------
    def acquire(self) -> RouterSnapshot:
        snapshot = self.current
        snapshot.users += 1
        return snapshot

    @staticmethod
    def release(snapshot: RouterSnapshot) -> None:
        snapshot.users -= 1

    # -- reload ----------------------------------------------------------------------------
    def reload(self, cfg: RouterConfig | None = None) -> bool:
        """Load (or take) a new configuration and swap it in; False when it was rejected."""
        try:
            if cfg is None:
                if self.path is None:
                    log.info("reload requested but the configuration did not come from a file")
                    return False
                self._signature = _file_signature(self.path)
                cfg = load_router_config(self.path)
            snapshot = self._build(cfg, self._generation + 1)
        except ConfigError as exc:
            self.reloads_failed += 1
            log.error("configuration reload rejected, keeping generation %d: %s", self._generation, exc)
            self._notify(False)
            return False
        old = self.current
        for name in restart_only_changes(old.config, cfg):
            log.warning("config reload: %s changed; this section needs a restart and is unchanged until then", name)
        for warning in router_warnings(cfg):
            log.warning("config warning: %s", warning)
        self._generation += 1
        self.current = snapshot
        self._retired.append(old)
        self.reloads_ok += 1
        log.info(
            "configuration generation %d active: %d backend(s), strategy %s",
            self._generation,
            len(snapshot.backends),
            cfg.selection_strategy.value,
        )
        for apply in self.on_config:
            try:
                apply(cfg)
            except Exception:  # one component's trouble must not undo the swap for the rest
                log.exception("a component failed to apply the reloaded configuration")
        self._notify(True)
        return True

    def _notify(self, ok: bool) -> None:
        for callback in self.on_reload:
            callback(ok)

    def file_changed(self) -> bool:
        return self.path is not None and _file_signature(self.path) != self._signature

    async def watch(self, stop: asyncio.Event, interval: float) -> None:
        """Poll the file's signature (mtime, size, inode) and reload when it changes. Editors
        that write a temp file and rename it are covered by the inode."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
            if not stop.is_set() and self.file_changed():
                self.reload()

    def retired_idle(self) -> list[RouterSnapshot]:
        """Retired snapshots with no request left; they are dropped from the holder."""
        idle = [s for s in self._retired if s.users <= 0]
        self._retired = [s for s in self._retired if s.users > 0]
        return idle

    def live_snapshots(self) -> list[RouterSnapshot]:
        return [self.current, *self._retired]


def resolve_config_path(path: str | None) -> str | None:
    """`--config`, else $CONTINUUM_CONFIG."""
    return path or os.environ.get("CONTINUUM_CONFIG") or None
