"""One Redis node and the Lua scripts it runs, as pure functions on a hashable state.

Each function is one script of ``lockservice/scripts/`` (each runs atomically on
the node) and returns ``(node, reply, published)``: ``published`` is a hand-over
``(lease, token)`` put on the waiter's process channel, or None. Keys the model
leaves out: ``waitx``/``waitt`` (keepalive purge, per-waiter ttl: every lease
asks the same ttl) and the run_id argument (see ``Node.synced``).
Switchable rules acting here: R4 (raise_fence acks only a free or own lock),
R12 (a try that finds a hand-over re-issues it), R13 (an undo names its grant),
R22 (a lease joins the holders only when its mode may), R23 (every grant, a
shared one too, issues a new token), R26 (no grant stores the idempotency tag: off,
``grant`` stores it with the grant's token, as a commit before the decision would).

Lock kinds (R22): ``lock`` is an exclusive holder; ``group`` the shared or
semaphore holders (``holders:{name}``), all of ``mode``. Each client's mode and
the semaphores' permits are ``Kinds``, passed to every script.

Idempotency (R26): the clients below ``Kinds.keyed`` carry one key (one tag);
``tags`` are the leases that committed it here with their decided token (the
entries of ``holdert:{name}``), dropped with the lease's hold. find.lua and tag.lua
are in ``tags.py``; acquire.lua answers a committed lease here (``-4``).
"""

from __future__ import annotations

from typing import NamedTuple

from tests.model.waiter import Rules

__all__ = [
    "ALL_EXCLUSIVE",
    "Kinds",
    "Lease",
    "Node",
    "acquire",
    "extend",
    "raise_fence",
    "release",
    "undo",
]

Lease = tuple[int, int]  # (client, acquire number): the lease_id
Lock = tuple[Lease, int, int]  # (lease, token, expiry tick)
Published = tuple[tuple[Lease, int], ...]  # hand-overs: (waiter, token) each
Result = tuple["Node", object, Published]


class Kinds(NamedTuple):
    """Each client's mode (exclusive when not listed) and the semaphores' permits."""

    modes: tuple[str, ...] = ()
    permits: int = 1
    keyed: int = 0  # clients 0 .. keyed - 1 carry one idempotency key (R26)

    def of(self, lease: Lease) -> str:
        return self.modes[lease[0]] if lease[0] < len(self.modes) else "exclusive"

    def tagged(self, lease: Lease) -> bool:
        """The lease's acquire carries the idempotency key."""
        return lease[0] < self.keyed


ALL_EXCLUSIVE = Kinds()


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
    group: tuple[Lock, ...] = ()  # shared or semaphore holders (R22), sorted
    mode: str = ""  # the group's mode
    tags: tuple[tuple[Lease, int], ...] = ()  # committed tag: (lease, decided token) (R26)

    def grantable(self, now: int) -> int:
        """0 when the node may grant, else acquire.lua's code (-2 unsynced, -1 quarantined)."""
        if not self.synced:
            return -2
        return -1 if now < self.quarantine or self.recopy else 0

    def held_by(self, lease: Lease) -> bool:
        return self.holding(lease) is not None

    def holding(self, lease: Lease) -> int | None:
        """The token of ``lease``'s grant here, alone or in the group, or None."""
        if self.lock is not None and self.lock[0] == lease:
            return self.lock[1]
        return next((token for who, token, _ in self.group if who == lease), None)

    def free(self) -> bool:
        return self.lock is None and not self.group

    def committed(self) -> tuple[Lease, int, int] | None:
        """queue.lua ``tagged``: a lease holding the lock here that committed the tag, with
        its token and expiry (R26)."""
        for lease, token in self.tags:
            if self.lock is not None and self.lock[0] == lease:
                return lease, token, self.lock[2]
            expiry = next((e for who, _, e in self.group if who == lease), None)
            if expiry is not None:
                return lease, token, expiry
        return None

    def pruned(self) -> Node:
        """Tags go with their lease's hold (release, undo, expiry)."""
        if not self.tags:
            return self
        return self._replace(tags=tuple(t for t in self.tags if self.held_by(t[0])))

    def joinable(self, mode: str, kinds: Kinds, rules: Rules) -> bool:
        """queue.lua ``joinable``: free, or a group this mode may join (R22)."""
        if self.free():
            return True
        if not rules.on("R22") and mode == "exclusive":
            return self.lock is None  # a script that looks at lock:{name} alone
        if mode == "exclusive" or self.lock is not None or self.mode != mode:
            return False
        return mode == "shared" or len(self.group) < kinds.permits

    def without(self, lease: Lease) -> Node:
        """The lease's grant given back (its place in the group, or the lock)."""
        if self.lock is not None and self.lock[0] == lease:
            return self._replace(lock=None).pruned()
        group = tuple(m for m in self.group if m[0] != lease)
        return self._replace(group=group, mode=self.mode if group else "").pruned()

    def grant(
        self,
        lease: Lease,
        now: int,
        ttl: int,
        mode: str = "exclusive",
        rules: Rules | None = None,
        tag: bool = False,
    ) -> tuple[Node, int]:
        """queue.lua ``grant()``: INCR fence (above the base), SET lock PX ttl (R1, R2),
        or a place in the group; a shared grant without R23 takes the counter as is.
        Without R26, a grant of a keyed lease (``tag``) stores the tag at once."""
        if mode == "shared" and rules is not None and not rules.on("R23") and self.fence:
            token = self.fence
        else:
            token = max(self.fence + 1, self.base + 1)
        node = self._replace(fence=token)
        if tag and rules is not None and not rules.on("R26"):
            node = node._replace(tags=tuple(sorted((*node.tags, (lease, token)))))
        if mode == "exclusive":
            return node._replace(lock=(lease, token, now + ttl)), token
        group = tuple(
            sorted((*(m for m in self.group if m[0] != lease), (lease, token, now + ttl)))
        )
        return node._replace(group=group, mode=mode), token

    def enqueue(self, lease: Lease, ticket: int) -> Node:
        if any(member == lease for _, member in self.queue):
            return self  # ZADD NX keeps an earlier place
        return self._replace(queue=tuple(sorted((*self.queue, (ticket, lease)))))

    def dequeue(self, lease: Lease) -> tuple[Node, bool]:
        kept = tuple(e for e in self.queue if e[1] != lease)
        return self._replace(queue=kept), len(kept) != len(self.queue)

    def head(self) -> Lease | None:
        return self.queue[0][1] if self.queue else None


