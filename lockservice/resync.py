"""Bringing a restarted (or new) Redis node back into quorums without token reuse.

R17-R19 of ``protocol.py``: a node counts only while its synced marker names
its current run id; an unsynced node's counters are raised from N - Q + 1
synced nodes (or, when a majority restarted, from every node that answers with
a wall-clock base), then it is quarantined for the longest TTL. Only a
cluster without any counter yet (new) skips the quarantine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from lockservice import scripts
from lockservice.health import Health
from lockservice.memory import wall_clock_base  # looked up at call time: tests skew it
from lockservice.node import Node
from lockservice.protocol import MAX_TTL_KEY, QUARANTINE_KEY, RECOPY_KEY, SYNCED_KEY, NodeState
from lockservice.replies import Failure, parse_count, parse_scan, parse_values
from lockservice.resp import Reply, is_failure

__all__ = ["QUARANTINE_KEY", "SYNCED_KEY", "Resyncer"]

log = logging.getLogger(__name__)

_BATCH = 1000


class Resyncer:
    """One resync task per node at most, owned here and cancelled on close."""

    def __init__(
        self,
        nodes: Sequence[Node],
        quorum: int,
        *,
        max_ttl: float,
        timeout: float,
        health: Health,
    ) -> None:
        self._health = health
        self._nodes = list(nodes)
        self._quorum = quorum
        self._own_max_ttl_ms = int(max_ttl * 1000) + 1
        self._quarantine_ms = self._own_max_ttl_ms  # raised to what other gateways recorded
        self._timeout = max(timeout * 10, 1.0)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restarted: set[str] = set()
        self._checks: set[asyncio.Task[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # False: trust an unsynced node as it is, as Redlock without resync would.
        # Only tests switch it off, to show what the resync prevents.
        self.enabled = True
        self._closed = False

    async def check(self, node: Node, *, restarted: bool) -> None:
        """Called on every (re)connect of ``node``: resync it, or say how it is."""
        if self._closed:
            return
        # R19: this gateway's max_ttl, for every gateway's quarantines (a max, only up)
        keys, values = (MAX_TTL_KEY,), (self._own_max_ttl_ms,)
        node.call(scripts.RESYNC, keys, values)
        if restarted:
            self._restarted.add(node.label)
            self._health.set(node.index, NodeState.UNSYNCED)
            self.schedule(node)
            return
        marker, quarantine, recopy = await asyncio.gather(
            self._ask(node, "GET", SYNCED_KEY),
            self._ask(node, "PTTL", QUARANTINE_KEY),
            self._ask(node, "EXISTS", RECOPY_KEY),
        )
        if not _synced(node, marker):
            self._health.set(node.index, NodeState.UNSYNCED)
            self.schedule(node)
        elif isinstance(quarantine, int) and quarantine > 0:
            self._health.set(node.index, NodeState.QUARANTINED)
            self._later(node, quarantine / 1000)  # its second copy (R21) when it ends
        elif recopy == 1:
            self._health.set(node.index, NodeState.QUARANTINED, "waiting for its second copy")
            self.schedule(node)
        elif isinstance(quarantine, int):
            self._health.set(node.index, NodeState.HEALTHY)

    def check_soon(self, node: Node, *, restarted: bool) -> None:
        """``check`` in a task of its own (a reconnect seen by the inbox reader)."""
        if self._closed:
            return
        if restarted:  # at once: a resync an acquire starts meanwhile must know it
            self._restarted.add(node.label)
        task = asyncio.create_task(
            self.check(node, restarted=restarted), name=f"fencegate-check-{node.label}"
        )
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def schedule(self, node: Node) -> None:
        if self._closed:
            return
        task = self._tasks.get(node.label)
        if task is None or task.done():
            self._tasks[node.label] = asyncio.create_task(
                self._sync(node), name=f"fencegate-resync-{node.label}"
            )

    def _later(self, node: Node, delay: float) -> None:
        """Schedule node's resync (its second copy, R21) once ``delay`` seconds passed."""
        old = self._timers.pop(node.label, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[node.label] = loop.call_later(delay + 0.01, self.schedule, node)

    def pending(self) -> bool:
        return any(not t.done() for t in self._tasks.values())

    async def settle(self, limit: float) -> None:
        """Wait (at most ``limit`` seconds) for the resyncs under way."""
        running = [t for t in self._tasks.values() if not t.done()]
        if running:
            await asyncio.wait(running, timeout=limit)

    async def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        tasks = [*self._tasks.values(), *self._checks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _ask(self, node: Node, *args: bytes | str | int) -> Reply:
        try:
            async with asyncio.timeout(self._timeout):
                return await node.command(*args)
        except TimeoutError as exc:
            return exc

    async def _ask_all(self, *args: bytes | str | int) -> list[Reply]:
        return await asyncio.gather(*(self._ask(n, *args) for n in self._nodes))

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
        markers, recorded, waiting = await asyncio.gather(
            self._ask_all("GET", SYNCED_KEY),
            self._ask_all("GET", MAX_TTL_KEY),
            self._ask_all("EXISTS", RECOPY_KEY),
        )
        longest = [int(r) for r in recorded if isinstance(r, bytes) and r.isdigit()]
        self._quarantine_ms = max([self._own_max_ttl_ms, *longest])
        mine = markers[self._nodes.index(node)]
        if _synced(node, mine):
            return await self._recopy(node, markers, waiting)  # R21, when due
        if is_failure(mine) or node.run_id is None:
            return False
        self._health.set(node.index, NodeState.UNSYNCED)
        run_id = node.run_id  # the run this resync vouches for, whatever happens meanwhile
        if not self.enabled:
            await self._finish(node, run_id, 0, 0)
            return True
        others = [(n, m) for n, m in zip(self._nodes, markers, strict=True) if n is not node]
        # a node waiting for its own second copy may miss a grant in flight (R21)
        synced = [n for n, m in others if _synced(n, m) and waiting[n.index] == 0]
        reachable = [n for n, m in others if not is_failure(m)]
        unknown = len(others) - len(reachable)  # may be synced: we cannot tell from here
        needed = len(self._nodes) - self._quorum + 1
        restarted = node.label in self._restarted
        if len(self._nodes) > 1 and len(synced) >= needed:
            # R18: N - Q + 1 synced nodes share a node with every earlier quorum.
            if not await self._any_counter([node, *synced]):
                # ... and none has a counter: no lease was ever granted (a new cluster),
                # so none can have been forgotten either.
                await self._join(node, run_id, others)
            else:
                copied = await self._copy_from(synced, node)
                base = max(_base(m) for n, m in others if n in synced)
                await self._finish(node, run_id, base, self._quarantine_ms)
                log.info(
                    "redis node %s resynced (%d counters raised from %d nodes); "
                    "quarantined for %.1f s so that no lease it lost is granted twice",
                    node.label, copied, len(synced), self._quarantine_ms / 1000,
                )  # fmt: skip
        elif (
            not any(n.label in self._restarted for n in [node, *reachable])
            and len(reachable) + 1 >= self._quorum
            and mine is None
            and all(m is None for n, m in others if n in reachable)
            and not await self._any_counter([node, *reachable])
        ):
            # No node that answers was ever synced or has a counter, and a quorum answers:
            # a cluster that never granted (a majority that lost all its data looks the
            # same: outside the guarantee). Start it here, all at once, so that the
            # others do not wait for a node that is down.
            base = _new_base(others)
            for peer in [node, *reachable]:
                await self._finish(peer, peer.run_id, base, 0)
            log.info("redis nodes %s start a new cluster",
                     ", ".join(n.label for n in [node, *reachable]))  # fmt: skip
        elif unknown:
            # R18: a node that does not answer may hold counters and be synced: whether
            # too few synced nodes exist cannot be told from here.
            log.warning(
                "redis node %s is not synced and %d of the other nodes do not answer: "
                "waiting for them, or for a gateway that reaches them, to resync it",
                node.label, unknown,
            )  # fmt: skip
            return False
        elif not restarted and not await self._any_counter([node, *reachable]):
            # Every node answered and none has a counter: no lease was ever granted.
            await self._join(node, run_id, others)
        else:
            # Every node answered and too few are synced (a majority restarted): take
            # every counter any node still has, and a base from the wall clock above
            # them all (a defence in depth: the majority guarantee is gone).
            copied = await self._copy_from(reachable, node)
            await self._finish(node, run_id, _new_base(others), self._quarantine_ms)
            log.warning(
                "redis node %s starts a new token base above every counter left "
                "(%d raised from %d nodes); quarantined for %.1f s",
                node.label, copied, len(reachable), self._quarantine_ms / 1000,
            )  # fmt: skip
        if node.run_id != run_id:
            return False  # it restarted again meanwhile: the marker names the old run
        self._restarted.discard(node.label)
        return True

    async def _recopy(self, node: Node, markers: list[Reply], waiting: list[Reply]) -> bool:
        """R21: the second copy of a resynced node, once its quarantine is over.

        A try sent before the node restarted may have run on a synced node after the
        first copy, and made a lease with the grant this node forgot: copy again, from
        N - Q + 1 synced nodes not waiting for a copy of their own (only those can
        grant). When every node answers and fewer are such nodes (two nodes that both
        wait would otherwise wait for each other), from every node, with a wall-clock
        base above them all, as R18's fallback: the grant may be on no node by then.
        """
        if waiting[node.index] != 1:
            return True  # nothing to do: synced, by this process or another
        left = await self._ask(node, "PTTL", QUARANTINE_KEY)
        if not isinstance(left, int):
            return False
        if left > 0:
            self._later(node, left / 1000)
            return True
        run_id = node.run_id
        others = [(n, m) for n, m in zip(self._nodes, markers, strict=True) if n is not node]
        able = [n for n, m in others if _synced(n, m) and waiting[n.index] == 0]
        everyone = all(not is_failure(m) for _, m in others)
        needed = len(self._nodes) - self._quorum + 1
        if len(able) < needed and not everyone:
            log.warning(
                "redis node %s waits for its second copy: %d synced nodes answer, %d needed",
                node.label, len(able), needed,
            )  # fmt: skip
            return False
        sources, base = able, 0
        if len(able) < needed:
            # Every node answered and too few are synced and not waiting: a majority
            # restarted since the first copy, and a grant this node forgot may be on no
            # node now. R18's fallback: every counter left, a wall-clock base above them.
            sources, base = [n for n, _ in others], _new_base(others)
        copied = await self._copy_from(sources, node)
        async with asyncio.timeout(self._timeout):
            done = await node.call(
                scripts.RECOPIED, (SYNCED_KEY, QUARANTINE_KEY), (run_id or "", base)
            )
        if done != 1 or node.run_id != run_id:
            return False
        log.info("redis node %s copied again (%d counters raised) and grants again",
                 node.label, copied)  # fmt: skip
        self._health.set(node.index, NodeState.HEALTHY)
        return True

    async def _join(self, node: Node, run_id: str | None, others: list[tuple[Node, Reply]]) -> None:
        """A node of a cluster that never granted: synced, no quarantine, with the base of
        the synced nodes (nothing was granted since they took it; a base of its own from
        a later clock would start every new name's counter above theirs here, and each
        such name's first grant would need a round 2), else a new one."""
        bases = [_base(m) for n, m in others if _synced(n, m)]
        await self._finish(node, run_id, max(bases) if bases else _new_base(others), 0)
        log.info("redis node %s joins a new cluster", node.label)

    async def _copy_from(self, sources: list[Node], target: Node) -> int:
        copied = 0
        for source in sources:
            copied += await self._copy(source, target)
        return copied

    async def _any_counter(self, nodes: list[Node]) -> bool:
        for source in nodes:
            reply = parse_scan(
                await self._ask(source, "SCAN", 0, "MATCH", "fence:*", "COUNT", 10_000)
            )
            if isinstance(reply, Failure):
                raise ConnectionError(f"scan of {source.label} failed: {reply.reason}")
            if reply[1] or reply[0] != b"0":
                return True
        return False

    async def _copy(self, source: Node, target: Node) -> int:
        """Raise every ``fence:*`` counter of ``target`` to its value on ``source``."""
        cursor = b"0"
        raised = seen = 0
        while True:
            scan = parse_scan(
                await self._ask(source, "SCAN", cursor, "MATCH", "fence:*", "COUNT", _BATCH)
            )
            if isinstance(scan, Failure):
                raise ConnectionError(f"scan of {source.label} failed: {scan.reason}")
            cursor, keys = scan
            if keys:
                values = parse_values(await self._ask(source, "MGET", *keys))
                if isinstance(values, Failure):
                    raise ConnectionError(f"mget on {source.label} failed: {values.reason}")
                pairs = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
                if pairs:
                    ks, vs = zip(*pairs, strict=True)
                    async with asyncio.timeout(self._timeout):
                        done = parse_count(await target.call(scripts.RESYNC, ks, vs))
                    if isinstance(done, Failure):
                        raise ConnectionError(f"resync of {target.label} failed: {done.reason}")
                    raised += done
                seen += len(keys)
                if seen % 100_000 < len(keys):
                    log.info("resync %s from %s: %d counters read", target.label,
                             source.label, seen)  # fmt: skip
            if cursor == b"0":
                return raised

    async def _finish(self, node: Node, run_id: str | None, base: int, quarantine_ms: int) -> None:
        """Mark the node synced for the run ``run_id`` that the copies went to: if it
        restarted meanwhile, the marker names the old run and vouches for nothing."""
        async with asyncio.timeout(self._timeout):
            done = await node.call(
                scripts.MARK_SYNCED,
                (SYNCED_KEY, QUARANTINE_KEY),
                (base, quarantine_ms, run_id or ""),
            )
        if is_failure(done):
            raise ConnectionError(f"marking {node.label} synced failed: {done!r}")
        if quarantine_ms and done == 1:
            why = f"for {quarantine_ms / 1000:.1f} s after a resync (R19)"
            self._health.set(node.index, NodeState.QUARANTINED, why)
            self._later(node, quarantine_ms / 1000)  # then its second copy (R21)
        elif done == 1:
            self._health.set(node.index, NodeState.HEALTHY)
        else:  # another process synced it in this run: its quarantine may still run
            left = await self._ask(node, "PTTL", QUARANTINE_KEY)
            if isinstance(left, int):
                state = NodeState.QUARANTINED if left > 0 else NodeState.HEALTHY
                self._health.set(node.index, state)


def _synced(node: Node, marker: Reply) -> bool:
    """The marker vouches for this run of the node (``<base> <run_id>``)."""
    return (
        isinstance(marker, bytes)
        and node.run_id is not None
        and marker.endswith(b" " + node.run_id.encode())
    )


def _new_base(others: list[tuple[Node, Reply]]) -> int:
    """A token base above every token issued before now (the wall clock, R2) and above
    every base the other nodes' markers name."""
    return max([wall_clock_base(), *(_base(m) for _, m in others)])


def _base(marker: Reply) -> int:
    if not isinstance(marker, bytes):
        return 0
    try:
        return int(marker.split(b" ", 1)[0])
    except ValueError:
        return 0
