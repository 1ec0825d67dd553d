"""Remote tokenizations remembered by conversation prefix: precise mode without a local
tokenizer asks a backend's `/tokenize` on the request's path only when nothing close to the
request is known.

Why: the `/tokenize` round trip comes before the routing decision, so all of it is added to
the time to first token (a millisecond or two on an idle engine, more on a busy one). Yet the
block hashes of almost all of a request are usually known already. Conversations grow turn by
turn (turn N+1 is turn N's messages, the answer and a new question) and many requests share
their first messages (a system prompt or a document with another question after it).

How: the leading messages of a chat request are hashed one after the other (with the model,
the tools, the template arguments and the cache salt first), so every prefix of the message
list has a digest. The block hashes of every tokenization are remembered under the digest of
the messages it covered. A request whose whole message list, or all but its last one or two
messages, is known is matched with those block hashes and no call (the newest messages are
not matched; nobody holds them yet except for an exact repeat). The last known block is left
out: a chat template may render the end of a conversation (the generation prompt, the last
token before the next message) differently from the same point inside a longer one. The
request's size is estimated from the known part's tokens per byte.

Only a request with nothing close known asks on its path; then, off the path, its messages
without the last one are tokenized too (what its siblings will share). A request matched from
a known prefix has its own messages tokenized off the path (what its next turn will share).
Off-path calls are bounded (at most `MAX_BACKGROUND` at once, more are skipped and counted)
and deduplicated; the memory is bounded by the number of block hashes it holds (LRU).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from continuum_ingress.kv.groups import GroupRuntime, RequestKeys, chat_messages
from continuum_ingress.kv.tokenize import TokenizeFailed, remote_tokens
from continuum_ingress.protocol.apis import Api
from continuum_ingress.transport import Upstream

if TYPE_CHECKING:
    from continuum_ingress.state import RequestState

log = logging.getLogger("continuum.ingress.kv")

REACH = 2  # how many trailing messages a known prefix may lack
MAX_BACKGROUND = 16  # off-path /tokenize calls at once, per match group

# Counted per match group in continuum_kv_remote_tokenize_total{group, how}.
HOW = ("request", "known", "known_prefix", "background", "background_skipped", "background_failed")


@dataclass(frozen=True, slots=True)
class Known:
    """What one tokenization of a message prefix gave."""

    chain: array[int]  # wire block hashes ('Q': 8 bytes each)
    tokens: int
    nbytes: int  # JSON size of the messages it covered (for the tokens-per-byte estimate)


def conversation_digests(
    body: Mapping[str, Any], model: str, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[bytes], list[int]]:
    """One digest per leading prefix of `messages` (index i: the first i+1 messages) and each
    message's JSON size. Everything else that changes what the engine renders before the
    messages (model, tools, template arguments, cache salt) is hashed first."""
    head = orjson.dumps(
        [model, body.get("tools"), body.get("chat_template_kwargs"), body.get("cache_salt")],
        option=orjson.OPT_SORT_KEYS,
    )
    digest = hashlib.blake2b(head, digest_size=16).digest()
    digests: list[bytes] = []
    sizes: list[int] = []
    for message in messages:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(digest + data, digest_size=16).digest()
        digests.append(digest)
        sizes.append(len(data))
    return digests, sizes


class KnownPrefixes:
    """Digest of a message prefix → what its tokenization gave; LRU, bounded by the number of
    block hashes held."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks = 0
        self._known: OrderedDict[bytes, Known] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._known

    def find(self, digests: Sequence[bytes], reach: int = REACH) -> tuple[int, Known] | None:
        """The longest known prefix lacking at most `reach` trailing messages: (its number of
        messages, what is known of it), or None."""
        n = len(digests)
        for k in range(n, max(0, n - reach - 1), -1):
            known = self._known.get(digests[k - 1])
            if known is not None:
                self._known.move_to_end(digests[k - 1])
                return k, known
        return None

    def put(self, digest: bytes, known: Known) -> None:
        if len(known.chain) > self.max_blocks:
            return
        old = self._known.pop(digest, None)
        if old is not None:
            self.blocks -= len(old.chain)
        self._known[digest] = known
        self.blocks += len(known.chain)
        while self.blocks > self.max_blocks:
            _, evicted = self._known.popitem(last=False)
            self.blocks -= len(evicted.chain)

    def clear(self) -> None:
        self._known.clear()
        self.blocks = 0


