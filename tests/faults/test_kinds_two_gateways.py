"""Every lock kind's invariants over HTTP, through two gateway processes on three Redis nodes.

Twelve HTTP clients take leases of random kinds (exclusive, shared, a
semaphore of 2 permits) on one name, each request through either gateway.
A client counts on its lease from when it sent the acquire until
``valid_ms`` later (on the test's clock: never longer than the nodes hold
it) and until it sends the release. At every grant:

- no exclusive lease is counted on together with any other lease (I1);
- never more than ``permits`` semaphore leases together (I5);
- an exclusive or semaphore grant's token exceeds every token granted before
  its request was sent, and a shared one's is at least that (I2).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests._servers import RedisNode
from tests.faults.test_gateway_two_processes import gateways, http_session

pytestmark = pytest.mark.faults

NAME = "kinds/two-gateways"
PERMITS = 2
KINDS = ("exclusive", "shared", "shared", "semaphore")


@dataclass
class Held:
    mode: str
    token: int
    until: float  # time.monotonic() of the end of its validity, as its client counts it


class Check:
    def __init__(self) -> None:
        self.active: dict[str, Held] = {}
        self.completed = 0
        self.violations: list[str] = []
        self.grants: Counter[str] = Counter()
        self.most_together: Counter[str] = Counter()

    def granted(self, lease_id: str, held: Held, floor: int) -> None:
        now = time.monotonic()
        live = [h for h in self.active.values() if h.until > now]
        if live and (held.mode == "exclusive" or any(h.mode == "exclusive" for h in live)):
            self.violations.append(f"I1: {held} granted while {live} counted on")
        together = 1 + sum(h.mode == held.mode for h in live)
        if held.mode == "semaphore" and together > PERMITS:
            self.violations.append(f"I5: {together} semaphore leases at once")
        if held.token < floor or (held.mode != "shared" and held.token == floor):
            self.violations.append(f"I2: {held.mode} token {held.token}, floor {floor}")
        self.completed = max(self.completed, held.token)
        self.active[lease_id] = held
        self.grants[held.mode] += 1
        self.most_together[held.mode] = max(self.most_together[held.mode], together)


async def client(
    session: aiohttp.ClientSession, urls: list[str], check: Check, i: int, rounds: int
) -> None:
    rng = random.Random(i)
    for r in range(rounds):
        url = urls[(i + r) % len(urls)]
        kind = rng.choice(KINDS)
        path = f"/v1/semaphores/{NAME}" if kind == "semaphore" else f"/v1/locks/{NAME}"
        body: dict[str, Any] = {"ttl_ms": 2000, "wait_ms": 5000}
        body.update({"permits": PERMITS} if kind == "semaphore" else {"mode": kind})
        floor = check.completed
        sent = time.monotonic()
        async with session.post(url + path, json=body) as response:
            grant = await response.json()
        if response.status != 200:
            assert response.status in (409, 503), grant
            continue
        held = Held(kind, grant["token"], sent + grant["valid_ms"] / 1000)
        check.granted(grant["lease_id"], held, floor)
        await asyncio.sleep(rng.uniform(0.002, 0.02))
        check.active.pop(grant["lease_id"])  # from here on the client does not count on it
        release = urls[(i + r + 1) % len(urls)] + path  # released through the other gateway
        async with session.delete(release, headers={"X-Lease-Id": grant["lease_id"]}) as response:
            assert response.status in (204, 409), await response.text()


async def test_each_kind_keeps_its_invariants_through_two_gateways(
    redis3: list[RedisNode], tmp_path: Path
) -> None:
    raw = {
        "locks": {"redis": [n.url for n in redis3], "node_timeout_ms": 500},
        "stores": {"files": {"type": "files", "root": str(tmp_path / "f")}},
    }
    check = Check()
    with gateways(tmp_path, raw, 2) as procs:
        async with http_session(total=30.0) as session:
            await asyncio.gather(*(p.wait_ready(session) for p in procs))
            urls = [p.url for p in procs]
            await asyncio.gather(*(client(session, urls, check, i, 10) for i in range(12)))
            async with session.get(f"{urls[0]}/v1/locks/{NAME}") as response:
                state = await response.json()
    assert check.violations == []
    assert min(check.grants[k] for k in ("exclusive", "shared", "semaphore")) >= 5, check.grants
    assert check.most_together["shared"] >= 2, check.most_together  # shared leases overlapped
    assert state["held"] is False  # every lease was released
