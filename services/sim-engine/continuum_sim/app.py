"""Composition root: one `SimEngineServer` per engine (engine core + ZMQ publisher + HTTP server),
and `serve_fleet` for the command line, which runs N of them on one event loop until a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from continuum_common.asgi_server import EmbeddedServer
from continuum_common.tokenization import TokenizationError, UnlockedTokenizer, find_chat_template
from continuum_sim.adapters.http_api import build_app
from continuum_sim.adapters.prompt_tokens import PromptTokens
from continuum_sim.adapters.zmq_publisher import ZmqEventPublisher
from continuum_sim.config import EngineConfig
from continuum_sim.engine import SimEngine
from continuum_sim.errors import SimConfigError, SimError
from continuum_sim.protocol.codec import BuiltinCodec, HfCodec, PromptCodec
from continuum_sim.protocol.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineEndpoints:
    """Where to reach one running engine. `kv_events_endpoint` is what a SUB socket connects to
    (engine `zmq_mode="bind"`) or binds (engine `zmq_mode="connect"`)."""

    name: str
    model: str
    url: str
    kv_events_endpoint: str | None
    zmq_mode: str
    replay_endpoint: str | None
    topic: str
    era: str
    hash_wire: str
    block_size: int
    num_gpu_blocks: int
    python_hash_seed: str
    tokenizer: str | None = None  # the Hugging Face tokenizer.json the engine uses (None: built-in)
    chat_template: str | None = None  # the chat template file it renders with (None: ChatML)

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def detokenize_url(self) -> str:
        return self.url + "/detokenize"

    @property
    def kv_capacity_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineEndpoints:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class SimEngineServer:
    """One engine with its sockets. `start()` binds everything; `stop()` releases it."""

    def __init__(self, config: EngineConfig, codec: PromptCodec, zmq_context: zmq.asyncio.Context) -> None:
        self.config = config
        self.publisher: ZmqEventPublisher | None = None
        self.engine = SimEngine(config, codec)
        self.prompts = PromptTokens(codec, config.name)
        if config.kv_events.enabled:
            self.publisher = ZmqEventPublisher(config.kv_events, self.engine.metrics, zmq_context)
            self.engine.events = self.publisher
        # Keep-alive longer than uvicorn's 5 s default: benchmark clients hold pooled connections.
        self.http = EmbeddedServer(
            build_app(self.engine, self.prompts), config.host, config.port, timeout_keep_alive=30
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def endpoints(self) -> EngineEndpoints:
        kv = self.config.kv_events
        pub = self.publisher
        return EngineEndpoints(
            name=self.config.name,
            model=self.config.model,
            url=self.http.url,
            kv_events_endpoint=pub.endpoint if pub else None,
            zmq_mode=kv.zmq_mode,
            replay_endpoint=pub.replay_endpoint if pub else None,
            topic=kv.topic,
            era=kv.era,
            hash_wire=kv.hash_wire,
            block_size=self.config.block_size,
            num_gpu_blocks=self.config.num_gpu_blocks,
            python_hash_seed=self.config.python_hash_seed,
            tokenizer=self.config.tokenizer,
            chat_template=chat_template_path(self.config),
        )

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        http = asyncio.create_task(self.http.serve(), name=f"{self.config.name}-http")
        self._tasks = [asyncio.create_task(self.engine.run(), name=f"{self.config.name}-steps"), http]
        while not self.http.started:  # uvicorn exposes readiness only as a flag
            if http.done():
                http.result()  # raises the start-up error
                raise RuntimeError(f"{self.config.name}: HTTP server stopped during start-up")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self.http.request_stop()
        if self._tasks:
            # uvicorn drains in-flight requests for up to its 2 s graceful timeout.
            await asyncio.wait([self._tasks[-1]], timeout=5)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.http.stop()  # closes the socket bound in __init__ even if start() never ran
        self.prompts.close()
        if self.publisher is not None:
            await self.publisher.close()

    def crashed(self) -> BaseException | None:
        """The exception of a background task that died, if any (the step loop never ends)."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None


def chat_template_path(config: EngineConfig) -> str | None:
    """The template an engine renders with: its own, else its model directory's
    (`find_chat_template`), else None (the built-in ChatML text)."""
    if config.chat_template is not None or config.tokenizer is None:
        return config.chat_template
    found = find_chat_template(config.tokenizer)
    return str(found) if found is not None else None


def load_codecs(configs: Sequence[EngineConfig]) -> list[PromptCodec]:
    """One codec per engine; engines with the same tokenizer files share one (codecs are
    immutable apart from bounded caches). SimConfigError when a file cannot be loaded."""
    shared: dict[tuple[str | None, str | None], PromptCodec] = {}
    out: list[PromptCodec] = []
    for config in configs:
        key = (config.tokenizer, chat_template_path(config))
        if key not in shared:
            if config.tokenizer is None:
                shared[key] = BuiltinCodec(Tokenizer())
            else:
                try:
                    shared[key] = HfCodec(UnlockedTokenizer(config.tokenizer, chat_template=key[1]))
                except TokenizationError as exc:
                    raise SimConfigError(f"{config.name}: {exc}") from None
        out.append(shared[key])
    return out


async def start_servers(configs: Sequence[EngineConfig], zmq_context: zmq.asyncio.Context) -> list[SimEngineServer]:
    """Start every engine."""
    codecs = load_codecs(configs)
    servers: list[SimEngineServer] = []
    try:
        for config, codec in zip(configs, codecs, strict=True):
            server = SimEngineServer(config, codec, zmq_context)
            servers.append(server)
            await server.start()
    except zmq.ZMQError as exc:
        await stop_servers(servers)
        raise SimError(f"{servers[-1].config.name}: cannot open its ZMQ sockets: {exc}") from exc
    except BaseException:
        await stop_servers(servers)
        raise
    return servers


async def stop_servers(servers: Sequence[SimEngineServer]) -> None:
    await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


def write_info(path: str | Path, endpoints: Sequence[EngineEndpoints], pids: Sequence[int] | None = None) -> None:
    """Write the fleet's endpoints as JSON, atomically (readers poll for the file). `pids`: the
    processes serving them (default: this one); `pid` is the first, for older readers."""
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    serving = list(pids) if pids else [os.getpid()]
    document = {"pid": serving[0], "pids": serving, "engines": [e.to_dict() for e in endpoints]}
    tmp.write_text(json.dumps(document, indent=2))
    tmp.replace(target)


async def serve_fleet(configs: Sequence[EngineConfig], info_file: str | None = None) -> None:
    """Run the engines until SIGINT/SIGTERM. Prints one line per engine."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    context = zmq.asyncio.Context()
    try:
        servers = await start_servers(configs, context)
        try:
            for server in servers:
                e = server.endpoints
                print(
                    f"{e.name}: {e.url}  kv-events {e.kv_events_endpoint or '-'} ({e.zmq_mode}, era {e.era})"
                    f"  replay {e.replay_endpoint or '-'}",
                    flush=True,
                )
            if info_file:
                write_info(info_file, [s.endpoints for s in servers])
            async with asyncio.TaskGroup() as group:
                group.create_task(_watch(servers, stop))
                await stop.wait()
        finally:
            await stop_servers(servers)
    finally:
        context.destroy(linger=0)


async def _watch(servers: Sequence[SimEngineServer], stop: asyncio.Event) -> None:
    """Fail loudly when an engine's loop dies instead of serving a half-dead fleet."""
    while not stop.is_set():
        for server in servers:
            exc = server.crashed()
            if exc is not None:
                stop.set()
                raise RuntimeError(f"engine {server.config.name} crashed") from exc
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