def acquire(
    node: Node,
    lease: Lease,
    ticket: int,
    now: int,
    ttl: int,
    rules: Rules,
    kinds: Kinds = ALL_EXCLUSIVE,
) -> Result:
    """acquire.lua for a waiter: ``(token, 0)``, ``(0, counter)``, ``(code, 0)``, or
    ``(-4, (lease, token, ticks left))`` for the lease that committed the tag (R26)."""
    code = node.grantable(now)
    if code:
        return node, (code, 0), ()
    mode, tag = kinds.of(lease), kinds.tagged(lease)
    found = node.committed() if tag else None
    if found is not None and found[0] != lease:  # the lease of the tag answers (R26)
        return node, (-4, (found[0], found[1], found[2] - now)), ()
    held = node.holding(lease)
    if held is not None:  # handed over meanwhile
        if not rules.on("R12"):
            return node, (held, 0), ()  # the old grant, as it stands
        node, token = node.grant(lease, now, ttl, mode, rules, tag)  # confirmed anew
        return node, (token, 0), ()
    if not node.joinable(mode, kinds, rules):
        return node.enqueue(lease, ticket), (0, node.fence), ()
    if node.queue:
        node = node.enqueue(lease, ticket)
        if node.head() != lease:
            return node, (0, node.fence), ()
        node, _ = node.dequeue(lease)
    node, token = node.grant(lease, now, ttl, mode, rules, tag)
    return node, (token, 0), ()


def _hand_over(
    node: Node, freed: bool, now: int, ttl: int, rules: Rules, kinds: Kinds
) -> tuple[Node, Published]:
    """queue.lua ``hand_over``: a freed lock (or permit) goes to the queue's head, and
    to each next waiter that may join it (R25), each published to its waiter."""
    published: Published = ()
    while freed and node.head() is not None and not node.grantable(now):
        head = node.head()
        assert head is not None
        mode = kinds.of(head)
        if not node.joinable(mode, kinds, rules):
            break
        node, _ = node.dequeue(head)
        node, token = node.grant(head, now, ttl, mode, rules, kinds.tagged(head))
        published = (*published, (head, token))
        if mode == "exclusive":
            break
    return node, published  # an ungrantable node publishes a bare wake-up: not modelled


def release(
    node: Node, lease: Lease, now: int, ttl: int, rules: Rules, kinds: Kinds = ALL_EXCLUSIVE
) -> Result:
    """release.lua (a release, or an abandon: leave the queue too). A waiter that
    leaves hands over when the lock is free or a group holds it (its head may join)."""
    owned = node.held_by(lease)
    if owned:
        node = node.without(lease)
    node, dequeued = node.dequeue(lease)
    freed = owned or (dequeued and node.lock is None)
    node, published = _hand_over(node, freed, now, ttl, rules, kinds)
    return node, int(owned), published


def undo(
    node: Node,
    lease: Lease,
    ticket: int | None,
    named: int,
    now: int,
    ttl: int,
    rules: Rules,
    kinds: Kinds = ALL_EXCLUSIVE,
) -> Result:
    """undo.lua: undo grant ``named`` (0: any grant of the lease, R13 off).

    ``ticket`` None: give the grant up; else keep it unless an earlier waiter is
    queued here (R15). Replies the token when kept, minus it when given up, 0 when
    the lease did not hold the lock."""
    token = node.holding(lease)
    if token is None or (named and token != named):
        return node, 0, ()
    if ticket is not None:
        node = node.enqueue(lease, ticket)
        if node.head() == lease:
            node, _ = node.dequeue(lease)
            return node, token, ()
    node, published = _hand_over(node.without(lease), True, now, ttl, rules, kinds)
    return node, -token, published


def raise_fence(node: Node, lease: Lease, token: int, rules: Rules) -> Result:
    """raise_fence.lua: counter = max(counter, token); 0 when another lease holds it
    (R4): an exclusive holder, or a group the lease is not a member of."""
    node = node._replace(fence=max(node.fence, token))
    if node.free():
        return node, node.fence, ()
    if node.holding(lease) is None:
        return node, (0 if rules.on("R4") else node.fence), ()
    if node.lock is not None:
        return node._replace(lock=(lease, token, node.lock[2])), node.fence, ()  # KEEPTTL
    group = tuple(sorted((who, token if who == lease else t, e) for who, t, e in node.group))
    return node._replace(group=group), node.fence, ()


def extend(node: Node, lease: Lease, now: int, ttl: int) -> Result:
    """extend.lua: PEXPIRE if the lease holds it (never re-creates a lock): token or 0."""
    token = node.holding(lease)
    if token is None:
        return node, 0, ()
    if node.lock is not None:
        return node._replace(lock=(lease, token, now + ttl)), token, ()
    group = tuple(sorted((w, t, now + ttl if w == lease else e) for w, t, e in node.group))
    return node._replace(group=group), token, ()
