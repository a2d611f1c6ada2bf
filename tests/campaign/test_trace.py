"""The campaign's per-node trace (``trace.py``) over real redis-server nodes: a known short
scenario (a grant, a waiter handed the lock, a clock jump, releases) is in it as it ran."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lockservice import LockManager
from lockservice.protocol import SYNCED_KEY
from tests._servers import RedisNode
from tests.campaign.nemesis import JUMP_MS, Nemesis
from tests.campaign.proxy import FaultProxy
from tests.campaign.trace import Tracer, merged

NAME = "files/k1"


def _numbers(value: Any) -> list[int]:
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, int) else []


async def test_the_trace_records_a_short_scenario_per_node(
    own_redis3: list[RedisNode], tmp_path: Path
) -> None:
    tracer = Tracer(tmp_path / "trace.jsonl", NAME)
    links = [
        [FaultProxy(node.port, trace=(tracer, g, n)) for n, node in enumerate(own_redis3)]
        for g in range(2)
    ]
    for proxy in (p for gateway in links for p in gateway):
        await proxy.start()
    g0 = await LockManager.connect([p.url for p in links[0]], max_ttl=30.0)
    g1 = await LockManager.connect([p.url for p in links[1]], max_ttl=30.0)
    nemesis = Nemesis(
        SimpleNamespace(nodes=own_redis3, heal_all=lambda: None), [], random.Random(1),
        tracer=tracer,
    )  # type: ignore[arg-type]  # fmt: skip
    try:
        # The nodes of a new cluster may have different wall-clock token bases, so A's
        # grants may differ and take round 2 (R4) or not: bases far apart, as nodes that
        # join the cluster one by one have them, make every quorum's grants differ.
        for node, skew in ((own_redis3[1], 10**9), (own_redis3[2], 2 * 10**9)):
            base, run_id = node.command("GET", SYNCED_KEY).split(b"\r\n")[1].split()
            node.command("SET", SYNCED_KEY, f"{int(base) + skew} {run_id.decode()}")
        before = time.monotonic()
        a = await g0.acquire(NAME, ttl=8.0)
        granted_a = time.monotonic()
        other = await g0.acquire("files/k2", ttl=8.0)  # another name: not traced
        waiter = asyncio.create_task(g1.acquire(NAME, ttl=8.0, wait=5.0))
        for _ in range(100):  # queued on every node (bounded: 5 s)
            if all(n.command("EXISTS", f"waitq:{{{NAME}}}").strip() == b":1" for n in own_redis3):
                break
            await asyncio.sleep(0.05)
        await g0.release(a)  # hands the lock to the waiter, by a message on g1's links
        b = await asyncio.wait_for(waiter, 5.0)
        assert b.token > a.token
        await asyncio.to_thread(nemesis._jump, 0)  # node 0's clock: B's grant expires there
        await g1.release(b)
        await g0.release(other)
    finally:
        await g0.close()
        await g1.close()
        for proxy in (p for gateway in links for p in gateway):
            await proxy.close()
        tracer.close()

    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert records[0]["ev"] == "start"
    assert records[0]["name"] == NAME
    assert not any("files/k2" in json.dumps(r) for r in records)
    calls = {r["call"]: r for r in records if r["ev"] == "call"}
    replies = {r["call"]: r for r in records if r["ev"] == "reply"}
    assert calls
    assert all(c["key"].endswith(f"{{{NAME}}}") for c in calls.values() if "key" in c)

    def on(g: int, script: str, lease: str) -> list[dict[str, Any]]:
        return [c for c in calls.values()
                if (c["g"], c.get("script")) == (g, script) and c["args"][0] == lease]  # fmt: skip

    # A's try went to every node through gateway 0's links, each answered in order after
    # the acquire's call; a quorum (2) answered before it returned: a round is decided by
    # Q replies (R3), so the third may pass its proxy after the acquire returned.
    tries = on(0, "acquire", a.lease_id)
    assert sorted(c["node"] for c in tries) == [0, 1, 2]
    for c in tries:
        r = replies[c["call"]]
        assert (r["g"], r["node"], r["conn"]) == (c["g"], c["node"], c["conn"])
        assert before <= c["mono"] <= r["mono"]
        assert abs(c["node_ms"] - r["node_ms"]) < 5000
    assert sum(replies[c["call"]]["mono"] <= granted_a for c in tries) >= 2
    # A's token is the largest grant of a quorum (R3); every two grants differ, so round 2
    # raised the counter to it on every node and a quorum acked before it returned (R4).
    granted = [_numbers(replies[c["call"]]["reply"])[0] for c in tries]
    assert len(set(granted)) == 3
    assert a.token in granted
    assert sum(g <= a.token for g in granted) >= 2
    raises = [c for c in calls.values()
              if (c["g"], c.get("script")) == (0, "raise_fence")
              and c["args"] == [str(a.token), a.lease_id]]  # fmt: skip
    # (a node whose grant came after the decision gets a second: R16 writes the token)
    assert {c["node"] for c in raises} == {0, 1, 2}
    acked = [replies[c["call"]] for c in raises]
    decided = sorted(replies[c["call"]]["mono"] for c in tries)[1]  # the Q-th reply
    assert all(c["mono"] >= decided for c in raises)
    assert len({r["node"] for r in acked if r["reply"] == a.token and r["mono"] <= granted_a}) >= 2
    # Its release on every node; B queued through gateway 1, then handed the lock.
    assert sorted(c["node"] for c in on(0, "release", a.lease_id)) == [0, 1, 2]
    assert {c["node"] for c in on(1, "acquire", b.lease_id)} == {0, 1, 2}
    pushes = [r for r in records if r["ev"] == "push" and r["g"] == 1]
    assert any(str(b.token) in r["message"][2] and b.lease_id in r["message"][2] for r in pushes)
    # The jump on node 0 expired B's grant there, seen with its value and PTTL.
    (jump,) = [r for r in records if r["ev"] == "jump"]
    assert (jump["node"], jump["jump_ms"]) == (0, JUMP_MS)
    lock = [k for k in jump["traced"] if k["key"] == f"lock:{{{NAME}}}"]
    assert [k["value"] for k in lock] == [f"{b.lease_id}:{b.token}"]
    assert 0 < lock[0]["pttl"] <= 8000
    assert sorted(c["node"] for c in on(1, "release", b.lease_id)) == [0, 1, 2]
    # Records are written in time order; the merged view shows them by time.
    monos = [r["mono"] for r in records]
    assert monos == sorted(monos)
    view = merged(tmp_path)
    assert len(view) == len(records)
    assert any(f'"script": "release", "key": "lock:{{{NAME}}}"' in line for line in view)
