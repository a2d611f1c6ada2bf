"""A node restarted with its data lost: resync, quarantine, and no token issued twice.

The dangerous schedule (Kleppmann's objection to Redlock, with counters):
node A is paused and misses a run of grants that only B and C see; C then
restarts and forgets them; A comes back and B goes away. A and C together
are a majority that has never seen the newest tokens. Without the resync,
their next grant reuses a token already handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis

from lockservice import LockHeld, LockManager, QuorumUnavailable, resync, scripts
from lockservice.node import Node
from lockservice.protocol import QUARANTINE_KEY, RECOPY_KEY, SYNCED_KEY, lock_keys
from tests._servers import RedisNode, free_port
from tests.faults.conftest import (
    MAX_TTL,
    NODE_TIMEOUT,
    Connect,
    cut_off,
    lock_key,
    node_connected,
    redlock,
    reply_bulk,
    reply_int,
    wait_until,
)

pytestmark = pytest.mark.faults

NAME = "restart/orders"
MISSED = 20  # grants that node A never sees


def quarantine_ms(node: RedisNode) -> int:
    return reply_int(node.command("PTTL", QUARANTINE_KEY))


def copied_again(node: RedisNode) -> bool:
    """The quarantine is over and the second copy done (R21): the node grants again."""
    return quarantine_ms(node) < 0 and reply_int(node.command("EXISTS", RECOPY_KEY)) == 0


async def _grant(mgr: LockManager, issued: list[int], *, held_on: RedisNode | None = None) -> None:
    lease = await mgr.acquire(NAME, ttl=1.0)
    assert lease.token > max(issued, default=0), (lease.token, max(issued, default=0))
    issued.append(lease.token)
    if held_on is not None:
        assert reply_int(held_on.command("EXISTS", lock_key(NAME))) == 1
    await mgr.release(lease)


async def _a_misses_grants_then_c_forgets_them(
    nodes: list[RedisNode], mgr: LockManager, issued: list[int], *, marker_survives: bool
) -> None:
    """Run the schedule up to: A resumed and reconnected, C restarted empty, B still up."""
    a, b, c = nodes
    # Nodes start from token bases a few ms (x 1000) apart: let A and C decide the
    # first grant, so that A's counter holds exactly its token, below every later one.
    b.pause()
    await _grant(mgr, issued)
    b.resume()
    await cut_off(mgr, a, 0)  # nothing sent from now on reaches A, not even late
    for _ in range(MISSED):
        await _grant(mgr, issued)  # granted by B and C only
    marker = reply_bulk(c.command("GET", SYNCED_KEY))
    assert marker is not None
    c.restart(lose_data=True)
    if marker_survives:
        # As after a restart from an AOF that lost its last second of writes: the
        # node looks synced, but its newest counters are gone.
        c.command("SET", SYNCED_KEY, marker.decode())
    a.resume()
    await wait_until(lambda: node_connected(mgr, 0), 3.0, "node A reconnected")


@pytest.mark.parametrize("marker_survives", [False, True], ids=["all-lost", "marker-kept"])
async def test_token_increases_after_node_restart_with_data_loss(
    own_redis3: list[RedisNode], connect: Connect, marker_survives: bool
) -> None:
    _, b, c = own_redis3
    mgr = await connect(own_redis3)
    issued: list[int] = []
    await _a_misses_grants_then_c_forgets_them(
        own_redis3, mgr, issued, marker_survives=marker_survives
    )

    # C is resynced from A and B, then quarantined for max_ttl.
    await wait_until(lambda: quarantine_ms(c) > 0, 5.0, "node C resynced and quarantined")
    assert MAX_TTL * 1000 - 1000 < quarantine_ms(c) <= MAX_TTL * 1000 + 1
    assert reply_bulk(c.command("GET", SYNCED_KEY)) is not None

    b.pause()  # the only node that saw the newest grants and kept them
    with contextlib.suppress(QuorumUnavailable):  # A alone is no quorum: refusing is right
        await _grant(mgr, issued)  # but a grant must still exceed every earlier token

    # Once the quarantine is over and C copied again (R21: from A and B, so B must be
    # back for it), A (stale) and C (resynced) are a quorum.
    b.resume()
    await wait_until(lambda: copied_again(c), MAX_TTL + 8.0, "node C copied again")
    b.pause()
    await _grant(mgr, issued, held_on=c)

    b.resume()
    for _ in range(3):
        await _grant(mgr, issued)
    assert issued == sorted(set(issued))


async def test_without_resync_a_restarted_node_reissues_tokens(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """The same schedule with the resync switched off: a token is issued a second time."""
    _, b, _ = own_redis3
    mgr = await connect(own_redis3)
    redlock(mgr).resyncer.enabled = False
    issued: list[int] = []
    await _a_misses_grants_then_c_forgets_them(own_redis3, mgr, issued, marker_survives=True)
    b.pause()
    lease = await mgr.acquire(NAME, ttl=1.0)  # granted by A (stale) and C (counters lost)
    await mgr.release(lease)
    # Invariant 2 broken: this grant's token is not above every earlier grant's.
    assert lease.token <= max(issued), "expected the unprotected cluster to reuse a token"


async def test_node_joining_a_new_cluster_is_not_quarantined(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    c = own_redis3[2]
    c.kill()
    mgr = await connect(own_redis3)  # A and B start a new cluster; no lock taken yet
    c.start()  # a new empty node joins; it cannot have forgotten any lease
    await wait_until(lambda: reply_bulk(c.command("GET", SYNCED_KEY)) is not None, 3.0, "synced")
    assert quarantine_ms(c) < 0
    own_redis3[0].kill()  # A down: B and the new node C are the quorum
    lease = await mgr.acquire(NAME, ttl=1.0)
    await mgr.release(lease)


def _base(node: RedisNode) -> int:
    marker = reply_bulk(node.command("GET", SYNCED_KEY))
    assert marker is not None, f"{node.url} not synced"
    return int(marker.split(b" ")[0])


def _fcalls(nodes: list[RedisNode]) -> int:
    """FCALLs the nodes ran so far (every lock script of a Redis 7 node is one)."""
    total = 0
    for node in nodes:
        stats = node.command("INFO", "commandstats").decode()
        line = next((x for x in stats.splitlines() if x.startswith("cmdstat_fcall:")), "")
        total += int(line.split("calls=")[1].split(",")[0]) if line else 0
    return total


@pytest.fixture
def later_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each base a resync takes from the clock is 1 ms later than the one before."""
    ticks = iter(range(1_000_000))
    real = resync.wall_clock_base()
    monkeypatch.setattr(resync, "wall_clock_base", lambda: real + 1000 * next(ticks))


