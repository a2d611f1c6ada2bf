"""The gateway app served in-process as ``fencegate serve`` serves it.

aiohttp's ``TestServer`` (behind pytest-aiohttp's ``aiohttp_client`` and
``aiohttp_server``) runs an app with ``handler_cancellation`` on, an access log
and a 60 s shutdown timeout: a client that disconnects cancels its handler, which
``fencegate serve`` never does. ``GatewayServer`` is a ``TestServer`` whose
runner is the one ``fencegate serve`` builds (``gateway.serve.app_runner``), so
an in-process test sees what production does; ``tests/conftest.py`` serves it
as the ``gateway_client`` and ``gateway_server`` fixtures.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.serve import app_runner

__all__ = ["Client", "GatewayServer", "ServeClient", "ServeServer", "clients", "servers"]

Client = TestClient[web.Request, web.Application]
ServeClient = Callable[[web.Application], Awaitable[Client]]
ServeServer = Callable[..., Awaitable["GatewayServer"]]


class GatewayServer(TestServer):
    """A ``TestServer`` (same API: ``port``, ``make_url``, ``close``...) running a
    ``create_app`` app under ``fencegate serve``'s runner."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        # TestServer.start_server passes handler_cancellation=True, and any keyword of
        # its own: production's runner takes none of them.
        extra = set(kwargs) - {"handler_cancellation"}
        if extra:
            raise TypeError(f"fencegate serve's runner takes no {sorted(extra)}")
        return app_runner(self.app)


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[ServeServer]:
    """``serve(app, ssl=None)``: a started ``GatewayServer``; all closed at the end."""
    started: list[GatewayServer] = []

    async def serve(app: web.Application, *, ssl: ssl.SSLContext | None = None) -> GatewayServer:
        server = GatewayServer(app)
        started.append(server)
        await server.start_server(ssl=ssl)
        return server

    try:
        yield serve
    finally:
        while started:
            await started.pop().close()


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[ServeClient]:
    """``serve(app)``: a ``TestClient`` of a started ``GatewayServer``; all closed at the end."""
    started: list[Client] = []

    async def serve(app: web.Application) -> Client:
        client: Client = TestClient(GatewayServer(app))
        started.append(client)
        await client.start_server()
        return client

    try:
        yield serve
    finally:
        while started:
            await started.pop().close()
