"""Which Redlock group serves a lock name: rendezvous (highest random weight) hashing.

A group's id is stable: an explicit one from the config, or derived from the
sorted labels (``host:port``) of its nodes, so adding, removing or reordering
*other* groups never changes it. Each name goes to the group with the highest
``weight(group id, name)``; adding a group moves only the names it now wins
(about 1/k of them) and removing one moves only that group's names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from lockservice.node import parse_node_url

__all__ = ["GroupSpec", "derived_id", "owner", "weight"]

_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def derived_id(urls: Sequence[str]) -> str:
    """The id of a group named by its nodes alone: the same whatever their order."""
    labels = sorted(parse_node_url(u).label for u in urls)
    return "g" + hashlib.blake2b("\n".join(labels).encode(), digest_size=4).hexdigest()


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One Redlock group: its placement id and its 1, 3 or 5 node URLs."""

    id: str
    urls: tuple[str, ...]

    @classmethod
    def of(cls, urls: Sequence[str], id: str | None = None) -> GroupSpec:
        """Raises ``ValueError`` for a bad URL or an id outside ``[A-Za-z0-9_.-]{1,64}``."""
        if id is not None and not _ID.fullmatch(id):
            raise ValueError(f"group id {id!r} is not 1-64 characters of A-Z a-z 0-9 _ . -")
        return cls(id if id is not None else derived_id(urls), tuple(urls))


def weight(group: str, name: str) -> int:
    """The rendezvous weight of ``name`` on ``group``: 64 well-mixed bits."""
    digest = hashlib.blake2b(f"{group}\n{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(name: str, groups: Sequence[str]) -> str:
    """The id of the group that serves ``name`` (ties, never seen, go to the larger id)."""
    return max(groups, key=lambda g: (weight(g, name), g))
