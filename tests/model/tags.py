"""Idempotency tags (R26): find.lua and tag.lua on a node, and ``acquire.found_lease``.

A tag names a lease only once its owner decided it: the acquire commits it after
the decision (tag.lua), on each node where the lease still holds the lock, with the
decided token; a node where another lease holding the lock committed it answers
that lease. A repeat asks the nodes first (find.lua, synced and not quarantined
nodes only) and returns the lease a quorum names. Replies: a committed lease is
``(lease, token, ticks left)``; find's "none" and tag's "not held here" are 0;
tag's "committed" is 1; -2 / -1: unsynced / quarantined (R17).
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.model.node_scripts import Lease, Node, Result

__all__ = ["Found", "commit", "find", "found_lease"]

Found = tuple[Lease, int, int]  # (lease, its decided token, ticks its hold has left)


def find(node: Node, now: int) -> Result:
    """find.lua: the lease holding the lock with the tag committed, read only."""
    code = node.grantable(now)
    if code:
        return node, code, ()
    found = node.committed()
    return node, (0 if found is None else (found[0], found[1], found[2] - now)), ()


def commit(node: Node, lease: Lease, token: int, now: int) -> Result:
    """tag.lua: record ``(lease, token)`` while the lease holds the lock here, unless
    another lease holding it committed the tag (answered)."""
    code = node.grantable(now)
    if code:
        return node, code, ()
    found = node.committed()
    if found is not None and found[0] != lease:
        return node, (found[0], found[1], found[2] - now), ()
    if not node.held_by(lease):
        return node, 0, ()
    tags = tuple(sorted({*node.tags, (lease, token)}))
    return node._replace(tags=tags), 1, ()


def found_lease(replies: Sequence[object], quorum: int, start: int, drift: int) -> Found | None:
    """``acquire.found_lease``: the lease a quorum of ``replies`` names, its largest token
    and the validity the quorum's ``quorum``-th longest hold gives from ``start``.
    Returns ``(lease, token, valid_until)``."""
    named = [r for r in replies if isinstance(r, tuple) and len(r) == 3]
    for lease in sorted({r[0] for r in named}):
        mine = [r for r in named if r[0] == lease]
        if len(mine) >= quorum:
            left = sorted((r[2] for r in mine), reverse=True)[quorum - 1]
            return lease, max(r[1] for r in mine), start + left - drift
    return None
