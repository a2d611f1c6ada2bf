"""Shared locks and semaphores under the faults of the lock core (R22-R26).

The mixed workload of ``kinds_check`` runs on three nodes of the test's own,
over two managers (two gateways), while one node is killed, paused, or
restarted with its data lost; every grant is checked against I1, I2 and I5.
Cancelled waiting acquires of each kind leave nothing behind on any node.
"""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LockManager, QuorumUnavailable
from lockservice.protocol import holder_keys, lock_keys
from tests._servers import RedisNode
from tests.faults.conftest import MAX_TTL, Connect, quarantined, reply_int, wait_until
from tests.lockservice.kinds_check import run_workload

pytestmark = pytest.mark.faults


async def _fault(nodes: list[RedisNode], fault: str) -> None:
    await asyncio.sleep(0.3)  # the workload is under way
    node = nodes[2]
    if fault == "killed":
        node.kill()
    elif fault == "paused":
        node.pause()
        await asyncio.sleep(1.0)
        node.resume()
    else:  # restarted empty: resynced, then quarantined for max_ttl (R17-R19)
        node.restart(lose_data=True)
        await wait_until(lambda: quarantined(node), 5.0, "restarted node resynced")


@pytest.mark.parametrize("fault", ["killed", "paused", "restarted-empty"])
async def test_every_kind_keeps_its_invariants_while_a_node_fails(
    own_redis3: list[RedisNode], connect: Connect, fault: str
) -> None:
    managers = [await connect(own_redis3), await connect(own_redis3)]
    work = run_workload(managers, "kfault/mix", tasks=10, rounds=25, ttl=1.0, wait=4.0, seed=3)
    check, _ = await asyncio.wait_for(asyncio.gather(work, _fault(own_redis3, fault)), 90)
    assert check.violations == []
    assert set(check.grants) == {"exclusive", "shared", "semaphore"}
    assert sum(check.grants.values()) >= 10 * 25 // 2


async def test_with_a_node_killed_semaphores_stop_and_other_kinds_go_on(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R32: a semaphore lease needs every node; exclusive and shared ones a majority."""
    mgr = await connect(own_redis3)
    sem = await mgr.acquire_semaphore("kdown/sem", 2, ttl=MAX_TTL)
    own_redis3[2].kill()
    with pytest.raises(QuorumUnavailable) as raised:
        await mgr.acquire_semaphore("kdown/sem", 2, ttl=MAX_TTL, wait=0.5)
    assert (raised.value.needed, raised.value.nodes) == (3, 3)
    with pytest.raises(QuorumUnavailable):
        await mgr.extend(sem, ttl=MAX_TTL)  # not on every node: not extended
    await mgr.release(sem)  # a release frees what it can
    shared = await mgr.acquire("kdown/rw", ttl=MAX_TTL, mode="shared")
    await mgr.release(shared)
    excl = await mgr.acquire("kdown/rw", ttl=MAX_TTL)
    assert excl.token > shared.token
    await mgr.release(excl)


def _left_behind(nodes: list[RedisNode], name: str) -> list[tuple[int, str, int]]:
    """Keys of ``name`` that still hold an entry on some node: (node, key, entries)."""
    found = []
    keys = lock_keys(name)
    kinds = {keys[0]: "EXISTS", keys[4]: "ZCARD", keys[5]: "ZCARD", keys[6]: "HLEN"}
    kinds.update(
        {key: "ZCARD" if key.startswith("holders:") else "HLEN" for key in holder_keys(name)}
    )
    for i, node in enumerate(nodes):
        for key, command in kinds.items():
            entries = reply_int(node.command(command, key))
            if entries:
                found.append((i, key, entries))
    return found


@pytest.mark.parametrize("kind", ["shared", "semaphore"])
async def test_a_cancelled_waiting_acquire_of_each_kind_leaves_nothing(
    own_redis3: list[RedisNode], connect: Connect, kind: str
) -> None:
    holder, quitter = await connect(own_redis3), await connect(own_redis3)
    name = f"kcancel/{kind}"
    lease = await holder.acquire(name, ttl=MAX_TTL)  # exclusive: every kind waits

    async def take(mgr: LockManager) -> object:
        if kind == "semaphore":
            return await mgr.acquire_semaphore(name, 2, ttl=MAX_TTL, wait=5.0)
        return await mgr.acquire(name, ttl=MAX_TTL, wait=5.0, mode="shared")

    waiters = [asyncio.create_task(take(quitter)) for _ in range(3)]
    await asyncio.sleep(0.2)  # the first is queued on every node, the rest behind it locally
    assert all(reply_int(n.command("ZCARD", lock_keys(name)[4])) == 1 for n in own_redis3)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await holder.release(holder.handle(name, lease.lease_id))
    await asyncio.sleep(0.05)  # the cancelled acquires' releases are on their way
    assert _left_behind(own_redis3, name) == []


async def test_held_and_released_leases_of_each_kind_leave_nothing(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """Memory stays bounded: every entry goes with its lease, by release or expiry."""
    mgr = await connect(own_redis3)
    name = "kbounded/x"
    for i in range(20):
        shared = await mgr.acquire(name, ttl=1.0, mode="shared", idempotency_key=f"s{i}")
        await mgr.release(mgr.handle(name, shared.lease_id, "shared"))
        sem = await mgr.acquire_semaphore(name, 3, ttl=1.0, idempotency_key=f"m{i}")
        await mgr.release(mgr.handle(name, sem.lease_id, "semaphore", 3))
        excl = await mgr.acquire(name, ttl=1.0, idempotency_key=f"x{i}")
        await mgr.release(mgr.handle(name, excl.lease_id))
    assert _left_behind(own_redis3, name) == []
    for i in range(5):  # never released: gone once they expire
        await mgr.acquire(name, ttl=0.2, mode="shared", idempotency_key=f"late{i}")
    assert _left_behind(own_redis3, name) != []
    await asyncio.sleep(0.3)
    assert _left_behind(own_redis3, name) == []
    lease = await mgr.acquire(name, ttl=0.2, idempotency_key="excl")  # exclusive with a tag
    await asyncio.sleep(0.3)
    assert _left_behind(own_redis3, name) == []
    assert lease.expired


@pytest.mark.parametrize("steps", range(0, 8, 2))
@pytest.mark.parametrize("kind", ["shared", "semaphore"])
async def test_an_acquire_of_each_kind_cancelled_mid_round_leaves_nothing(
    own_redis3: list[RedisNode], connect: Connect, kind: str, steps: int
) -> None:
    """Cancelled after ``steps`` loop iterations: before, during and after the replies."""
    mgr = await connect(own_redis3)
    name = f"kcancel-mid/{kind}"
    other = await mgr.acquire(name, ttl=MAX_TTL, mode="shared")  # a holder that stays
    if kind == "semaphore":
        await mgr.release(mgr.handle(name, other.lease_id, "shared"))
        other = await mgr.acquire_semaphore(name, 2, ttl=MAX_TTL)
        task = asyncio.create_task(mgr.acquire_semaphore(name, 2, ttl=MAX_TTL))
    else:
        task = asyncio.create_task(mgr.acquire(name, ttl=MAX_TTL, mode="shared"))
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    if not isinstance(outcome, BaseException):
        await mgr.release(mgr.handle(name, outcome.lease_id, outcome.mode, outcome.permits))
    await mgr.release(mgr.handle(name, other.lease_id, other.mode, other.permits))
    await asyncio.sleep(0.05)  # the cancelled acquire's release is on its way
    assert _left_behind(own_redis3, name) == []
