"""Precise keys from a backend's `/tokenize`, asked on the request's path only when nothing
close to the request was tokenized before (docs/kv-scorer.md, "Remembered tokenizations").

Why: without a local tokenizer the `/tokenize` round trip comes before the routing decision,
so all of it adds to the time to first token (a millisecond or two on an idle engine, tens on a
busy one with a long prompt). Yet the block hashes of almost all of a request are usually
known already: turn N+1 of a conversation is turn N plus the answer and a new question, and
many requests share their first messages (a system prompt, a document).

* **Chat.** A request whose whole message list, or all but its last one or two messages, is
  known (kv/known_prefixes.py) is matched with those block hashes and no call. The last known
  block is left out: a chat template may render the end of a conversation (the generation
  prompt) differently from the same point inside a longer one. Its newest messages are not
  matched (nobody holds them yet, except for an exact repeat). Off the path, once it has been
  answered, its messages followed by its answer are tokenized (what its next turn starts
  with, and what the engine that generated the answer holds): the answer is read from the
  bytes the client received (kv/answers.py `AnswerRecorder`, fed by the forwarder through
  hooks.ANSWER_RECORDER). Without a readable answer, its own messages are tokenized instead.
* **Completions.** A prompt that repeats a known one, or starts with a known one's text (to a
  512-byte chunk), is matched with the known prompt's block hashes up to a margin short of the
  shared text (tokens per byte estimated from the known prompt), however long the rest: as in
  chat, the new text is held nowhere yet; its own text is learnt off the path once it has been
  answered.
* A known part under the group's `tokenize_memory_min_tokens` is not used: such a request is
  new (below).
* A request with nothing close known is, with the group's `tokenize_new_prompts: off_path` (the
  default), routed at once with approximate keys (kv/chunks.py, recorded in the group's
  fallback memory, so a burst of one new prompt stays together) and tokenized off the path once
  answered, as above. With `on_path` it asks on its path; a chat request's messages without the
  last one are then tokenized off the path too (what its siblings will share). With the group's
  `tokenize_wait_ms`, a call on the path is waited for at most that long: past it the request
  goes on as an `off_path` one would, and the call finishes off its path (`late`), its answer
  remembered and recorded as held where the request went.
* What is learnt once a request has been answered comes, from a vLLM engine, with the answer
  itself: the ingress asks for the token ids of the prompt and the output (`return_token_ids`,
  kv/answer_ids.py, `token_ids_from_answers`) and learns the request's own prompt and its
  conversation with the answer from them, without a call. All but its last message (what its
  siblings share) is not in the answer and is still asked. An engine whose answers come without
  the ids is asked no more after `MAX_MISSING` of them in a row, and /tokenize learns instead.
* Every answer remembered is also offered to the other ingress replicas (`share`, set by the
  KV component: digests and block hashes over NATS, continuum_common.wire.decisions), and what
  they learnt is remembered here (`apply_shared`), so N replicas ask as often as one; a process
  that starts gets what its predecessors learnt from the route history the same way.

Off-path calls are bounded (`MAX_BACKGROUND` at once per group, more are skipped) and
deduplicated; late calls too (`MAX_LATE` per group, more are cancelled and counted); every outcome is counted (`continuum_kv_remote_tokenize_total{group, how}`). The
request's size is estimated from the known part's tokens per byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import orjson

from continuum_common.wire.decisions import KIND_CHAT, KIND_TEXT, Tokenized
from continuum_ingress.hooks import ANSWER_RECORDER
from continuum_ingress.kv.answer_ids import ANSWER_IDS, ASKS, AnswerIds
from continuum_ingress.kv.answers import AnswerRecorder, reads_answers
from continuum_ingress.kv.groups import GroupRuntime, RequestKeys, chat_messages
from continuum_ingress.kv.known_prefixes import Known, KnownPrefixes, KnownTexts, conversation_digests, text_digest
from continuum_ingress.kv.tokenize import TokenizeFailed, remote_tokens
from continuum_ingress.protocol.apis import Api
from continuum_ingress.transport import Upstream

if TYPE_CHECKING:
    from continuum_ingress.state import RequestState

log = logging.getLogger("continuum.ingress.kv")

MAX_BACKGROUND = 16  # off-path /tokenize calls at once, per match group
# Late calls at once, per match group. Each is bounded by the call's timeout already; this bounds
# how many a flood of requests to a stalled engine can leave behind.
MAX_LATE = 64
# Answers in a row that came without the token ids asked for, after which a backend is asked
# no more (an older vLLM ignores `return_token_ids`), until the ingress restarts.
MAX_MISSING = 4
TEXT_MARGIN = 0.9  # of the estimated tokens in the shared text, the part matched
_HEAD = 16  # bytes of context digest before a completion prompt's text


def _known(keys: RequestKeys, nbytes: int) -> Known:
    return Known(array("Q", keys.chain), keys.prompt_tokens, nbytes)


@dataclass(frozen=True, slots=True)
class _Lesson:
    """One off-path tokenization: what to ask (`messages` instead of the request's own, if
    given), under which key it is deduplicated, and where its answer goes (`nbytes`: the size
    of what it covers)."""

    key: bytes
    remember: Callable[[Known], None]
    nbytes: int
    messages: list[dict[str, Any]] | None = None
    generation: bool = True
    # A request routed with approximate keys (`off_path`): what it teaches is also recorded as
    # held where it went, as a request matched precisely is when it is routed (kv/selector.py).
    record: bool = False
    # Which of the ids the engine returned with the request's answer (kv/answer_ids.py) are
    # what this lesson would ask /tokenize for: the prompt's (the request's own prompt), the
    # prompt's and the output's (the conversation with its answer), or none.
    ids: Literal["prompt", "answer"] | None = None


class RemoteTokens:
    """One precise match group without a local tokenizer. `count(group, how)` counts every
    request (`request`, `known`, `known_prefix`) and every off-path call (`background`,
    `background_skipped`, `background_failed`)."""

    def __init__(
        self,
        group: GroupRuntime,
        count: Callable[[str, str], None],
        *,
        max_blocks: int,
        max_background: int = MAX_BACKGROUND,
        max_late: int = MAX_LATE,
        replica: str = "",
        clock: Callable[[], float] = time.monotonic,
        member: Callable[[str], bool] = lambda backend: True,
    ) -> None:
        assert group.config is not None and group.hasher is not None
        self.group = group
        self.count = count
        self.path = group.config.tokenize_path
        self.timeout_s = group.config.tokenize_timeout_ms / 1000
        self.bs = float(group.block_size)
        # A known part shorter than this is not used (the request is asked on its path).
        self.min_tokens = group.config.tokenize_memory_min_tokens
        # Less than that remembered: routed at once with approximate keys, tokenized afterwards.
        self.off_path = group.config.tokenize_new_prompts == "off_path"
        # On the path, wait at most this long for the answer (None: up to the call's timeout).
        wait_ms = group.config.tokenize_wait_ms
        self.wait_s = None if wait_ms is None else wait_ms / 1000
        # Learn from the ids the engine returns with its answers (vLLM), not from /tokenize.
        self.answer_ids = group.config.token_ids_from_answers and group.config.engine == "vllm"
        self._missing: dict[str, int] = {}  # backend -> answers in a row without the ids
        self.member = member  # whether a backend (by name) is in this group
        self.known = KnownPrefixes(max_blocks) if max_blocks > 0 else None
        self.texts = KnownTexts(max_blocks) if max_blocks > 0 else None
        self.max_background = max_background
        self.max_late = max_late
        self._tasks: set[asyncio.Task[None]] = set()
        self._late: set[asyncio.Task[None]] = set()  # calls that outlived their request's wait
        self._pending: set[bytes] = set()
        self._closed = False
        # set once NATS is connected: what this replica learns, offered to the others
        self.share: Callable[[Tokenized], None] | None = None
        self.replica = replica
        self.clock = clock

    async def keys(self, state: RequestState, client: Upstream) -> RequestKeys:
        """The request's keys (raises TokenizeFailed when a call on the path fails)."""
        if state.key_api is Api.COMPLETIONS:
            return await self._completion_keys(state, client)
        messages = chat_messages(state.key_api, state.key_body)
        if self.known is None or not messages:
            return await self._asked(state, client)
        digests, sizes = conversation_digests(state.key_body, state.model, messages)
        n = len(messages)
        found = self.known.find(digests)
        if found is not None:
            k, known = found
            if k == n and known.chain:
                self.count(self.group.name, "known")
                return RequestKeys("precise", known.chain.tolist(), self.bs, max(1, known.tokens))
            if k < n and len(known.chain) > 1 and (len(known.chain) - 1) * self.bs >= self.min_tokens:
                self.count(self.group.name, "known_prefix")
                key = digests[n - 1]
                self._ask_ids(state)
                own = _Lesson(key, partial(self._remember_chat, key), sum(sizes), ids="prompt")
                self._follow_up(client, state, messages, own)
                estimate = known.tokens + sum(sizes[k:]) * known.tokens / max(1, known.nbytes)
                return RequestKeys("precise", known.chain[:-1].tolist(), self.bs, max(1, round(estimate)))
        if self.off_path:
            return self._new_chat(client, state, messages, digests, sizes)
        keys = await self._asked(state, client, lambda k: self._remember_chat(digests[n - 1], _known(k, sum(sizes))))
        self._siblings(client, state, messages, digests, sizes, new=False)
        self._ask_ids(state)
        self._follow_up(client, state, messages, None)
        return keys

    async def _completion_keys(self, state: RequestState, client: Upstream) -> RequestKeys:
        prompt = state.key_body.get("prompt")
        if self.texts is None or not isinstance(prompt, str):
            return await self._asked(state, client)
        salt = state.key_body.get("cache_salt")
        head = hashlib.blake2b(orjson.dumps([state.model, salt]), digest_size=_HEAD).digest()
        data = head + prompt.encode("utf-8", "surrogatepass")
        found = self.texts.find(data)
        if found is not None:
            known, shared = found
            if shared == len(data) and known.chain:
                self.count(self.group.name, "known")
                return RequestKeys("precise", known.chain.tolist(), self.bs, max(1, known.tokens))
            per_byte = known.tokens / max(1, known.nbytes - _HEAD)
            blocks = int((shared - _HEAD) * per_byte * TEXT_MARGIN / self.bs)
            if blocks and blocks * self.bs >= self.min_tokens:
                self.count(self.group.name, "known_prefix")
                key = text_digest(data)
                self._ask_ids(state)
                lesson = _Lesson(key, partial(self._remember_text, data), len(data), ids="prompt")
                self._background(client, state, lesson, after=True)
                estimate = (len(data) - _HEAD) * per_byte
                return RequestKeys("precise", known.chain[:blocks].tolist(), self.bs, max(1, round(estimate)))
        if self.off_path:
            self.count(self.group.name, "new")
            self._ask_ids(state)
            lesson = _Lesson(
                text_digest(data), partial(self._remember_text, data), len(data), record=True, ids="prompt"
            )
            self._background(client, state, lesson, after=True)
            return self.group.approximate_keys(state)
        return await self._asked(state, client, lambda k: self._remember_text(data, _known(k, len(data))))

    def _new_chat(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]],
        digests: list[bytes],
        sizes: list[int],
    ) -> RequestKeys:
        """`off_path`: a chat request too little of which is remembered goes with approximate
        keys; its messages (with its answer when it can be read) and, for its siblings, all but
        its last message are tokenized once it has been answered (during its prefill a call
        would delay its first token)."""
        self.count(self.group.name, "new")
        n = len(messages)
        self._ask_ids(state)
        remember = partial(self._remember_chat, digests[n - 1])
        own = _Lesson(digests[n - 1], remember, sum(sizes), record=True, ids="prompt")
        self._siblings(client, state, messages, digests, sizes, new=True)
        self._follow_up(client, state, messages, own)
        return self.group.approximate_keys(state)

    def _siblings(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]],
        digests: list[bytes],
        sizes: list[int],
        *,
        new: bool,
    ) -> None:
        """Learn the request without its last message (what its siblings share), when unknown:
        at once after a call on the path; for a `new` request, once it has been answered, and
        recorded as held where it went."""
        n = len(messages)
        if n < 2 or self.known is None or digests[n - 2] in self.known:
            return
        key = digests[n - 2]
        lesson = _Lesson(
            key, partial(self._remember_chat, key), sum(sizes[:-1]), messages[:-1], generation=False, record=new
        )
        self._background(client, state, lesson, after=new)

    async def _asked(
        self, state: RequestState, client: Upstream, remember: Callable[[RequestKeys], None] | None = None
    ) -> RequestKeys:
        """Keys from a call on the request's path, given to `remember` once answered. A call
        that outlasts the group's `tokenize_wait_ms` is left to finish off the path (`late`):
        the request goes on with approximate keys, as a new prompt off the path does."""
        if self.wait_s is None:
            tokens = await self._call(client, state)
        else:
            call = asyncio.ensure_future(self._call(client, state))
            try:
                done, _ = await asyncio.wait((call,), timeout=self.wait_s)
            except asyncio.CancelledError:  # the request went away: so does its call
                call.cancel()
                raise
            if not done:
                self.count(self.group.name, "late")
                self._finish_late(call, state, remember)
                return self.group.approximate_keys(state)
            tokens = call.result()  # TokenizeFailed: the caller falls back
        self.count(self.group.name, "request")
        keys = self.group.keys_from_tokens(state, tokens)
        if remember is not None:
            remember(keys)
        return keys

    def _finish_late(
        self, call: asyncio.Future[list[int]], state: RequestState, remember: Callable[[RequestKeys], None] | None
    ) -> None:
        """Leave a late call to finish off the path, unless `max_late` are already doing so."""
        if len(self._late) >= self.max_late:
            call.cancel()
            self.count(self.group.name, "late_dropped")
            return
        task = asyncio.get_running_loop().create_task(self._late_answer(call, state, remember))
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    async def _late_answer(
        self, call: asyncio.Future[list[int]], state: RequestState, remember: Callable[[RequestKeys], None] | None
    ) -> None:
        """A late call's answer: remembered (`remember`), and recorded as held where its request
        went (a speculative entry, as a precisely matched request's is when it is routed)."""
        try:
            keys = self.group.keys_from_tokens(state, await call)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as exc:  # TokenizeFailed, or anything unexpected: counted, never raised
            log.debug("late tokenize for group %s failed: %s", self.group.name, type(exc).__name__)
            self.count(self.group.name, "late_failed")
            return
        self.count(self.group.name, "late_answered")
        if remember is not None:
            remember(keys)
        if state.backend is not None:
            self.group.memory.record(state.backend, keys.chain, self.clock())

    def _call(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]] | None = None,
        generation: bool = True,
    ) -> Awaitable[list[int]]:
        return remote_tokens(
            client,
            self.path,
            api=state.key_api,
            body=state.key_body,
            model=state.model,
            timeout_s=self.timeout_s,
            messages=messages,
            generation=generation,
        )

    def _background(self, client: Upstream, state: RequestState, lesson: _Lesson, *, after: bool = False) -> None:
        """Tokenize off the path and remember what it gave; one call per key at a time. With
        `after`, once the request has been answered: what it teaches is for its next turn, which
        cannot come sooner, and the engine is then no longer busy with the request itself (a
        `/tokenize` of the same conversation during its prefill would delay its first token)."""
        if lesson.key in self._pending:
            return
        self._pending.add(lesson.key)
        task = state.task
        if after and task is not None and not task.done():
            task.add_done_callback(lambda _: self._start(client, state, lesson))
        else:
            self._start(client, state, lesson)

    def _start(self, client: Upstream, state: RequestState, lesson: _Lesson) -> None:
        if self._closed:  # a request answered after shutdown began
            self._pending.discard(lesson.key)
            return
        tokens = self._from_answer(state, lesson)
        if tokens is not None:  # the engine returned them with the answer: no call
            self._pending.discard(lesson.key)
            self._learnt(state, lesson, tokens, "answer_ids")
            return
        if len(self._tasks) >= self.max_background:
            self._pending.discard(lesson.key)
            self.count(self.group.name, "background_skipped")
            return
        task = asyncio.get_running_loop().create_task(self._learn(client, state, lesson))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _learn(self, client: Upstream, state: RequestState, lesson: _Lesson) -> None:
        try:
            tokens = await self._call(client, state, lesson.messages, lesson.generation)
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
            self._pending.discard(lesson.key)
        self._learnt(state, lesson, tokens, "background", keys)

    def _learnt(
        self, state: RequestState, lesson: _Lesson, tokens: list[int], how: str, keys: RequestKeys | None = None
    ) -> None:
        """Remember what `tokens` (the lesson's tokenization) gave, and record it where the
        request went when the lesson says so."""
        if keys is None:
            keys = self.group.keys_from_tokens(state, tokens)
        self.count(self.group.name, how)
        lesson.remember(Known(array("Q", keys.chain), len(tokens), lesson.nbytes))
        if lesson.record and state.backend is not None:
            self.group.memory.record(state.backend, keys.chain, self.clock())

    # -- token ids returned with the answer ---------------------------------------------------
    def _ask_ids(self, state: RequestState) -> None:
        """Have the request's answer carry its token ids (kv/answer_ids.py), to learn from them
        instead of asking /tokenize once it has been answered."""
        if (
            self.answer_ids
            and state.api is state.key_api
            and state.api in ASKS
            and state.key_body.get("n") in (None, 1)
        ):
            state.extras[ANSWER_IDS] = AnswerIds(self.wants_ids)

    def wants_ids(self, backend: str) -> bool:
        """Whether `backend` is asked for the ids: one of this group's (a request may go to
        another group's backend), and not after MAX_MISSING answers in a row came without them."""
        return self.member(backend) and self._missing.get(backend, 0) < MAX_MISSING

    def _from_answer(self, state: RequestState, lesson: _Lesson) -> list[int] | None:
        """The lesson's tokens from the ids that came with the request's answer, or None (then
        /tokenize is asked). An answer that came whole without them counts against its backend."""
        ids = state.extras.get(ANSWER_IDS) if lesson.ids is not None else None
        if not isinstance(ids, AnswerIds) or not ids.asked:
            return None
        backend = state.backend
        if ids.missing():
            ids.asked = False  # counted once per request
            self.count(self.group.name, "answer_ids_missing")
            if backend is not None:
                self._missing[backend] = misses = self._missing.get(backend, 0) + 1
                if misses == MAX_MISSING:
                    log.warning(
                        "backend %s returned no token ids with %d answers in a row (return_token_ids needs vLLM "
                        "0.10.2 or later): asking its /tokenize instead",
                        backend,
                        misses,
                    )
            return None
        tokens = ids.prompt() if lesson.ids == "prompt" else ids.answer()
        if tokens is not None and backend is not None:
            self._missing.pop(backend, None)
        return tokens

    # -- the next turn: this one's messages and its answer ------------------------------------
    def _follow_up(
        self, client: Upstream, state: RequestState, messages: list[dict[str, Any]], own: _Lesson | None
    ) -> None:
        """Learn, once `state` has been answered, what its next turn will start with: its
        messages plus the answer the client received (kv/answers.py) when the answer can be
        read, else its own messages (`own`, when they are not known yet)."""
        if not (self.group.learn_answers and reads_answers(state.api, state.key_api)) or state.task is None:
            if own is not None:
                self._background(client, state, own, after=True)
            return
        follow = AnswerRecorder(
            stream=state.stream,
            on_answer=partial(self._answered, client, state, messages, own),
            api=state.api,
        )
        state.extras[ANSWER_RECORDER] = follow
        state.task.add_done_callback(lambda _: follow.settle(None))

    def _answered(
        self,
        client: Upstream,
        state: RequestState,
        messages: list[dict[str, Any]],
        own: _Lesson | None,
        text: str | None,
    ) -> None:
        """A chat request's answer, or None: learn its messages with the answer, or without
        one its own messages."""
        if text is None:
            self.count(self.group.name, "no_answer")
            if own is not None:
                self._background(client, state, own)
            return
        self.count(self.group.name, "answer")
        answered = [*messages, {"role": "assistant", "content": text}]
        digests, sizes = conversation_digests(state.key_body, state.model, answered)
        key = digests[-1]
        if self.known is None or key in self.known:
            return
        remember = partial(self._remember_answer, key, own.key if own is not None else None, sum(sizes[:-1]))
        record = own is not None and own.record
        lesson = _Lesson(key, remember, sum(sizes), answered, False, record, ids="answer")
        tokens = self._from_answer(state, lesson)
        if tokens is None:  # asked of /tokenize, off the path
            self._background(client, state, lesson)
            return
        # The ids came with the answer. Hashed once: the prompt's blocks are the first blocks
        # of the prompt and the answer, so the request's own messages are learnt exactly from
        # them, where the answer's lesson would estimate their end.
        keys = self.group.keys_from_tokens(state, tokens)
        prompt = len(tokens) - state.extras[ANSWER_IDS].output_tokens  # set by answer()
        if own is not None and own.key not in self.known and prompt > 0:
            chain = keys.chain[: prompt // self.group.block_size]
            own_keys = RequestKeys("precise", chain, keys.tokens_per_key, prompt)
            self._learnt(state, own, tokens[:prompt], "answer_ids", own_keys)
        self._learnt(state, lesson, tokens, "answer_ids", keys)

    def _remember_answer(self, key: bytes, own: bytes | None, own_nbytes: int, known: Known) -> None:
        """A conversation with its answer, and (`own`, when not known yet) the conversation
        without it: the answer's tokenization begins with the request's own (the template
        renders the assistant header of the generation prompt, then the answer), to a boundary
        estimated from the JSON sizes less a block. A next turn that does not replay the answer
        verbatim still finds what was asked before it."""
        self._remember_chat(key, known)
        if own is None or self.known is None or own in self.known:
            return
        share = own_nbytes / max(1, known.nbytes)
        blocks = int(len(known.chain) * share) - 1
        if blocks >= 2:
            self._remember_chat(own, Known(known.chain[:blocks], round(known.tokens * share), own_nbytes))

    # -- remembering, here and on the other replicas ----------------------------------------
    def _remember_chat(self, digest: bytes, known: Known) -> None:
        self.group.measured(known.nbytes, known.tokens)
        if self.known is None:
            return
        self.known.put(digest, known)
        self._offer(KIND_CHAT, digest, known, [])

    def _remember_text(self, data: bytes, known: Known) -> None:
        self.group.measured(known.nbytes, known.tokens)
        if self.texts is None:
            return
        digest, chunks = self.texts.put(data, known)
        self._offer(KIND_TEXT, digest, known, chunks)

    def _offer(self, kind: int, digest: bytes, known: Known, chunks: list[int]) -> None:
        if self.share is None or not known.chain:
            return
        self.share(
            Tokenized(
                self.replica, self.group.name, kind, digest, known.chain.tolist(), known.tokens, known.nbytes, chunks
            )
        )

    def apply_shared(self, learnt: Tokenized, how: str = "shared") -> None:
        """What another replica learnt from `/tokenize` (`how`: `shared` live, `restored` from
        the route history): remembered as if asked here."""
        known = Known(array("Q", learnt.chain), learnt.tokens, learnt.nbytes)
        self.group.measured(known.nbytes, known.tokens)
        if learnt.kind == KIND_CHAT and self.known is not None:
            self.known.put(learnt.digest, known)
        elif learnt.kind == KIND_TEXT and self.texts is not None:
            self.texts.put_hashed(learnt.digest, list(learnt.chunks), known)
        else:
            return
        self.count(self.group.name, how)

    def clear(self) -> None:
        if self.known is not None:
            self.known.clear()
        if self.texts is not None:
            self.texts.clear()

    async def settle(self) -> None:
        """Wait for the off-path calls in flight (they are bounded by the call timeout)."""
        while self._tasks or self._late:
            await asyncio.gather(*self._tasks, *self._late, return_exceptions=True)

    async def aclose(self) -> None:
        self._closed = True
        tasks = [*self._tasks, *self._late]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
