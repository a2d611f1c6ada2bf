"""The nemesis: a seeded random schedule of faults, each one healed before the next.

Fault kinds (``KINDS``) and what each does, with the window recorded in the history:

* ``pause_client``: SIGSTOP a client process past its TTL, then SIGCONT;
* ``pause_node``: SIGSTOP a Redis node, then SIGCONT;
* ``kill_node``: kill -9 a Redis node and restart it empty;
* ``rollback_node``: SAVE an RDB snapshot of a node, let it run on, kill -9 it and
  restart it from the old snapshot (its counters go back in time);
* ``partition``: black-hole proxy links: one node from both gateways, one gateway
  from two nodes (it loses its quorum), or each gateway from a different node;
* ``delay``: delay every chunk on the links of one gateway or of one node;
* ``cut``: close the connections of one node's links and refuse new ones;
* ``drop_replies`` / ``drop_commands``: one direction of one link loses its data and
  its connections end (the node runs commands whose replies are lost / never sees
  the commands);
* ``kill_gateway``: kill -9 a gateway process, start it again on the same port;
* ``pause_gateway``: SIGSTOP a gateway process past the TTL, then SIGCONT;
* ``restart_pg``: crash-stop PostgreSQL (``pg_ctl -m immediate``), start it again;
* ``skew_gateway``: move a gateway's wall clock by seconds (libfaketime), then back;
* ``clock_jump_node``: a Redis node's wall clock jumps forward by ``JUMP_MS``: every
  key with a shorter remaining TTL expires now (Kleppmann's third scenario). Redis
  expires keys by wall clock, but redis-server links jemalloc, which libfaketime
  cannot wrap (libfaketime issue #130: the server does not start), so the jump is
  applied by its effect, with a Lua script that expires those keys at once;
* ``kleppmann``: the whole timeline of that scenario on three nodes (of one group,
  with Redlock groups; so are a partition's two nodes): one gateway
  is cut off from node C (so its grants hold A and B), and node B's clock jumps
  forward again and again: the other gateway can then grant the same name on B
  and C while the first lease is still valid. Mutual exclusion is gone by design
  of the fault; fencing must still refuse every stale write.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Final

import hiredis

from tests.campaign.cluster import Cluster
from tests.campaign.history import FaultWindow
from tests.campaign.trace import Tracer

__all__ = ["KINDS", "Nemesis", "Planned", "plan"]

KINDS: Final = (
    "pause_client", "pause_node", "kill_node", "rollback_node", "partition", "delay", "cut",
    "drop_replies", "drop_commands", "kill_gateway", "pause_gateway", "restart_pg",
    "skew_gateway", "clock_jump_node", "kleppmann",
)  # fmt: skip
JUMP_MS: Final = 10_000
# ARGV[1]: the jump (ms). ARGV[2], when tracing (``trace.py``): the traced name's key
# tag; the reply is then {expired, key, pttl, value, ...} for the expired keys of it.
EXPIRE_SOON = """
local n, seen = 0, {}
for _, key in ipairs(redis.call('KEYS', '*')) do
  local left = redis.call('PTTL', key)
  if left > 0 and left <= tonumber(ARGV[1]) then
    if ARGV[2] and string.find(key, ARGV[2], 1, true) then
      local kind = redis.call('TYPE', key)['ok']
      local value = kind
      if kind == 'string' then
        value = redis.call('GET', key)
      elseif kind == 'zset' then
        value = table.concat(redis.call('ZRANGE', key, 0, -1, 'WITHSCORES'), ' ')
      elseif kind == 'hash' then
        value = table.concat(redis.call('HGETALL', key), ' ')
      end
      table.insert(seen, key)
      table.insert(seen, left)
      table.insert(seen, value)
    end
    redis.call('PEXPIRE', key, 1)
    n = n + 1
  end
end
if ARGV[2] then
  table.insert(seen, 1, n)
  return seen
end
return n
"""


@dataclass(frozen=True)
class Planned:
    kind: str
    seconds: float  # how long the fault stays in place
    gap: float  # quiet time after it is healed
    mandatory: bool = False  # the first of its kind: injected even past the deadline


def plan(rng: random.Random, kinds: Sequence[str], seconds: float, ttl: float) -> list[Planned]:
    """Every kind once in a random order, then random kinds, about ``seconds`` in all."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
    order = list(kinds)
    rng.shuffle(order)
    schedule: list[Planned] = []
    total = 0.0
    while order or total < seconds:
        first = bool(order)
        kind = order.pop() if order else rng.choice(list(kinds))
        item = Planned(kind, rng.uniform(1.2, 2.0) * ttl, rng.uniform(0.3, 1.0), first)
        schedule.append(item)
        total += item.seconds + item.gap
        if not order and total >= seconds:
            break
    return schedule


