"""Request headers that must come once, a request's body, and the header of every
JSON answer.

A second copy of a header is refused, never ignored: a proxy or a client
library that appends a header instead of replacing it sends two values; taking
either one silently could fence a write with the wrong token or release the
wrong lease. ``X-Fencing-Token`` sent twice is
``bad_token`` (``routes.py``); the others here are ``bad_request``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.errors import BadRequest

__all__ = ["json_answer", "json_bytes", "one_header", "read_body"]

_JSON: Final = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json; charset=utf-8"}))
_dumps: Final = json.dumps


def json_answer(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """``web.json_response(data, status=status, headers=headers)``, the same bytes on the
    wire, without parsing its content type anew for every answer."""
    if headers:  # in json_response's order: these, then the content type
        both = CIMultiDict(headers)
        both.update(_JSON)
        return web.Response(body=_dumps(data).encode(), status=status, headers=both)
    return web.Response(body=_dumps(data).encode(), status=status, headers=_JSON)


def json_bytes(body: bytes) -> web.Response:
    """200 with ``body``, JSON already encoded, and the header of every JSON answer."""
    return web.Response(body=body, headers=_JSON)


def one_header(request: web.Request, name: str) -> str | None:
    """The value of header ``name``, or None when it is absent.

    Raises:
        BadRequest: the header is sent more than once.
    """
    values = request.headers.getall(name, None)
    if values is None:
        return None
    if len(values) > 1:
        raise BadRequest(f"header {name} is sent {len(values)} times; send it once")
    return values[0]


async def read_body(request: web.Request) -> bytes:
    """``await request.read()``, without its read loop when the whole body is in.

    A body that came with its head (a lock's, most writes') is taken from the stream
    at once, held to ``client_max_size`` (the body limit: the guard answers 413) as
    read() holds it; one still coming is read by read().
    """
    content = request.content
    if not content.is_eof():  # more to come: read() waits for it
        return await request.read()
    raw = content.read_nowait()
    limit = request.client_max_size
    if limit and len(raw) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(raw))
    return raw
