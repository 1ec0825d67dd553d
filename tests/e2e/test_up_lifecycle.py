"""The lifecycle of `continuum-router up` as a real process: what its children and ports do when
it is killed, when a second one starts, on SIGHUP, and when its terminal hangs up."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx

from continuum_testing.up_process import (
    ROUTER,
    children_of,
    kill_leftovers,
    listening_ports,
    lock_record,
    read_until,
    recorded_children,
    run_to_end,
    start_up,
    stop,
    wait_all_gone,
)

BANNER = r"Continuum is up on (http://\S+)"


async def test_kill_9_of_up_takes_its_children_and_ports_and_the_next_up_starts_clean(tmp_path: Path) -> None:
    state = tmp_path / ".continuum"
    proc = await start_up(tmp_path, "--demo", "--port", "0")
    assert proc.stdout is not None
    children: dict[str, int] = {}
    try:
        url = (await read_until(proc.stdout, BANNER, 60))[0].group(1)
        children = recorded_children(state)
        # The lock file names every child process `up` has (the engines and nats-server).
        assert set(children) == {"simulated engines", "nats-server"}
        assert set(children.values()) == children_of(proc.pid)
        ports = listening_ports(state, url, children["nats-server"])
        proc.kill()
        await proc.wait()
        alive, listening = await wait_all_gone(list(children.values()), ports)
        assert alive == [] and listening == [], f"left running: pids {alive}, ports {listening}"
    finally:
        await stop(proc, signal.SIGKILL)
        kill_leftovers(list(children.values()))

    # The dead `up` left its lock file: the next one says so, starts, and owns the file.
    assert lock_record(state)["pid"] == proc.pid
    again = await start_up(tmp_path, "--demo", "--port", "0")
    assert again.stdout is not None
    try:
        _, seen = await read_until(again.stdout, BANNER, 60)
        assert f"the previous up (pid {proc.pid}) did not stop cleanly" in seen
        assert lock_record(state)["pid"] == again.pid
        children = recorded_children(state)
    finally:
        code = await stop(again, signal.SIGINT)
    alive, _ = await wait_all_gone(list(children.values()), [], limit=1)
    kill_leftovers(alive)
    assert code == 0 and alive == []
    assert not (state / "up.lock").exists()  # a clean stop removes it


async def _reloads_ok(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(r'^continuum_config_reloads_total\{result="ok"\} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_a_second_up_is_refused_and_sighup_reloads_without_touching_the_engines(tmp_path: Path) -> None:
    state = tmp_path / ".continuum"
    proc = await start_up(tmp_path, "--demo", "--port", "0")
    assert proc.stdout is not None
    children: dict[str, int] = {}
    try:
        url = (await read_until(proc.stdout, BANNER, 60))[0].group(1)
        children = recorded_children(state)

        # Same state directory: one line naming the running one, exit 1, nothing started.
        code, out, err = await run_to_end(*ROUTER, "up", "--demo", "--port", "0", cwd=tmp_path)
        assert code == 1
        assert out == ""
        assert err.splitlines() == [
            f"error: continuum-router up is already running with the state directory {state.resolve()} "
            f"(pid {proc.pid}); stop it first, or start this one in another directory"
        ]
        assert children_of(proc.pid) == set(children.values())

        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            before = await _reloads_ok(client)
            proc.send_signal(signal.SIGHUP)
            for _ in range(100):
                if await _reloads_ok(client) == before + 1:
                    break
                await asyncio.sleep(0.05)
            assert await _reloads_ok(client) == before + 1
            await asyncio.sleep(1.0)  # past the second look at the terminal
            assert proc.returncode is None
            assert children_of(proc.pid) == set(children.values())
            body = {"model": "continuum-sim-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
    finally:
        code = await stop(proc, signal.SIGTERM)
    alive, _ = await wait_all_gone(list(children.values()), [], limit=1)
    kill_leftovers(alive)
    assert code == 0 and alive == []


# Runs the rest of its command line with stdin (a pty) as its controlling terminal, as a login
# shell's job has one.
# Takes the pty as controlling terminal and restores SIGHUP's default disposition (a suite run
# under nohup would pass SIG_IGN on, and `up` rightly never stops on a hang-up then).
_WITH_CTTY = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)


class _PtyOutput:
    """Everything written to the terminal, read from its master side as it comes."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.text = ""
        self.changed = asyncio.Event()
        os.set_blocking(master, False)
        asyncio.get_running_loop().add_reader(master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO: the other side is gone
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            return
        self.text += data.decode(errors="replace")
        self.changed.set()

    async def wait_for(self, pattern: str, limit: float) -> re.Match[str]:
        async with asyncio.timeout(limit):
            while (match := re.search(pattern, self.text)) is None:
                self.changed.clear()
                await self.changed.wait()
        return match

    def hang_up(self) -> None:
        if self.master < 0:
            return
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        self.master = -1


async def test_a_terminal_hang_up_stops_up_cleanly(tmp_path: Path) -> None:
    master, slave = os.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WITH_CTTY, *ROUTER, "up", "--demo", "--port", "0",
        cwd=tmp_path, env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"},
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    output = _PtyOutput(master)
    children: dict[str, int] = {}
    try:
        url = (await output.wait_for(BANNER, 60)).group(1)
        state = tmp_path / ".continuum"
        children = recorded_children(state)
        ports = listening_ports(state, url, children["nats-server"])
        output.hang_up()  # closing the terminal: the kernel sends SIGHUP to `up`
        async with asyncio.timeout(30):
            code = await proc.wait()
        # what `up` said after the terminal was gone (why it stopped, and any error) is kept
        kept = state / "up-after-hangup.log"
        said = kept.read_text(errors="replace") if kept.exists() else ""
        assert code == 0, said[-4000:]
        assert "the terminal is gone (SIGHUP): stopping" in said
        alive, listening = await wait_all_gone(list(children.values()), ports, limit=5)
        assert alive == [] and listening == [], f"left running: pids {alive}, ports {listening}"
        assert not (state / "up.lock").exists()
    finally:
        output.hang_up()
        await stop(proc, signal.SIGKILL)
        kill_leftovers(list(children.values()))