@dataclass
class Nemesis:
    cluster: Cluster
    clients: list[subprocess.Popen[bytes]]
    rng: random.Random
    windows: list[FaultWindow] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    struck: tuple[float, float] | None = None  # the current fault's act on a node
    tracer: Tracer | None = None  # notes each fault and each jump (``trace.py``)

    async def _strike(self, act: Callable[[], object]) -> None:
        """Run ``act`` (it takes entries from a node) in a thread and note when."""
        before = time.monotonic()
        await asyncio.to_thread(act)
        self.struck = (before, time.monotonic())

    async def run(self, schedule: Sequence[Planned], deadline: float) -> None:
        """Inject the planned faults in order, each healed before the next, until ``deadline``
        (the first fault of each kind even after it)."""
        try:
            for item in schedule:
                if not item.mandatory and time.monotonic() + item.seconds > deadline:
                    break
                start = time.monotonic()
                self.struck = None
                detail = await self._inject(item)
                struck = self.struck or (None, None)
                window = FaultWindow(item.kind, start, time.monotonic(), detail, *struck)
                self.windows.append(window)
                if self.tracer is not None:
                    self.tracer.write({"ev": "fault", **asdict(window)})
                self.injected[item.kind] += 1
                await asyncio.sleep(item.gap)
        finally:
            await asyncio.to_thread(self.cluster.heal_all)

    async def _inject(self, item: Planned) -> str:
        faults: dict[str, Callable[[float], Awaitable[str]]] = {
            "pause_client": self.pause_client, "pause_node": self.pause_node,
            "kill_node": self.kill_node, "rollback_node": self.rollback_node,
            "partition": self.partition, "delay": self.delay, "cut": self.cut,
            "drop_replies": self.drop_replies, "drop_commands": self.drop_commands,
            "kill_gateway": self.kill_gateway, "pause_gateway": self.pause_gateway,
            "restart_pg": self.restart_pg, "skew_gateway": self.skew_gateway,
            "clock_jump_node": self.clock_jump_node, "kleppmann": self.kleppmann,
        }  # fmt: skip
        return await faults[item.kind](item.seconds)

    def _node(self) -> int:
        return self.rng.randrange(len(self.cluster.nodes))

    def _gateway(self) -> int:
        return self.rng.randrange(len(self.cluster.gateways))

    async def pause_client(self, seconds: float) -> str:
        running = [p for p in self.clients if p.poll() is None]
        if not running:
            return "no client running"
        proc = self.rng.choice(running)
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            proc.send_signal(signal.SIGCONT)
        return f"client pid {proc.pid}"

    async def pause_node(self, seconds: float) -> str:
        i = self._node()
        node = self.cluster.nodes[i]
        node.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            node.resume()
        return f"node {i}"

    async def kill_node(self, seconds: float) -> str:
        i = self._node()
        node = self.cluster.nodes[i]
        await self._strike(node.kill)
        await asyncio.sleep(seconds / 2)
        await asyncio.to_thread(node.restart_empty)
        await asyncio.sleep(seconds / 2)
        return f"node {i}"

    async def rollback_node(self, seconds: float) -> str:
        i = self._node()
        node = self.cluster.nodes[i]
        await asyncio.to_thread(node.snapshot)
        await asyncio.sleep(seconds)  # the node moves on past its snapshot
        await self._strike(node.rollback)
        return f"node {i}"

    async def _links(
        self, links: list[tuple[int, int]], mode: str, seconds: float, **kw: float
    ) -> None:
        proxies = [self.cluster.proxies[g][n] for g, n in links]
        for proxy in proxies:
            proxy.set(mode, **kw)  # type: ignore[arg-type]
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in proxies:
                proxy.heal()

    def _all_links(self) -> list[tuple[int, int]]:
        return [
            (g, n)
            for g in range(len(self.cluster.gateways))
            for n in range(len(self.cluster.nodes))
        ]

    async def partition(self, seconds: float) -> str:
        shape = self.rng.choice(["node_alone", "gateway_minority", "split_majorities"])
        if shape == "node_alone":
            n = self._node()
            links = [(g, n) for g in range(len(self.cluster.gateways))]
        elif shape == "gateway_minority":
            g = self._gateway()
            links = [(g, n) for n in self.rng.sample(self.cluster.group_nodes(self.rng), 2)]
        else:
            a, b = self.rng.sample(self.cluster.group_nodes(self.rng), 2)
            links = [(0, a), (1, b)]
        await self._links(links, "blackhole", seconds)
        return f"{shape} {links}"

    async def delay(self, seconds: float) -> str:
        by_gateway = self.rng.random() < 0.5
        chosen = self._gateway() if by_gateway else self._node()
        links = [link for link in self._all_links() if link[0 if by_gateway else 1] == chosen]
        lag = self.rng.uniform(0.03, 0.3)
        await self._links(links, "delay", seconds, delay=lag)
        return f"{'gateway' if by_gateway else 'node'} {chosen} +{lag * 1000:.0f} ms"

    async def cut(self, seconds: float) -> str:
        n = self._node()
        await self._links([link for link in self._all_links() if link[1] == n], "cut", seconds)
        return f"node {n}"

    async def drop_replies(self, seconds: float) -> str:
        link = (self._gateway(), self._node())
        await self._links([link], "drop_down", seconds)
        return f"link {link}"

    async def drop_commands(self, seconds: float) -> str:
        link = (self._gateway(), self._node())
        await self._links([link], "drop_up", seconds)
        return f"link {link}"

    async def kill_gateway(self, seconds: float) -> str:
        g = self._gateway()
        gateway = self.cluster.gateways[g]
        await asyncio.to_thread(gateway.kill)
        await asyncio.sleep(seconds / 2)
        gateway.start()
        await asyncio.sleep(seconds / 2)
        return f"gateway {g}"

    async def pause_gateway(self, seconds: float) -> str:
        g = self._gateway()
        gateway = self.cluster.gateways[g]
        gateway.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            gateway.signal(signal.SIGCONT)
        return f"gateway {g}"

    async def restart_pg(self, seconds: float) -> str:
        await asyncio.to_thread(self.cluster.pg.restart, mode="immediate", down=seconds / 2)
        return "postgres"

    async def skew_gateway(self, seconds: float) -> str:
        if not self.cluster.skewable:
            raise RuntimeError("skew_gateway needs libfaketime (Debian package faketime)")
        g = self._gateway()
        offset = self.rng.choice([-1, 1]) * self.rng.uniform(2.0, 30.0)
        gateway = self.cluster.gateways[g]
        gateway.skew(offset)
        try:
            await asyncio.sleep(seconds)
        finally:
            gateway.skew(0)
        return f"gateway {g} {offset:+.1f} s"

    async def clock_jump_node(self, seconds: float) -> str:
        i = self._node()
        replies: list[str] = []
        await self._strike(lambda: replies.append(self._jump(i)))
        await asyncio.sleep(seconds)
        return f"node {i} +{JUMP_MS} ms: {replies[0]} keys expired"

    def _jump(self, i: int) -> str:
        """Node ``i``'s clock jumps ``JUMP_MS`` forward (by its effect): how many keys expired
        (or the node's error reply)."""
        node = self.cluster.nodes[i]
        if self.tracer is None:
            return (
                node.command("EVAL", EXPIRE_SOON, "0", str(JUMP_MS))
                .strip()
                .decode(errors="replace")
            )
        tag = self.tracer.tag.decode()
        before = time.monotonic()
        reader = hiredis.Reader()
        reader.feed(node.command("EVAL", EXPIRE_SOON, "0", str(JUMP_MS), tag))
        reply = reader.gets()
        if not isinstance(reply, list):
            self.tracer.write({"ev": "jump", "node": i, "sent": before, "reply": repr(reply)})
            return repr(reply)
        expired = [
            {"key": k.decode(), "pttl": left, "value": v.decode(errors="replace")}
            for k, left, v in zip(reply[1::3], reply[2::3], reply[3::3], strict=True)
        ]  # fmt: skip
        self.tracer.write({"ev": "jump", "node": i, "jump_ms": JUMP_MS, "sent": before,
                           "expired_keys": reply[0], "traced": expired})  # fmt: skip
        return str(reply[0])

    async def kleppmann(self, seconds: float) -> str:
        g = self._gateway()
        c, b = self.rng.sample(self.cluster.group_nodes(self.rng), 2)
        proxy = self.cluster.proxies[g][c]
        proxy.set("blackhole")
        jumps = 0
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while loop.time() < end:
                await asyncio.sleep(self.rng.uniform(0.1, 0.4))
                await asyncio.to_thread(self._jump, b)
                jumps += 1
        finally:
            proxy.heal()
        return f"gateway {g} cut from node {c}; node {b} jumped {jumps} times"
