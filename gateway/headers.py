"""Request headers that must come once: a second copy is refused, never ignored.

A proxy or a client library that appends a header instead of replacing it
sends two values; taking either one silently could fence a write with the
wrong token or release the wrong lease. ``X-Fencing-Token`` sent twice is
``bad_token`` (``routes.py``); the others here are ``bad_request``.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import BadRequest

__all__ = ["one_header"]


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
