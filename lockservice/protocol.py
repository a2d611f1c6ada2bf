"""The lock protocol in one place: its rules, its words, its keys and its states.

Every other module of ``lockservice`` cites these rules by number (``R4``)
instead of restating them; the model in ``tests/model/`` has a switch per rule
and shows a counterexample when one is removed.

Invariants (DESIGN.md), for one lock name, N nodes, quorum Q = N // 2 + 1:

- **I1** mutual exclusion: no two leases are valid at once, while a majority of
  nodes is healthy and clocks drift less than ``drift(ttl)``.
- **I2** monotonic tokens: every grant's token is greater than every earlier
  grant's — across processes, with a minority down, after a restart with data loss.
- **I3** no deadlock: a lease neither extended nor released expires after its ttl.
- **I4** only the owner (its 128-bit ``lease_id``) extends or releases a lease.

Lock kinds share one namespace and one counter per name: a name is held by one
*exclusive* lease, or by any number of *shared* leases, or by up to N
*semaphore* leases of ``permits`` N. I1 and I2 read, with I5 and I6 added:

- **I1** no exclusive lease is valid together with any other lease of its name.
- **I5** never more than N semaphore leases of a name are valid at once. Each
  node caps its holders at N; over majority quorums those caps do not add up
  (leases on {n1,n2}, {n1,n3} and {n2,n3} leave every node at 2 holders), so a
  semaphore lease is granted, raised and extended on *every* node (R32): any
  valid lease then holds a place on every node, and one node's cap bounds them.
- **I2** a grant's token is greater than the token of every grant completed
  before its acquire began (for exclusive leases that is every earlier grant,
  since they never overlap - which rests on I1's clock bound: a Redis clock
  jump that expires a counted grant early can let two exclusive leases whose
  acquires overlap share a token, as it can let them overlap); grants whose
  acquires overlap are not ordered (two shared or semaphore leases granted
  together may share a token).
- **I6** a shared grant's token is at most the newest token issued for the
  name, and below the token of every grant completed after its acquire began.

Glossary:

- *try*: one round of ``acquire.lua`` on every node for one lease id.
- *grant*: one node's ``lock:{name}`` set for a lease, with a token from that
  node's ``fence:{name}`` counter (R1). A *lease* is a quorum of valid grants.
- *round 2*: raising ``fence:{name}`` to the lease's token on every node (R4).
- *hand-over*: a release that grants the lock to the next queued waiter inside
  the release script and publishes the token to that waiter's process (R9).
- *undo*: giving back the grants of a try that did not make a lease (R7, R13-R15).
- *confirmation*: a try that finds a hand-over already granted to it and
  issues that grant anew (R12).
- *resync*: raising a restarted node's counters to what the others hold (R18).
- *quarantine*: the time after a resync during which a node grants nothing (R19).

Rules, each with the invariant it protects and where it is enforced:

R1  A grant is one script: ``SET lock NX PX ttl`` and ``INCR fence`` together
    (``queue.lua: grant``).                                                [I2]
R2  Counters never go down and are never deleted; a missing counter restarts
    above the node's synced token base (``queue.lua: grant``).             [I2]
R3  A lease needs grants on Q nodes (a semaphore's on all N: R32); its token
    is the largest of their tokens: every earlier lease's quorum shares a node
    with this one (``acquire``, ``handover.Pending.lease``).              [I1, I2]
R4  Round 2: when those tokens differ, the counters are raised to the token on
    every node, and the lease exists only once Q nodes acked; a node counts
    only when it is free or held by the raising lease, so that no grant older
    than the raise completes a quorum below it (``raise_fence.lua``).      [I2]
R5  Validity is ``ttl - drift(ttl)`` from the *send time* of the try that got
    the grant, on a monotonic clock; the lease ends with its Q-th latest
    grant; without Q valid grants the try is undone (``handover.Pending``). [I1]
R6  Release and extend compare the lease id; extend never re-creates an
    expired lock (``release.lua``, ``extend.lua``).                       [I4, I1]
R7  A try that did not make a lease is undone (``undo.lua``) and an acquire
    that gives up or is cancelled is released (``release.lua``, which also
    leaves the queue), sent on each node's connection behind the try and
    synchronously, so cancellation cannot skip it. A try without waiting
    undoes any grant of its lease on every node; a queued waiter only the
    grants it knows (R13). Releases and unnamed undos that cannot be sent are
    replayed after a reconnect, so a lease id whose unnamed cleanup may still
    run is never used for another try: a retry after a resync wait of a try
    without waiting takes a new lease id (``cleanup``, ``manager``).        [I3, I1]
R8  A waiter's ticket (its arrival time) is the same on every node; a free
    lock goes to the earliest live waiter; a keepalive drops dead waiters
    (``queue.lua``).                                                  [fairness]
R9  Hand-over: the release script grants the lock to the queue head (R1: a
    new token, the waiter's ttl) and publishes the token on that waiter's
    process channel; Q valid hand-over grants make a lease, R3 and R4 apply
    (``queue.lua: hand_over``, from release.lua and undo.lua).    [no round trip]
R10 A handed-over grant counts from the send time of the waiter's last try
    that node answered "held" or "queued", never from the message's arrival
    (``Pending.handed``).                                                   [I1]
R11 A "queued" answer carries the node's counter; a hand-over message whose
    token is not above it is older than that answer and ignored
    (``Pending.refused``, ``Pending.handed``).                              [I1]
R12 A try that finds a hand-over already granted confirms it by issuing it
    anew (new token, ttl from now); messages with a lower token are ignored
    from then on (``acquire.lua``, ``Pending.granted``).                    [I1]
R13 A queued waiter's undo names the grant's token, so an undo delivered late
    (stuck in a dropped connection) cannot take a later grant (``undo.lua``). [I1]
R14 While an undo to a node is unanswered nothing from that node counts; a
    lost undo answer makes the node suspect until a try of the waiter gets an
    answer from it (``Pending.park``, ``Pending.undone``).                  [I1]
R15 An undo keeps a grant unless an earlier waiter is queued on that node; a
    waiter that fewer than Q nodes answer ("held" or granted) gives all its
    grants up (``undo.lua``, ``acquire``).                            [liveness]
R16 A node that grants after the try was decided gets the lease's real token
    written into its lock value; if its counter ran ahead, the others are
    raised to it (``cleanup.settle_late``; for a queued lease, up to 4096
    recent ones are remembered).                              [I2 for inspect]
R17 A node grants only while ``fencegate:synced`` names its current run id
    (acquire, inspect, state and the hand-over are passed the run id read at
    connect): a restart, even from an old snapshot, makes every process see it
    unsynced (``queue.lua: grantable``, ``inspect.lua``). Extend, release and
    round 2 do not check it: counters only rise, and R19 covers what a
    restarted node forgot.                                                  [I2]
R18 A resync raises every counter of the unsynced node to the largest value
    on N - Q + 1 *synced* nodes, which every earlier quorum shares a node with,
    and marks synced the run its copies went to (a node that restarts again
    meanwhile stays unsynced). Only when *every* other node answered and too
    few are synced (a majority restarted) does it copy from all of them, with a
    wall-clock base above them all; while a node does not answer, it waits. A
    node joins without quarantine only when no lease can have been granted:
    N - Q + 1 synced nodes or all N without a counter, or a quorum of nodes
    none of which was ever synced, none seen restarting (``resync``); it
    takes the synced nodes' base, and nodes that start a cluster together end
    with the largest base any resync gave them (a base only rises:
    ``mark_synced.lua``), so a new name's first grant needs no round 2. [I2, I1]
R19 A resynced node is quarantined for ``max_ttl``: it grants nothing until
    every lease it may have forgotten expired (``mark_synced.lua``): for the
    largest ``max_ttl`` any gateway has recorded on the nodes (each records
    its own at every connect), so gateways with different ``max_ttl`` are safe
    (``resync``).                                                           [I1]
R20 A node whose ``maxmemory-policy`` is not ``noeviction`` never counts: it
    could evict counters or live locks (``node``; checked at each connect, so
    a policy changed at run time is seen at the next reconnect).            [I2]
R21 After its quarantine a resynced node copies the counters again, from N - Q
    + 1 synced nodes that are not waiting for a copy of their own, before it
    grants: a try sent before the restart may have run on a synced node after
    the first copy and made a lease with the grant the node forgot. When every
    node answers and fewer such nodes exist (a majority restarted since: that
    grant may be on no node), it copies from all of them and raises its token
    base above the wall clock, as R18's fallback. The model found both
    schedules (``mark_synced.lua``, ``recopied.lua``, ``resync``).         [I2]

R22 Modes: an exclusive request conflicts with every holder; a shared one joins
    shared holders; a semaphore(N) one joins semaphore holders of the same N
    while fewer than N hold it; shared and semaphore conflict. A semaphore(N)
    request that finds semaphore holders of M != N fails at once with
    ``PermitsMismatch`` (from a majority of nodes). On a node, lock:{name} is
    "<lease_id>:<token>" for an exclusive holder or "=<mode> <permits>" for a
    group whose members are in holders:{name} (lease id by expiry, node ms)
    and holdert:{name} (token, and the tag once committed: R26); every
    script that grants looks at both, and a group's keys expire with its last member (``queue.lua:
    joinable``, ``grant``, ``holder``; ``memory._conflicts``). Extend, release,
    undo (R13 names a member's token alike) and round 2 (R4: a group counts
    when the raising lease is a member whose grant has not expired: the
    others' grants are concurrent with it, not earlier) work per lease for
    every kind.                                                     [I1, I5]
R23 Every grant issues a new token, a shared one too (R1): a node orders its
    grants by token (R11-R13 compare them), so two grants on a node must not
    share one. A shared lease's token is thus the newest issued for the name
    at its grant (the max of its quorum's counters, raised by round 2 when
    they differ, R4) and a later exclusive grant's is larger (R3, R4). It is
    also what makes a read lock protect a read: a shared reader's fenced read
    raises the store's mark above the token of an exclusive holder that paused
    past its ttl, whose late write is then refused; with the exclusive's own
    token (DESIGN's first wording) it would pass (``queue.lua: grant``,
    ``memory._token``).                                                 [I2, I6]
R24 A semaphore grant, like an exclusive one, issues a new token (R1); grants
    whose acquires overlap may share a token (the max of different quorums'
    counters), so a semaphore's token orders its holders' writes but does not
    exclude them.                                                          [I2]
R25 FIFO across kinds: a request joins the holders only when no earlier waiter
    is queued on the node (acquire.lua), so a queued exclusive waiter blocks
    shared requests that come after it; the hand-over grants the queue's head
    and then every next waiter that may join (all shared waiters at the head,
    semaphore waiters while permits are left), publishing to each (``queue.lua:
    hand_over``); a waiter that leaves the queue hands over alike when the lock
    is free or a group holds it, since the next head may join (``release.lua``).
    In one process the manager's per-name turns keep arrival order
    (``turns``).                                          [no writer starvation]
R26 An idempotency tag (a digest of the key and of the kind, ``lease.
    idempotency_tag``, never the key) names a lease only once its owner has
    decided it: no script that grants stores a tag (a grant is not yet a lease:
    its owner may still give it up, R7, R13-R15). The acquire that is about to
    return its lease commits the tag (tag.lua, ``Redlock.commit``): on each node
    where the lease still holds the lock, holdert:{name} records "<decided
    token> <tag>" with the lease (it goes with the release or the expiry, and
    extend keeps it); a node where another lease holding the lock committed the
    tag answers that lease, and when a quorum does, the acquire gives its own
    lease up and returns that one (two requests with one key that both got a
    lease end with one). Fewer than Q acks and no quorum naming another lease:
    the acquire gives its lease up and fails (QuorumUnavailable); returned, no
    quorum would name it, and a repeat would take a second lease of the key at
    once (a free permit, or joining shared holders; an exclusive one queues).
    A repeat asks the nodes
    first (find.lua; synced and not quarantined nodes only, R17) and returns the
    lease a quorum names committed (its id, the decided token, the validity a
    quorum still gives it) while that validity lasts beyond drift(left): in the
    lock's last drift(ttl), past the lease's validity, the repeat waits the lock
    out and acquires afresh; a try that finds it answers it instead of granting
    or queueing (acquire.lua, ``acquire.found_lease``, ``idempotency``,
    ``memory.commit``). extend answers the token Q nodes hold: the decided one
    is on a quorum (R4), other tokens of the lease (a round-1 grant round 2
    missed, a grant after the decision, R16) on fewer; it writes that token
    where another answered (R16), and answers none while fewer than Q of the
    nodes that answered agree (``redlock.extend``).
                                                           [one lease per key]
Redlock groups (``[locks] groups``; not the holder groups of R22): names spread
over independent Redlock groups, and changes of the groups while gateways run.
A *moved* name is one whose group under ``previous_groups`` differs from its
group under ``groups``.

R27 A name is served by one group: the highest rendezvous weight of the name
    over the group ids (``placement.owner``). An id is explicit or derived
    from the group's sorted node labels, so adding, removing or reordering
    other groups never moves a name between two groups that both stay; a node
    is in one group only. Each group is one Redlock: R1-R21 hold within it
    (``groups.Groups``).                                                [I1, I2]
R28 During a change, a moved name is locked in its old group first, then in
    its new one, with one lease id; there is a lease only when both granted.
    Gateways of the old configuration take the old group alone, those of the
    change both, those of the new configuration the new group alone: each two
    kinds that may run at once share a group that both lock (old and change:
    the old group; change and new: the new group); old and new never run at
    once (R30). The old group's grant is kept while the new group refuses, and
    a retry issues it anew, so the lease id is never reused after an undo (R7)
    (``Groups.try_acquire``).                                               [I1]
R29 Such a lease's token is the larger of its two grants' tokens, and the
    other group's counter is raised to it on a quorum of that group that is
    free or held by the lease (``raise_fence.lua``, as R4) before the lease
    exists: every later grant in either group is above it
    (``Groups.try_acquire``).                                               [I2]
R30 Carry-over, after the last gateway of the old configuration stopped and
    before the first drops ``previous_groups``, only while every node of the old
    and new groups is synced in its current run with no second copy due (R17,
    R21; an empty restarted node would copy nothing; checked before and after
    the copy, else it refuses: resync pending): every moved name's counter is
    raised on *every* node of its new group to the largest value on *every*
    node of its old group (``resync.lua``), and the token base of every synced
    node of the new groups to the largest base of the old groups (a counter
    lost with a majority's data is below it, R18); then every lease that holds
    a moved name in the old group is waited out there (at most the largest
    ``max_ttl`` any gateway recorded on the old nodes, R19), the new group
    holding it too or not: a changing gateway's lease renewed through a gateway
    of the old configuration was extended in the old group alone and outlives
    its new group's grant (the groups model found it); a holder group's pttl is
    its last member's. After it, each new counter is above every token the old
    group issued for the name, and no lease valid through the old group alone
    is left (``carry.carry_over``).                                     [I2, I1]
R31 A lease of a moved name is extended only while both groups hold it: the old
    group first, the new one only once the old one extended it, and a
    ``LeaseLost`` from either is a ``LeaseLost``, so it never lives on in one
    group after it ended in the other (its grant there is given up: the name
    is free at once, not held until the ttl). Likewise a repeat (R26) answers
    it only when both groups name it committed, and a commit goes in route
    order: the old group decides (another lease it names is the answer), the
    new group is asked only once the old one took the tag, and its answer
    decides nothing (commits that cross between two gateways end with one
    lease). A release goes to both (``Groups.extend``, ``find``, ``commit``,
    ``release``).                                                       [I1, I4]

R32 A semaphore lease over N > 1 nodes needs all N grants, not Q: a try, a
    hand-over (``Pending.need``), round 2 and an extend count N nodes (an extend
    also when a node answers that the lease holds a permit: a handle, as the
    gateway's renew extends, is labelled exclusive whatever its kind); fewer is
    undone like a failed try (extend: the lease keeps its old validity, or is
    lost when a node no longer holds it). An extend on a majority alone would
    let the grant expire on the other nodes, whose place a new lease takes.
    Release and undo free what they reach, as for every kind. The price: one
    node down, paused or quarantined stops new semaphore leases and their
    extends (exclusive and shared locks keep majority quorums); permits held in
    slots (one key per permit, each a Redlock) would lift it later. A waiting
    try that no more than N - Q nodes are known to be out of (a majority may
    answer) gives its grants up (R15) and the waiter tries again with the same
    lease id and ticket until its wait runs out (FAILED -> TRYING), then fails
    with QuorumUnavailable; more than N - Q out fails at once, as for every
    kind (``protocol.grants_needed``, ``acquire``, ``manager``,
    ``redlock.extend``).                                                  [I5]
R33 A waiter's try decides "held" or "unavailable" only once each node whose
    grant the waiter holds (handed over, or kept by an undo) answered or failed;
    such a node counts toward a lease before it answers. Its answer is what the
    undo names (R13): the try re-issued that grant with a new token (R12), so an
    undo naming the old one did nothing, R15's tie-break never ran, and two
    waiters split between the live nodes stayed split, each retry renewing both
    grants. It costs at most ``node_timeout`` per try, when that node is paused
    (``acquire.try_decider``; the model's liveness check).           [liveness]

Where each rule is checked (tests, model runs, counterexamples): RULES_CHECKED.md
beside this module.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "ATTEMPT_TRANSITIONS",
    "KEEPALIVE_MS",
    "MAX_TTL_KEY",
    "NODE_TRANSITIONS",
    "QUARANTINE_KEY",
    "RECOPY_KEY",
    "RELEASE_CHANNEL",
    "SYNCED_KEY",
    "AttemptState",
    "NodeState",
    "drift",
    "extend_keys",
    "fence_key",
    "holder_keys",
    "inspect_keys",
    "lock_key",
    "lock_keys",
    "raise_keys",
    "waiter_spec",
]

RELEASE_CHANNEL: Final = "fencegate:released"  # + ":<process>": hand-overs and wake-ups
SYNCED_KEY: Final = "fencegate:synced"  # "<token base> <run_id>" (R17)
QUARANTINE_KEY: Final = "fencegate:quarantine"  # PX max_ttl after a resync (R19)
RECOPY_KEY: Final = QUARANTINE_KEY + ":recopy"  # set by a resync until its 2nd copy (R21)
MAX_TTL_KEY: Final = "fencegate:max_ttl_ms"  # the largest max_ttl of any gateway (R19)
KEEPALIVE_MS: Final = 3000  # a queued waiter that does not try again within it drops out (R8)


def drift(ttl: float) -> float:
    """Clock drift allowance subtracted from every validity window (R5)."""
    return ttl * 0.01 + 0.002


def grants_needed(mode: str, nodes: int) -> int:
    """How many nodes' grants make a lease of ``mode`` (R3, R32): a majority, but
    every node for a semaphore."""
    return nodes if mode == "semaphore" else nodes // 2 + 1


def lock_key(name: str) -> str:
    return f"lock:{{{name}}}"


def fence_key(name: str) -> str:
    return f"fence:{{{name}}}"


def holder_keys(name: str) -> tuple[str, str]:
    """A group of shared or semaphore holders (R22): expiries (zset), tokens and committed
    tags (hash, R26)."""
    return f"holders:{{{name}}}", f"holdert:{{{name}}}"


def waiter_spec(ttl_ms: int, mode: str = "exclusive", permits: int = 0) -> str:
    """A waiter's entry in waitt:{name}: its ttl, and its kind unless exclusive (as
    acquire.lua builds it), so that a hand-over grants what it asked for (R25)."""
    if mode == "exclusive":
        return str(ttl_ms)
    return f"{ttl_ms} {mode} {permits}"


def extend_keys(name: str) -> tuple[str, ...]:
    """The keys extend.lua takes."""
    return (lock_key(name), *holder_keys(name))


def raise_keys(name: str) -> tuple[str, ...]:
    """The keys raise_fence.lua takes."""
    return (fence_key(name), lock_key(name), *holder_keys(name))


def inspect_keys(name: str) -> tuple[str, ...]:
    """The keys inspect.lua takes."""
    return (lock_key(name), fence_key(name), SYNCED_KEY, *holder_keys(name))


def lock_keys(name: str) -> tuple[str, ...]:
    """The keys acquire.lua, release.lua, undo.lua, find.lua and tag.lua take, in their order."""
    return (
        lock_key(name),
        fence_key(name),
        SYNCED_KEY,
        QUARANTINE_KEY,
        f"waitq:{{{name}}}",
        f"waitx:{{{name}}}",
        f"waitt:{{{name}}}",
        *holder_keys(name),
    )


class NodeState(enum.StrEnum):
    """What one process knows of one node (the ``fencegate_redis_node_state`` gauge).

    Only a connection, an acquire's answer or a resync moves it; a read-only
    script (inspect) never does, so a quarantined node does not look healthy.
    """

    DOWN = "down"  # not connected: unreachable, refused the login, or overdue replies
    REFUSED = "refused"  # connected but never counted: evicting maxmemory-policy (R20)
    UNSYNCED = "unsynced"  # restarted or new: counters may be behind (R17)
    QUARANTINED = "quarantined"  # resynced, waiting out max_ttl (R19)
    HEALTHY = "healthy"  # counts in quorums

    @property
    def counts(self) -> bool:
        """Whether an acquire can be granted by this node now."""
        return self is NodeState.HEALTHY


NODE_TRANSITIONS: Final[dict[NodeState, frozenset[NodeState]]] = {
    NodeState.DOWN: frozenset(
        {NodeState.REFUSED, NodeState.UNSYNCED, NodeState.QUARANTINED, NodeState.HEALTHY}
    ),
    NodeState.REFUSED: frozenset({NodeState.DOWN}),
    NodeState.UNSYNCED: frozenset({NodeState.DOWN, NodeState.QUARANTINED, NodeState.HEALTHY}),
    NodeState.QUARANTINED: frozenset({NodeState.DOWN, NodeState.UNSYNCED, NodeState.HEALTHY}),
    NodeState.HEALTHY: frozenset({NodeState.DOWN, NodeState.UNSYNCED, NodeState.QUARANTINED}),
}


class AttemptState(enum.StrEnum):
    """The life of one acquire (one lease id) in one process (``handover.Pending``).

    TRYING -> GRANTED            a quorum of valid grants with one token (R3, R5)
    TRYING -> RAISING -> GRANTED tokens differed: round 2 acked by Q nodes (R4)
    TRYING -> QUEUED             held, queued behind an earlier waiter (R8), or the
                                 grants ran out on the way; grants it holds are
                                 undone or kept (R13-R15)
    QUEUED -> TRYING             woken by a release, a nudge or the poll timer
    QUEUED -> RAISING / GRANTED  Q hand-overs arrived (R9-R12)
    TRYING / RAISING -> FAILED   no quorum answered: undone, QuorumUnavailable
    FAILED -> TRYING             retried once after a resync wait, or, for a
                                 semaphore waiter that a majority may answer, until
                                 its wait runs out (R32) (or RAISING / GRANTED:
                                 hand-overs arrived during that wait)
    any but GRANTED -> ABANDONED wait ran out or the caller was cancelled: undone (R7)
    """

    TRYING = "trying"
    RAISING = "raising"
    QUEUED = "queued"
    GRANTED = "granted"
    FAILED = "failed"
    ABANDONED = "abandoned"


_A = AttemptState
ATTEMPT_TRANSITIONS: Final[dict[AttemptState, frozenset[AttemptState]]] = {
    _A.TRYING: frozenset({_A.GRANTED, _A.RAISING, _A.QUEUED, _A.FAILED, _A.ABANDONED}),
    _A.RAISING: frozenset({_A.GRANTED, _A.QUEUED, _A.FAILED, _A.ABANDONED}),
    _A.QUEUED: frozenset({_A.TRYING, _A.RAISING, _A.GRANTED, _A.ABANDONED}),
    _A.FAILED: frozenset({_A.TRYING, _A.RAISING, _A.GRANTED, _A.ABANDONED}),
    _A.GRANTED: frozenset(),
    _A.ABANDONED: frozenset(),
}
