"""Hand-over: a release grants the lock to the next queued waiter in the same script.

The bookkeeping (``Pending``) is tested alone; the rest against real nodes:
no round trip of the waiter's own, a validity that never outlasts the nodes'
locks, splits between nodes that resolve by ticket, cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import redis

from lockservice import LockManager
from lockservice.acquire import try_decider
from lockservice.cleanup import Cleanups, release_args
from lockservice.handover import Handovers, Pending
from lockservice.protocol import RELEASE_CHANNEL, drift, lock_keys
from lockservice.redlock import Redlock
from lockservice.replies import Failure, Granted, Held
from lockservice.scripts import RELEASE
from lockservice.waiters import Waiters
from tests._servers import RedisNode
from tests.lockservice.test_waiting import script_calls

TTL = 10.0
CUT = TTL - drift(TTL)


# ------------------------------------------------------------ Pending alone
def test_a_handed_over_grant_counts_from_the_last_refused_try() -> None:
    p = Pending("n", 3, TTL, start=100.0)
    p.refused(0, 101.0, counter=6)
    p.refused(0, 100.5, counter=5)  # an older try answering late moves nothing back
    p.handed(0, 7)
    p.handed(1, 7)  # node 1 never answered a try: counts from the first try
    assert p.grants[0].since == 101.0
    assert p.grants[1].since == 100.0
    assert p.lease(now=101.0) == (7, 100.0 + CUT, True)


def test_a_quorum_of_valid_grants_makes_the_lease_and_the_highest_token_wins() -> None:
    p = Pending("n", 3, TTL, start=0.0)
    p.handed(0, 5)
    assert p.lease(now=1.0) is None
    p.granted(2, 9, sent=3.0)
    token, valid_until, agreed = p.lease(now=3.5)  # type: ignore[misc]
    assert (token, agreed) == (9, False)  # round 2 needed
    assert valid_until == 0.0 + CUT  # the second-latest end: a quorum holds until then
    assert p.lease(now=CUT + 0.1) is None  # node 0's grant ran out: no quorum left


def test_a_semaphore_waiter_holds_once_every_node_handed_it_over() -> None:
    """R32: two of three hand-overs are no semaphore lease; the third makes it, valid
    until the earliest grant ends."""
    p = Pending("n", 3, TTL, start=0.0, need=3)
    p.handed(0, 5)
    p.granted(2, 9, sent=3.0)
    assert p.lease(now=3.5) is None
    p.granted(1, 8, sent=2.0)
    assert p.lease(now=3.5) == (9, 0.0 + CUT, False)


def test_an_undo_sets_grants_aside_until_each_node_answers() -> None:
    p = Pending("n", 3, TTL, start=0.0)
    p.handed(0, 5)
    p.handed(1, 5)
    assert p.park() == {0: 5, 1: 5}
    assert p.lease(now=1.0) is None  # nothing counts while the undo is out
    p.undone(0, 5, 5)  # kept
    p.undone(1, 5, -5)  # given to an earlier waiter
    assert set(p.grants) == {0}
    p.handed(1, 5)  # that grant's message, arriving after the undo's answer
    assert set(p.grants) == {0}
    p.handed(1, 6)  # a new hand-over after the earlier waiter released
    assert p.lease(now=1.0) == (6, CUT, False)


def test_a_message_older_than_a_queued_answer_is_ignored() -> None:
    """A hand-over whose token a node's later "queued" answer already counted is gone:
    the grant ran out or was given away before that answer."""
    p = Pending("n", 3, TTL, start=0.0)
    p.handed(0, 7)
    p.refused(0, 2.0, counter=7)  # node 0 no longer holds it for us
    assert 0 not in p.grants
    p.handed(0, 7)  # the same message, delivered again late
    assert 0 not in p.grants
    p.handed(1, 8)
    p.refused(1, 2.0, counter=7)  # a hand-over after that answer (8 > 7) stands
    assert p.grants[1].token == 8


def test_a_hand_over_message_older_than_our_confirmation_is_ignored() -> None:
    """Node 0 handed us token 7; our try confirmed it anew as 8; an undo gave 8 to an
    earlier waiter; then the hand-over's own message (7) arrives: it holds nothing."""
    p = Pending("n", 3, TTL, start=0.0)
    p.granted(0, 8, sent=1.0)
    assert p.park() == {0: 8}
    p.undone(0, 8, -8)
    p.handed(0, 7)
    assert 0 not in p.grants


