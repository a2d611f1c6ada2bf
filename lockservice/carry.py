"""Finishing a change of Redlock groups: the carry-over (R30).

While gateways run with ``previous_groups``, a moved name is locked in its old
and its new group, and its token is raised in both (R28, R29). Names nobody
locked during the change still have their counters in the old group only, so
before any gateway drops ``previous_groups`` (and with it the old group), the
counters of every moved name are copied into its new group: ``carry_over``
raises ``fence:{name}`` on every node of the new group to the largest value on
the nodes of the old group. It then waits until every lease that holds a moved
name in its old group has expired there, so that gateways of the new
configuration, which look at the new group alone, can never overlap with one of
them: a lease of the old configuration holds the old group alone, and one of the
changing configuration renewed through a gateway of the old one holds it longer
than the new group.

It needs every node of the groups involved to answer: a counter missed on one
node could let a token go backwards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from lockservice import scripts
from lockservice.errors import LockServiceError
from lockservice.node import parse_node_url
from lockservice.placement import GroupSpec, owner
from lockservice.protocol import MAX_TTL_KEY, RECOPY_KEY, SYNCED_KEY, fence_key

__all__ = ["CarryFailed", "CarryReport", "ResyncPending", "carry_over"]

log = logging.getLogger(__name__)

_BATCH = 500
_FENCE_PREFIX = "fence:{"


class CarryFailed(LockServiceError):
    """A node of a group being carried over could not be read or written."""

    code = "carry_failed"


class ResyncPending(CarryFailed):
    """A node is not synced in its current run of the server, or waits for its second
    copy (R17, R21): its counters and base may be missing what it granted before."""

    code = "resync_pending"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: its counters may be lost; a gateway connected to it resyncs it "
            "(the change config's gateways do), then run it again"
        )


@dataclass(frozen=True, slots=True)
class CarryReport:
    """What one carry-over did."""

    scanned: int  # counters read on the old groups
    moved: int  # names whose group changed
    raised: int  # counters raised on a node of a new group
    waited: float  # seconds waited for leases of moved names in an old group


async def carry_over(
    groups: Sequence[GroupSpec],
    previous: Sequence[GroupSpec],
    *,
    max_ttl: float,
    node_timeout: float = 5.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> CarryReport:
    """Copy the counters of every moved name into its new group, then wait out the
    leases that hold a moved name in its old group (at most the largest ``max_ttl``
    any gateway recorded on the old nodes, R19, or ``max_ttl`` when larger).

    Refuses to read or write anything unless every node of the groups is synced in
    its current run (an empty restarted node would copy nothing, R17).

    Raises:
        ResyncPending: a node is not synced yet; run it again once it is.
        CarryFailed: a node did not answer; nothing is wrong, run it again.
    """
    current = [g.id for g in groups]
    before = [g.id for g in previous]
    specs = {g.id: g for g in (*groups, *previous)}
    clients = {
        url: aioredis.from_url(
            url, socket_timeout=node_timeout, socket_connect_timeout=node_timeout
        )
        for spec in specs.values()
        for url in spec.urls
    }
    try:
        runs = await _synced_runs(specs.values(), clients)
        scanned = 0
        moved: dict[str, dict[str, int]] = {}  # new group -> name -> counter
        old_of: dict[str, str] = {}
        for spec in previous:
            counters = await _counters(spec, clients)
            scanned += len(counters)
            for name, value in counters.items():
                if owner(name, before) != spec.id:
                    continue  # left from an earlier placement: its owner then holds more
                new = owner(name, current)
                if new != spec.id:
                    moved.setdefault(new, {})[name] = value
                    old_of[name] = spec.id
        raised = 0
        for gid, names in moved.items():
            raised += await _raise(specs[gid], names, clients)
        # A name whose counter the old group lost with a majority of its data is not
        # listed above; the old group's token base (R18) is above its tokens.
        base = max([await _base(spec, clients) for spec in previous], default=0)
        for gid in current:
            await _raise_base(specs[gid], base, clients)
        if await _synced_runs(specs.values(), clients) != runs:  # a restart meanwhile
            raise ResyncPending("a node restarted during the carry-over (resync pending)")
        wait = await _old_group_leases(old_of, specs, clients)
        wait = min(wait, await _longest_max_ttl(previous, clients, max_ttl))
        if wait > 0:
            log.info("waiting %.3f s for leases of the old groups to expire", wait)
            await sleep(wait)
        total = sum(len(n) for n in moved.values())
        return CarryReport(scanned, total, raised, wait)
    except (RedisError, OSError) as exc:
        raise CarryFailed(f"carry-over stopped, run it again: {exc}") from exc
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()))


async def _synced_runs(
    specs: Iterable[GroupSpec], clients: dict[str, aioredis.Redis]
) -> dict[str, str]:
    """Each node's run id, once every node of ``specs`` is synced for its current run of
    the server and waits for no second copy (R17, R21); else ``ResyncPending``."""
    runs: dict[str, str] = {}
    for spec in specs:
        for url in spec.urls:
            client = clients[url]
            info = await client.info("server")
            marker, recopy = await client.get(SYNCED_KEY), await client.exists(RECOPY_KEY)
            run_id = str(info.get("run_id", ""))
            if marker is None or _text(marker).partition(" ")[2] != run_id or recopy:
                label = parse_node_url(url).label
                raise ResyncPending(f"node {label} of group {spec.id!r}: resync pending")
            runs[url] = run_id
    return runs


async def _counters(spec: GroupSpec, clients: dict[str, aioredis.Redis]) -> dict[str, int]:
    """Every name's largest ``fence:{name}`` over all nodes of ``spec``."""
    found: dict[str, int] = {}
    for url in spec.urls:
        client = clients[url]
        batch: list[bytes] = []
        async for key in client.scan_iter(match=_FENCE_PREFIX + "*", count=1000):
            batch.append(key)
            if len(batch) >= _BATCH:
                _merge(found, batch, await client.mget(batch))
                batch = []
        if batch:
            _merge(found, batch, await client.mget(batch))
    return found


