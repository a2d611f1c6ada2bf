"""Script replies, parsed once at the edge into typed values.

Each ``parse_*`` takes what a node answered (a RESP value, an error reply, a
lost connection) and returns a value of this module or a ``Failure``: nothing
past here sees a raw reply. The sentinel codes the Lua scripts return are
``Code``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lockservice.resp import Reply, ReplyError

__all__ = [
    "AcquireReply",
    "Code",
    "Failure",
    "Granted",
    "Held",
    "Inspected",
    "Mismatch",
    "Quarantined",
    "StateReply",
    "Tagged",
    "Unsynced",
    "describe",
    "parse_acquire",
    "parse_count",
    "parse_extend",
    "parse_find",
    "parse_inspect",
    "parse_pong",
    "parse_scan",
    "parse_state",
    "parse_tag",
    "parse_values",
]


class Code(enum.IntEnum):
    """Sentinels in the first field of acquire.lua's and inspect.lua's answers."""

    HELD = 0  # another lease holds it, or an earlier waiter is queued (acquire)
    QUARANTINED = -1  # resynced after a restart, waiting out max_ttl (R19)
    UNSYNCED = -2  # not synced in this run of the server (R17)
    MISMATCH = -3  # semaphore holders of other permits hold it (R22)
    TAGGED = -4  # the lease held with the try's idempotency tag is another one (R26)


@dataclass(frozen=True, slots=True)
class Failure:
    """A node that did not answer usefully: down, an error reply, or garbage."""

    reason: str
    down: bool = False  # the connection is lost or was never made


@dataclass(slots=True, unsafe_hash=True)  # never changed; frozen, its __init__ costs 4x
class Granted:
    """The node granted the lock (or re-issued a hand-over, R12) with ``token``."""

    token: int


@dataclass(frozen=True, slots=True)
class Held:
    """Another lease holds it for ``pttl`` ms, or (``pttl`` 0) earlier waiters are
    queued; ``counter`` is ``fence:{name}`` at the answer (R11)."""

    pttl: int
    counter: int


@dataclass(frozen=True, slots=True)
class Quarantined:
    """The node grants nothing for ``pttl`` more ms (R19)."""

    pttl: int


@dataclass(frozen=True, slots=True)
class Unsynced:
    """The node has not been resynced since it (re)started (R17)."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Semaphore holders with ``permits`` other than asked hold it (R22)."""

    permits: int


@dataclass(frozen=True, slots=True)
class Tagged:
    """The lease held with the idempotency tag: its id, token and ms left (R26)."""

    token: int
    pttl: int
    lease_id: str


KINDS = ("", "exclusive", "shared", "semaphore")  # inspect.lua's kind codes


@dataclass(frozen=True, slots=True)
class Inspected:
    """inspect.lua: the holders' newest token (0 when free), ms until the last ends,
    the counter, how many hold it, their mode ("" when free) and permits."""

    token: int
    pttl: int
    counter: int
    holders: int = 0
    mode: str = ""
    permits: int = 0


AcquireReply = Granted | Held | Quarantined | Unsynced | Mismatch | Tagged | Failure
StateReply = bool | Quarantined | Unsynced | Failure  # True: it can grant now

# An answer without a counter (from an older acquire.lua) vouches for no hand-over.
_NO_COUNTER = 1 << 62


def failure(reply: Reply) -> Failure | None:
    """The failure a reply stands for, or None for a normal answer."""
    if isinstance(reply, ReplyError):
        return Failure(f"error reply: {reply}")
    if isinstance(reply, ConnectionError):
        return Failure(f"down: {reply}", down=True)
    if isinstance(reply, TimeoutError):
        return Failure("no reply in time")
    return None


def _ints(reply: Reply) -> list[int] | None:
    """``reply`` if it is a list of integers (hiredis makes exact ints, never bools)."""
    if type(reply) is not list:
        return None
    for x in reply:
        if type(x) is not int:
            return None
    return reply  # type: ignore[return-value]  # a list of ints: checked above


def _unexpected(reply: Reply) -> Failure:
    return failure(reply) or Failure(f"unexpected reply {reply!r}")


def _tagged(reply: Reply) -> Tagged | None:
    """``{token, pttl, lease_id}`` (find.lua, and acquire.lua after its code)."""
    if isinstance(reply, list) and len(reply) == 3:
        token, pttl, lease_id = reply
        if isinstance(token, int) and isinstance(pttl, int) and isinstance(lease_id, bytes):
            return Tagged(token, pttl, lease_id.decode(errors="replace"))
    return None


def parse_acquire(reply: Reply) -> AcquireReply:
    if isinstance(reply, list) and len(reply) == 4 and reply[0] == Code.TAGGED:
        return _tagged(reply[1:]) or _unexpected(reply)
    fields = _ints(reply)
    if fields is None or len(fields) < 2:
        return _unexpected(reply)
    code = fields[0]
    if code > 0:
        return Granted(code)
    if code == Code.HELD:
        return Held(fields[1], fields[2] if len(fields) > 2 else _NO_COUNTER)
    if code == Code.QUARANTINED:
        return Quarantined(fields[1])
    if code == Code.UNSYNCED:
        return Unsynced()
    if code == Code.MISMATCH:
        return Mismatch(fields[1])
    return Failure(f"unexpected reply {reply!r}")


