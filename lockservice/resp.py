"""A lean Redis connection with automatic pipelining.

Every command a task sends in one turn of the event loop goes out in one
socket write, and replies resolve futures in order (Redis answers each
connection in order). Futures always get a *value*: a reply, a
``hiredis.ReplyError`` or a ``ConnectionError``; never an exception, so a
caller may stop waiting for one (quorum reached, deadline passed) without the
loop complaining about an unretrieved exception.

redis-py's pool does one round trip per command per connection; a Redlock
round sends the same script to every node and many tasks share a node, so
batching per node is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple, TypeAlias

import hiredis

if TYPE_CHECKING:
    from lockservice.scripts import Script

__all__ = [
    "Connection",
    "Packed",
    "Reply",
    "ReplyError",
    "Retry",
    "is_failure",
    "open_connection",
    "pack_args",
    "pack_call",
    "pack_command",
    "pack_keys",
    "pack_script",
    "pack_str",
]

log = logging.getLogger(__name__)
ReplyError = hiredis.ReplyError
# What a command's future resolves to: a RESP value, an error reply, or a lost
# connection. ``lockservice.replies`` parses it; nothing past there sees it.
Reply: TypeAlias = "bytes | int | list[Reply] | ReplyError | ConnectionError | TimeoutError | None"


def _pack(args: tuple[bytes | str | int, ...]) -> bytes:
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # stub types a 1-tuple
    return packed


def pack_command(*args: bytes | str | int) -> bytes:
    """One command packed as RESP, to send with ``Connection.send_packed``."""
    return _pack(args)


def _body(args: tuple[bytes | str | int, ...]) -> bytes:
    """``args`` packed without the ``*<count>`` line that starts a command."""
    if not args:
        return b""
    packed = _pack(args)
    return packed[packed.index(b"\r\n") + 2 :]


def pack_script(
    command: bytes,
    name: bytes,
    keys: tuple[bytes | str | int, ...],
    args: tuple[bytes | str | int, ...],
) -> bytes:
    """``command name len(keys) *keys *args`` packed as RESP, as ``hiredis.pack_command``.

    ``command``: EVALSHA (``name`` the script's SHA1) or FCALL (its function's name).
    What the nodes of a fan-out share is packed once for all: ``pack_call``.
    """
    return _pack((command, name, len(keys), *keys, *args))


class Packed(NamedTuple):
    """Arguments packed once, to go into many commands (``pack_call``): the nodes of a
    fan-out get the same lease id and ttl, every command to a node its run id, every
    command on a name that name's keys. ``body``: their RESP bulk strings as
    ``hiredis.pack_command`` packs them (no ``*<count>`` line); ``values``: what they
    are, for a command sent again when the node misses the script (``Retry``)."""

    values: tuple[bytes | str | int, ...]
    body: bytes


def pack_args(*values: bytes | str | int) -> Packed:
    """``values`` packed once (``Packed``)."""
    return Packed(values, _body(values))


def pack_str(value: str) -> Packed:
    """``pack_args(value)`` of one str, the same bytes (UTF-8, as hiredis encodes a
    str) for a fraction of the cost: a lease id, new in every fan-out."""
    data = value.encode()
    return Packed((value,), b"$%d\r\n%b\r\n" % (len(data), data))


# The last keys ``pack_keys`` packed: the nodes of a fan-out get one tuple of keys, built
# once per fan-out. One tuple, replaced whole: a loop in another thread sees an old
# entry or a new one, never half.
_last_keys: tuple[tuple[bytes | str | int, ...], Packed] = ((), Packed((), b""))


def pack_keys(keys: Sequence[bytes | str | int]) -> Packed:
    """``pack_args(*keys)``, once for a fan-out that passes every node one tuple."""
    global _last_keys
    last = _last_keys
    if last[0] is keys:
        return last[1]
    packed = pack_args(*keys)
    if type(keys) is tuple:  # immutable: the same object is the same keys
        _last_keys = (keys, packed)
    return packed


# ``command name numkeys`` per script and key count (a few dozen at most), packed once:
# the start of every script command. A dict of a pure function: never stale.
_calls: dict[tuple[bytes, bytes, int], bytes] = {}


def pack_call(command: bytes, name: bytes, keys: Packed, *args: Packed) -> bytes:
    """``pack_script`` of arguments packed already: only the count and a join per call.

    hiredis formats every argument with sprintf, and packing was the largest part of
    the client's own work for a command; what repeats is packed once (``Packed``)."""
    nkeys = len(keys.values)
    start = _calls.get((command, name, nkeys))
    if start is None:
        start = _calls[command, name, nkeys] = _body((command, name, nkeys))
    count = 3 + nkeys
    parts = [b"", start, keys.body]
    for arg in args:
        count += len(arg.values)
        parts.append(arg.body)
    parts[0] = _COUNTS[count] if count < len(_COUNTS) else b"*%d\r\n" % count
    return b"".join(parts)