def _merge(found: dict[str, int], keys: list[bytes], values: list[bytes | str | None]) -> None:
    for key, value in zip(keys, values, strict=True):
        text = _text(key)
        if value is None or not text.endswith("}"):
            continue
        name = text[len(_FENCE_PREFIX) : -1]
        found[name] = max(found.get(name, 0), int(value))


async def _raise(spec: GroupSpec, names: dict[str, int], clients: dict[str, aioredis.Redis]) -> int:
    """Raise the counters of ``names`` on every node of ``spec`` (``resync.lua``)."""
    items = sorted(names.items())
    raised = 0
    for url in spec.urls:
        for i in range(0, len(items), _BATCH):
            chunk = items[i : i + _BATCH]
            keys = [fence_key(n) for n, _ in chunk]
            values = [str(v) for _, v in chunk]
            raised += int(
                await clients[url].eval(scripts.RESYNC.source.decode(), len(keys), *keys, *values)
            )
    return raised


async def _base(spec: GroupSpec, clients: dict[str, aioredis.Redis]) -> int:
    """The largest token base on the markers of ``spec``'s nodes (``fencegate:synced``)."""
    markers = await asyncio.gather(*(clients[u].get(SYNCED_KEY) for u in spec.urls))
    return max((_marker_base(m) for m in markers if m is not None), default=0)


def _marker_base(marker: bytes | str) -> int:
    try:
        return int(_text(marker).split(" ", 1)[0])
    except ValueError:
        return 0


async def _raise_base(spec: GroupSpec, base: int, clients: dict[str, aioredis.Redis]) -> None:
    """Raise the token base of every synced node of ``spec`` to ``base``, for the run of
    the server it was synced for (an unsynced node takes the others' base, R18)."""
    for url in spec.urls:
        async with clients[url].pipeline(transaction=True) as pipe:
            await pipe.watch(SYNCED_KEY)
            marker = await pipe.get(SYNCED_KEY)
            if marker is None or _marker_base(marker) >= base:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                continue
            run_id = _text(marker).split(" ", 1)[1] if " " in _text(marker) else ""
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.set(SYNCED_KEY, f"{base} {run_id}")
            await pipe.execute()  # WatchError: the marker changed meanwhile, run it again


async def _longest_max_ttl(
    specs: Sequence[GroupSpec], clients: dict[str, aioredis.Redis], own: float
) -> float:
    """The largest max_ttl any gateway recorded on the nodes of ``specs`` (R19), or ours:
    a gateway of the old configuration may have granted that long a lease."""
    recorded = await asyncio.gather(*(clients[u].get(MAX_TTL_KEY) for s in specs for u in s.urls))
    longest = [int(_text(r)) / 1000 for r in recorded if r is not None and _text(r).isdigit()]
    return max([own, *longest])


async def _old_group_leases(
    old_of: dict[str, str], specs: dict[str, GroupSpec], clients: dict[str, aioredis.Redis]
) -> float:
    """Seconds until every lease that holds a moved name in its old group expired there,
    whether or not its new group holds it too: a lease of the changing configuration
    renewed through a gateway of the old one was extended in the old group alone, and
    outlives its grant in the new group (the groups model's finding, R30)."""
    longest = 0.0
    for gid in dict.fromkeys(old_of.values()):
        for url in specs[gid].urls:
            client = clients[url]
            async for key in client.scan_iter(match="lock:{*", count=1000):
                name = _text(key)[len("lock:{") : -1]
                if old_of.get(name) != gid:
                    continue
                pttl = await client.pttl(key)  # a group of holders: its last member's
                if pttl > 0:
                    longest = max(longest, pttl / 1000)
    return longest


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
