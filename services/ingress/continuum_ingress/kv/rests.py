"""The rests of prompts routed on their held part (`tokenize_unheld_text: off_path`), encoded
after their requests were forwarded.

One queue, oldest first, encoded a few pieces (~100 tokens each) at a time for about
`slice_seconds` per turn of the event loop in all; what is left waits for the next turn, after
the I/O that came in meanwhile. A new 12k-token prompt takes 15-50 ms to encode: in one callback
(or a burst of them, each taking a slice per turn) that would hold up every request and stream
the loop serves meanwhile. At most `limit` rests wait; `add` refuses more.

The budget is small (REST_SLICE_S, 0.5 ms) because a request's way to its first chunk crosses
several loop turns (its body, the upstream's first chunk, the write to the client), and while
rests are queued every turn carries a slice: I/O that became ready waits for the slice under way.
With 2-ms slices about one loop-lag tick in thirteen on the conversation trace came 5-25 ms late;
with 0.5 ms about one in forty, at the same CPU (docs/benchmarks.md, "Rests in half-millisecond
slices").
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from continuum_common.tokenization import PartialPrompt

T = TypeVar("T")

REST_SLICE_S = 0.0005  # encoding per loop turn, all queued rests together (see above)


def encode_until(prompt: PartialPrompt, deadline: float, pieces: int) -> bool:
    """Encode `prompt` `pieces` at a time, at least once and until `deadline` (perf_counter);
    True once it is whole."""
    while not prompt.done:
        prompt.extend(pieces)
        if time.perf_counter() >= deadline:
            break
    return prompt.done


class RestQueue(Generic[T]):
    """`on_whole(item, chain)` once an item's prompt is whole; `on_failed(item, exc)` when its
    encoding raised (the item is dropped)."""

    def __init__(
        self,
        on_whole: Callable[[T, list[int]], None],
        on_failed: Callable[[T, Exception], None],
        *,
        limit: int = 64,
        slice_seconds: float = REST_SLICE_S,
        pieces: int = 2,
    ) -> None:
        self.on_whole = on_whole
        self.on_failed = on_failed
        self.limit = limit
        self.slice_seconds = slice_seconds
        self.pieces = pieces
        self._pending = 0  # added and not yet whole or failed
        self._queue: deque[tuple[T, PartialPrompt]] = deque()

    def __len__(self) -> int:
        return self._pending

    def add(self, item: T, prompt: PartialPrompt) -> bool:
        """Queue `prompt` once the callbacks already scheduled in this loop turn have run (the
        forwarder writes its request in one of them). False when `limit` rests wait already."""
        if self._pending >= self.limit:
            return False
        self._pending += 1
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._enqueue, item, prompt)
        return True

    def _enqueue(self, item: T, prompt: PartialPrompt) -> None:
        self._queue.append((item, prompt))
        if len(self._queue) == 1:
            self._encode()

    def _encode(self) -> None:
        try:
            self._encode_until(time.perf_counter() + self.slice_seconds)
        finally:  # a callback that raised must not stall the rests behind it
            if self._queue:
                asyncio.get_running_loop().call_soon(self._encode)

    def _encode_until(self, deadline: float) -> None:
        while self._queue:
            item, prompt = self._queue[0]
            try:
                whole = encode_until(prompt, deadline, self.pieces)
            except Exception as exc:  # TokenizationError; the request went already
                self._done()
                self.on_failed(item, exc)
                continue
            if not whole:
                break
            self._done()
            self.on_whole(item, prompt.finish().block_hashes)
            if time.perf_counter() >= deadline:
                break

    def _done(self) -> None:
        self._queue.popleft()
        self._pending -= 1
