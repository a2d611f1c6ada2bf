"""One script to every node at once, decided as soon as the outcome is certain.

A round returns when ``decided(replies)`` says so (Q good answers, or so many
bad ones that Q cannot be reached), so one slow or paused node never delays an
answer; it waits for the per-node timeout only when the outcome hangs on the
nodes that have not answered. The result keeps every node's parsed answer, so
the errors reported belong to this round and no other.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from lockservice.errors import QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.replies import Failure, Quarantined, describe
from lockservice.resp import Reply

__all__ = ["Deadlines", "Decider", "Round", "Rounds", "fan_out"]

T = TypeVar("T")
Decider = Callable[[Sequence[T | None]], bool]


@dataclass(slots=True)  # not frozen: its __init__ would cost 4x, twice per lock cycle
class Round(Generic[T]):
    """What each node answered when the round was decided (None: not yet); never
    changed once made."""

    labels: tuple[str, ...]
    replies: tuple[T | None, ...]
    timed_out: bool
    timeout: float

    def count(self, good: Callable[[T], bool]) -> int:
        n = 0
        for r in self.replies:
            if r is not None and good(r):
                n += 1
        return n

    def errors(self, good: Callable[[T], bool]) -> dict[str, str]:
        """Why each node that did not answer ``good`` failed, by node label.

        A node that had not answered when the others decided the round is no
        failure and is left out; one that had not answered by the timeout is.
        """
        out = {}
        for label, reply in zip(self.labels, self.replies, strict=True):
            if reply is None:
                if self.timed_out:
                    out[label] = f"no reply within the node timeout ({self.timeout:g} s)"
            elif isinstance(reply, Failure):
                out[label] = reply.reason
            elif not good(reply):
                out[label] = describe(reply)
        return out


async def fan_out(
    futures: Sequence[asyncio.Future[Reply]],
    parse: Callable[[Reply], T],
    decided: Callable[[Sequence[T | None]], bool],
    *,
    labels: tuple[str, ...],
    deadlines: Deadlines,
    events: LockEvents,
    on_reply: Callable[[int, T], None] | None = None,
) -> Round[T]:
    """Wait until ``decided`` or the node timeout (``deadlines``); every answer is
    parsed on arrival.

    ``on_reply`` sees each answer as it comes, also after the decision (late).
    Per-node latency goes to ``events.node_call``, measured with perf_counter.
    """
    loop = asyncio.get_running_loop()
    replies: list[T | None] = [None] * len(futures)
    finished: asyncio.Future[bool] = loop.create_future()
    start = time.perf_counter()

    def on_done(i: int, fut: asyncio.Future[Reply]) -> None:
        reply = parse(fut.result())
        replies[i] = reply
        events.node_call(labels[i], time.perf_counter() - start, not isinstance(reply, Failure))
        if on_reply is not None:
            on_reply(i, reply)
        if not finished.done() and decided(replies):
            finished.set_result(False)

    for i, fut in enumerate(futures):
        fut.add_done_callback(functools.partial(on_done, i))
    if not finished.done() and decided(replies):  # e.g. no node to ask
        finished.set_result(False)
    else:
        deadlines.add(loop, finished)
    timed_out = await finished
    node_timeout = deadlines.timeout
    if timed_out:
        for i, reply in enumerate(replies):
            if reply is None:
                events.node_call(labels[i], node_timeout, False)
    return Round(labels, tuple(replies), timed_out, node_timeout)  # late answers: on_reply


class Deadlines:
    """The node timeout of every round over one set of nodes, on one timer.

    The rounds have one timeout, so they end in the order they start: a queue, and
    one timer at the first undecided round's end, stand for a timer per round (a
    timer per round was some 1 % of a lock cycle's work). A round's ``finished``
    gets True at its end unless it was decided (False) before.
    """

    # Loop timers fire on the millisecond (uvloop rounds a delay to it): a round that
    # ends within one of the timer's firing ends with it, as its own timer would.
    _SLACK = 0.001

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._rounds: collections.deque[tuple[float, asyncio.Future[bool]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[bool]) -> None:
        """Settle ``finished`` with True at the timeout from now, unless done by then."""
        rounds = self._rounds
        if loop is not self._loop:  # the first round, or a new loop: start afresh
            rounds.clear()
            self._loop, self._timer = loop, None
        while rounds and rounds[0][1].done():  # decided already
            rounds.popleft()
        rounds.append((loop.time() + self.timeout, finished))
        if self._timer is None:
            self._timer = loop.call_at(rounds[0][0], self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        rounds = self._rounds
        now = loop.time() + self._SLACK
        while rounds and (rounds[0][1].done() or rounds[0][0] <= now):
            _, finished = rounds.popleft()
            if not finished.done():
                finished.set_result(True)
        if rounds:
            self._timer = loop.call_at(rounds[0][0], self._expire, loop)


class Rounds:
    """``fan_out`` over one set of nodes, with their quorum rule and error report."""

    def __init__(self, labels: tuple[str, ...], *, node_timeout: float, events: LockEvents) -> None:
        self.labels = labels
        self.n = len(labels)
        self.quorum = self.n // 2 + 1
        self._deadlines = Deadlines(node_timeout)
        self._events = events

    async def run(
        self,
        futures: Sequence[asyncio.Future[Reply]],
        parse: Callable[[Reply], T],
        decided: Decider[T],
        on_reply: Callable[[int, T], None] | None = None,
    ) -> Round[T]:
        return await fan_out(
            futures,
            parse,
            decided,
            labels=self.labels,
            deadlines=self._deadlines,
            events=self._events,
            on_reply=on_reply,
        )

    def decider(self, good: Callable[[T], bool], need: int = 0) -> Decider[T]:
        """Decided once Q (or ``need``) replies are good, or so many are not that it
        cannot be reached."""
        n, q = self.n, need or self.quorum

        def decided(replies: Sequence[T | None]) -> bool:
            ok = bad = 0
            for r in replies:
                if r is not None:
                    if good(r):
                        ok += 1
                    else:
                        bad += 1
            return ok >= q or bad > n - q or ok + bad == n

        return decided

    def unavailable(
        self, name: str, rnd: Round[T], good: Callable[[T], bool], need: int = 0
    ) -> QuorumUnavailable:
        """The error of a round without quorum (Q, or ``need`` nodes): each node's own
        reason, of this round, and when quarantines alone keep the quorum out, how long
        until they end."""
        need = need or self.quorum
        short = need - rnd.count(good)
        ends = sorted(r.pttl / 1000 for r in rnd.replies if isinstance(r, Quarantined))
        retry = ends[short - 1] if 0 < short <= len(ends) else None
        return QuorumUnavailable(name, rnd.errors(good), need, self.n, retry)
