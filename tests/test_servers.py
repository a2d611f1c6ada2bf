"""The test servers' ports: parallel test workers must never share a redis-server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests._servers import PortTaken, RedisNode, free_port


def _process_id(node: RedisNode) -> int:
    info = node.command("INFO", "server").decode()
    return int(info.split("process_id:", 1)[1].split("\r\n", 1)[0])


def test_a_node_whose_port_was_taken_first_starts_on_another(tmp_path: Path) -> None:
    first = RedisNode(tmp_path / "first")
    first.start()
    second = RedisNode(tmp_path / "second")
    second.port = first.port  # another worker's node took the port in the meantime
    try:
        second.start()
        assert second.port != first.port
        assert first.proc is not None
        assert second.proc is not None
        assert _process_id(first) == first.proc.pid
        assert _process_id(second) == second.proc.pid
        # a restart keeps its address (tests rely on it): a taken port is an error then
        second.kill()
        second.port = first.port
        with pytest.raises(PortTaken):
            second.start()
    finally:
        first.stop()
        second.stop()


def test_free_ports_are_bindable_below_the_ephemeral_range_and_not_repeated() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports), ports
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))
