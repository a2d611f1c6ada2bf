"""Releases and undos: what they send, and what is sent again after a reconnect.

Every release and undo of the Redis backend is built here (the argument lists
of ``release.lua`` and ``undo.lua`` exist once, also for the tests), and so is
the replay queue: a release, or the undo of a try without waiting, that could
not reach a node is sent again when the node reconnects, and once more when
commands stuck in its old socket have surely run (R7). A queued waiter's undo
is never replayed: it names its grant (R13) and its answer is awaited (R14).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from lockservice import scripts
from lockservice.node import Node
from lockservice.protocol import KEEPALIVE_MS, RELEASE_CHANNEL, lock_keys, raise_keys
from lockservice.replies import Failure, Granted, parse_acquire
from lockservice.resp import Packed, Reply, pack_args, pack_str

__all__ = ["Cleanups", "packed_lock_keys", "release_args", "undo_args"]

_MAX_REPLAYS = 100_000
_Command = tuple[scripts.Script, tuple[bytes | str | int, ...], tuple[bytes | str | int, ...]]


def release_args(lease_id: str, name: str, process: str, run_id: str) -> tuple[str, ...]:
    """ARGV of release.lua."""
    return (lease_id, *_release_rest(name, process), run_id)


def _release_rest(name: str, process: str) -> tuple[str, str, str]:
    """ARGV[2..4] of release.lua: the same for every release of ``name`` here."""
    return (RELEASE_CHANNEL, name, process)


@functools.lru_cache(maxsize=1024)
def _packed_release_rest(name: str, process: str) -> Packed:
    """``_release_rest`` packed: a name is mostly released again soon. A pure
    function's cache: never stale; bounded."""
    return pack_args(*_release_rest(name, process))


@functools.lru_cache(maxsize=1024)
def packed_lock_keys(name: str) -> Packed:
    """``lock_keys(name)`` packed (``pack_args``): every acquire and release of a name
    sends them, and a name is mostly taken again soon. A pure function's cache: never
    stale; bounded."""
    return pack_args(*lock_keys(name))


def undo_args(
    lease_id: str, name: str, process: str, run_id: str, *, ticket: str, spec: str, grant: str
) -> tuple[str, ...]:
    """ARGV of undo.lua: ``ticket`` '' for a try without waiting, ``spec`` the waiter's
    ttl and kind (``protocol.waiter_spec``), ``grant`` the token of the grant to undo
    ('' for any grant of the lease)."""
    return (
        *release_args(lease_id, name, process, run_id),
        ticket,
        str(KEEPALIVE_MS),
        spec,
        grant,
    )


