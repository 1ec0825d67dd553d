"""Prompt text to token ids for the HTTP API, off the event loop where the codec allows it.

vLLM's API server tokenizes on one worker thread (`AsyncMicrobatchTokenizer`, a one-thread
executor) so that its event loop keeps serving while a long prompt is tokenized; Hugging Face's
Rust tokenizer releases the interpreter lock meanwhile. The simulator does the same with a
Hugging Face tokenizer (`codec.off_loop`): one thread per engine, the encodes of its requests
in arrival order. Tokenized on the loop, a 12k-token prompt held every other request of the
engine for 30-90 ms, and a request waiting in the engine's socket meanwhile was counted against
the router in front of it (docs/sim-engine.md, "What is reported").

The built-in tokenizer is pure Python and keeps the lock: it stays on the loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from continuum_sim.protocol.codec import PromptCodec


class PromptTokens:
    def __init__(self, codec: PromptCodec, name: str) -> None:
        self.codec = codec
        # Threads start on the first submit; a codec that stays on the loop never starts one.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-tokenizer")
        self._closed = False

    @property
    def off_loop(self) -> bool:
        return self.codec.off_loop and not self._closed

    async def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """`codec.encode` (its errors unchanged), on the worker thread when the codec allows."""
        if not self.off_loop:
            return self.codec.encode(text, add_special_tokens=add_special_tokens)
        work = partial(self.codec.encode, text, add_special_tokens=add_special_tokens)
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        """Stop the worker (an encode it is running finishes; queued ones are cancelled). Later
        encodes run on the loop."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
