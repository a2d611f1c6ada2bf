"""Breadth-first exploration of the protocol model, and its command line.

    python -m tests.model.explore --clients 3 --depth 60 --seconds 600
    python -m tests.model.explore --without R12   # expect a counterexample

BFS over states with a visited set: the first violation found is one of the
fewest steps, and its trace is printed step by step.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable, Sized
from dataclasses import dataclass, field

from tests.model.protocol_model import Bounds, Label, Model, State

__all__ = ["Result", "describe", "explore", "main", "replay"]


@dataclass
class Result:
    states: int = 0
    transitions: int = 0
    depth: int = 0  # the deepest level explored completely
    seconds: float = 0.0
    complete: bool = False  # every reachable state within the bounds was explored
    violation: str | None = None
    trace: list[str] = field(default_factory=list)
    steps: list[Label] = field(default_factory=list)  # the trace's steps, as the model names them

    def summary(self) -> str:
        rate = self.states / self.seconds if self.seconds else 0.0
        how = "complete" if self.complete else f"stopped at depth {self.depth}"
        found = f"VIOLATION {self.violation}" if self.violation else "no violation"
        return (
            f"{found}: {self.states} states, {self.transitions} transitions, {how}, "
            f"{self.seconds:.1f} s ({rate:.0f} states/s)"
        )


def explore(
    model: Model,
    *,
    max_depth: int = 1000,
    max_states: int = 10_000_000,
    seconds: float = 1e9,
    progress: Callable[[Result], None] | None = None,
    every: float = 5.0,
    depth_first: bool = False,
    start: State | None = None,
) -> Result:
    """Explore from the initial state; stop at the first violation or a bound.

    Breadth first (the default) the counterexample is one of the fewest steps;
    ``depth_first`` reaches long ones sooner, with a trace that may be longer."""
    if depth_first:
        return _explore_depth_first(model, max_depth, max_states, seconds, progress, every)
    began = time.monotonic()
    result = Result()
    start = start or model.initial()
    parent: dict[State, tuple[State, Label] | None] = {start: None}
    frontier: deque[State] = deque([start])
    depth = 0
    shown = began
    while frontier:
        if depth >= max_depth:
            break
        level: deque[State] = deque()
        for state in frontier:
            for label, nxt in model.successors(state):
                result.transitions += 1
                if nxt in parent:
                    continue
                parent[nxt] = (state, label)
                bad = model.violation(nxt)
                if bad is not None:
                    result.violation = bad
                    result.trace, result.steps = _trace(parent, nxt)
                    return _done(result, parent, depth, began)
                level.append(nxt)
            if len(parent) >= max_states or time.monotonic() - began > seconds:
                return _done(result, parent, depth, began)
            now = time.monotonic()
            if progress is not None and now - shown >= every:
                shown = now
                progress(_done(result, parent, depth, began))
        frontier = level
        depth += 1
    result.complete = not frontier
    return _done(result, parent, depth, began)


def _explore_depth_first(
    model: Model,
    max_depth: int,
    max_states: int,
    seconds: float,
    progress: Callable[[Result], None] | None,
    every: float,
) -> Result:
    began = shown = time.monotonic()
    result = Result()
    start = model.initial()
    parent: dict[State, tuple[State, Label] | None] = {start: None}
    stack = [(start, 0)]
    deepest = 0
    while stack:
        state, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth >= max_depth:
            continue
        for label, nxt in model.successors(state):
            result.transitions += 1
            if nxt in parent:
                continue
            parent[nxt] = (state, label)
            bad = model.violation(nxt)
            if bad is not None:
                result.violation = bad
                result.trace, result.steps = _trace(parent, nxt)
                return _done(result, parent, deepest, began)
            stack.append((nxt, depth + 1))
        now = time.monotonic()
        if len(parent) >= max_states or now - began > seconds:
            return _done(result, parent, deepest, began)
        if progress is not None and now - shown >= every:
            shown = now
            progress(_done(result, parent, deepest, began))
    result.complete = True  # within max_depth
    return _done(result, parent, deepest, began)


def _done(result: Result, parent: Sized, depth: int, began: float) -> Result:
    result.states = len(parent)
    result.depth = depth
    result.seconds = time.monotonic() - began
    return result


def _trace(
    parent: dict[State, tuple[State, Label] | None], last: State
) -> tuple[list[str], list[Label]]:
    lines, labels = [], []
    state = last
    while (link := parent[state]) is not None:
        before, label = link
        lines.append(f"t={before.now} {describe(label)}")
        labels.append(label)
        state = before
    lines.reverse()
    labels.reverse()
    return [f"{i + 1:2d}. {line}" for i, line in enumerate(lines)], labels


def replay(model: Model, steps: list[Label]) -> tuple[int, State]:
    """Take ``steps`` in ``model`` while it can: how many it took, and the state reached."""
    state = model.initial()
    for i, label in enumerate(steps):
        for candidate, nxt in model.successors(state):
            if candidate == label:
                state = nxt
                break
        else:
            return i, state
    return len(steps), state


def _lease(lease: object) -> str:
    assert isinstance(lease, tuple)
    return f"L{lease[0]}.{lease[1]}"


def _msg(msg: object) -> str:
    assert isinstance(msg, tuple)
    kind, lease = msg[0], _lease(msg[1])
    if kind == "acq":
        return f"acquire({lease} try {msg[3]} sent t={msg[4]})"
    if kind == "undo":
        keep = "give up" if msg[2] == -1 else "keep unless earlier waiter"
        return f"undo({lease} grant {msg[3] or 'any'}, {keep})"
    if kind == "rel":
        return f"release({lease}{'' if msg[2] else ', replayed'})"
    if kind == "raise":
        return f"raise_fence({lease} to {msg[2]})"
    if kind == "find":
        return f"find(the tag of {lease})"
    if kind == "tag":
        return f"tag({lease} token {msg[2]})"
    return f"extend({lease})"


def describe(label: Label) -> str:
    """One step, readable."""
    kind = label[0]
    if kind == "run":
        _, n, c, msg, reply = label
        return f"node {n} runs {_msg(msg)} from client {c} -> {reply}"
    if kind == "reply":
        _, c, n, msg, reply = label
        return f"client {c} gets node {n}'s answer {reply} to {_msg(msg)}"
    if kind == "stuck runs":
        _, n, msg, reply = label
        return f"node {n} runs a stuck {_msg(msg)} -> {reply} (answer lost)"
    if kind in ("hand-over", "LOSE hand-over", "DUPLICATE hand-over"):
        _, n, lease, token = label
        return f"{kind} message of node {n}: {_lease(lease)} token {token}"
    if kind == "resync":
        return f"node {label[1]} resynced by a process that reached nodes {list(label[2])}"  # type: ignore[call-overload]
    if kind == "recopy":
        return f"node {label[1]} copies again from nodes {list(label[2])}"  # type: ignore[call-overload]
    if kind == "DROP connection":
        return f"DROP connection of client {label[1]} to node {label[2]}"
    if kind == "CRASH":
        return f"CRASH node {label[1]}: restarts with its data lost"
    if kind == "tick":
        return "time advances one tick"
    if kind in ("decide", "time out"):
        return f"client {label[1]} {kind}s its {label[2]} round"
    return f"client {label[1]}: {kind}"


def _acquires(text: str) -> int | tuple[int, ...]:
    values = tuple(int(x) for x in text.split(","))
    return values[0] if len(values) == 1 else values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.model.explore", description=__doc__)
    d = Bounds()
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--acquires", default="1", help="per client: N, or N,N,... client by client")
    p.add_argument("--tries", type=int, default=d.tries, help="round-1 tries per acquire")
    p.add_argument("--extends", type=int, default=d.extends, help="per lease")
    p.add_argument("--time", type=int, default=d.max_time, help="ticks of model time")
    p.add_argument("--ttl", type=int, default=d.ttl)
    p.add_argument("--faults", type=int, default=d.faults)
    p.add_argument("--crashes", type=int, default=d.crashes)
    p.add_argument("--capacity", type=int, default=d.capacity)
    p.add_argument("--reorders", type=int, default=d.reorders)
    p.add_argument("--counter", type=int, default=d.counter, help="every node's at the start")
    p.add_argument("--keyed", type=int, default=d.keyed, help="clients carrying one key (R26)")
    p.add_argument("--modes", default="", help="each client's lock kind: exclusive,shared,...")
    p.add_argument("--permits", type=int, default=d.permits, help="of every semaphore client")
    p.add_argument("--kinds", default=",".join(sorted(d.kinds)), help="fault kinds allowed")
    p.add_argument("--depth", type=int, default=1000, help="steps from the start")
    p.add_argument("--max-states", type=int, default=20_000_000)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--without", action="append", default=[], metavar="RULE")
    p.add_argument("--dfs", action="store_true", help="depth first: long counterexamples sooner")
    p.add_argument("--down", default="", help="nodes down throughout: 0,1,...")
    p.add_argument(
        "--liveness", action="store_true", help="check liveness.py's progress, not the invariants"
    )
    a = p.parse_args(argv)
    bounds = Bounds(
        clients=a.clients, acquires=_acquires(a.acquires), tries=a.tries, extends=a.extends,
        max_time=a.time, ttl=a.ttl, faults=a.faults, crashes=a.crashes, capacity=a.capacity,
        reorders=a.reorders, counter=a.counter, kinds=frozenset(k for k in a.kinds.split(",") if k),
        keyed=a.keyed, modes=tuple(m for m in a.modes.split(",") if m), permits=a.permits,
        down=frozenset(int(n) for n in a.down.split(",") if n),
    )  # fmt: skip
    model = Model(bounds, frozenset(r.upper() for r in a.without))
    print(f"bounds {bounds._asdict()}, without {sorted(model.rules.off) or 'nothing'}")

    def progress(r: Result) -> None:
        print(f"  {r.states} states, depth {r.depth}, {r.seconds:.0f} s, "
              f"{r.states / max(r.seconds, 1e-9):.0f} states/s", flush=True)  # fmt: skip

    if a.liveness:
        from tests.model.liveness import check  # it builds on this module

        result = check(model, seconds=a.seconds, max_states=a.max_states)
    else:
        result = explore(
            model, max_depth=a.depth, max_states=a.max_states, seconds=a.seconds,
            progress=progress, depth_first=a.dfs,
        )  # fmt: skip
    print("\n".join(result.trace))
    print(result.summary())
    return 1 if result.violation else 0


if __name__ == "__main__":
    sys.exit(main())
