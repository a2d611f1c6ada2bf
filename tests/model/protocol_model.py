"""fencegate's lock protocol for one lock name, as an explicit-state model.

A state holds the nodes (``node_scripts.Node``), the clients (one gateway process
each, one acquire at a time), every message in flight and the model time. The
successors of a state are every step the system can take next: a client acts, a
node runs the next request of one connection, a reply or a hand-over message is
delivered, time advances one tick, or a fault happens (within ``Bounds``).

Links: requests and replies of one client<->node command connection are FIFO
(the code relies on it: an undo is sent behind the try it undoes, and its
answer comes after everything sent before it). A dropped connection fails every
call in flight on it (the client sees a ConnectionError), and its unsent or
unanswered requests may still run on the node at any later time, or never (a
paused server resumes). Hand-over messages travel on the pub/sub connection, a
bag with no order relative to the replies: each can be lost or duplicated.

Time: one tick counter shared by nodes and clients. That is the timing assumption
the protocol states (clocks advance together within the drift bound): a lock on
a node expires ``ttl`` ticks after its grant, and a client counts a grant valid
until ``since + ttl - drift`` where ``since`` is no later than the grant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import combinations
from typing import Any

from tests.model import node_scripts as ns
from tests.model import tags
from tests.model.node_scripts import Lease, Node
from tests.model.repeats import Repeats, answers_find
from tests.model.state import (
    FAIL,
    Bounds,
    Client,
    Label,
    Msg,
    State,
    believes,
    canonical,
    put,
)
from tests.model.waiter import Pending, Rules

__all__ = ["Bounds", "Client", "Label", "Model", "State"]


class Model(Repeats):
    def __init__(self, bounds: Bounds | None = None, without: frozenset[str] = frozenset()):
        bounds = bounds or Bounds()
        self.b = bounds
        self.rules = Rules(frozenset(without))
        self.n = bounds.nodes
        self.q = bounds.nodes // 2 + 1
        self.cut = bounds.ttl - bounds.drift  # R5: validity = ttl - drift(ttl)
        self.kinds = ns.Kinds(bounds.modes, bounds.permits, bounds.keyed)

    def initial(self) -> State:
        nodes = (Node(fence=self.b.counter),) * self.n
        return State(0, nodes, (Client(),) * self.b.clients, (), ())

    # helpers
    def _need(self, c: int) -> int:
        """Grants (and acks of round 2 and extend) that make client ``c``'s lease: a
        majority, or every node for a semaphore (R32)."""
        if self.kinds.of((c, 0)) == "semaphore" and self.rules.on("R32"):
            return self.n
        return self.q

    def _client(self, s: State, c: int, **kw: Any) -> State:
        return s._replace(clients=put(s.clients, c, s.clients[c]._replace(**kw)))

    def _round(self) -> tuple[object, ...]:
        """The answers of a round just sent: none yet, a down node's failure at once."""
        return tuple(FAIL if n in self.b.down else None for n in range(self.n))

    def _send(self, s: State, c: int, n: int, msg: Msg) -> State:
        if n in self.b.down:
            return s  # its call failed at once (``_round``); a release is not replayed
        link = c * self.n + n
        return s._replace(inflight=(*s.inflight, (link, msg)))

    def _send_all(self, s: State, c: int, msg: Msg) -> State:
        for n in range(self.n):
            s = self._send(s, c, n, msg)
        return s

    def _fits(self, s: State) -> bool:
        cap = self.b.capacity
        if len(s.stuck) > cap:
            return False
        return len(s.inflight) <= cap or max(Counter(x[0] for x in s.inflight).values()) <= cap

    # client steps (acquire.py attempt / _grant / _undo, redlock.py abandon, manager.py)
    def _attempt(self, s: State, c: int) -> State:
        """A try: a hand-over quorum is a lease at once; else ask every node."""
        cl = s.clients[c]
        assert cl.pending is not None
        ready = cl.pending.lease(self._need(c), s.now, self.cut, self.rules)
        if ready is not None:
            return self._grant(s, c, ready)
        before = cl.pending.valid(s.now, self.cut)
        lease = (c, cl.acquires)
        s = self._send_all(s, c, ("acq", lease, cl.ticket, cl.tries + 1, s.now))
        return self._client(
            s, c, phase="trying", tries=cl.tries + 1, start=s.now, replies=self._round(),
            before=before,
        )  # fmt: skip

    def _grant(self, s: State, c: int, ready: tuple[int, int, bool]) -> State:
        token, valid_until, agreed = ready
        cl = s.clients[c]
        if not agreed:  # round 2 (R4)
            s = self._send_all(s, c, ("raise", (c, cl.acquires), token, cl.tries))
            return self._client(
                s, c, phase="raising", token=token, valid_until=valid_until, start=s.now,
                replies=self._round(),
            )  # fmt: skip
        return self._leased(s, c, token, valid_until)

    def _leased(self, s: State, c: int, token: int, valid_until: int) -> State:
        if valid_until <= s.now:  # took longer than the ttl: undo, try again
            return self._client(self._undo(s, c, give_up=False), c, phase="waiting")
        cl = s.clients[c]
        # I2 for every kind, shared too (R23): above every lease completed before the
        # acquire began, so that a shared reader's fenced read fences out their late writes
        if self.b.modes and token <= cl.floor and not s.broken:
            s = s._replace(broken=f"I2: lease {(c, cl.acquires)} got token {token} <= {cl.floor}")
        s = s._replace(leases=(*s.leases, token))
        if not self.kinds.tagged((c, 0)):
            return self._client(
                s, c, phase="holding", pending=None, token=token, valid_until=valid_until,
                extends=0,
            )  # fmt: skip
        lease = (c, cl.acquires)
        s = s._replace(decided=(*s.decided, (lease, token)))
        if not self.rules.on("R26"):  # the tag was stored at the grant: nothing to commit
            return self._client(
                s, c, phase="holding", pending=None, valid_until=valid_until, extends=0,
                held=(lease, token),
            )  # fmt: skip
        # R26: decided, the tag names this lease from now on (tag.lua on every node)
        s = self._send_all(s, c, ("tag", lease, token))
        return self._client(
            s, c, phase="committing", pending=None, token=token, valid_until=valid_until,
            start=s.now, replies=self._round(), held=(lease, token),
        )  # fmt: skip

    def _undo(self, s: State, c: int, *, give_up: bool) -> State:
        """Undo the grants the waiter holds, each named by its token (R13), behind the try
        on each node's connection (R7); given up (no ticket) or kept unless an earlier
        waiter is queued there (R15)."""
        cl = s.clients[c]
        assert cl.pending is not None
        pending, named = cl.pending.park()
        ticket = -1 if give_up else cl.ticket
        for n, token in named.items():
            grant = token if self.rules.on("R13") else 0
            s = self._send(s, c, n, ("undo", (c, cl.acquires), ticket, grant, token))
        return self._client(s, c, pending=pending)

    def _abandon(self, s: State, c: int) -> State:
        """A failed acquire gives back any grant and its place in the queue (replayed
        once after a dropped connection)."""
        s = self._send_all(s, c, ("rel", (c, s.clients[c].acquires), 1))
        return self._client(s, c, phase="idle", pending=None)

    def _after_try(self, s: State, c: int) -> State:
        """The round of a try is decided (or timed out): acquire.py ``attempt``."""
        cl = s.clients[c]
        pending = cl.pending
        assert pending is not None
        busy = usable = 0
        named = []
        for i, reply in enumerate(cl.replies):
            if not isinstance(reply, tuple):
                continue
            code, extra = reply
            if code == -4:  # the lease of the tag (R26)
                usable += 1
                busy += 1
                named.append(extra)
            elif code > 0:
                usable += 1
                since = cl.start if self.rules.on("R5") else s.now
                pending = pending.granted(i, code, since, self.rules)
            elif code == 0:
                usable += 1
                busy += 1
                pending = pending.refused(i, cl.start, extra, self.rules)
        s = self._client(s, c, pending=pending)
        found = tags.found_lease(named, self.q, cl.start, self.b.drift)
        if found is not None:  # answered by the tag's lease: its own grants given back
            return self._returned(self._abandon(s, c), c, found)
        need = self._need(c)
        ready = pending.lease(need, s.now, self.cut, self.rules)
        if ready is not None:
            s = self._client(s, c, deaf=cl.deaf | {cl.tries})
            return self._grant(s, c, ready)
        granted = pending.held()
        if granted:
            s = self._undo(s, c, give_up=usable < need)
        if granted >= need or (busy and granted + busy >= need):
            return self._client(s, c, phase="waiting")
        # R32: a semaphore's try that no more than N - Q nodes are known to be out of
        # (failed, quarantined, unsynced; a node not answered may still be there) leaves
        # a majority: the waiter, its grants given up above, tries again while it may
        # (manager.py, QuorumUnavailable.majority); else QuorumUnavailable
        out = sum(r == FAIL or (isinstance(r, tuple) and r[0] in (-1, -2)) for r in cl.replies)
        if need > self.q and self.n - out >= self.q and cl.tries < self.b.tries:
            return self._client(s, c, phase="waiting")
        return self._abandon(s, c)  # QuorumUnavailable

    def _after_raise(self, s: State, c: int) -> State:
        cl = s.clients[c]
        ok = sum(isinstance(r, int) and r >= cl.token for r in cl.replies)
        if ok >= self._need(c):
            assert cl.pending is not None
            s = self._client(s, c, pending=cl.pending.retoken(cl.token))
            return self._leased(s, c, cl.token, cl.valid_until)
        return self._abandon(self._undo(s, c, give_up=True), c)

    def _after_extend(self, s: State, c: int) -> State:
        cl = s.clients[c]
        ok = sum(isinstance(r, int) and r > 0 for r in cl.replies)
        need = self._need(c)
        if ok >= need:
            tokens = [r for r in cl.replies if isinstance(r, int) and r > 0]
            token = next((t for t in tokens if tokens.count(t) >= self.q), 0)
            if not token:  # no Q nodes agree on the token: QuorumUnavailable, as it was
                return self._client(s, c, phase="holding")
            if cl.held is not None:  # R26: extend answers the token Q nodes hold
                s = self._extended(s, c, token)
                for n, r in enumerate(cl.replies):
                    if isinstance(r, int) and r > 0 and r != token:
                        s = self._settle_late(s, c, n, r)  # R16, as Redlock.extend
            return self._client(s, c, phase="holding", valid_until=cl.start + self.cut)
        if sum(r == 0 for r in cl.replies) > self.n - need:
            return self._client(s, c, phase="idle")  # LeaseLost: the holder stops
        return self._client(s, c, phase="holding")  # QuorumUnavailable: as it was

    def _decided(self, cl: Client, c: int) -> bool:
        r, q = cl.replies, self._need(c)
        if cl.phase == "trying":  # acquire.py _decider
            granted = held = pending = owed = 0
            for i, reply in enumerate(r):
                refused = isinstance(reply, tuple) and reply[0] in (0, -4)
                if i in cl.before and not self.rules.on("R33"):
                    granted += 1  # counted granted before it answered
                elif isinstance(reply, tuple) and reply[0] > 0:
                    granted += 1
                elif i in cl.before and not refused:
                    owed += 1  # R33: a lease may count it; held or failed wait for it
                    pending += reply is None
                elif reply is None:
                    pending += 1
                elif refused:
                    held += 1
            if granted + owed >= q:
                return True
            if granted + pending >= q:
                return False
            return granted + held >= q or granted + held + pending < q or not pending
        if cl.phase == "finding":
            ok = sum(answers_find(x) for x in r)
        elif cl.phase == "committing":
            ok = sum(x == 1 for x in r)
        elif cl.phase == "extending":  # Redlock.extend: Q of the acks agree on a token
            tokens = [x for x in r if isinstance(x, int) and x > 0]
            if len(tokens) >= q and any(tokens.count(t) >= self.q for t in tokens):
                return True
            return sum(x == 0 for x in r) > self.n - q or None not in r
        else:
            ok = sum(isinstance(x, int) and x >= cl.token for x in r)
        bad = sum(x is not None for x in r) - ok
        return ok >= q or bad > self.n - q or None not in r

    def _client_steps(self, s: State, c: int) -> Iterator[tuple[Label, State]]:
        cl = s.clients[c]
        b = self.b
        most = b.acquires if isinstance(b.acquires, int) else b.acquires[c]
        if cl.phase == "idle" and cl.acquires < most:
            pending = Pending.new(self.n, s.now)
            s2 = self._client(
                s, c, acquires=cl.acquires + 1, pending=pending, tries=0, deaf=frozenset(),
                ticket=s.now * 100 + sum(x.acquires for x in s.clients),  # arrival order
                floor=max(s.leases, default=0) if self.b.modes else 0,  # else: by creation
            )  # fmt: skip
            start = self._find if self.kinds.tagged((c, 0)) else self._attempt
            yield ("acquire", c), start(s2, c)
        elif cl.phase == "waiting":
            assert cl.pending is not None
            ready = cl.pending.lease(self._need(c), s.now, self.cut, self.rules)
            if cl.tries < b.tries or ready:
                yield ("retry", c), self._attempt(s, c)
            else:  # the deadline: a waiter gives up after its last try (a bound)
                yield ("give up", c), self._abandon(s, c)
        elif cl.phase in ("finding", "trying", "raising", "committing", "extending"):
            after = self._after(cl.phase)
            if self._decided(cl, c):
                yield ("decide", c, cl.phase), after(s, c)
            elif None in cl.replies and self._may(s, "timeout"):  # a slow node: a fault
                yield ("time out", c, cl.phase), after(s._replace(faults=s.faults + 1), c)
        elif cl.phase == "holding":
            lease = cl.held[0] if cl.held else (c, cl.acquires)
            yield ("release", c), self._released(self._send_all(s, c, ("rel", lease, 1)), lease)
            if cl.extends < b.extends and cl.valid_until > s.now:
                s2 = self._send_all(s, c, ("ext", lease, cl.extends + 1, s.now))
                s2 = self._client(
                    s2, c, phase="extending", extends=cl.extends + 1, start=s.now,
                    replies=self._round(),
                )  # fmt: skip
                yield ("extend", c), s2

    def _released(self, s: State, lease: Lease) -> State:
        """A release ends the hold of every client holding the lease: clients that
        hold one lease through its key (R26) are one caller's repeats."""
        for k, other in enumerate(s.clients):
            own = other.held[0] if other.held else (k, other.acquires)
            if own == lease and other.phase in ("holding", "extending"):
                s = self._client(s, k, phase="idle")
        return s

    def _after(self, phase: str) -> Any:
        return {
            "finding": self._after_find,
            "trying": self._after_try,
            "raising": self._after_raise,
            "committing": self._after_commit,
        }.get(phase, self._after_extend)

    # nodes
    def run(self, s: State, n: int, msg: Msg) -> tuple[State, object]:
        """Node ``n`` runs one request; returns the state and the reply."""
        node, now, ttl, rules, kinds = s.nodes[n], s.now, self.b.ttl, self.rules, self.kinds
        kind, lease = msg[0], msg[1]
        assert isinstance(lease, tuple)
        if kind == "acq":
            node, reply, pub = ns.acquire(node, lease, msg[2], now, ttl, rules, kinds)  # type: ignore[arg-type]
        elif kind == "undo":
            ticket = msg[2] if msg[2] != -1 else None
            node, reply, pub = ns.undo(node, lease, ticket, msg[3], now, ttl, rules, kinds)  # type: ignore[arg-type]
        elif kind == "rel":
            node, reply, pub = ns.release(node, lease, now, ttl, rules, kinds)
        elif kind == "raise":
            node, reply, pub = ns.raise_fence(node, lease, msg[2], rules)  # type: ignore[arg-type]
        elif kind == "find":
            node, reply, pub = tags.find(node, now)
        elif kind == "tag":
            node, reply, pub = tags.commit(node, lease, msg[2], now)  # type: ignore[arg-type]
        else:
            node, reply, pub = ns.extend(node, lease, now, ttl)
        s = s._replace(nodes=put(s.nodes, n, node))
        for waiter, token in pub:
            link = (self.b.clients + waiter[0]) * self.n + n
            s = s._replace(inflight=(*s.inflight, (link, ("handover", waiter, token, n))))
        return s, reply

    def _deliver(self, s: State, c: int, n: int, msg: Msg, reply: object) -> State:
        """Client ``c`` gets ``reply`` to ``msg`` from node ``n``."""
        cl = s.clients[c]
        kind, lease = msg[0], msg[1]
        mine = lease == (c, cl.acquires)
        pending = cl.pending if mine else None
        if kind == "acq" and mine and cl.phase == "trying" and msg[3] == cl.tries:
            if cl.replies[n] is None:
                return self._answered(self._client(s, c, replies=put(cl.replies, n, reply)), c)
        elif kind == "acq" and pending is not None and isinstance(reply, tuple):
            if msg[3] not in cl.deaf:  # a late answer (Handovers.answered_late)
                code, extra = reply
                sent = msg[4] if self.rules.on("R5") else s.now
                if code == 0:
                    pending = pending.refused(n, msg[4], extra, self.rules)  # type: ignore[arg-type]
                elif code > 0:
                    pending = pending.granted(n, code, sent, self.rules)  # type: ignore[arg-type]
                return self._client(s, c, pending=pending)
        elif kind == "acq" and mine and cl.held is not None and cl.held[0] == lease:
            if isinstance(reply, tuple) and reply[0] > 0:  # a grant after the decision
                return self._settle_late(s, c, n, reply[0])
        elif kind == "undo" and pending is not None:
            answer = reply if isinstance(reply, int) else None
            return self._client(s, c, pending=pending.undone(n, msg[4], answer, self.rules))  # type: ignore[arg-type]
        elif kind == "rel" and reply == FAIL and msg[2]:
            return self._send(s, c, n, ("rel", lease, 0))  # replayed after the reconnect
        elif kind in ("find", "tag") and mine and cl.phase in ("finding", "committing"):
            if cl.replies[n] is None and (kind == "find") == (cl.phase == "finding"):
                return self._answered(self._client(s, c, replies=put(cl.replies, n, reply)), c)
        elif kind == "ext" and cl.held and lease == cl.held[0] and cl.phase == "extending":
            if cl.replies[n] is None and msg[2] == cl.extends:
                return self._answered(self._client(s, c, replies=put(cl.replies, n, reply)), c)
        elif kind in ("raise", "ext") and mine and cl.phase in ("raising", "extending"):
            round_of = cl.extends if kind == "ext" else cl.tries  # which round it answers
            if cl.replies[n] is None and msg[2 if kind == "ext" else 3] == round_of:
                return self._answered(self._client(s, c, replies=put(cl.replies, n, reply)), c)
        return s

    def _answered(self, s: State, c: int) -> State:
        """A round goes on as soon as it is decided (the answer's callback decides it)."""
        cl = s.clients[c]
        if not self._decided(cl, c):
            return s
        return self._after(cl.phase)(s, c)  # type: ignore[no-any-return]

    def _hand_over(self, s: State, n: int, lease: Lease, token: int) -> State:
        """A hand-over message reaches the waiter's process (Handovers.handed)."""
        c = lease[0]
        cl = s.clients[c]
        if cl.held is not None and cl.held[0] == lease == (c, cl.acquires):
            return self._settle_late(s, c, n, token)  # R16, for keyed leases only
        if cl.pending is None or lease != (c, cl.acquires):
            return s  # the acquire is over (R16, fixing the late grant's token: not modelled)
        return self._client(s, c, pending=cl.pending.handed(n, token, s.now, self.rules))

    # the environment: time, faults, resync (resync.py)
    def _crash(self, s: State, n: int) -> State:
        """Node ``n`` restarts with its data lost; calls in flight to it fail."""
        node = Node(synced=False) if self.rules.on("R17") else Node(base=s.nodes[n].base)
        s = self._fail_link(s, n, stuck=False)
        stuck = tuple(x for x in s.stuck if x[0] != n)
        return s._replace(
            nodes=put(s.nodes, n, node), stuck=stuck, faults=s.faults + 1, crashes=s.crashes + 1
        )

    def _fail_link(self, s: State, n: int, c: int | None = None, *, stuck: bool = True) -> State:
        """Drop client ``c``'s connection to node ``n`` (every client's: ``c`` None): every
        call in flight on it fails at once."""
        for k in range(self.b.clients) if c is None else (c,):
            link = k * self.n + n
            reqs = [m for k, m in s.inflight if k == link]
            s = s._replace(inflight=tuple(x for x in s.inflight if x[0] != link))
            if stuck:  # still in the socket of a paused server: may run any time later
                s = s._replace(stuck=tuple(sorted((*s.stuck, *((n, m) for m in reqs)))))
            for msg in reqs:
                s = self._deliver(s, k, n, msg, FAIL)
        return s

    def _resyncs(self, s: State, n: int) -> Iterator[tuple[Label, State]]:
        """Resync of unsynced node ``n`` by a process that got answers from ``seen``."""
        others = [m for m in range(self.n) if m != n]
        needed = self.n - self.q + 1
        done = set()
        for k in range(1, len(others) + 1):
            for seen in combinations(others, k):
                synced = [m for m in seen if s.nodes[m].synced and not s.nodes[m].recopy]
                if len(synced) >= needed:
                    sources, base = synced, max(s.nodes[m].base for m in synced)
                elif self.rules.on("R18") and k == len(others):
                    # a majority restarted: every node answered, too few synced; the
                    # wall clock is above every token issued (that is its assumption)
                    sources = list(seen)
                    base = 1 + max((*s.leases, *(x.fence for x in s.nodes), 0))
                elif not self.rules.on("R18") and k + 1 >= self.q:
                    # the buggy fallback: synced nodes merely unreachable, and a wall
                    # clock that is behind (contributes nothing)
                    sources, base = list(seen), max(s.nodes[m].base for m in seen)
                else:
                    continue
                fence = max(s.nodes[n].fence, *(s.nodes[m].fence for m in sources))
                quarantine = s.now + self.b.ttl if self.rules.on("R19") else 0
                recopy = bool(quarantine) and self.rules.on("R21")
                node = s.nodes[n]._replace(
                    fence=fence, synced=True, base=base, quarantine=quarantine, recopy=recopy
                )
                if node not in done:
                    done.add(node)
                    yield ("resync", n, seen), s._replace(nodes=put(s.nodes, n, node))

    def _rebases(self, s: State) -> Iterator[tuple[Label, State]]:
        """A synced node's base rises while it serves (mark_synced.lua: resyncs that start
        a cluster together, R18): to one above every token and counter, the most a later
        wall clock could give."""
        top = 1 + max((*s.leases, *(x.fence for x in s.nodes), *(x.base for x in s.nodes), 0))
        for n, node in enumerate(s.nodes):
            if node.synced and node.base < top:
                nodes = put(s.nodes, n, node._replace(base=top))
                yield ("REBASE", n), s._replace(nodes=nodes, faults=s.faults + 1)

    def _recopies(self, s: State, n: int) -> Iterator[tuple[Label, State]]:
        """R21: once its quarantine is over, node ``n`` copies the counters again before
        it grants: a try in flight during the first copy may have made a lease since.
        As ``Resyncer._recopy``: from the synced nodes among those that answered that
        are not waiting for a copy of their own, when there are N - Q + 1 of them;
        else, when every other node answered, from all of them with a wall-clock base
        above every token (R18's fallback: two nodes that both wait would otherwise
        wait for each other). Without R18 it takes its sources as the first copy did
        (resync.py chooses both by one rule): any Q - 1 nodes or more that it
        reached, synced or not."""
        others = [m for m in range(self.n) if m != n]
        needed = self.n - self.q + 1
        r18 = self.rules.on("R18")
        done = set()
        least = 1 if r18 else self.q - 1
        for seen in (x for k in range(least, len(others) + 1) for x in combinations(others, k)):
            sources = seen
            if r18:
                sources = tuple(m for m in seen if s.nodes[m].synced and not s.nodes[m].recopy)
                everyone = len(seen) == len(others) and not any(m in self.b.down for m in seen)
                if len(sources) < needed and not everyone:
                    continue
            base = s.nodes[n].base
            if r18 and len(sources) < needed:
                # R18's fallback: a majority restarted since the first copy, every
                # node answered; every counter left, the wall clock above them all
                sources, base = seen, 1 + max((*s.leases, *(x.fence for x in s.nodes), 0))
            fence = max(s.nodes[n].fence, *(s.nodes[m].fence for m in sources))
            node = s.nodes[n]._replace(fence=fence, recopy=False, base=base)
            if node not in done:
                done.add(node)
                yield ("recopy", n, sources), s._replace(nodes=put(s.nodes, n, node))

    def _may(self, s: State, kind: str) -> bool:
        return s.faults < self.b.faults and kind in self.b.kinds

    def _tick(self, s: State) -> State:
        now = s.now + 1
        nodes = tuple(_expire(x, now) for x in s.nodes)
        return s._replace(now=now, nodes=nodes)

    def successors(self, s: State) -> Iterator[tuple[Label, State]]:
        for label, s2 in self._steps(s):
            if s2.clients is not s.clients:
                s2 = s2._replace(clients=tuple(map(canonical, s2.clients)))
            if self._fits(s2):
                yield label, s2

    def _steps(self, s: State) -> Iterator[tuple[Label, State]]:
        b = self.b
        for c in range(b.clients):
            yield from self._client_steps(s, c)
        firsts: set[int] = set()
        for i, (link, msg) in enumerate(s.inflight):
            if link in firsts:
                continue  # FIFO: behind an earlier request on its link
            firsts.add(link)
            if i and s.reorders >= b.reorders:
                break
            rest = s.inflight[:i] + s.inflight[i + 1 :]
            s2 = s._replace(inflight=rest, reorders=s.reorders + bool(i))
            if msg[0] == "handover":
                _, lease, token, n = msg
                yield ("hand-over", n, lease, token), self._hand_over(s2, n, lease, token)  # type: ignore[arg-type]
                continue
            c, n = divmod(link, self.n)
            s2, reply = self.run(s2, n, msg)  # the node runs it, and the client gets the answer
            yield ("run", n, c, msg, reply), self._deliver(s2, c, n, msg, reply)
        for i, (n, msg) in enumerate(s.stuck):
            if i and s.stuck[i - 1] == (n, msg):
                continue
            s2, reply = self.run(s._replace(stuck=s.stuck[:i] + s.stuck[i + 1 :]), n, msg)
            yield ("stuck runs", n, msg, reply), s2
        for i, (link, msg) in enumerate(s.inflight):
            if msg[0] != "handover":
                continue
            _, lease, token, n = msg
            rest, faults = s.inflight[:i] + s.inflight[i + 1 :], s.faults + 1
            if self._may(s, "lose"):
                yield ("LOSE hand-over", n, lease, token), s._replace(inflight=rest, faults=faults)
            if self._may(s, "duplicate"):
                again = (*s.inflight, (link, msg))  # a second copy, after all sent so far
                yield (
                    ("DUPLICATE hand-over", n, lease, token),
                    s._replace(inflight=again, faults=faults),
                )
        for n in range(self.n):
            node = s.nodes[n]
            if not node.synced:
                yield from self._resyncs(s, n)
            elif node.recopy and s.now >= node.quarantine:
                yield from self._recopies(s, n)
        if s.now < b.max_time:
            yield ("tick",), self._tick(s)
        if self._may(s, "drop"):
            for c in range(b.clients):
                for n in range(self.n):
                    link = c * self.n + n
                    if any(x[0] == link for x in s.inflight):
                        s2 = self._fail_link(s, n, c)
                        yield ("DROP connection", c, n), s2._replace(faults=s.faults + 1)
        if self._may(s, "crash") and s.crashes < b.crashes:
            for n in range(self.n):
                yield ("CRASH", n), self._crash(s, n)
        if self._may(s, "rebase"):
            yield from self._rebases(s)

    # invariants
    def violation(self, s: State) -> str | None:
        believers = [c for c, cl in enumerate(s.clients) if believes(cl, s.now)]
        # one lease per id: clients that hold one lease (an idempotent repeat, R26) are one
        held = {c: cl.held[0] if cl.held else (c, cl.acquires) for c, cl in enumerate(s.clients)}
        valid = sorted({held[c] for c in believers})
        modes = [self.kinds.of(lease) for lease in valid]
        if len(valid) > 1 and "exclusive" in modes:
            return f"I1: clients {believers} ({modes}) both hold a valid lease at t={s.now}"
        if modes.count("semaphore") > self.b.permits:
            return (
                f"I5: clients {valid} hold {modes.count('semaphore')} semaphore leases at t={s.now}"
            )
        if s.broken:
            return s.broken
        keyed = sorted({held[c] for c in believers if self.kinds.tagged((c, 0))})
        if len(keyed) > 1:
            leases = ", ".join(f"L{x[0]}.{x[1]}" for x in keyed)
            return f"one lease per key: {leases} are valid, each returned for the key"
        if not self.b.modes:  # exclusive leases never overlap: ordered by creation
            for earlier, later in zip(s.leases, s.leases[1:], strict=False):
                if later <= earlier:
                    return f"I2: a lease got token {later} after a lease with token {earlier}"
        for n, node in enumerate(s.nodes):
            for lock in (node.lock, *node.group):
                if lock is not None and not s.now < lock[2] <= s.now + self.b.ttl:
                    return f"I3: node {n} holds {lock} beyond its ttl at t={s.now}"
        return None


def _expire(node: Node, now: int) -> Node:
    """Locks and group members whose ttl ran out are gone."""
    if node.lock is not None and node.lock[2] <= now:
        node = node._replace(lock=None)
    if node.group:
        group = tuple(m for m in node.group if m[2] > now)
        node = node._replace(group=group, mode=node.mode if group else "")
    return node.pruned()