async def test_nodes_that_start_a_cluster_together_end_with_one_base(
    own_redis3: list[RedisNode],
    connect: Connect,
    later_clock: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each node's resync starts the new cluster with a base of its own clock reading
    (their markers read before any was written: a slow link); a node marked synced by
    one keeps the largest (mark_synced.lua), so a new name's counters agree on every
    node: its acquire and release are one script a node, no round 2 nor R16's raise."""
    finish = resync.Resyncer._finish

    async def slow_finish(self: resync.Resyncer, *args: Any) -> None:
        await asyncio.sleep(0.1)
        await finish(self, *args)

    monkeypatch.setattr(resync.Resyncer, "_finish", slow_finish)
    mgr = await connect(own_redis3)
    await wait_until(
        lambda: all(reply_bulk(n.command("GET", SYNCED_KEY)) for n in own_redis3), 3.0, "synced"
    )
    assert len({_base(n) for n in own_redis3}) == 1, [_base(n) for n in own_redis3]
    for i in range(3):
        before = _fcalls(own_redis3)
        lease = await mgr.acquire(f"new/name/{i}", ttl=1.0)
        await mgr.release(lease)
        await asyncio.sleep(0.05)  # a late grant's raise (R16) would be sent by now
        assert _fcalls(own_redis3) - before == 6


async def test_node_joining_a_new_cluster_takes_its_base(
    own_redis3: list[RedisNode], connect: Connect, later_clock: None
) -> None:
    """A node that joins a cluster that never granted takes the synced nodes' base, not
    a later clock's: a base above theirs would give every new name's first grant
    different tokens, and a round 2."""
    a, b, c = own_redis3
    c.kill()
    await connect(own_redis3)  # A and B start a new cluster; no lock taken yet
    c.start()
    await wait_until(lambda: reply_bulk(c.command("GET", SYNCED_KEY)) is not None, 3.0, "synced")
    assert _base(c) == _base(a) == _base(b)


async def test_restarted_node_does_not_grant_a_lease_it_forgot(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """Quarantine: C forgot a lease that A and C granted; C and B must not grant it again."""
    a, b, c = own_redis3
    holder, other = await connect(own_redis3), await connect(own_redis3)
    loop = asyncio.get_running_loop()
    await cut_off(holder, b, 1)
    first = await holder.acquire(NAME, ttl=MAX_TTL)  # held on A and C only
    b.resume()
    await wait_until(lambda: node_connected(holder, 1), 3.0, "node B reconnected")
    c.restart(lose_data=True)  # forgets the lease
    await wait_until(lambda: quarantine_ms(c) > 0, 3.0, "node C resynced and quarantined")
    assert first.remaining() > 0.2, "too slow to test inside the lease"

    # B and C would be a majority of free nodes: only the quarantine keeps C out.
    with pytest.raises(LockHeld):
        await other.acquire(NAME, ttl=1.0)
    while True:
        try:
            second = await other.acquire(NAME, ttl=1.0, wait=MAX_TTL + 1.0)
            break
        except QuorumUnavailable:
            assert loop.time() < first.valid_until + 1.0
            await asyncio.sleep(0.02)
    assert loop.time() >= first.valid_until  # granted only once the first lease ran out
    assert second.token > first.token
    await other.release(second)

    # After the quarantine C counts again: without A, B and C make the quorum.
    await wait_until(lambda: copied_again(c), MAX_TTL + 8.0, "node C copied again")
    a.kill()
    third = await other.acquire(NAME, ttl=1.0)
    assert third.token > second.token
    await other.release(third)


async def test_a_gateway_whose_clock_is_behind_and_cannot_reach_a_synced_node_waits(
    own_redis3: list[RedisNode], connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R18: a resync from too few synced nodes is no resync, whatever the wall clock says.

    C restarts empty after grants that B missed. The only gateway left cannot
    reach A (a partition) and its host clock runs an hour behind. Copying C's
    counters from B alone, with a token base from that clock, would let B and C
    issue again tokens that A and C issued: it must wait until a gateway that
    reaches enough synced nodes resyncs C.
    """
    a, b, c = own_redis3
    first = await connect(own_redis3)
    issued: list[int] = []
    for _ in range(3):
        await _grant(first, issued)
    await cut_off(first, b, 1)
    for _ in range(MISSED):
        await _grant(first, issued)  # granted by A and C only
    b.resume()
    await first.close()  # the gateway that could resync C properly is gone
    c.restart(lose_data=True)

    real_clock = resync.wall_clock_base
    monkeypatch.setattr(resync, "wall_clock_base", lambda: real_clock() - 3_600_000_000)
    unreachable_a = f"redis://127.0.0.1:{free_port()}"
    skewed = await LockManager.connect(
        [unreachable_a, b.url, c.url], node_timeout=NODE_TIMEOUT, max_ttl=MAX_TTL
    )
    try:
        await asyncio.sleep(MAX_TTL / 2)
        assert reply_bulk(c.command("GET", SYNCED_KEY)) is None, "C resynced from B alone"
        with pytest.raises(QuorumUnavailable, match="not resynced"):
            await skewed.acquire(NAME, ttl=1.0)

        monkeypatch.undo()
        proper = await connect(own_redis3)  # reaches A and B: resyncs C from both
        await wait_until(lambda: quarantine_ms(c) > 0, 5.0, "node C resynced and quarantined")
        await wait_until(lambda: copied_again(c), MAX_TTL + 8.0, "node C copied again")
        a.kill()
        await proper.close()
        lease = await skewed.acquire(NAME, ttl=1.0, wait=2.0)  # B and C
        assert lease.token > max(issued), (lease.token, max(issued))
        await skewed.release(lease)
    finally:
        await skewed.close()


async def test_a_restarted_node_is_not_taken_for_a_new_one_by_a_gateway_cut_off_from_the_counters(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R18 (review finding): the "new cluster" shortcut needs every node to answer.

    P1, cut off from A, holds a lease granted by B and C (A never saw a counter).
    C restarts empty. P2, a gateway that just started and is cut off from B,
    sees only A (synced, no counter) and C (empty): without the rule it marks C
    as a new node, with no quarantine, and grants the lock on A and C while P1's
    lease is still valid.
    """
    a, b, c = own_redis3
    await (await connect(own_redis3)).close()  # a new cluster: every node synced
    cut = f"redis://127.0.0.1:{free_port()}"
    p1 = await LockManager.connect([cut, b.url, c.url], node_timeout=NODE_TIMEOUT, max_ttl=MAX_TTL)
    p2: LockManager | None = None
    try:
        held = await p1.acquire(NAME, ttl=MAX_TTL)
        c.restart(lose_data=True)
        p2 = await LockManager.connect(
            [a.url, f"redis://127.0.0.1:{free_port()}", c.url],
            node_timeout=NODE_TIMEOUT,
            max_ttl=MAX_TTL,
        )
        while held.remaining() > 0.2:
            with pytest.raises(QuorumUnavailable):
                await p2.acquire(NAME, ttl=1.0)
            await asyncio.sleep(0.1)
        assert reply_bulk(c.command("GET", SYNCED_KEY)) is None
    finally:
        await p1.close()
        if p2 is not None:
            await p2.close()


async def test_a_majority_restarted_is_not_resynced_without_the_node_that_does_not_answer(
    own_redis3: list[RedisNode], connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R18 (review finding): the wall-clock fallback needs every other node to answer.

    A gateway cut off from B sees A and C restart empty; B, the only node with
    the counters, does not answer it, and its clock runs an hour behind: a base
    from that clock would issue tokens below earlier ones. (A gateway that starts
    only after such a loss cannot tell it from a new cluster: a majority that
    lost its data is outside the guarantee, see README.)
    """
    a, _, c = own_redis3
    first = await connect(own_redis3)
    issued: list[int] = []
    for _ in range(5):
        await _grant(first, issued)
    await first.close()
    real_clock = resync.wall_clock_base
    monkeypatch.setattr(resync, "wall_clock_base", lambda: real_clock() - 3_600_000_000)
    skewed = await LockManager.connect(
        [a.url, f"redis://127.0.0.1:{free_port()}", c.url],
        node_timeout=NODE_TIMEOUT,
        max_ttl=MAX_TTL,
    )
    try:
        a.restart(lose_data=True)
        c.restart(lose_data=True)
        await asyncio.sleep(MAX_TTL + 0.5)  # past any quarantine a resync would have set
        for node in (a, c):
            assert reply_bulk(node.command("GET", SYNCED_KEY)) is None
        with pytest.raises(QuorumUnavailable):
            await skewed.acquire(NAME, ttl=1.0)
    finally:
        await skewed.close()


async def test_a_node_that_restarts_again_during_its_resync_is_resynced_again(
    own_redis3: list[RedisNode], connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a resync vouches for the run its copies went to, not a later one.

    C restarts; while its counters are copied from A and B it restarts again
    and loses the part copied from A. Marking the new run synced would leave C
    with B's counters only, and B missed the newest grants.
    """
    a, b, c = own_redis3
    mgr = await connect(own_redis3)
    issued: list[int] = []
    await cut_off(mgr, b, 1)
    for _ in range(MISSED):
        await _grant(mgr, issued)  # granted by A and C only
    b.resume()
    await wait_until(lambda: node_connected(mgr, 1), 3.0, "node B reconnected")

    copy = resync.Resyncer._copy
    restarted_again = False

    async def copy_then_restart(self: resync.Resyncer, source: Node, target: Node) -> int:
        nonlocal restarted_again
        copied = await copy(self, source, target)
        if not restarted_again and source.label.endswith(f":{a.port}"):
            restarted_again = True
            before = target.run_id
            c.restart(lose_data=True)  # loses what was just copied from A
            await wait_until(lambda: target.run_id != before, 5.0, "C's new run seen")
        return copied

    monkeypatch.setattr(resync.Resyncer, "_copy", copy_then_restart)
    c.restart(lose_data=True)
    await wait_until(lambda: restarted_again, 5.0, "C restarted during its resync")
    await wait_until(lambda: quarantine_ms(c) > 0, 10.0, "C resynced (again) and quarantined")
    await wait_until(lambda: copied_again(c), MAX_TTL + 8.0, "node C copied again")
    a.kill()  # B (missed the newest grants) and C must still issue above them
    await _grant(mgr, issued, held_on=c)
    assert issued == sorted(set(issued))


async def test_the_quarantine_lasts_the_longest_max_ttl_of_any_gateway(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R19 (review finding): a gateway with a short max_ttl resyncs a node that a
    gateway with a long one granted leases on: the quarantine must outlast those."""
    c = own_redis3[2]
    long_lived = await connect(own_redis3, max_ttl=30.0)
    short = await connect(own_redis3)  # max_ttl 2 s
    await short.release(await short.acquire(NAME, ttl=1.0))
    await long_lived.close()  # it recorded its max_ttl; only the short one is left
    c.restart(lose_data=True)
    await wait_until(lambda: quarantine_ms(c) > 0, 5.0, "node C resynced and quarantined")
    assert quarantine_ms(c) > 25_000, quarantine_ms(c)


def _raw_acquire(node: RedisNode, lease_id: str, name: str = NAME) -> int:
    """One node runs acquire.lua for ``lease_id``, as a try of some gateway would."""
    info = node.command("INFO", "server").decode()
    run_id = next(x.split(":", 1)[1] for x in info.split("\r\n") if x.startswith("run_id:"))
    keys = lock_keys(name)
    args = (lease_id, "10000", "", "3000", run_id, "raw")
    with redis.Redis.from_url(node.url) as r:
        reply = r.eval(scripts.ACQUIRE.source, len(keys), *keys, *args)
    return int(reply[0])


async def test_a_grant_that_lands_after_the_first_copy_is_copied_again(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R21, the schedule the model check found (tests/model).

    Lease L0's try reaches node 0 (token t), then node 0 restarts empty and is
    resynced from nodes 1 and 2 before L0's try runs on node 1 (token t: L0 holds
    nodes 0 and 1). Lease L1 gets t on node 2. Once node 0's quarantine is over it
    must not grant L1 t as well: it copies the counters again first.
    """
    zero, one, two = own_redis3
    mgr = await connect(own_redis3, max_ttl=1.0)
    issued: list[int] = []
    for _ in range(3):
        await _grant(mgr, issued)
    await wait_until(
        lambda: all(reply_int(n.command("EXISTS", lock_key(NAME))) == 0 for n in own_redis3),
        3.0,
        "the last release ran on every node",
    )
    l0, l1 = "0" * 32, "1" * 32
    t = _raw_acquire(zero, l0)
    assert t > max(issued)
    zero.restart(lose_data=True)
    await wait_until(lambda: quarantine_ms(zero) > 0, 5.0, "node 0 resynced and quarantined")
    assert _raw_acquire(one, l0) == t  # L0's try, late on node 1: L0 holds nodes 0 and 1
    assert _raw_acquire(two, l1) == t  # L1 on node 2
    await wait_until(lambda: copied_again(zero), 10.0, "node 0 copied again")
    assert _raw_acquire(zero, l1) > t  # not L0's token again


async def test_a_second_copy_after_a_second_restart_keeps_tokens_increasing(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R21 with R18's fallback, the schedule the model check found (tests/model).

    As above, L0 holds nodes 0 and 1 with token t, node 0 having forgotten it. Then
    node 1 restarts empty too before node 0's quarantine ends: no node keeps t. Every
    node answers, fewer than N - Q + 1 are synced and not waiting, so node 0's second
    copy cannot find t anywhere; it must start above the wall clock as the first copy
    of a majority-restarted cluster does, else L1 gets t again on nodes 0 and 2.
    """
    zero, one, two = own_redis3
    mgr = await connect(own_redis3, max_ttl=3.0)
    issued: list[int] = []
    for _ in range(3):
        await _grant(mgr, issued)
    await wait_until(
        lambda: all(reply_int(n.command("EXISTS", lock_key(NAME))) == 0 for n in own_redis3),
        3.0,
        "the last release ran on every node",
    )
    l0, l1 = "0" * 32, "1" * 32
    t = _raw_acquire(zero, l0)
    assert t > max(issued)
    zero.restart(lose_data=True)
    await wait_until(lambda: quarantine_ms(zero) > 0, 5.0, "node 0 resynced and quarantined")
    assert _raw_acquire(one, l0) == t  # L0's try, late on node 1: L0 holds nodes 0 and 1
    one.restart(lose_data=True)  # within node 0's quarantine (3 s)
    assert quarantine_ms(zero) > 0, "node 1 restarted too late for this schedule"
    await wait_until(lambda: copied_again(zero), 15.0, "node 0 copied again")
    assert _raw_acquire(two, l1) == t  # L1 on node 2, which never saw t
    assert _raw_acquire(zero, l1) > t  # not L0's token again
