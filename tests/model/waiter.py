"""The waiter side of a queued acquire, as ``lockservice.handover.Pending`` does it.

An immutable mirror of ``Pending``: every method returns a new value, so that a
waiter's bookkeeping can be part of a hashable model state. Times are model ticks.
The rules that can be switched off (``Rules``) are named where they act:

- R10 a handed-over grant counts from the send time of the waiter's last try that
  the node answered "held/queued" (``floors``), never from the message's arrival;
- R11 a "queued" answer carries the node's counter: a hand-over message with a
  token up to it is older and ignored (``seen``, set in ``refused``);
- R12 a try that finds a hand-over confirms it with a new token: messages with a
  lower token are then ignored (``seen`` in ``granted``, the check in ``handed``);
- R14 nothing from a node counts while an undo to it is unanswered (``parked``),
  and a lost undo answer makes the node suspect until a try of ours is answered.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Grant", "Pending", "Rules"]

Grant = tuple[int, int]  # (token, since): since is a time no later than the grant


class Rules(NamedTuple):
    """The rules in force; a rule switched off is left out of the model."""

    off: frozenset[str] = frozenset()

    def on(self, rule: str) -> bool:
        return rule not in self.off


def _put(
    items: tuple[Grant | None, ...], node: int, grant: Grant | None
) -> tuple[Grant | None, ...]:
    return (*items[:node], grant, *items[node + 1 :])


def _set(items: tuple[int, ...], node: int, value: int) -> tuple[int, ...]:
    return (*items[:node], value, *items[node + 1 :])


class Pending(NamedTuple):
    """One queued acquire: what each node granted it, and since when at the latest."""

    floors: tuple[int, ...]  # per node: no grant there is older than this
    grants: tuple[Grant | None, ...]  # the grants that count
    parked: tuple[Grant | None, ...]  # held back until the node's undos answer
    undoing: tuple[int, ...]  # per node: undos sent and not answered yet
    given_up: frozenset[tuple[int, int]]  # (node, token) an undo gave away
    seen: tuple[int, ...]  # per node: its counter when it last said "queued"
    suspect: frozenset[int]  # nodes an undo may have reached unseen

    @classmethod
    def new(cls, nodes: int, start: int) -> Pending:
        none: tuple[Grant | None, ...] = (None,) * nodes
        return cls(
            (start,) * nodes, none, none, (0,) * nodes, frozenset(), (0,) * nodes, frozenset()
        )

    def _record(self, node: int, grant: Grant, rules: Rules) -> Pending:
        if self.undoing[node] and rules.on("R14"):
            known = self.parked[node]
            if known is None or grant > known:
                return self._replace(parked=_put(self.parked, node, grant))
            return self
        return self._replace(grants=_put(self.grants, node, grant))

    def refused(self, node: int, sent: int, counter: int, rules: Rules) -> Pending:
        """The node answered "held" or "queued" to a try sent at ``sent``."""
        p = self
        if rules.on("R11"):
            grants, parked = p.grants, p.parked
            if (known := grants[node]) is not None and known[0] <= counter:
                grants = _put(grants, node, None)  # a newer token is a hand-over after it
            if (known := parked[node]) is not None and known[0] <= counter:
                parked = _put(parked, node, None)
            seen = _set(p.seen, node, max(p.seen[node], counter))
            p = p._replace(grants=grants, parked=parked, seen=seen)
        return p._replace(
            suspect=p.suspect - {node}, floors=_set(p.floors, node, max(p.floors[node], sent))
        )

    def granted(self, node: int, token: int, sent: int, rules: Rules) -> Pending:
        """The node granted (or confirmed a hand-over) in answer to a try sent at ``sent``."""
        p = self._replace(suspect=self.suspect - {node})
        if rules.on("R12"):
            p = p._replace(seen=_set(p.seen, node, max(p.seen[node], token - 1)))
        return p._record(node, (token, max(sent, p.floors[node])), rules)

    def handed(self, node: int, token: int, now: int, rules: Rules) -> Pending:
        """The node handed the lock over with ``token``; the message came at ``now``."""
        if (node, token) in self.given_up or token <= self.seen[node]:
            return self
        if node in self.suspect and rules.on("R14"):
            return self
        since = self.floors[node] if rules.on("R10") else now
        known = self.grants[node] or self.parked[node]
        if known is not None:
            if known[0] > token and rules.on("R12"):
                return self  # a try of ours has since confirmed it anew, with a new token
            if known[0] == token:
                since = max(since, known[1])
        return self._record(node, (token, since), rules)

    def park(self) -> tuple[Pending, dict[int, int]]:
        """Undos go to the nodes that granted; returns the grants to undo, node -> token."""
        named = {n: g[0] for n, g in enumerate(self.grants) if g is not None}
        parked, undoing = self.parked, self.undoing
        for n, g in enumerate(self.grants):
            if g is not None:
                parked = _put(parked, n, g)
                undoing = _set(undoing, n, undoing[n] + 1)
        none: tuple[Grant | None, ...] = (None,) * len(self.grants)
        return self._replace(grants=none, parked=parked, undoing=undoing), named

    def undone(self, node: int, named: int, reply: int | None, rules: Rules) -> Pending:
        """The answer to an undo of grant ``named``: its token when kept, minus it when
        given up, 0 when the node no longer held it, None when the answer was lost."""
        parked = self.parked[node]
        p = self._replace(
            undoing=_set(self.undoing, node, self.undoing[node] - 1),
            parked=_put(self.parked, node, None),
        )
        if reply is None:
            return p._replace(suspect=p.suspect | {node}) if rules.on("R14") else p
        floor = named - 1 if reply > 0 else named
        p = p._replace(seen=_set(p.seen, node, max(p.seen[node], floor)))
        if reply > 0:
            since = p.floors[node]
            if parked is not None and parked[0] == reply:
                since = max(since, parked[1])
            parked = (reply, since)
        else:
            p = p._replace(given_up=p.given_up | {(node, named)})
            if parked is not None and parked[0] <= named:
                parked = None
        return p._record(node, parked, rules) if parked is not None else p

    def retoken(self, token: int) -> Pending:
        """Round 2 wrote ``token`` into this lease's lock value on the nodes it holds."""
        return self._replace(grants=tuple(g and (token, g[1]) for g in self.grants))

    def held(self) -> int:
        return sum(g is not None for g in self.grants)

    def valid(self, now: int, cut: int) -> frozenset[int]:
        """The nodes whose grant still counts at ``now`` (``cut``: ttl - drift)."""
        return frozenset(n for n, g in enumerate(self.grants) if g and g[1] + cut > now)

    def lease(self, quorum: int, now: int, cut: int, rules: Rules) -> tuple[int, int, bool] | None:
        """``(token, valid_until, all tokens agree)`` once ``quorum`` grants are valid."""
        valid = [g for g in self.grants if g and g[1] + cut > now]
        if len(valid) < quorum:
            return None
        ends = sorted((g[1] + cut for g in valid), reverse=True)
        tokens = {g[0] for g in valid}
        token = max(tokens) if rules.on("R3") else min(tokens)
        return token, ends[quorum - 1], len(tokens) == 1
