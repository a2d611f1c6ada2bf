"""One Redis node and the Lua scripts it runs, as pure functions on a hashable state.

Each function is one script of ``lockservice/scripts/`` (each runs atomically on
the node) and returns ``(node, reply, published)``: ``published`` is a hand-over
``(lease, token)`` put on the waiter's process channel, or None. Keys the model
leaves out: ``waitx``/``waitt`` (keepalive purge, per-waiter ttl: every lease
asks the same ttl) and the run_id argument (see ``Node.synced``).
Switchable rules acting here: R4 (raise_fence acks only a free or own lock),
R12 (a try that finds a hand-over re-issues it), R13 (an undo names its grant).
"""

from __future__ import annotations

from typing import NamedTuple

from tests.model.waiter import Rules

__all__ = ["Lease", "Node", "acquire", "extend", "raise_fence", "release", "undo"]

Lease = tuple[int, int]  # (client, acquire number): the lease_id
Lock = tuple[Lease, int, int]  # (lease, token, expiry tick)
Published = tuple[Lease, int] | None
Result = tuple["Node", object, Published]


class Node(NamedTuple):
    lock: Lock | None = None
    fence: int = 0  # fence:{name}
    queue: tuple[tuple[int, Lease], ...] = ()  # waitq:{name}: (ticket, member), sorted
    # fencegate:synced names this run of the server (every script call passes the run
    # id the caller read at connect; a restart drops every connection, so callers
    # always pass the current one): False after a restart until a resync (R17)
    synced: bool = True
    base: int = 0  # the token base of the marker
    quarantine: int = 0  # fencegate:quarantine: refuses grants while now < this
    recopy: bool = False  # fencegate:recopy: refuses grants until copied again (R21)

    def grantable(self, now: int) -> int:
        """0 when the node may grant, else acquire.lua's code (-2 unsynced, -1 quarantined)."""
        if not self.synced:
            return -2
        return -1 if now < self.quarantine or self.recopy else 0

    def held_by(self, lease: Lease) -> bool:
        return self.lock is not None and self.lock[0] == lease

    def grant(self, lease: Lease, now: int, ttl: int) -> tuple[Node, int]:
        """queue.lua ``grant()``: INCR fence (above the base), SET lock PX ttl (R1, R2)."""
        token = max(self.fence + 1, self.base + 1)
        return self._replace(fence=token, lock=(lease, token, now + ttl)), token

    def enqueue(self, lease: Lease, ticket: int) -> Node:
        if any(member == lease for _, member in self.queue):
            return self  # ZADD NX keeps an earlier place
        return self._replace(queue=tuple(sorted((*self.queue, (ticket, lease)))))

    def dequeue(self, lease: Lease) -> tuple[Node, bool]:
        kept = tuple(e for e in self.queue if e[1] != lease)
        return self._replace(queue=kept), len(kept) != len(self.queue)

    def head(self) -> Lease | None:
        return self.queue[0][1] if self.queue else None


def acquire(node: Node, lease: Lease, ticket: int, now: int, ttl: int, rules: Rules) -> Result:
    """acquire.lua for a waiter: ``(token, 0)``, ``(0, counter)``, or ``(code, 0)``."""
    code = node.grantable(now)
    if code:
        return node, (code, 0), None
    if node.lock is not None:
        if node.lock[0] == lease:  # handed over meanwhile
            if not rules.on("R12"):
                return node, (node.lock[1], 0), None  # the old grant, as it stands
            node, token = node.grant(lease, now, ttl)  # confirmed anew: new token, ttl
            return node, (token, 0), None
        return node.enqueue(lease, ticket), (0, node.fence), None
    if node.queue:
        node = node.enqueue(lease, ticket)
        if node.head() != lease:
            return node, (0, node.fence), None
        node, _ = node.dequeue(lease)
    node, token = node.grant(lease, now, ttl)
    return node, (token, 0), None


def _hand_over(node: Node, freed: bool, now: int, ttl: int) -> tuple[Node, Published]:
    """queue.lua ``hand_over``: a freed lock goes to the queue's head, published to it."""
    head = node.head()
    if not freed or head is None or node.grantable(now):
        return node, None  # an ungrantable node publishes a bare wake-up: not modelled
    node, _ = node.dequeue(head)
    node, token = node.grant(head, now, ttl)
    return node, (head, token)


def release(node: Node, lease: Lease, now: int, ttl: int) -> Result:
    """release.lua (a release, or an abandon: leave the queue too)."""
    held = node.lock is not None
    owned = node.held_by(lease)
    if owned:
        node = node._replace(lock=None)
    node, dequeued = node.dequeue(lease)
    node, published = _hand_over(node, owned or (dequeued and not held), now, ttl)
    return node, int(owned), published


def undo(
    node: Node, lease: Lease, ticket: int | None, named: int, now: int, ttl: int, rules: Rules
) -> Result:
    """undo.lua: undo grant ``named`` (0: any grant of the lease, R13 off).

    ``ticket`` None: give the grant up; else keep it unless an earlier waiter is
    queued here (R15). Replies the token when kept, minus it when given up, 0 when
    the lease did not hold the lock."""
    lock = node.lock
    owned = lock is not None and lock[0] == lease and (not named or lock[1] == named)
    if not owned or lock is None:
        return node, 0, None
    token = lock[1]
    if ticket is not None:
        node = node.enqueue(lease, ticket)
        if node.head() == lease:
            node, _ = node.dequeue(lease)
            return node, token, None
    node, published = _hand_over(node._replace(lock=None), True, now, ttl)
    return node, -token, published


def raise_fence(node: Node, lease: Lease, token: int, rules: Rules) -> Result:
    """raise_fence.lua: counter = max(counter, token); 0 when another lease holds it (R4)."""
    node = node._replace(fence=max(node.fence, token))
    if node.lock is not None:
        if node.lock[0] != lease:
            return node, (0 if rules.on("R4") else node.fence), None
        node = node._replace(lock=(lease, token, node.lock[2]))  # KEEPTTL
    return node, node.fence, None


def extend(node: Node, lease: Lease, now: int, ttl: int) -> Result:
    """extend.lua: PEXPIRE if the lease holds it (never re-creates a lock): token or 0."""
    if node.lock is None or node.lock[0] != lease:
        return node, 0, None
    return node._replace(lock=(lease, node.lock[1], now + ttl)), node.lock[1], None
