"""JSON answers to requests aiohttp refuses before any route or middleware sees them.

A request line, header or length that aiohttp's parser rejects (an unknown method,
``Content-Length: -1``, a duplicated ``Content-Type``, a line too long) is answered
by aiohttp's ``RequestHandler.handle_error`` with a ``text/plain`` body. Clients read
fencegate's errors as JSON (``{"error": code, "message": ...}``, DESIGN.md), so the
handler here answers those in that shape, with the same status, and closes the
connection as aiohttp does. aiohttp has no public hook for it: the server of
``JsonErrorRunner`` makes this handler class instead of its own.
"""

from __future__ import annotations

from http.client import responses
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import INTERNAL, BadRequest, reason_code
from gateway.headers import json_answer

__all__ = ["JsonErrorRunner"]

_MESSAGE_LIMIT = 300  # characters of the parser's message kept (it may quote the request)


class _JsonErrors(RequestHandler):
    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own first: it logs, and refuses when a response was sent already
        super().handle_error(request, status, exc, message)
        if status >= 500:
            body = INTERNAL
        else:
            reason = responses.get(status, "Bad Request")  # the parser's are 4xx
            code = BadRequest.code if status == 400 else reason_code(reason)
            text = (message or reason).splitlines()[0][:_MESSAGE_LIMIT]
            body = {"error": code, "message": text}
        response = json_answer(body, status=status)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors as JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is web.Server:  # the class this aiohttp makes: a layout we know
            server.__class__ = _JsonErrorServer
        return server
