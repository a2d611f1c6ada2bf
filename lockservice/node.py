"""One Redis node: its connections, scripts, restart detection and health.

A node keeps two connections: one for commands (auto-pipelined, see
``resp.py``) and one subscribed to this process's release channel. A
background task reconnects either when it drops, and aborts the command
connection when a reply is overdue (a paused or wedged server), so that calls
fail at once instead of piling up behind it. While a node is down, ``call``
answers a ``ConnectionError`` immediately: a node failure is a value counted
against quorum, never a wait.

A node calls nothing above it: what happens to it (a reconnect, a message on
the release channel) goes into the ``Inbox`` its owner reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from lockservice import scripts
from lockservice.protocol import QUARANTINE_KEY, SYNCED_KEY
from lockservice.resp import (
    Connection,
    Packed,
    Reply,
    Retry,
    is_failure,
    open_connection,
    pack_args,
    pack_call,
    pack_command,
    pack_keys,
    pack_script,
)

__all__ = ["Connected", "Inbox", "Message", "Node", "NodeAddress", "Replay", "parse_node_url"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Connected:
    """Node ``index`` (re)connected; ``restarted``: its run_id changed (R17)."""

    index: int
    restarted: bool


@dataclass(frozen=True, slots=True)
class Replay:
    """Commands stuck in node ``index``'s old socket have surely run or died by now."""

    index: int


@dataclass(frozen=True, slots=True)
class Message:
    """A message on this process's release channel, from node ``index``."""

    index: int
    payload: bytes


Inbox = asyncio.Queue[Connected | Replay | Message]


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node is and how to log in; ``label`` never contains a secret."""

    label: str
    host: str | None
    port: int
    path: str | None
    tls: bool
    username: str | None
    password: str | None
    db: int


def parse_node_url(url: str) -> NodeAddress:
    """Parse ``redis://[user:pass@]host[:port][/db]``, ``rediss://`` or ``unix:///path``."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis url {_redact(url)!r}: scheme must be redis, rediss or unix")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"redis url {_redact(url)!r}: unix url needs a socket path")
        db = _int(query.get("db", ["0"])[0], url)
        return NodeAddress(parts.path, None, 0, parts.path, False, username, password, db)
    if not parts.hostname:
        raise ValueError(f"redis url {_redact(url)!r}: missing host")
    try:
        port = parts.port or 6379
    except ValueError as exc:
        raise ValueError(f"redis url {_redact(url)!r}: bad port") from exc
    db_text = parts.path.lstrip("/") or query.get("db", ["0"])[0]
    host = parts.hostname
    label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return NodeAddress(
        label, host, port, None, parts.scheme == "rediss", username, password, _int(db_text, url)
    )