def test_a_lost_undo_answer_makes_the_node_suspect_until_a_try_answers() -> None:
    p = Pending("n", 3, TTL, start=0.0)
    p.handed(0, 7)
    p.park()
    p.undone(0, 7, None)  # the undo may still run on the node, unseen
    p.handed(0, 7)
    p.handed(0, 9)
    assert 0 not in p.grants
    p.granted(0, 9, sent=1.0)  # our own try's answer: trusted again
    assert p.grants[0].token == 9


def test_nothing_a_node_says_counts_while_an_undo_to_it_is_unanswered() -> None:
    """A try's late grant, answered just before the undo that gives it away, must not
    make a lease in between: two leases would hold the lock at once."""
    p = Pending("n", 3, TTL, start=0.0)
    p.handed(0, 7)
    p.handed(1, 7)
    assert p.park() == {0: 7, 1: 7}  # the failed try's undos are on their way
    p.granted(1, 7, sent=0.5)  # the try's answer from node 1, late
    assert p.lease(now=1.0) is None
    p.undone(1, 7, -7)  # ... and the undo gave that grant to an earlier waiter
    p.undone(0, 7, 7)  # node 0 kept its hand-over
    assert set(p.grants) == {0}
    p.handed(2, 9)  # a hand-over from a node no undo went to
    assert p.lease(now=1.0) == (9, CUT, False)


def test_a_try_decides_held_only_once_the_node_it_holds_answered() -> None:
    """R33: a node whose grant the waiter holds (``before``) counts toward a lease
    before it answers, but "held" or "unavailable" waits for its answer (the answer
    is the token the undo must name: the try re-issued the grant, R12)."""
    decided = try_decider(frozenset({2}), 2)
    down = Failure("down", down=True)
    held = Held(pttl=0, counter=5)
    assert not decided([down, held, None])  # before R33: decided on node 1's "held"
    assert decided([down, held, Granted(6)])  # its re-issued grant: held, usable 2
    assert decided([down, held, down])  # it failed: unavailable, its grant given up
    assert decided([None, Granted(7), None])  # a lease need not wait for it
    assert decided([down, Granted(7), down])  # nor lose its grant when it is down
    assert decided([held, held, None])  # a quorum holds it: known without it
    assert not try_decider(frozenset(), 2)([down, held, None])  # node 2 may grant


def test_a_lease_is_contended_only_when_it_waited_behind_others() -> None:
    """The release of a lease granted after a "held" answer or a hand-over goes out at
    once (``Handovers.contended``); one granted at once does not, even when a node's
    late answer left it queued there (``Pending.queued``, R16)."""
    handovers = Handovers(0.01, Waiters(), Cleanups([], "p", horizon=1.0))
    late = handovers.open("late", Pending("n", 3, TTL, start=0.0))
    late.granted(0, 7, sent=0.0)
    late.granted(1, 7, sent=0.0)
    late.queued = True  # node 2 had not answered when the try was decided
    handovers.close("late", 7)
    waited = handovers.open("waited", Pending("n", 3, TTL, start=0.0))
    waited.refused(0, 0.0, counter=6)
    waited.handed(0, 7)
    waited.handed(1, 7)
    handovers.close("waited", 7)
    handovers.open("gave-up", Pending("n", 3, TTL, start=0.0)).refused(0, 0.0, counter=6)
    handovers.close("gave-up")
    assert not handovers.contended("late")
    assert handovers.contended("waited")
    assert not handovers.contended("waited")  # asked once, at the release
    assert not handovers.contended("gave-up")


# ------------------------------------------------------------ real nodes
def client(node: RedisNode) -> redis.Redis:
    return redis.Redis.from_url(node.url)


