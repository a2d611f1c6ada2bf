"""A model of the Redlock-group rules R28-R31: one moved name, a change of groups.

One lock name moves from group A (``previous_groups``) to group B (``groups``).
R1-R21 make each group one Redlock whose lease is a quorum of grants with the
largest token, so a group is abstracted as one *virtual node*: a holder (lease,
expiry) and a counter, granting or refusing atomically (``Group``). What the
model explores is what ``groups.Groups`` and ``carry.carry_over`` add on top:

- gateways of three configurations (R28): *old* locks A alone, *change* locks A
  and then B with one lease id (a lease only when both granted, the token the
  larger one, the lower group's counter raised to it, R29), *new* locks B
  alone. Old gateways run from the start (and stop once), change gateways
  throughout, new gateways only once the carry-over finished (R30).
- clients: each request (acquire, extend, release) goes through a gateway of
  any configuration that runs (a load balancer does not remember which one
  granted the lease); a change gateway may crash between its two grants, and
  a client may walk away from a lease (its grants then expire).
- the carry-over (R30) in the steps ``carry.carry_over`` takes: read A's
  counter, raise B's to it, look at A's lease, wait it out.
- time in ticks; a grant lives ``ttl`` ticks, a client counts its lease valid
  until ``grant time + ttl`` (drift 0: the tick is the only clock).

Invariants, checked in every state: **I1** no two clients hold a valid lease
at once; **I2** every lease's token is above every earlier lease's.

Switches (``without``): ``R28`` change gateways lock B alone; ``R29`` no raise of
the lower group's counter; ``R30copy`` the carry-over does not copy counters;
``R30wait`` it does not wait out leases; ``R30all`` it waits out only the leases
that B does not hold (``carry.py`` before this model's finding, README.md of this
folder: a change lease renewed through an old gateway outlives its grant in B);
``R31`` a change gateway's extend succeeds when either group holds the lease.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["RULES", "Bounds", "GroupsModel", "Result", "explore", "replay"]

RULES = frozenset({"R28", "R29", "R30copy", "R30wait", "R30all", "R31"})

Lease = tuple[int, int]  # (client, its n-th acquire)
Label = tuple[object, ...]


class Group(NamedTuple):
    """One Redlock group as one virtual node: lock:{name} and fence:{name}."""

    holder: Lease | None = None
    expiry: int = 0
    counter: int = 0

    def free_for(self, lease: Lease) -> bool:
        return self.holder is None or self.holder == lease

    def grant(self, lease: Lease, now: int, ttl: int) -> Group:
        """acquire.lua: SET lock PX ttl with INCR fence (a try that holds re-issues, R12)."""
        return Group(lease, now + ttl, self.counter + 1)


class Client(NamedTuple):
    phase: str = "idle"  # idle, half, raising, stale, held, lost, done
    acquires: int = 0  # acquires begun; the lease id of the current one is (c, acquires)
    tries: int = 0  # change acquire: tries of the old group left
    tok_a: int = 0
    tok_b: int = 0
    since: int = 0  # the first grant's time: validity runs from it
    token: int = 0
    valid_until: int = 0
    extends: int = 0  # extends left


class State(NamedTuple):
    now: int
    a: Group
    b: Group
    old_up: bool
    new_up: bool
    carry: int  # 0 not begun, 1 read A, 2 raised B, 3 waiting, 4 done
    carry_value: int
    carry_until: int
    clients: tuple[Client, ...]
    top: int  # the largest token of any lease so far (I2)
    bad: str | None


@dataclass(frozen=True)
class Bounds:
    clients: int = 2
    acquires: int | tuple[int, ...] = 1  # per client: N, or N per client
    tries: int = 1  # re-tries of the old group within one change acquire
    extends: int = 1  # per lease
    max_time: int = 3
    ttl: int = 2
    counters: tuple[tuple[int, int], ...] = ((0, 0), (0, 2), (2, 0))  # (A, B) at the start


class GroupsModel:
    def __init__(self, bounds: Bounds | None = None, without: frozenset[str] = frozenset()):
        unknown = set(without) - RULES
        if unknown:
            raise ValueError(f"unknown rules {sorted(unknown)}; known: {sorted(RULES)}")
        self.bounds = bounds or Bounds()
        self.off = frozenset(without)

    def initial(self) -> list[State]:
        b = self.bounds
        clients = tuple(Client("idle" if self._acquires(c) else "done") for c in range(b.clients))
        return [
            State(0, Group(counter=ca), Group(counter=cb), True, False, 0, 0, 0, clients, 0, None)
            for ca, cb in b.counters
        ]

    # --- invariants -------------------------------------------------------------

    def violation(self, s: State) -> str | None:
        valid = [
            i
            for i, c in enumerate(s.clients)
            if c.phase in ("held", "lost") and c.valid_until > s.now
        ]
        if len(valid) > 1:
            return f"I1: clients {valid} hold valid leases at t={s.now}"
        return s.bad

    # --- helpers ----------------------------------------------------------------

    def _set(self, s: State, c: int, cl: Client, **kw: object) -> State:
        clients = (*s.clients[:c], cl, *s.clients[c + 1 :])
        return s._replace(clients=clients, **kw)  # type: ignore[arg-type]

    def _leased(self, s: State, c: int, cl: Client, token: int, valid_until: int) -> State:
        """A lease is made: I2 is checked against every earlier lease."""
        bad = s.bad
        if token <= s.top and bad is None:
            bad = f"I2: client {c}'s lease got token {token} after a lease with token {s.top}"
        held = cl._replace(
            phase="held", token=token, valid_until=valid_until, extends=self.bounds.extends
        )
        return self._set(s, c, held, top=max(s.top, token), bad=bad)

    def _configs(self, s: State) -> list[str]:
        return [k for k, up in (("old", s.old_up), ("change", True), ("new", s.new_up)) if up]

    def _route(self, cfg: str) -> str:
        """The groups a gateway of ``cfg`` takes the moved name to (R28)."""
        if cfg == "change":
            return "B" if "R28" in self.off else "AB"
        return "A" if cfg == "old" else "B"

    @staticmethod
    def _release(g: Group, lease: Lease) -> Group:
        return g._replace(holder=None, expiry=0) if g.holder == lease else g

    def _acquires(self, c: int) -> int:
        a = self.bounds.acquires
        return a if isinstance(a, int) else a[c]

    def _idle_or_done(self, c: int, cl: Client) -> Client:
        return Client("idle" if cl.acquires < self._acquires(c) else "done", cl.acquires)

    # --- steps ------------------------------------------------------------------

    def successors(self, s: State) -> Iterator[tuple[Label, State]]:
        if s.bad is not None:
            return
        ttl = self.bounds.ttl
        for c, cl in enumerate(s.clients):
            yield from self._client_steps(s, c, cl, ttl)
        yield from self._operator_steps(s)
        if s.now < self.bounds.max_time:
            now = s.now + 1
            a = s.a if s.a.expiry > now else s.a._replace(holder=None, expiry=0)
            b = s.b if s.b.expiry > now else s.b._replace(holder=None, expiry=0)
            yield ("tick",), s._replace(now=now, a=a, b=b)

    def _client_steps(
        self, s: State, c: int, cl: Client, ttl: int
    ) -> Iterator[tuple[Label, State]]:
        lease = (c, cl.acquires)
        if cl.phase == "idle":
            n = cl.acquires + 1
            new_lease = (c, n)
            for cfg in self._configs(s):
                groups = self._route(cfg)
                if groups == "AB":  # R28: the old group first
                    if s.a.holder is None:
                        got = Client(
                            "half", n, self.bounds.tries, tok_a=s.a.counter + 1, since=s.now
                        )
                        yield (
                            ("acquire", c, cfg, "A granted"),
                            self._set(s, c, got, a=s.a.grant(new_lease, s.now, ttl)),
                        )
                    continue
                g = s.a if groups == "A" else s.b
                if g.holder is None:
                    g2 = g.grant(new_lease, s.now, ttl)
                    st = s._replace(a=g2) if groups == "A" else s._replace(b=g2)
                    got = Client("held", n)
                    yield (
                        ("acquire", c, cfg, f"{groups} granted"),
                        self._leased(st, c, got, g2.counter, s.now + ttl),
                    )
        elif cl.phase == "half":  # a change gateway holds A's grant, tries B
            if s.b.free_for(lease):
                b = s.b.grant(lease, s.now, ttl)
                nxt = cl._replace(phase="raising", tok_b=b.counter)
                yield ("try B", c, "granted"), self._set(s, c, nxt, b=b)
            yield from self._retry_or_leave(s, c, cl, lease, ttl)
        elif cl.phase == "raising":
            yield from self._raise(s, c, cl, lease)
            yield (
                ("CRASH gateway of", c, "before the lease"),
                self._set(s, c, Client("done", cl.acquires)),
            )
        elif cl.phase == "stale":
            yield from self._retry_or_leave(s, c, cl, lease, ttl)
        elif cl.phase == "held":
            for cfg in self._configs(s):
                if cl.extends > 0:
                    yield from self._extend(s, c, cl, lease, cfg, ttl)
                a, b = s.a, s.b
                groups = self._route(cfg)
                if "A" in groups:
                    a = self._release(a, lease)
                if "B" in groups:
                    b = self._release(b, lease)
                yield ("release", c, cfg), self._set(s, c, self._idle_or_done(c, cl), a=a, b=b)
        elif cl.phase == "lost" and cl.valid_until <= s.now:
            yield ("gives up the lost lease", c), self._set(s, c, self._idle_or_done(c, cl))

    def _retry_or_leave(
        self, s: State, c: int, cl: Client, lease: Lease, ttl: int
    ) -> Iterator[tuple[Label, State]]:
        """B refused (or the grants ran out): a retry issues A's grant anew (R28); the
        acquire may also give up (both released) or its gateway crash (grants stay)."""
        if cl.tries > 0 and s.a.free_for(lease):
            a = s.a.grant(lease, s.now, ttl)
            nxt = cl._replace(phase="half", tries=cl.tries - 1, tok_a=a.counter, since=s.now)
            yield ("retry A", c, "granted"), self._set(s, c, nxt, a=a)
        a, b = self._release(s.a, lease), self._release(s.b, lease)
        yield ("give up", c), self._set(s, c, self._idle_or_done(c, cl), a=a, b=b)
        yield ("CRASH gateway of", c, "mid-acquire"), self._set(s, c, Client("done", cl.acquires))

    def _raise(self, s: State, c: int, cl: Client, lease: Lease) -> Iterator[tuple[Label, State]]:
        """R29: the lease's token is the larger grant's; the lower group's counter is
        raised to it (acked only where free or held by the lease, raise_fence.lua),
        then the validity is checked (``Groups.try_acquire``)."""
        token = max(cl.tok_a, cl.tok_b)
        a, b = s.a, s.b
        if "R29" not in self.off:
            for name in ("a", "b"):
                g = a if name == "a" else b
                if g.counter < token:
                    if not g.free_for(lease):  # QuorumUnavailable: the acquire gives up
                        a2, b2 = self._release(s.a, lease), self._release(s.b, lease)
                        yield (
                            ("raise refused", c, name.upper()),
                            self._set(s, c, self._idle_or_done(c, cl), a=a2, b=b2),
                        )
                        return
                    g = g._replace(counter=token)
                    if name == "a":
                        a = g
                    else:
                        b = g
        valid_until = cl.since + self.bounds.ttl  # min of both grants': A's came first
        st = s._replace(a=a, b=b)
        if valid_until <= s.now:
            yield ("raised, too late", c), self._set(st, c, cl._replace(phase="stale"))
            return
        yield ("raised, lease", c, token), self._leased(st, c, cl, token, valid_until)

    def _extend(
        self, s: State, c: int, cl: Client, lease: Lease, cfg: str, ttl: int
    ) -> Iterator[tuple[Label, State]]:
        """extend.lua in each group the gateway routes the name to: a group extends
        only a live lock of the lease (R6); R31: the lease holds if every group held."""
        groups = self._route(cfg)
        a, b = s.a, s.b
        held = []
        if "A" in groups:
            held.append(a.holder == lease)
            if a.holder == lease:
                a = a._replace(expiry=s.now + ttl)
        if "B" in groups:
            held.append(b.holder == lease)
            if b.holder == lease:
                b = b._replace(expiry=s.now + ttl)
        ok = any(held) if "R31" in self.off else all(held)
        if ok:
            nxt = cl._replace(valid_until=s.now + ttl, extends=cl.extends - 1)
        else:  # LeaseLost: the client keeps the validity it had, and extends no more
            nxt = cl._replace(phase="lost")
        yield ("extend", c, cfg, "ok" if ok else "lost"), self._set(s, c, nxt, a=a, b=b)

    def _operator_steps(self, s: State) -> Iterator[tuple[Label, State]]:
        if s.old_up:
            yield ("the last old gateway stops",), s._replace(old_up=False)
            return
        if s.carry == 0:
            yield (
                ("carry reads A's counter", s.a.counter),
                s._replace(carry=1, carry_value=s.a.counter),
            )
        elif s.carry == 1:
            b = s.b
            if "R30copy" not in self.off:
                b = b._replace(counter=max(b.counter, s.carry_value))
            yield ("carry raises B's counter", b.counter), s._replace(carry=2, b=b)
        elif s.carry == 2:
            until = s.now
            wait = s.a.holder is not None and "R30wait" not in self.off
            if wait and ("R30all" not in self.off or s.b.holder != s.a.holder):
                until = s.a.expiry
            yield (
                ("carry looks at A's lease, waits until", until),
                s._replace(carry=3, carry_until=until),
            )
        elif s.carry == 3 and s.now >= s.carry_until:
            yield ("carry done",), s._replace(carry=4)
        elif s.carry == 4 and not s.new_up:
            yield ("the first new gateway starts",), s._replace(new_up=True)


@dataclass
class Result:
    states: int = 0
    complete: bool = False
    violation: str | None = None
    trace: list[str] = field(default_factory=list)
    steps: list[Label] = field(default_factory=list)
    start: State | None = None
    kinds: set[str] = field(default_factory=set)  # the steps taken, numbers left out


def explore(model: GroupsModel, *, max_states: int = 2_000_000) -> Result:
    """Breadth first from every initial state: the first violation has the fewest steps."""
    parent: dict[State, tuple[State, Label] | None] = {}
    frontier: deque[State] = deque()
    for s in model.initial():
        parent[s] = None
        frontier.append(s)
    result = Result()
    while frontier:
        state = frontier.popleft()
        for label, nxt in model.successors(state):
            if nxt in parent:
                continue
            result.kinds.add(" ".join(str(x) for x in label if not isinstance(x, int)))
            parent[nxt] = (state, label)
            bad = model.violation(nxt)
            if bad is not None:
                result.violation = bad
                result.states = len(parent)
                _trace(result, parent, nxt)
                return result
            frontier.append(nxt)
        if len(parent) >= max_states:
            result.states = len(parent)
            return result
    result.states = len(parent)
    result.complete = True
    return result


def _trace(result: Result, parent: dict[State, tuple[State, Label] | None], last: State) -> None:
    lines, labels = [], []
    state = last
    while (link := parent[state]) is not None:
        before, label = link
        lines.append(f"t={before.now} " + " ".join(str(x) for x in label))
        labels.append(label)
        state = before
    result.start = state
    lines.reverse()
    labels.reverse()
    head = f"start: counters A={state.a.counter} B={state.b.counter}"
    result.trace = [head] + [f"{i + 1:2d}. {line}" for i, line in enumerate(lines)]
    result.steps = labels


def replay(model: GroupsModel, start: State, steps: list[Label]) -> tuple[int, State]:
    """Take ``steps`` from ``start`` while the model can: how many it took, the state reached."""
    state = start
    for i, label in enumerate(steps):
        for candidate, nxt in model.successors(state):
            if candidate == label:
                state = nxt
                break
        else:
            return i, state
    return len(steps), state