def parse_find(reply: Reply) -> Tagged | Unsynced | Quarantined | Failure:
    """find.lua: the lease committed with the tag, or ``Tagged(0, 0, "")`` when none is."""
    fields = _ints(reply)
    if fields == [0]:
        return Tagged(0, 0, "")
    return _unable(fields) or _tagged(reply) or _unexpected(reply)


def parse_tag(reply: Reply) -> bool | Tagged | Unsynced | Quarantined | Failure:
    """tag.lua: True when committed, False when the lease does not hold the lock
    there, or the other lease committed with the tag."""
    if isinstance(reply, list) and len(reply) == 4 and reply[0] == Code.TAGGED:
        return _tagged(reply[1:]) or _unexpected(reply)
    fields = _ints(reply)
    if fields in ([1], [0]):
        return fields == [1]
    return _unable(fields) or _unexpected(reply)


def _unable(fields: list[int] | None) -> Unsynced | Quarantined | None:
    """``{-2, 0}`` or ``{-1, pttl}``: a node that may not answer for tags (R17)."""
    if fields is not None and len(fields) == 2:
        if fields[0] == Code.UNSYNCED:
            return Unsynced()
        if fields[0] == Code.QUARANTINED:
            return Quarantined(fields[1])
    return None


def parse_inspect(reply: Reply) -> Inspected | Unsynced | Failure:
    fields = _ints(reply)
    if fields == [Code.UNSYNCED]:
        return Unsynced()
    if fields is None or len(fields) not in (3, 6):
        return _unexpected(reply)
    if len(fields) == 3:
        return Inspected(fields[0], fields[1], fields[2])
    token, pttl, counter, holders, kind, permits = fields
    if not 0 <= kind < len(KINDS):
        return _unexpected(reply)
    return Inspected(token, pttl, counter, holders, KINDS[kind], permits)


def parse_state(reply: Reply) -> StateReply:
    """state.lua: True when the node can grant now."""
    fields = _ints(reply)
    if fields is None or len(fields) != 2:
        return _unexpected(reply)
    if fields[0] == 1:
        return True
    if fields[0] == Code.QUARANTINED:
        return Quarantined(fields[1])
    if fields[0] == Code.UNSYNCED:
        return Unsynced()
    return Failure(f"unexpected reply {reply!r}")


def parse_count(reply: Reply) -> int | Failure:
    """An integer answer: release (1/0), undo (±token/0), extend and raise_fence
    (token/0), resync (counters raised), mark_synced (1/0)."""
    if isinstance(reply, int):
        return reply
    return _unexpected(reply)


def parse_extend(reply: Reply) -> tuple[int, bool] | Failure:
    """extend.lua: the lease's token (0: not held there), and whether the lease holds
    a semaphore permit there (R32: every node counts, whatever the caller's label)."""
    if isinstance(reply, int):
        return reply, False
    ints = _ints(reply)
    if ints is not None and len(ints) == 2:
        return ints[0], ints[1] == 1
    return _unexpected(reply)


def parse_pong(reply: Reply) -> bool | Failure:
    if reply == b"PONG":
        return True
    return _unexpected(reply)


def describe(reply: object) -> str:
    """A parsed answer that did not count, in words for an error message."""
    if isinstance(reply, Failure):
        return reply.reason
    if isinstance(reply, Quarantined):
        if not reply.pttl:
            return "quarantined until its counters are copied again after a resync (R21)"
        return f"quarantined for {reply.pttl / 1000:.1f} s more after a resync (R19)"
    if isinstance(reply, Unsynced):
        return "restarted or new, not resynced yet (R17)"
    if isinstance(reply, Held):
        return "held by another lease" if reply.pttl else "earlier waiters are queued"
    if isinstance(reply, Mismatch):
        return f"held by semaphore leases of {reply.permits} permits"
    if isinstance(reply, Tagged):
        return "held by the lease of the idempotency key"
    if reply is False:  # tag.lua: the lease no longer holds the lock there (R26)
        return "did not take the idempotency tag: the lease does not hold it there"
    if isinstance(reply, int) and not isinstance(reply, bool):
        return "refused: not held by this lease, or held by another" if reply == 0 else f"{reply}"
    return repr(reply)


def parse_scan(reply: Reply) -> tuple[bytes, list[bytes]] | Failure:
    """SCAN: the next cursor (b"0" at the end) and the keys of this batch."""
    if isinstance(reply, list) and len(reply) == 2:
        cursor, keys = reply
        if isinstance(cursor, bytes) and isinstance(keys, list):
            found = [k for k in keys if isinstance(k, bytes)]
            if len(found) == len(keys):
                return cursor, found
    return _unexpected(reply)


def parse_values(reply: Reply) -> list[bytes | None] | Failure:
    """MGET: a value or None per key."""
    if isinstance(reply, list):
        values = [v for v in reply if v is None or isinstance(v, bytes)]
        if len(values) == len(reply):
            return values
    return _unexpected(reply)
