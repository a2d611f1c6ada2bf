"""Bringing a restarted (or new) Redis node back into quorums without token reuse.

A node takes part in quorums only while it holds ``fencegate:synced`` (its
token base) and has no ``fencegate:quarantine`` key: the acquire script
checks both, so every process and every gateway replica sees the same state.

A node that restarted (its ``run_id`` changed) or that has no marker may have
lost its ``fence:*`` counters. Before it counts again its counters are raised
to the maximum found on the other nodes (``N - Q + 1`` marked nodes, so that
every quorum of an earlier grant is covered), and then it is quarantined for
the longest TTL, so that no lease it forgot can be granted twice. Only when no
reachable node holds a marker, or no marked node has any counter, is the
cluster new: its nodes then start from a token base taken from the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from lockservice import scripts
from lockservice.memory import wall_clock_base
from lockservice.node import Node
from lockservice.resp import Reply, is_failure

__all__ = ["QUARANTINE_KEY", "SYNCED_KEY", "Resyncer"]

log = logging.getLogger(__name__)

SYNCED_KEY = "fencegate:synced"
QUARANTINE_KEY = "fencegate:quarantine"
_BATCH = 1000


class Resyncer:
    """One resync task per node at most, owned here and cancelled on close."""

    def __init__(
        self, nodes: Sequence[Node], quorum: int, *, max_ttl: float, timeout: float
    ) -> None:
        self._nodes = list(nodes)
        self._quorum = quorum
        self._quarantine_ms = int(max_ttl * 1000) + 1
        self._timeout = max(timeout * 10, 1.0)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restarted: set[str] = set()
        self.enabled = True  # tests switch it off to show what it prevents

    async def check(self, node: Node, *, restarted: bool) -> None:
        """Called on every (re)connect of ``node``."""
        if not self.enabled:
            return
        if restarted:
            # From now on no process counts it, until it is resynced.
            self._restarted.add(node.label)
            await self._ask(node, "DEL", SYNCED_KEY)
            self.schedule(node)
            return
        if await self._ask(node, "EXISTS", SYNCED_KEY) == 0:
            self.schedule(node)

    def schedule(self, node: Node) -> None:
        if not self.enabled:
            return
        task = self._tasks.get(node.label)
        if task is None or task.done():
            self._tasks[node.label] = asyncio.create_task(
                self._sync(node), name=f"fencegate-resync-{node.label}"
            )

    def pending(self) -> bool:
        return any(not t.done() for t in self._tasks.values())

    async def settle(self, limit: float) -> None:
        """Wait (at most ``limit`` seconds) for the resyncs under way."""
        running = [t for t in self._tasks.values() if not t.done()]
        if running:
            await asyncio.wait(running, timeout=limit)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _ask(self, node: Node, *args: bytes | str | int) -> Reply:
        try:
            async with asyncio.timeout(self._timeout):
                return await node.command(*args)
        except TimeoutError as exc:
            return exc

    async def _sync(self, node: Node) -> None:
        backoff = 0.05
        while True:
            try:
                if await self._sync_once(node):
                    return
            except (ConnectionError, TimeoutError, ValueError) as exc:
                log.warning("resync of redis node %s failed, will retry: %s", node.label, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _sync_once(self, node: Node) -> bool:
        markers = await asyncio.gather(*(self._ask(n, "GET", SYNCED_KEY) for n in self._nodes))
        mine = markers[self._nodes.index(node)]
        if isinstance(mine, bytes):
            return True  # another process resynced it
        if is_failure(mine):
            return False
        reachable = [n for n, m in zip(self._nodes, markers, strict=True) if not is_failure(m)]
        sources = [
            (n, int(m))
            for n, m in zip(self._nodes, markers, strict=True)
            if n is not node and isinstance(m, bytes)
        ]
        restarted = node.label in self._restarted
        needed = len(self._nodes) - self._quorum + 1
        if len(self._nodes) > 1 and len(sources) >= needed:
            copied = 0
            for source, _ in sources:
                copied += await self._copy(source, node)
            base = max(b for _, b in sources)
            await self._finish(node, base, self._quarantine_ms)
            log.warning(
                "redis node %s resynced (%d counters raised from %d nodes); quarantined "
                "for %.1f s so that no lease it lost is granted twice",
                node.label, copied, len(sources), self._quarantine_ms / 1000,
            )  # fmt: skip
        elif len(reachable) >= self._quorum and not await self._any_counter(
            [s for s, _ in sources]
        ):
            quarantine = self._quarantine_ms if restarted else 0
            await self._finish(node, wall_clock_base(), quarantine)
            log.info("redis node %s starts a new token base%s", node.label,
                     " (quarantined: it restarted)" if quarantine else "")  # fmt: skip
        else:
            log.warning(
                "redis node %s lost its data and only %d of the %d other nodes needed to "
                "resync it answer; it stays out of quorums",
                node.label, len(sources), needed,
            )  # fmt: skip
            return False
        self._restarted.discard(node.label)
        return True

    async def _any_counter(self, sources: list[Node]) -> bool:
        for source in sources:
            reply = await self._ask(source, "SCAN", 0, "MATCH", "fence:*", "COUNT", 10_000)
            if is_failure(reply):
                raise ConnectionError(f"scan of {source.label} failed: {reply}")
            if reply[1] or reply[0] != b"0":
                return True
        return False

    async def _copy(self, source: Node, target: Node) -> int:
        """Raise every ``fence:*`` counter of ``target`` to its value on ``source``."""
        cursor: bytes | int = 0
        raised = seen = 0
        while True:
            reply = await self._ask(source, "SCAN", cursor, "MATCH", "fence:*", "COUNT", _BATCH)
            if is_failure(reply):
                raise ConnectionError(f"scan of {source.label} failed: {reply}")
            cursor, keys = reply
            if keys:
                values = await self._ask(source, "MGET", *keys)
                if is_failure(values):
                    raise ConnectionError(f"mget on {source.label} failed: {values}")
                pairs = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
                if pairs:
                    ks, vs = zip(*pairs, strict=True)
                    async with asyncio.timeout(self._timeout):
                        done = await target.call(scripts.RESYNC, ks, vs)
                    if is_failure(done):
                        raise ConnectionError(f"resync of {target.label} failed: {done}")
                    raised += int(done)
                seen += len(keys)
                if seen % 100_000 < len(keys):
                    log.info("resync %s from %s: %d counters read", target.label,
                             source.label, seen)  # fmt: skip
            if cursor == b"0":
                return raised

    async def _finish(self, node: Node, base: int, quarantine_ms: int) -> None:
        async with asyncio.timeout(self._timeout):
            done = await node.call(
                scripts.MARK_SYNCED, (SYNCED_KEY, QUARANTINE_KEY), (base, quarantine_ms)
            )
        if is_failure(done):
            raise ConnectionError(f"marking {node.label} synced failed: {done}")
