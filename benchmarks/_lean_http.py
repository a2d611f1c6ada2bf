"""A lean HTTP/1.1 keep-alive client for the benchmarks: asyncio Protocols, little CPU.

aiohttp's ``ClientSession`` costs the load generator ~110 µs of CPU per request
(benchmarks/results/etcd.md: 225 µs per fencegate lock cycle of two requests),
taken from the cores the servers run on. This client does only what the
benchmarks need:

* ``Connection``: one TCP connection to one host:port, one request in flight at a
  time, kept alive between requests; it connects on first use and again after the
  server closed it;
* ``Pool``: N of them to one host:port, ``pool[i]`` for worker ``i`` (a worker owns
  its connection, so there is nothing to wait for and no lock);
* a request is one ``bytes`` built from fixed parts (request line, ``Host``, the
  caller's few headers, ``Content-Length``) and one ``transport.write``;
* an answer is parsed from what arrives in ``data_received``: the status line,
  the header block (returned raw; ``header()`` finds one value), and a body of
  ``Content-Length`` bytes or ``Transfer-Encoding: chunked`` (etcd's JSON gateway,
  Go's net/http, answers its errors chunked with a trailer; its 200s have a
  Content-Length, as do all of fencegate's answers). 204 and 304 have no body.

Errors: ``ServerClosed`` when the connection ends before the whole answer (the
next request connects again), ``BadResponse`` for an answer it cannot parse
(the connection is dropped), ``TimeoutError`` when no whole answer came within
``timeout`` seconds (the connection is dropped). Redirects, 1xx answers, bodies
delimited by the end of the connection, TLS and proxies are not supported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final, NamedTuple, cast

__all__ = [
    "BadResponse",
    "Connection",
    "LeanHTTPError",
    "Pool",
    "Response",
    "ServerClosed",
    "header",
]

MAX_HEAD: Final = 64 * 1024  # a header block longer than this is refused
NO_BODY: Final = frozenset((204, 304))


class LeanHTTPError(Exception):
    """Base class of the lean client's errors."""


class ServerClosed(LeanHTTPError):
    """The connection ended before the whole answer arrived."""

    def __init__(self, where: str, got: int) -> None:
        super().__init__(f"{where} closed the connection with {got} bytes of the answer read")
        self.got = got


class BadResponse(LeanHTTPError):
    """An answer that is not the HTTP/1.1 this client parses."""

    def __init__(self, where: str, why: str, start: bytes) -> None:
        super().__init__(f"bad answer from {where}: {why} (starts {start[:60]!r})")


class Response(NamedTuple):
    status: int
    head: bytes  # the status line and header lines, CRLF-separated, without the blank line
    body: bytes


def header(head: bytes, name: str) -> str | None:
    """The value of the first header ``name`` (any case) in a raw header block, or None."""
    key = b"\r\n" + name.lower().encode("latin-1") + b":"
    lower = head.lower()
    i = lower.find(key)
    if i < 0:
        return None
    j = head.find(b"\r\n", i + len(key))
    return head[i + len(key) : j if j >= 0 else len(head)].strip().decode("latin-1")