_COUNTS: Final = tuple(b"*%d\r\n" % n for n in range(32))  # a command's first line


# What to send when the script is missing on the node, built only then: the script,
# its keys and arguments, and whether the command was an FCALL to send again after
# the library's load (else, and when that load was refused: EVAL of its source).
Retry: TypeAlias = "tuple[Script, Packed, tuple[Packed, ...], bool] | None"
_MISSING_FUNCTION = "ERR Function not found"

_Pending: TypeAlias = "tuple[asyncio.Future[Reply], float, Retry]"


def is_failure(reply: Reply) -> bool:
    """True for an error reply or a lost connection."""
    return isinstance(reply, ReplyError | ConnectionError | TimeoutError)


class Connection(asyncio.Protocol):
    """One socket to one Redis server; ``send`` queues, the loop flushes."""

    def __init__(self, on_push: Callable[[Reply], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader()
        # (future, loop time sent, what to send when the script is missing: Retry)
        self._pending: collections.deque[_Pending] = collections.deque()
        # FUNCTION LOAD of the scripts' library, packed: set when FCALL calls them
        self.load_library: bytes | None = None
        self.label = "redis connection"  # for the log: the node's label (``Node``)
        # stands for the reply of a FUNCTION LOAD sent again after an FCALL's miss
        self._library_load: asyncio.Future[Reply] = self._loop.create_future()
        self._library_load.set_result(None)
        self._out: list[bytes] = []
        self._burst = False
        self._transport: asyncio.Transport | None = None
        self._on_push = on_push
        self.closed = False
        self.lost: asyncio.Future[None] = self._loop.create_future()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        gets: Callable[[], Reply | bool] = self._reader.gets  # hiredis: False when no reply
        while (reply := gets()) is not False:
            if self._on_push is not None:
                self._on_push(reply)
                continue
            if not self._pending:  # a reply nobody asked for: the stream is broken
                self.abort()
                return
            fut, _, instead = self._pending.popleft()
            if fut is self._library_load:
                self._library_loaded(reply)
                continue
            if (
                instead is not None
                and isinstance(reply, ReplyError)
                and self._resend(fut, instead, reply)
            ):
                continue
            if not fut.done():
                fut.set_result(reply)

    def _resend(
        self,
        fut: asyncio.Future[Reply],
        retry: tuple[Script, Packed, tuple[Packed, ...], bool],
        error: ReplyError,
    ) -> bool:
        """Run a script the node is missing (restarted, flushed, a replica promoted)
        once more; the same future gets the second reply, which is sent even if
        nobody waits (a release). False: ``error`` stands.

        An EVALSHA answered NOSCRIPT becomes EVAL of the source. An FCALL answered
        "Function not found" is sent again after the library's load; if that load
        is refused (an ACL user without FUNCTION, a node over maxmemory), the call
        misses again and becomes EVAL, and the connection goes on by EVALSHA
        (``_library_loaded``): a refused load never fails a call."""
        text = str(error)
        if not (text.startswith("NOSCRIPT") or text == _MISSING_FUNCTION):
            return False
        now = self._loop.time()
        script, keys, args, again = retry
        if again and self.load_library is not None:  # else refused already: EVAL
            # "already exists" when another call's miss loaded it first: the same code
            self._pending.append((self._library_load, now, None))
            self._pending.append((fut, now, (script, keys, args, False)))
            self._write(self.load_library + pack_call(b"FCALL", script.function, keys, *args))
            return True
        self._pending.append((fut, now, None))
        # EVAL runs the source (and caches it for EVALSHA)
        self._write(pack_call(b"EVAL", script.source, keys, *args))
        return True

    def _library_loaded(self, reply: Reply) -> None:
        if not is_failure(reply) or "already exists" in str(reply) or self.load_library is None:
            return
        self.load_library = None  # the next calls on this connection: EVALSHA
        log.info("%s: lock scripts run as EVALSHA: FUNCTION LOAD refused: %s", self.label, reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = ConnectionError(f"connection lost: {exc}" if exc else "connection closed")
        while self._pending:
            fut, _, _ = self._pending.popleft()
            if not fut.done():
                fut.set_result(error)
        if not self.lost.done():
            self.lost.set_result(None)

    # API
    def send(
        self,
        *args: bytes | str | int,
        later: bool = False,
        noscript: Retry = None,
    ) -> asyncio.Future[Reply]:
        """Queue one command; the future resolves to its reply (never raises).

        ``later``: nobody waits for the reply now (a release whose answer is
        known), so it may ride along with the next command instead of taking a
        write of its own. ``noscript``: what to send when the node is missing the
        script (``Retry``): the EVAL of its source for an EVALSHA answered NOSCRIPT,
        the FCALL again for one answered "Function not found" (after
        ``load_library``); the future then resolves to that command's reply: one
        future per call, no second hop.
        """
        return self.send_packed(_pack(args), later=later, noscript=noscript)

    def send_packed(
        self,
        packed: bytes,
        *,
        later: bool = False,
        noscript: Retry = None,
    ) -> asyncio.Future[Reply]:
        """``send`` of a command packed already (``pack_script``)."""
        fut: asyncio.Future[Reply] = self._loop.create_future()
        if self.closed:
            fut.set_result(ConnectionError("connection closed"))
            return fut
        self._pending.append((fut, self._loop.time(), noscript))  # packed only if needed
        self._write(packed, later)
        return fut

    def send_now(self, packed: bytes, *, noscript: Retry = None) -> asyncio.Future[Reply]:
        """``send_packed`` written at once, with whatever this turn held back, and
        without holding back the turn's next command: a release that hands the lock
        over, whose write starts the waiter's turn."""
        transport = self._transport
        if transport is None or self.closed:
            return self.send_packed(packed, noscript=noscript)  # queued, or refused
        fut: asyncio.Future[Reply] = self._loop.create_future()
        self._pending.append((fut, self._loop.time(), noscript))
        if self._out:
            self._out.append(packed)
            packed = b"".join(self._out)
            self._out.clear()
        transport.write(packed)
        return fut

    def _write(self, packed: bytes, later: bool = False) -> None:
        # The first awaited command of a loop turn goes out at once (latency), with
        # whatever was held back for later; the rest of that turn is batched into
        # one write at its end (throughput). ``later`` for every command (a Node
        # with ``batch_writes``, the gateway's): one write per turn.
        if later or self._burst or self._transport is None:
            if not self._out:
                self._loop.call_soon(self.flush)
            self._out.append(packed)
            return
        if self._out:
            self._out.append(packed)
            packed = b"".join(self._out)
            self._out.clear()
        self._transport.write(packed)
        self._burst = True
        self._loop.call_soon(self._end_burst)

    def _end_burst(self) -> None:
        self._burst = False

    def send_untracked(self, *args: bytes | str | int) -> None:
        """Queue a command whose replies arrive as pushes (SUBSCRIBE)."""
        if not self.closed:
            self._write(_pack(args))

    def flush(self) -> None:
        """Write what this loop turn queued (at its end, or before a close)."""
        if self._out and self._transport is not None and not self.closed:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def oldest_pending(self) -> float | None:
        """Loop time at which the oldest unanswered command was sent."""
        return self._pending[0][1] if self._pending else None

    def close(self) -> None:
        """Close after writing everything queued (a release sent just before)."""
        self.flush()
        if self._transport is not None:
            self._transport.close()
        else:
            self.connection_lost(None)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        else:
            self.connection_lost(None)


async def open_connection(
    host: str | None,
    port: int,
    *,
    path: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    username: str | None = None,
    password: str | None = None,
    db: int = 0,
    connect_timeout: float,
    on_push: Callable[[Reply], None] | None = None,
) -> Connection:
    """Connect, authenticate and select ``db``; raise ``ConnectionError`` on failure."""
    loop = asyncio.get_running_loop()
    conn: Connection | None = None
    try:
        async with asyncio.timeout(connect_timeout):
            if path is not None:
                _, conn = await loop.create_unix_connection(lambda: Connection(), path)
            else:
                assert host is not None
                _, conn = await loop.create_connection(
                    lambda: Connection(), host, port, ssl=ssl_context
                )
            setup: list[asyncio.Future[Reply]] = []
            if password is not None:
                auth = (username, password) if username else (password,)
                setup.append(conn.send("AUTH", *auth))
            if db:
                setup.append(conn.send("SELECT", db))
            for reply in await asyncio.gather(*setup):
                if is_failure(reply):
                    raise ConnectionError(f"redis refused the connection setup: {reply!r}")
    except BaseException as exc:
        if conn is not None:
            conn.abort()  # never leak the socket of a half-set-up connection
        if isinstance(exc, OSError | TimeoutError):
            raise ConnectionError(f"cannot connect: {str(exc) or type(exc).__name__}") from exc
        raise
    conn._on_push = on_push
    return conn
