"""A bounded liveness check: waiters that each retry once, with no fault, get a lease.

The invariants (``Model.violation``) are safety: nothing bad happens. This is the
progress the protocol promises a queued waiter (R15, R33): from a *settled* state
(every client waiting, with a try left, no lease made yet, nothing in flight), every
schedule in which each waiter retries once and every message is delivered, without
a fault, an expiry or a waiter giving up, ends with a lease made or ready (Q valid
grants held by one waiter, taken by its next try without a round trip). A schedule
that ends otherwise can repeat for ever: the stall of two waiters split between the
live nodes (``tests/faults/test_split_stall.py``), which a retry that decides before
the node whose grant it holds answers keeps up (R33 off).

``check`` explores the reachable states breadth first (``Bounds``: no faults, no
time, so nothing expires), and from each settled one every continuation in which
each waiter takes one ``retry`` (memoized across them); the first that ends without
a lease is the counterexample: the steps to the settled state, then the stall.
"""

from __future__ import annotations

import time
from collections import deque

from tests.model.explore import Result, _trace, describe
from tests.model.protocol_model import Label, Model, State

__all__ = ["check", "settled", "stall"]

Key = tuple[State, frozenset[int]]


def settled(model: Model, s: State) -> bool:
    """Every client waits with a try left, no lease was made, and nothing is in flight."""
    if s.inflight or s.stuck or s.leases:
        return False
    return all(cl.phase == "waiting" and cl.tries < model.b.tries for cl in s.clients)


def _progress(model: Model, s: State) -> bool:
    """A lease was made, or a waiter holds Q valid grants (its next try takes them)."""
    if s.leases:
        return True
    for c, cl in enumerate(s.clients):
        need = model._need(c)
        if cl.pending is not None and cl.pending.lease(need, s.now, model.cut, model.rules):
            return True
    return False


def _allowed(label: Label, retried: frozenset[int]) -> frozenset[int] | None:
    """The waiters retried after ``label``, or None when the check does not take it:
    a second retry, giving up, time and faults."""
    kind = label[0]
    if kind == "retry":
        c = label[1]
        assert isinstance(c, int)
        return None if c in retried else retried | {c}
    if kind in ("give up", "tick", "time out") or str(kind).split()[0].isupper():
        return None  # LOSE / DUPLICATE hand-over, DROP connection, CRASH: faults
    return retried


def stall(model: Model, start: State, memo: dict[Key, bool] | None = None) -> list[Label] | None:
    """Steps from settled ``start`` in which every waiter retries once and that end
    without a lease made or ready; None when every such schedule makes one."""
    memo = {} if memo is None else memo
    path: list[Label] = []

    def stalls(s: State, retried: frozenset[int]) -> bool:
        key = (s, retried)
        if key in memo:
            return memo[key]
        memo[key] = False  # the steps only go forward (tries, messages): no cycles
        found = False
        if not _progress(model, s):
            moved = False
            for label, nxt in model.successors(s):
                after = _allowed(label, retried)
                if after is None:
                    continue
                moved = True
                path.append(label)
                if stalls(nxt, after):
                    found = True
                    break
                path.pop()
            found = found or not moved  # the end, every waiter retried: no lease
        memo[key] = found
        return found

    return list(path) if stalls(start, frozenset()) else None


def check(model: Model, *, seconds: float = 60.0, max_states: int = 2_000_000) -> Result:
    """Every reachable settled state, breadth first; the first stall is the violation."""
    began = time.monotonic()
    result = Result()
    first = model.initial()
    parent: dict[State, tuple[State, Label] | None] = {first: None}
    memo: dict[Key, bool] = {}
    frontier: deque[tuple[State, int]] = deque([(first, 0)])
    while frontier:
        s, result.depth = frontier.popleft()
        if settled(model, s):
            steps = stall(model, s, memo)
            if steps is not None:
                result.trace, result.steps = _trace(parent, s)
                at = len(result.trace)
                result.trace.append("    settled: every waiter retries once from here")
                for i, label in enumerate(steps):
                    result.trace.append(f"{at + i + 1:2d}. t={s.now} {describe(label)}")
                result.steps += steps
                result.violation = (
                    "liveness: every waiter retried once, no fault, no lease made or ready"
                )
                break
        for label, nxt in model.successors(s):
            result.transitions += 1
            if nxt not in parent:
                parent[nxt] = (s, label)
                frontier.append((nxt, result.depth + 1))
        if len(parent) >= max_states or time.monotonic() - began > seconds:
            break
    result.complete = not frontier and result.violation is None
    result.states = len(parent)
    result.seconds = time.monotonic() - began
    return result