def _chunked(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at ``pos``: (body, end) or None while incomplete."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = buf[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError(f"chunk size {size_text[:20]!r}") from None
        if size < 0:
            raise ValueError(f"chunk size {size_text[:20]!r}")
        if size == 0:  # then trailer lines, each CRLF-ended, and an empty line
            end = buf.find(b"\r\n\r\n", eol)
            return None if end < 0 else (b"".join(parts), end + 4)
        start = eol + 2
        if len(buf) < start + size + 2:
            return None
        if buf[start + size : start + size + 2] != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")
        parts.append(buf[start : start + size])
        pos = start + size + 2


class _Protocol(asyncio.Protocol):
    """Parses the answers of one connection; ``waiter`` is the request in flight."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Response] | None = None
        self.buf = b""
        self.closed = False
        self.keep = True  # the last answer allows another request on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            error = ServerClosed(self.where, len(self.buf))
            if exc is not None:
                error.__cause__ = exc
            waiter.set_exception(error)

    def fail(self, error: Exception) -> None:
        """Fail the request in flight and drop the connection."""
        waiter, self.waiter = self.waiter, None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if self.waiter is None:
            self.buf = buf
            self.fail(BadResponse(self.where, "bytes with no request in flight", buf))
            return
        try:
            parsed = self._parse(buf)
        except ValueError as exc:
            self.fail(BadResponse(self.where, str(exc), buf))
            return
        if parsed is None:
            self.buf = buf
            return
        response, end = parsed
        self.buf = b""
        if end != len(buf):
            self.fail(BadResponse(self.where, f"{len(buf) - end} bytes after the answer", buf))
            return
        waiter, self.waiter = self.waiter, None
        if not waiter.done():
            waiter.set_result(response)

    def _parse(self, buf: bytes) -> tuple[Response, int] | None:
        split = buf.find(b"\r\n\r\n")
        if split < 0:
            if len(buf) > MAX_HEAD:
                raise ValueError(f"no end of the header block in {MAX_HEAD} bytes")
            return None
        if not buf.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) or buf[12:13] not in (b" ", b"\r"):
            raise ValueError("not an HTTP/1.x status line")
        try:
            status = int(buf[9:12])
        except ValueError:
            raise ValueError("no status code") from None
        head = buf[:split]
        lower = buf[: split + 2].lower()  # every header line CRLF-ended
        start = split + 4
        self.keep = buf[7] == 0x31  # HTTP/1.1 keeps the connection unless it says close
        i = lower.find(b"\r\nconnection:")
        if i >= 0:
            value = lower[i + 13 : lower.find(b"\r\n", i + 13)]
            self.keep = b"close" not in value and (self.keep or b"keep-alive" in value)
        i = lower.find(b"\r\ntransfer-encoding:")
        if i >= 0:
            value = lower[i + 20 : lower.find(b"\r\n", i + 20)].strip()
            if value != b"chunked":
                raise ValueError(f"transfer-encoding {value[:30]!r}")
            got = _chunked(buf, start)
            return None if got is None else (Response(status, head, got[0]), got[1])
        i = lower.find(b"\r\ncontent-length:")
        if i >= 0:
            size = int(lower[i + 17 : lower.find(b"\r\n", i + 17)])  # ValueError: malformed
            if size < 0:
                raise ValueError(f"content-length {size}")
        elif status in NO_BODY:
            size = 0
        else:
            raise ValueError(f"status {status} with neither content-length nor chunked")
        end = start + size
        if len(buf) < end:
            return None
        return Response(status, head, buf[start:end]), end


class Connection:
    """One keep-alive connection to ``host:port``, one request in flight at a time."""

    def __init__(self, host: str, port: int, *, timeout: float = 30.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.where = f"{host}:{port}"
        self._host_line = f"\r\nHost: {self.where}\r\n"
        self._proto: _Protocol | None = None
        self.connects = 0  # how many times it connected (a test's and a curious reader's)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: _Protocol(self.where), self.host, self.port)
        self.connects += 1
        return proto

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
    ) -> Response:
        """Send one request and return its answer: (status, raw header block, body)."""
        proto = self._proto
        if proto is None or proto.closed or not proto.keep:
            if proto is not None and not proto.closed and proto.transport is not None:
                proto.transport.close()
            proto = self._proto = await self._connect()
        if proto.waiter is not None:
            raise RuntimeError(f"a request to {self.where} is already in flight")
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers])
        raw = f"{method} {path} HTTP/1.1{self._host_line}{extra}Content-Length: {len(body)}\r\n\r\n"
        loop = asyncio.get_running_loop()
        waiter = proto.waiter = loop.create_future()
        assert proto.transport is not None
        proto.transport.write(raw.encode("latin-1") + body if body else raw.encode("latin-1"))
        timer = loop.call_later(self.timeout, self._expire, proto, waiter)
        try:
            response: Response = await waiter
            return response
        finally:
            timer.cancel()
            if proto.waiter is waiter:  # cancelled: its answer may still come, drop it all
                proto.fail(ServerClosed(self.where, len(proto.buf)))

    def _expire(self, proto: _Protocol, waiter: asyncio.Future[Response]) -> None:
        if proto.waiter is waiter:
            proto.fail(TimeoutError(f"no answer from {self.where} in {self.timeout:g} s"))

    def close(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()


class Pool:
    """``size`` connections to one ``host:port``; ``pool[i]`` is worker ``i``'s own."""

    def __init__(self, host: str, port: int, size: int, *, timeout: float = 30.0) -> None:
        self.conns = [Connection(host, port, timeout=timeout) for _ in range(size)]

    @classmethod
    def for_url(cls, url: str, size: int, *, timeout: float = 30.0) -> Pool:
        """A pool for ``http://host:port`` (no path, no TLS)."""
        rest = url.removeprefix("http://")
        if rest == url or "/" in rest.rstrip("/"):
            raise ValueError(f"not an http://host:port url: {url!r}")
        host, _, port = rest.rstrip("/").rpartition(":")
        return cls(host.strip("[]"), int(port), size, timeout=timeout)

    def __getitem__(self, i: int) -> Connection:
        return self.conns[i]

    def __len__(self) -> int:
        return len(self.conns)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