class Cleanups:
    """Sends releases and undos for one process's leases, replaying lost ones."""

    def __init__(self, nodes: Sequence[Node], process: str, *, horizon: float) -> None:
        self._nodes = list(nodes)
        self._process = process
        self._horizon = horizon  # after max_ttl every lock a cleanup could free expired
        self._replays: list[dict[_Command, float]] = [{} for _ in self._nodes]

    def release(
        self, name: str, lease_id: str, *, later: bool, alone: bool = False
    ) -> list[asyncio.Future[Reply]]:
        """release.lua on every node, replayed where the node is down (R6, R7);
        ``later`` and ``alone``: see ``Connection.send_packed``."""
        keys, lease, rest = self._release_parts(name, lease_id)
        return [
            self._send(
                i, scripts.RELEASE, keys, lease, rest, node.run_arg, later=later, alone=alone
            )
            for i, node in enumerate(self._nodes)
        ]

    def _release_parts(self, name: str, lease_id: str) -> tuple[Packed, Packed, Packed]:
        """The keys and ``release_args`` but the run id: what every node's release
        shares, packed once for all of them."""
        return packed_lock_keys(name), pack_str(lease_id), _packed_release_rest(name, self._process)

    def release_confirmed(
        self, name: str, lease_id: str
    ) -> tuple[list[asyncio.Future[Reply]], Callable[[int, int | Failure], None]]:
        """``release`` for a round that awaits the answers: the same commands, and the
        round's per-reply hook in place of a done-callback per node. The hook sees every
        answer, also after the decision (``fanout.fan_out``), so a node that was down is
        remembered for the replay as ``release`` does, for one callback less per node."""
        keys, lease, rest = self._release_parts(name, lease_id)
        sent = []
        futures = []
        for node in self._nodes:
            run_arg = node.run_arg  # what was sent: the replay sends the same
            sent.append(run_arg)
            futures.append(node.call_packed(scripts.RELEASE, keys, lease, rest, run_arg))

        def remember_if_down(index: int, reply: int | Failure) -> None:
            if isinstance(reply, Failure) and reply.down:
                self._remember(index, scripts.RELEASE, keys, (lease, rest, sent[index]))

        return futures, remember_if_down

    def undo_any(self, name: str, lease_id: str, spec: str) -> None:
        """Undo any grant of a try without waiting, on every node (R7): a node that has
        not answered may still grant, so it is not named, and it is replayed."""
        keys = packed_lock_keys(name)
        for i, node in enumerate(self._nodes):
            args = undo_args(
                lease_id, name, self._process, node.run_id or "", ticket="", spec=spec, grant=""
            )
            self._send(i, scripts.UNDO, keys, pack_args(*args), later=True)

    def undo_named(
        self, name: str, lease_id: str, ticket: str, spec: str, named: dict[int, int]
    ) -> dict[int, asyncio.Future[Reply]]:
        """A queued waiter's undo of the grants ``named`` (node -> token, R13), never
        replayed; ``ticket`` '' gives them up whatever the queue (R15)."""
        futures = {}
        keys = packed_lock_keys(name)
        for i, token in named.items():
            node = self._nodes[i]
            args = undo_args(
                lease_id,
                name,
                self._process,
                node.run_id or "",
                ticket=ticket,
                spec=spec,
                grant=str(token),
            )
            futures[i] = node.call_packed(scripts.UNDO, keys, pack_args(*args), later=True)
        return futures

    def settle_late(self, index: int, name: str, lease_id: str, granted: int, late: int) -> None:
        """R16: node ``index`` granted lease ``granted`` late, counting ``late``.

        The lease's real token is recorded there, or that node's lock value would
        carry a token nobody was issued. A node whose counter ran ahead raises the
        others' to it, so that the next grant finds them equal (no round 2).
        """
        if late == granted:
            return
        keys = raise_keys(name)
        self._nodes[index].call(scripts.RAISE_FENCE, keys, (granted, lease_id))
        if late > granted:
            for i, node in enumerate(self._nodes):
                if i != index:
                    node.call(scripts.RAISE_FENCE, keys, (late, ""))  # counter only

    def settle_if_granted(
        self, index: int, name: str, lease_id: str, token: int, fut: asyncio.Future[Reply]
    ) -> None:
        """A try's answer that came after the decision: R16 if it is a grant."""
        reply = parse_acquire(fut.result())
        if isinstance(reply, Granted):
            self.settle_late(index, name, lease_id, token, reply.token)

    def replay(self, index: int) -> None:
        """Send node ``index`` what could not reach it, now that it is connected."""
        node, replays = self._nodes[index], self._replays[index]
        if not replays or not node.connected:
            return
        horizon = asyncio.get_running_loop().time() - self._horizon
        for command, since in list(replays.items()):
            if since < horizon:
                del replays[command]
            else:
                script, keys, args = command
                node.call(script, keys, args)

    def _send(
        self,
        index: int,
        script: scripts.Script,
        keys: Packed,
        *args: Packed,
        later: bool,
        alone: bool = False,
    ) -> asyncio.Future[Reply]:
        fut = self._nodes[index].call_packed(script, keys, *args, later=later, alone=alone)
        fut.add_done_callback(functools.partial(self._remember_if_down, index, script, keys, args))
        return fut

    def _remember_if_down(
        self,
        index: int,
        script: scripts.Script,
        keys: Packed,
        args: tuple[Packed, ...],
        fut: asyncio.Future[Reply],
    ) -> None:
        if isinstance(fut.result(), ConnectionError):
            self._remember(index, script, keys, args)

    def _remember(
        self, index: int, script: scripts.Script, keys: Packed, args: tuple[Packed, ...]
    ) -> None:
        """Keep a command that did not reach node ``index`` for its replay."""
        replays = self._replays[index]
        if len(replays) >= _MAX_REPLAYS:
            replays.pop(next(iter(replays)))
        values = tuple(value for arg in args for value in arg.values)
        replays[script, keys.values, values] = asyncio.get_running_loop().time()
