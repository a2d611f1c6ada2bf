"""The client side of idempotency tags (R26), mixed into ``protocol_model.Model``.

A keyed acquire asks the nodes for the lease committed with its tag first
(``_find``); once its own lease is decided it commits the tag (``_leased`` sends
tag.lua, ``_after_commit`` reads the answers) and gives its own lease up when a
quorum names another. ``_returned`` is every way a lease of the tag is returned,
and checks it against what its owner decided (one lease per key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tests.model import tags
from tests.model.state import State

if TYPE_CHECKING:
    from tests.model.state import Bounds
    from tests.model.waiter import Rules

__all__ = ["Repeats", "answers_find"]


def answers_find(reply: object) -> bool:
    """find.lua answered: a committed lease, or none (not unsynced, quarantined, failed)."""
    return reply == 0 or isinstance(reply, tuple)


class Repeats:
    b: Bounds
    n: int
    q: int
    _client: Callable[..., State]
    _send: Callable[..., State]
    _send_all: Callable[..., State]
    _round: Callable[[], tuple[object, ...]]
    _attempt: Callable[[State, int], State]
    _abandon: Callable[[State, int], State]
    rules: Rules

    def _find(self, s: State, c: int) -> State:
        """A keyed acquire asks the nodes for the lease committed with its tag first."""
        s = self._send_all(s, c, ("find", (c, s.clients[c].acquires)))
        return self._client(s, c, phase="finding", start=s.now, replies=self._round())

    def _after_find(self, s: State, c: int) -> State:
        cl = s.clients[c]
        if sum(answers_find(r) for r in cl.replies) < self.q:
            return self._client(s, c, phase="idle", pending=None)  # QuorumUnavailable
        found = tags.found_lease(cl.replies, self.q, cl.start, self.b.drift)
        if found is None:
            return self._attempt(s, c)
        return self._returned(s, c, found)

    def _after_commit(self, s: State, c: int) -> State:
        """Committed on a quorum: the own lease. Else a quorum naming another lease of
        the tag: give the own lease up, return that one. Else give the own lease up
        too (QuorumUnavailable): no quorum names it, and a repeat would take another."""
        cl = s.clients[c]
        if sum(r == 1 for r in cl.replies) >= self.q:
            return self._client(s, c, phase="holding", extends=0)
        found = tags.found_lease(cl.replies, self.q, cl.start, self.b.drift)
        if found is None and not self.rules.on("R26q"):  # the own, untagged (best effort)
            return self._client(s, c, phase="holding", extends=0)
        if found is None:
            return self._abandon(s, c)
        return self._returned(self._abandon(s, c), c, found)

    def _returned(self, s: State, c: int, found: tags.Found) -> State:
        """The acquire returns the lease of its tag; it must be a lease its owner
        decided, with the decided token (one lease per key)."""
        lease, token, valid_until = found
        decided = dict(s.decided).get(lease)
        if decided != token and not s.broken:
            why = "its owner never decided" if decided is None else f"decided with {decided}"
            s = s._replace(
                broken=f"one lease per key: client {c} got L{lease[0]}.{lease[1]} token {token}, "
                f"{why}"
            )
        return self._client(
            s, c, phase="holding", pending=None, valid_until=valid_until, extends=0,
            held=(lease, token),
        )  # fmt: skip

    def _extended(self, s: State, c: int, token: int) -> State:
        """The token an extend of a keyed lease answers (the one Q nodes hold) is the
        one its owner decided: what a handle of the lease learns from it."""
        held = s.clients[c].held
        assert held is not None
        decided = dict(s.decided).get(held[0])
        if decided != token and not s.broken:
            s = s._replace(
                broken=f"one lease per key: an extend of L{held[0][0]}.{held[0][1]} answered "
                f"token {token}, decided {decided}"
            )
        return s

    def _settle_late(self, s: State, c: int, n: int, late: int) -> State:
        """R16 (``cleanup.settle_late``), modelled for keyed leases only, whose extend
        answers a token: node ``n`` granted the decided lease late with token ``late``
        (a try's answer after the decision, or a hand-over). The decided token is
        written into its lock value (raise_fence); a counter that ran ahead raises
        the others' (raise_fence of no lease: the counter only)."""
        held = s.clients[c].held
        assert held is not None
        lease, granted = held
        if late == granted:
            return s
        s = self._send(s, c, n, ("raise", lease, granted, -1))  # -1: no round waits for it
        if late > granted:
            for m in range(self.n):
                if m != n:
                    s = self._send(s, c, m, ("raise", (-1, 0), late, -1))
        return s
