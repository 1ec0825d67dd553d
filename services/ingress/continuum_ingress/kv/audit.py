"""Checks that a precise group's local tokenizer agrees with its engines.

A local tokenizer that differs from the engine's (another revision of the model's files, a
chat template the engine does not use) makes every block hash wrong: precise matching then finds
nothing and silently stops working. So one request in `every` (at most one check at a time per
group, in the background, never delaying a request) is also tokenized by a backend of the group
(`/tokenize`), and the block hashes of both token lists are compared. After `mismatches_to_disable`
disagreements in a row the group falls back to approximate matching until the router restarts
(an ERROR log says why); agreement resets the count. Every outcome is counted in
`continuum_kv_tokenizer_audits_total{group, result}`.

A check waits up to AUDIT_TIMEOUT_S for `/tokenize` (or `tokenize_timeout_ms`, if longer), not
`tokenize_timeout_ms` alone: that bound is made for calls a request waits on, and an engine busy
prefilling long prompts takes longer than it to tokenize one (on the simulated fleet with the
conversation trace, 8 of 10 checks got no answer within the 200-ms default). Nothing waits on a
check, and at most one runs per group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from continuum_ingress.kv.groups import GroupRuntime
from continuum_ingress.kv.tokenize import TokenizeFailed, remote_tokens
from continuum_ingress.protocol.apis import Api
from continuum_ingress.transport import Upstream

log = logging.getLogger("continuum.ingress.kv")

AUDIT_EVERY = 200
MISMATCHES_TO_DISABLE = 3
AUDIT_TIMEOUT_S = 10.0


class TokenizerAudit:
    def __init__(
        self,
        group: GroupRuntime,
        count: Callable[[str, str], None],
        *,
        every: int = AUDIT_EVERY,
        mismatches_to_disable: int = MISMATCHES_TO_DISABLE,
        timeout_s: float = AUDIT_TIMEOUT_S,
    ) -> None:
        self.group = group
        self.count = count  # (group, result)
        self.every = every
        self.timeout_s = timeout_s
        self.mismatches_to_disable = mismatches_to_disable
        self._seen = 0
        self._mismatches = 0
        self._task: asyncio.Task[None] | None = None

    def due(self) -> bool:
        """True for one request in `every` while no check is running."""
        self._seen += 1
        if self._seen < self.every or (self._task is not None and not self._task.done()):
            return False
        self._seen = 0
        return True

    def start(
        self, client: Upstream, *, api: Api, body: dict[str, object], model: str, expected: Sequence[int]
    ) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._check(client, api=api, body=body, model=model, expected=list(expected))
        )

    async def _check(
        self, client: Upstream, *, api: Api, body: dict[str, object], model: str, expected: list[int]
    ) -> None:
        cfg = self.group.config
        assert cfg is not None
        timeout_s = max(cfg.tokenize_timeout_ms / 1000, self.timeout_s)
        try:
            tokens = await remote_tokens(
                client, cfg.tokenize_path, api=api, body=body, model=model, timeout_s=timeout_s
            )
        except TokenizeFailed:
            self.count(self.group.name, "error")
            return
        hasher = self.group.hasher
        assert hasher is not None
        salt = body.get("cache_salt")
        engine = [hasher.wire(d) for d in hasher.chain(tokens, cache_salt=salt if isinstance(salt, str) else None)]
        if engine == expected:
            self._mismatches = 0
            self.count(self.group.name, "match")
            return
        self._mismatches += 1
        self.count(self.group.name, "mismatch")
        if self._mismatches >= self.mismatches_to_disable and self.group.precise_disabled is None:
            self.group.precise_disabled = "tokenizer_mismatch"
            log.error(
                "match group %s: the local tokenizer disagrees with the engines' /tokenize (%d checks in a row);"
                " precise matching is off, approximate matching is used until restart. Check `tokenizer` and"
                " `chat_template` against the model the engines serve.",
                self.group.name,
                self._mismatches,
            )

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
