"""Grants that releases hand to a queued waiter, collected until they make a lease.

When a lock is released while waiters are queued, each node grants it to its
earliest waiter inside the release script and publishes the token on that
waiter's process channel (``release.lua``): the waiter holds the lock one
message after the release, without a round trip of its own. Each node decides
alone, so the grants of one waiter arrive one by one, and only a quorum of
grants that are still valid makes a lease.

A waiter cannot know when a node made a grant, only a lower bound: a node that
answered one of its tries "held" or "queued" made any grant it holds now after
running that try, so after the try was sent. A handed-over grant's validity
counts from the send time of the last such try (at worst from the first try
of the acquire), so it never ends after the lock on that node does.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockservice.backend import drift

__all__ = ["Grant", "Pending"]


@dataclass(frozen=True, slots=True)
class Grant:
    """One node's grant: its token, and a loop time no later than the grant."""

    token: int
    since: float


class Pending:
    """One queued acquire: what each node granted it, and since when at the latest."""

    __slots__ = ("floors", "given_up", "grants", "name", "parked", "ttl")

    def __init__(self, name: str, nodes: int, ttl: float, start: float) -> None:
        self.name = name
        self.ttl = ttl
        self.floors = [start] * nodes  # per node: no grant there is older than this
        self.grants: dict[int, Grant] = {}
        self.parked: dict[int, Grant] = {}  # set aside while an undo decides about them
        self.given_up: set[tuple[int, int]] = set()  # (node, token) an undo gave away

    def refused(self, node: int, sent: float) -> None:
        """The node answered "held" or "queued" to a try sent at ``sent``."""
        if sent > self.floors[node]:
            self.floors[node] = sent

    def granted(self, node: int, token: int, sent: float) -> None:
        """The node granted (or confirmed a hand-over) in answer to a try sent at ``sent``."""
        self.grants[node] = Grant(token, max(sent, self.floors[node]))

    def handed(self, node: int, token: int) -> None:
        """A release on the node handed the lock over with ``token``."""
        if (node, token) in self.given_up:
            return  # the message came after the undo that gave this grant away
        since = self.floors[node]
        known = self.grants.get(node)
        if known is not None and known.token == token:
            since = max(since, known.since)
        self.grants[node] = Grant(token, since)

    def park(self) -> None:
        """An undo is on its way to every node: no grant counts until it answers."""
        self.parked.update(self.grants)
        self.grants.clear()

    def undone(self, node: int, reply: int) -> None:
        """The undo's answer: a kept grant's token, minus a given-up one's, or 0."""
        parked = self.parked.pop(node, None)
        if reply > 0:
            since = self.floors[node]
            if parked is not None and parked.token == reply:
                since = max(since, parked.since)
            self.grants[node] = Grant(reply, since)
        elif reply < 0:
            self.given_up.add((node, -reply))
            known = self.grants.get(node)
            if known is not None and known.token == -reply:
                del self.grants[node]

    def lease(self, quorum: int, now: float) -> tuple[int, float, bool] | None:
        """``(token, valid_until, all tokens agree)`` once ``quorum`` grants are valid."""
        cut = self.ttl - drift(self.ttl)
        valid = [g for g in self.grants.values() if g.since + cut > now]
        if len(valid) < quorum:
            return None
        ends = sorted((g.since + cut for g in valid), reverse=True)
        tokens = {g.token for g in valid}
        return max(tokens), ends[quorum - 1], len(tokens) == 1