def _int(text: str, url: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise ValueError(f"redis url {_redact(url)!r}: database {text!r} is not a number") from exc


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class Node:
    """A Redis server taking part in quorums."""

    def __init__(
        self,
        address: NodeAddress,
        index: int,
        *,
        timeout: float,
        channels: tuple[str, ...],
        inbox: Inbox,
        batch_writes: bool = False,
    ) -> None:
        self.address = address
        self.batch_writes = batch_writes
        self.index = index
        self.label = address.label
        self.timeout = timeout
        self.run_id: str | None = None
        self.run_arg = _NO_RUN_ID  # run_id packed (``call_packed``), set with it
        self._channels = channels
        self._inbox = inbox
        self._conn: Connection | None = None
        self._sub: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._poked: asyncio.Future[None] | None = None
        self.refused: str | None = None  # why the node is left out, e.g. its eviction policy
        self.problem: str | None = None  # why it is not connected (logged once per change)
        self.stall_after = max(1.0, 5 * timeout)
        # Why the scripts run as EVALSHA, not FCALL of the library (Redis 7), as decided
        # at the last connect (logged once per change); None while they run as FCALL.
        self.no_functions: str | None = None

    @property
    def functions(self) -> bool:
        """Whether the scripts run as FCALL of the library on the connection now (its
        load refused later turns the connection to EVALSHA: ``Connection``)."""
        conn = self._conn
        return conn is not None and conn.load_library is not None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def start(self) -> bool:
        """Connect once (a node that is down is not an error) and start upkeep.

        Returns whether the command connection is up; this first connect is not
        reported to the inbox, later ones are.
        """
        up = await self._connect_commands(report=False)
        await self._connect_subscriber()
        self._task = asyncio.create_task(self._upkeep(), name=f"fencegate-node-{self.label}")
        return up

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            self._conn.close()  # releases queued just before still go out
        if self._sub is not None:
            self._sub.abort()

    # commands
    def command(
        self,
        *args: bytes | str | int,
        later: bool = False,
        noscript: Retry = None,
    ) -> asyncio.Future[Reply]:
        conn = self._conn
        if conn is None or conn.closed:
            return self._unsent()
        return conn.send(*args, later=later, noscript=noscript)

    def _unsent(self) -> asyncio.Future[Reply]:
        """The answer of a command that could not be sent: why, and a reconnect now."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if self.refused:
            reason = f"evicts keys (maxmemory-policy {self.refused})"
        else:
            reason = self.problem or "is not connected"
        fut.set_result(ConnectionError(reason))  # the label is the key of the report
        if self._poked is not None and not self._poked.done():
            self._poked.set_result(None)  # reconnect now rather than at the next tick
        return fut

    def call(
        self,
        script: scripts.Script,
        keys: Sequence[bytes | str | int],
        args: Sequence[bytes | str | int],
        *,
        later: bool = False,
    ) -> asyncio.Future[Reply]:
        """FCALL ``script``'s function, or EVALSHA it on a node without functions.

        A missing script is loaded and run once more, on the same future
        (``Connection.send``): FCALL answered "Function not found" is sent again
        after the library's load (that load refused: EVAL of its source, and the
        connection goes on by EVALSHA), EVALSHA answered NOSCRIPT becomes EVAL.
        ``later``: see ``Connection.send``; with ``batch_writes`` every call is
        ``later``. The nodes of a fan-out share one ``keys`` tuple: packed once for
        all of them (``pack_keys``); ``call_packed`` packs what else they share once.
        """
        return self.call_packed(script, pack_keys(keys), pack_args(*args), later=later)

    def call_packed(
        self,
        script: scripts.Script,
        keys: Packed,
        *args: Packed,
        later: bool = False,
        alone: bool = False,
    ) -> asyncio.Future[Reply]:
        """``call`` of keys and arguments packed already (``pack_args``): what a fan-out
        shares (the name's keys, a lease id) packed once for every node, and what every
        command to this node repeats (its ``run_arg``) packed once for all of them.
        ``alone`` (unless ``batch_writes``): ``Connection.send_now``."""
        conn = self._conn
        if conn is None or conn.closed:
            return self._unsent()
        fcall = conn.load_library is not None
        packed = (
            pack_call(b"FCALL", script.function, keys, *args)
            if fcall
            else pack_call(b"EVALSHA", script.sha, keys, *args)
        )
        if alone and not self.batch_writes:
            return conn.send_now(packed, noscript=(script, keys, args, fcall))
        return conn.send_packed(
            packed, later=later or self.batch_writes, noscript=(script, keys, args, fcall)
        )

    def _failed(self, reason: str) -> None:
        """The node cannot be used: log why, once per change of reason."""
        if any(word in reason for word in ("WRONGPASS", "NOAUTH", "invalid password")):
            reason = f"authentication failed ({reason})"
        if reason != self.problem:
            log.warning("redis node %s is down: %s", self.label, reason)
            self.problem = reason

    # connections
    async def _open(self, on_push: Callable[[Reply], None] | None = None) -> Connection:
        a = self.address
        return await open_connection(
            a.host,
            a.port,
            path=a.path,
            ssl_context=ssl.create_default_context() if a.tls else None,
            username=a.username,
            password=a.password,
            db=a.db,
            connect_timeout=max(self.timeout * 4, 0.5),
            on_push=on_push,
        )

    async def _connect_commands(self, *, report: bool = True) -> bool:
        conn: Connection | None = None
        try:
            conn = await self._open()
            async with asyncio.timeout(max(self.timeout * 4, 0.5)):
                # The library's load and a read-only call of it go along: on a server
                # before Redis 7, or a user without FUNCTION or FCALL, they fail alike.
                server, memory, loaded, called = await asyncio.gather(
                    conn.send("INFO", "server"),
                    conn.send("INFO", "memory"),
                    conn.send_packed(_LOAD_LIBRARY),
                    conn.send_packed(_PROBE),
                )
        except BaseException as exc:  # cancelled too (close() during a reconnect): no leak
            if conn is not None:
                conn.abort()
            if not isinstance(exc, ConnectionError | TimeoutError):
                raise
            self._failed(str(exc) or "no answer to INFO in time")
            return False
        if is_failure(server) or is_failure(memory):
            conn.abort()
            self._failed(f"refused INFO: {server if is_failure(server) else memory!r}")
            return False
        policy = _info_field(memory, "maxmemory_policy")
        if policy not in (None, "noeviction"):
            # An evicting node can drop fence:* counters or live locks: never count it.
            conn.abort()
            if self.refused != policy:
                log.error(
                    "redis node %s has maxmemory-policy %s: fencegate needs noeviction "
                    "(evicted counters would reissue tokens); leaving it out of quorums",
                    self.label, policy,
                )  # fmt: skip
            self.refused = policy
            return False
        self.refused = None
        if self.problem is not None:
            log.info("redis node %s is connected again", self.label)
            self.problem = None
        run_id = _info_field(server, "run_id")
        restarted = self.run_id is not None and run_id != self.run_id
        if restarted:
            log.warning("redis node %s restarted (run_id changed): resyncing it", self.label)
        self.run_id = run_id
        self.run_arg = pack_args(run_id or "")
        self._use_functions(conn, _info_field(server, "redis_version"), loaded, called)
        self._conn = conn
        if report:
            self._inbox.put_nowait(Connected(self.index, restarted))
        # Commands stuck in an aborted socket may still run when a paused server
        # resumes, after this connect: say when they surely have.
        asyncio.get_running_loop().call_later(
            self.stall_after, self._inbox.put_nowait, Replay(self.index)
        )
        return True

    def _use_functions(
        self, conn: Connection, version: str | None, loaded: Reply, called: Reply
    ) -> None:
        """FCALL the library when a function of it answered, else EVALSHA the scripts.

        The call tells: on a node over maxmemory FUNCTION LOAD is refused, yet the
        library loaded before (by this gateway or another of this version) serves.
        """
        if not is_failure(called):
            conn.load_library, conn.label = _LOAD_LIBRARY, f"redis node {self.label}"
            if self.no_functions is not None:
                log.info("redis node %s: lock scripts run as functions again", self.label)
            self.no_functions = None
            return
        major = int(version.split(".")[0]) if version and version[0].isdigit() else 0
        if major < 7:
            why = f"redis {version} has no functions (7.0 or later)"
        elif is_failure(loaded) and "already exists" not in str(loaded):
            why = f"FUNCTION LOAD refused: {loaded!s}"
        else:
            why = f"FCALL refused: {called!s}"
        if why != self.no_functions:
            log.info("redis node %s: lock scripts run as EVALSHA: %s", self.label, why)
        self.no_functions = why
        for script in scripts.ALL:
            conn.send("SCRIPT", "LOAD", script.source)

    async def _connect_subscriber(self) -> bool:
        try:
            sub = await self._open(on_push=self._push)
        except ConnectionError:
            return False
        sub.send_untracked("SUBSCRIBE", *self._channels)
        self._sub = sub
        return True

    def _push(self, reply: Reply) -> None:
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
            payload = reply[2]
            if isinstance(payload, bytes):
                self._inbox.put_nowait(Message(self.index, payload))

    async def _upkeep(self) -> None:
        """Reconnect what dropped, abort a connection whose replies are overdue."""
        backoff = 0.05
        loop = asyncio.get_running_loop()
        while True:
            self._poked = loop.create_future()
            waits: list[asyncio.Future[None]] = [self._poked]
            for conn in (self._conn, self._sub):
                if conn is not None and not conn.closed:
                    waits.append(conn.lost)
            await asyncio.wait(
                waits, timeout=min(self.stall_after / 4, 0.5), return_when=asyncio.FIRST_COMPLETED
            )
            conn = self._conn
            if conn is not None and not conn.closed:
                oldest = conn.oldest_pending()
                if oldest is not None and loop.time() - oldest > self.stall_after:
                    log.warning("node %s: no reply for %.1f s, reconnecting", self.label,
                                loop.time() - oldest)  # fmt: skip
                    conn.abort()
            ok = True
            if not self.connected:
                ok = await self._connect_commands()
            if self._sub is None or self._sub.closed:
                ok = await self._connect_subscriber() and ok
            if ok:
                backoff = 0.05
            else:
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 1.0)


_NO_RUN_ID: Final = pack_args("")  # the run_id argument of a node never connected
# FUNCTION LOAD without REPLACE: a library of this name holds this very code.
_LOAD_LIBRARY: Final = pack_command(b"FUNCTION", b"LOAD", scripts.LIBRARY)
# state.lua, read only (`no-writes`), as the probe that FCALL is allowed.
_PROBE: Final = pack_script(b"FCALL", scripts.STATE.function, (SYNCED_KEY, QUARANTINE_KEY), ("",))


def _info_field(info: Reply, field: str) -> str | None:
    if not isinstance(info, bytes):
        return None
    prefix = field.encode() + b":"
    for line in info.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].decode()
    return None
