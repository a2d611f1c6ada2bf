"""A node's connection attempt that is cancelled (``Node.close`` during a reconnect)
closes its socket instead of leaving it to the garbage collector."""

from __future__ import annotations

import asyncio

from lockservice.node import Inbox, Node, parse_node_url


async def test_a_connect_cancelled_while_waiting_for_info_closes_its_socket() -> None:
    accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await accepted.put(reader)  # a server that takes the connection and never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    inbox: Inbox = asyncio.Queue()
    node = Node(parse_node_url(f"redis://127.0.0.1:{port}"), 0, timeout=5.0, channels=(),
                inbox=inbox)  # fmt: skip
    try:
        connecting = asyncio.create_task(node._connect_commands(report=False))
        reader = await asyncio.wait_for(accepted.get(), 5.0)
        await asyncio.sleep(0.05)  # INFO sent; the connect now waits for its answer
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        # The client side closed its socket: the server reads to EOF, not until the GC.
        async with asyncio.timeout(2.0):
            while await reader.read(4096):
                pass
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
