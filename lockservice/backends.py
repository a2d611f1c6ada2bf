"""The backend of a ``LockManager`` from its configuration: Redlock groups, one Redlock
over 1, 3 or 5 Redis nodes, or (no node) the in-process backend of one process."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lockservice.backend import Backend
from lockservice.events import LockEvents
from lockservice.groups import Groups
from lockservice.memory import MemoryBackend
from lockservice.placement import GroupSpec
from lockservice.redlock import Redlock

__all__ = ["start_backend"]

log = logging.getLogger(__name__)


def _spec(group: GroupSpec | Sequence[str]) -> GroupSpec:
    return group if isinstance(group, GroupSpec) else GroupSpec.of(group)


async def start_backend(
    urls: Sequence[str],
    *,
    groups: Sequence[GroupSpec | Sequence[str]],
    previous_groups: Sequence[GroupSpec | Sequence[str]],
    node_timeout: float,
    max_ttl: float,
    events: LockEvents,
    batch_writes: bool,
) -> Backend:
    """Build and start the backend ``LockManager.connect`` describes (its Args)."""
    backend: Backend
    if groups or previous_groups:
        current = [_spec(g) for g in groups] or [GroupSpec.of(urls)]
        backend = Groups(
            current,
            previous=[_spec(g) for g in previous_groups],
            node_timeout=node_timeout,
            max_ttl=max_ttl,
            events=events,
            batch_writes=batch_writes,
        )
    elif urls:
        backend = Redlock(
            urls,
            node_timeout=node_timeout,
            max_ttl=max_ttl,
            events=events,
            batch_writes=batch_writes,
        )
    else:
        backend = MemoryBackend()
        log.warning(
            "no redis nodes configured: locks are held in this process only; "
            "run exactly one gateway process, or configure [locks] redis"
        )
    await backend.start()
    if urls or groups or previous_groups:  # the in-process backend was announced above, once
        log.info("lock backend: %s", backend.describe())
    return backend