async def queued(nodes: list[RedisNode], name: str, count: int) -> None:
    for _ in range(200):
        if all(client(n).zcard(f"waitq:{{{name}}}") == count for n in nodes):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} waiters never queued on every node")


async def test_a_release_hands_the_lock_over_without_a_try_of_the_waiter(
    redis3: list[RedisNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lockservice.manager._BACKOFF_QUEUED", 30.0)  # no polling at all
    urls = [n.url for n in redis3]
    holder_mgr, waiter_mgr = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        # the first grant of a name may find the nodes' counters apart (a round 2):
        # the claim is about the steady state
        await holder_mgr.release(await holder_mgr.acquire("hand/over", ttl=20.0))
        lease = await holder_mgr.acquire("hand/over", ttl=20.0)
        await asyncio.sleep(0.05)  # every node has answered
        waiter = asyncio.create_task(waiter_mgr.acquire("hand/over", ttl=5.0, wait=20.0))
        await queued(redis3, "hand/over", 1)
        for node in redis3:
            node.command("CONFIG", "RESETSTAT")
        loop = asyncio.get_running_loop()
        released_at = loop.time()
        await holder_mgr.release(lease)
        got = await asyncio.wait_for(waiter, 5.0)
        latency = loop.time() - released_at
        assert latency < 0.05, f"granted {latency * 1000:.0f} ms after the release"
        assert got.token > lease.token
        # one script a node: the release, which granted; the waiter sent nothing
        assert [script_calls(n) for n in redis3] == [1, 1, 1]
        for node in redis3:
            assert client(node).get("lock:{hand/over}") == f"{got.lease_id}:{got.token}".encode()
        await waiter_mgr.release(got)
    finally:
        await holder_mgr.close()
        await waiter_mgr.close()


def release_on_every_node(
    nodes: list[RedisNode], backend: Redlock, name: str, lease_id: str
) -> None:
    """The holder's release, run synchronously: the event loop sees nothing meanwhile."""
    keys = lock_keys(name)
    for node, redis_node in zip(nodes, backend.nodes, strict=True):
        with redis.Redis.from_url(node.url) as r:
            args = release_args(lease_id, name, "holder", redis_node.run_id or "")
            assert r.eval(RELEASE.source, len(keys), *keys, *args) == 1


async def test_a_late_message_never_stretches_the_validity(redis3: list[RedisNode]) -> None:
    """The waiter's process is busy for 0.5 s after the nodes handed it the lock.

    Counting the grant from the message's arrival would claim 0.5 s the nodes
    never promised; it must count from the waiter's last refused try.
    """
    urls = [n.url for n in redis3]
    holder_mgr, waiter_mgr = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        lease = await holder_mgr.acquire("hand/late", ttl=20.0)
        waiter = asyncio.create_task(waiter_mgr.acquire("hand/late", ttl=3.0, wait=20.0))
        await queued(redis3, "hand/late", 1)
        backend = waiter_mgr.backend
        assert isinstance(backend, Redlock)
        release_on_every_node(redis3, backend, "hand/late", lease.lease_id)
        time.sleep(0.5)  # noqa: ASYNC251 - block the loop: the hand-overs wait in the sockets
        got = await asyncio.wait_for(waiter, 5.0)
        now = asyncio.get_running_loop().time()
        held_for = sorted(client(n).pttl("lock:{hand/late}") / 1000 for n in redis3)
        assert got.valid_until - now <= held_for[1], (got.valid_until - now, held_for)
    finally:
        await holder_mgr.close()
        await waiter_mgr.close()


async def test_waiters_split_between_nodes_are_all_served_soon(
    redis3: list[RedisNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each node missed different waiters and hands the lock to a different one.

    Nobody holds a quorum. Their next tries join every queue by ticket, and an
    undo gives a grant up to an earlier waiter queued there: all three are
    served within a few poll intervals, never after a TTL, never two at once.
    (Which one first depends on which tries reach which node first.)
    """
    monkeypatch.setattr("lockservice.manager._BACKOFF_QUEUED", 1.0)
    urls = [n.url for n in redis3]
    holder_mgr = await LockManager.connect(urls, max_ttl=60.0)
    managers = [await LockManager.connect(urls, max_ttl=60.0) for _ in range(3)]
    held: list[tuple[int, float, float, int]] = []  # waiter, start, end, token
    try:
        lease = await holder_mgr.acquire("hand/split", ttl=60.0)

        async def waiter(i: int) -> None:
            got = await managers[i].acquire("hand/split", ttl=60.0, wait=30.0)
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.sleep(0.05)
            held.append((i, start, loop.time(), got.token))
            await managers[i].release(got)

        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(waiter(i)))
            await queued(redis3, "hand/split", i + 1)
            await asyncio.sleep(0.002)  # distinct tickets, in this order
        members = client(redis3[0]).zrange("waitq:{hand/split}", 0, -1)
        # node 1 never saw waiter 0; node 2 saw neither waiter 0 nor waiter 1
        for node, missed in ((redis3[1], members[:1]), (redis3[2], members[:2])):
            with client(node) as r:
                r.zrem("waitq:{hand/split}", *missed)
                r.zrem("waitx:{hand/split}", *missed)
                r.hdel("waitt:{hand/split}", *missed)
        loop = asyncio.get_running_loop()
        released_at = loop.time()
        await holder_mgr.release(lease)
        await asyncio.wait_for(asyncio.gather(*tasks), 20.0)
        assert loop.time() - released_at < 10.0  # a TTL is 60 s
        assert sorted(h[0] for h in held) == [0, 1, 2]
        tokens = [h[3] for h in held]
        assert tokens == sorted(set(tokens))
        assert tokens[0] > lease.token
        for a, b in itertools.pairwise(held):
            assert a[2] <= b[1], "two waiters held the lock at once"
    finally:
        for task in tasks:
            task.cancel()
        for mgr in (holder_mgr, *managers):
            await mgr.close()


async def test_a_waiter_cancelled_with_part_of_a_hand_over_leaves_nothing_behind(
    redis3: list[RedisNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lockservice.manager._BACKOFF_QUEUED", 30.0)
    urls = [n.url for n in redis3]
    holder_mgr, waiter_mgr = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        lease = await holder_mgr.acquire("hand/cancel", ttl=20.0)
        waiter = asyncio.create_task(waiter_mgr.acquire("hand/cancel", ttl=20.0, wait=20.0))
        await queued(redis3, "hand/cancel", 1)
        for node in redis3[1:]:  # only node 0 will hand it over
            client(node).delete("waitq:{hand/cancel}", "waitx:{hand/cancel}", "waitt:{hand/cancel}")
        await holder_mgr.release(lease)
        for _ in range(100):
            if client(redis3[0]).exists("lock:{hand/cancel}"):
                break
            await asyncio.sleep(0.01)
        assert not waiter.done()  # one grant of three is no lease
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        got = await holder_mgr.acquire("hand/cancel", ttl=1.0)  # at once, no wait
        assert got.token > lease.token
    finally:
        await holder_mgr.close()
        await waiter_mgr.close()


async def test_a_malformed_message_on_the_release_channel_stops_nothing(
    redis3: list[RedisNode],
) -> None:
    """Whoever can publish on a process's channel must not stop its hand-overs."""
    urls = [n.url for n in redis3]
    holder_mgr, waiter_mgr = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        backend = waiter_mgr.backend
        assert isinstance(backend, Redlock)
        channel = f"{RELEASE_CHANNEL}:{backend._process}"
        for node in redis3:
            client(node).publish(channel, "hand/bad\nx\ny\nnot-a-token")
            client(node).publish(channel, b"\xff\xfe")
        lease = await holder_mgr.acquire("hand/bad", ttl=5.0)
        waiter = asyncio.create_task(waiter_mgr.acquire("hand/bad", ttl=3.0, wait=5.0))
        await queued(redis3, "hand/bad", 1)
        await holder_mgr.release(lease)
        got = await asyncio.wait_for(waiter, 3.0)
        assert got.token > lease.token
        reader = backend._reader
        assert reader is not None
        assert not reader.done()  # still reading: replays, resyncs and hand-overs go on
        await waiter_mgr.release(got)
    finally:
        await holder_mgr.close()
        await waiter_mgr.close()
