"""The fault proxy in front of a real redis-server: each mode does what the nemesis assumes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests._servers import RedisNode
from tests.campaign.proxy import FaultProxy

PING = b"*1\r\n$4\r\nPING\r\n"
INCR = b"*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n"


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[FaultProxy, RedisNode]]:
    node = RedisNode(tmp_path / "node")
    node.start()
    link = FaultProxy(node.port)
    await link.start()
    try:
        yield link, node
    finally:
        await link.close()
        node.stop()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def ask(link: FaultProxy, payload: bytes, within: float = 0.5) -> tuple[Conn, bytes | None]:
    """Send on a new connection; the reply, b"" on EOF, None when nothing came in time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    writer.write(payload)
    try:
        async with asyncio.timeout(within):
            return (reader, writer), await reader.read(100)
    except TimeoutError:
        return (reader, writer), None
    except ConnectionError:
        return (reader, writer), b""


async def close(conn: Conn) -> None:
    writer = conn[1]
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_pass_delay_and_blackhole(proxy: tuple[FaultProxy, RedisNode]) -> None:
    link, _ = proxy
    conn, reply = await ask(link, PING)
    assert reply == b"+PONG\r\n"
    await close(conn)

    link.set("delay", delay=0.3)
    loop = asyncio.get_running_loop()
    start = loop.time()
    conn, reply = await ask(link, PING, within=5.0)
    assert reply == b"+PONG\r\n"
    assert loop.time() - start >= 0.6  # both directions waited
    await close(conn)

    link.set("blackhole")
    conn, reply = await ask(link, PING, within=0.5)
    assert reply is None  # held while the partition lasts
    link.heal()
    assert await asyncio.wait_for(conn[0].read(100), 5.0) == b"+PONG\r\n"  # delivered afterwards
    await close(conn)


async def test_cut_closes_open_and_new_connections(proxy: tuple[FaultProxy, RedisNode]) -> None:
    link, _ = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    writer.write(PING)
    assert await reader.read(100) == b"+PONG\r\n"
    link.set("cut")
    assert await asyncio.wait_for(reader.read(100), 5.0) == b""  # EOF on the open one
    await close((reader, writer))
    conn, reply = await ask(link, PING, within=5.0)
    assert reply == b""  # a new one is closed at once
    await close(conn)
    link.heal()
    conn, reply = await ask(link, PING, within=5.0)
    assert reply == b"+PONG\r\n"
    await close(conn)


async def test_dropping_replies_runs_commands_and_dropping_commands_does_not(
    proxy: tuple[FaultProxy, RedisNode],
) -> None:
    link, node = proxy
    link.set("drop_down")
    conn, reply = await ask(link, INCR, within=5.0)
    assert reply == b""  # no reply, and the connection ends
    await close(conn)
    assert node.command("GET", "n") == b"$1\r\n1\r\n"  # it ran; the reply was lost

    link.set("drop_up")
    conn, reply = await ask(link, INCR, within=5.0)
    assert reply == b""
    await close(conn)
    assert node.command("GET", "n") == b"$1\r\n1\r\n"  # never reached the node
    link.heal()
    conn, reply = await ask(link, INCR, within=5.0)
    assert reply == b":2\r\n"  # a new connection after the loss has no hole in its stream
    await close(conn)
