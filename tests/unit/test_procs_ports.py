"""Ports handed to child services: free, and outside the kernel's ephemeral range so that no
outgoing connection can take one before the child binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from continuum_common import procs
from continuum_common.procs import ephemeral_port_range, free_port, port_is_free


def test_free_ports_lie_outside_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = ephemeral_port_range()
    ports = {free_port() for _ in range(50)}
    assert all(not low <= p <= high for p in ports)
    assert all(p >= 10_000 for p in ports)
    assert all(port_is_free(p) for p in ports)
    assert len(ports) > 40  # picked at random, not one fixed port


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])


def test_the_range_comes_from_the_kernel_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("20000\t60000\n")
    monkeypatch.setattr(procs, "_EPHEMERAL_RANGE_FILE", range_file)
    assert ephemeral_port_range() == (20_000, 60_000)
    assert all(10_000 <= p < 20_000 or p > 60_000 for p in (free_port() for _ in range(30)))
    range_file.write_text("garbage")
    assert ephemeral_port_range() == (32_768, 60_999)


def test_no_room_outside_the_range_falls_back_to_the_os(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("1024 65535")
    monkeypatch.setattr(procs, "_EPHEMERAL_RANGE_FILE", range_file)
    port = free_port()
    assert 1024 <= port <= 65_535 and port_is_free(port)


async def test_the_nats_readiness_probe_is_refused_at_once_while_nothing_listens(tmp_path: Path) -> None:
    # nats-py keeps retrying a refused first connect, so a probe that asked it first ran into
    # its own 2-s bound on every start that probed before the server listened; the plain TCP
    # connect in front of it is refused at once, and start() probes again 50 ms later.
    server = procs.NatsServer(data_dir=tmp_path, port=free_port())
    with pytest.raises(ConnectionRefusedError):
        await server.wait_ready()


async def test_a_second_nats_server_in_one_process_is_ready_through_the_probe(tmp_path: Path) -> None:
    for name in ("a", "b"):
        server = procs.NatsServer(data_dir=tmp_path / name)
        await server.start()
        try:
            await server.wait_ready()
        finally:
            await server.close()