class RemoteTokens:
    """Precise keys for one match group from its backends' `/tokenize`, remembered by
    conversation prefix (module docstring). `count(group, how)` counts every request and every
    off-path call (HOW)."""

    def __init__(
        self,
        group: GroupRuntime,
        count: Callable[[str, str], None],
        *,
        max_blocks: int,
        max_background: int = MAX_BACKGROUND,
    ) -> None:
        assert group.config is not None and group.hasher is not None
        self.group = group
        self.count = count
        self.path = group.config.tokenize_path
        self.timeout_s = group.config.tokenize_timeout_ms / 1000
        self.known = KnownPrefixes(max_blocks) if max_blocks > 0 else None
        self.max_background = max_background
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: set[bytes] = set()

    async def keys(self, state: RequestState, client: Upstream) -> RequestKeys:
        """The request's keys (raises TokenizeFailed when a call on the path fails)."""
        body = state.request.body
        messages = chat_messages(state.api, body) if state.api is not Api.COMPLETIONS else []
        if self.known is None or not messages:
            tokens = await self._call(client, state, None, True)
            self.count(self.group.name, "request")
            return self.group.keys_from_tokens(state, tokens)
        digests, sizes = conversation_digests(body, state.model, messages)
        n = len(messages)
        found = self.known.find(digests)
        if found is not None:
            k, known = found
            if k == n and known.chain:
                self.count(self.group.name, "known")
                chain = known.chain.tolist()
                return RequestKeys("precise", chain, float(self.group.block_size), max(1, known.tokens))
            # (a prefix shorter than two blocks would match nothing once its last is left out)
            if k < n and len(known.chain) >= 2:
                self.count(self.group.name, "known_prefix")
                self._background(client, state, messages, digests[n - 1], sum(sizes), generation=True)
                tail = sum(sizes[k:]) * known.tokens / max(1, known.nbytes)
                estimate = max(1, known.tokens + round(tail))
                return RequestKeys("precise", known.chain[:-1].tolist(), float(self.group.block_size), estimate)
        tokens = await self._call(client, state, None, True)
        self.count(self.group.name, "request")
        keys = self.group.keys_from_tokens(state, tokens)
        self.known.put(digests[n - 1], Known(array("Q", keys.chain), len(tokens), sum(sizes)))
        if n >= 2 and digests[n - 2] not in self.known:
            self._background(client, state, messages[: n - 1], digests[n - 2], sum(sizes[:-1]), generation=False)
        return keys

    async def _call(
        self, client: Upstream, state: RequestState, messages: list[dict[str, Any]] | None, generation: bool
    ) -> list[int]:
        return await remote_tokens(
            client,
            self.path,
            api=state.api,
            body=state.request.body,
            model=state.model,
            timeout_s=self.timeout_s,
            messages=messages,
            generation=generation,
        )

    def _background(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]],
        digest: bytes,
        nbytes: int,
        *,
        generation: bool,
    ) -> None:
        if digest in self._pending:
            return
        if len(self._tasks) >= self.max_background:
            self.count(self.group.name, "background_skipped")
            return
        self._pending.add(digest)
        task = asyncio.get_running_loop().create_task(
            self._learn(client, state, messages, digest, nbytes, generation=generation)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _learn(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]],
        digest: bytes,
        nbytes: int,
        *,
        generation: bool,
    ) -> None:
        try:
            tokens = await self._call(client, state, messages, generation)
            keys = self.group.keys_from_tokens(state, tokens)
        except TokenizeFailed as exc:
            log.debug("off-path tokenize for group %s failed: %s", self.group.name, exc)
            self.count(self.group.name, "background_failed")
            return
        except Exception:  # never let a learning call end in an unretrieved task exception
            log.warning("off-path tokenize for group %s failed unexpectedly", self.group.name, exc_info=True)
            self.count(self.group.name, "background_failed")
            return
        finally:
            self._pending.discard(digest)
        self.count(self.group.name, "background")
        if self.known is not None:
            self.known.put(digest, Known(array("Q", keys.chain), len(tokens), nbytes))

    def clear(self) -> None:
        if self.known is not None:
            self.known.clear()

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
