"""Each Lua script alone on a real redis-server, through redis-py.

Every test runs twice: the scripts sent by EVAL of their source (as on a node
before Redis 7) and by FCALL of their function in the library (``scripts.LIBRARY``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from lockservice import scripts
from lockservice.cleanup import release_args, undo_args
from lockservice.protocol import RELEASE_CHANNEL as CHAN
from tests._servers import RedisNode

LOCK, FENCE, SYNCED, QUAR = "lock:{n}", "fence:{n}", "fencegate:synced", "fencegate:quarantine"
WAITQ, WAITX, WAITT = "waitq:{n}", "waitx:{n}", "waitt:{n}"
HOLDERS, HOLDERT = "holders:{n}", "holdert:{n}"
KEYS = [LOCK, FENCE, SYNCED, QUAR, WAITQ, WAITX, WAITT, HOLDERS, HOLDERT]
INSPECT_KEYS = [LOCK, FENCE, SYNCED, HOLDERS, HOLDERT]
RAISE_KEYS = [FENCE, LOCK, HOLDERS, HOLDERT]
ID_A, ID_B = "a" * 32, "b" * 32
BASE = 1_700_000_000_000_000
RUN_ID = "r" * 40


class Client(redis.Redis):
    """A client that runs the scripts by FCALL (``by_fcall``) or by EVAL."""

    by_fcall = False


@pytest.fixture(params=["eval", "fcall"])
def r(redis1: list[RedisNode], request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    client = Client.from_url(redis1[0].url)
    if request.param == "fcall":
        client.by_fcall = True
        client.function_load(scripts.LIBRARY.decode(), replace=True)  # the same code
    client.set(SYNCED, f"{BASE} {RUN_ID}")
    yield client
    client.close()


def run(r: redis.Redis, script: scripts.Script, keys: list[str], args: list[object]) -> object:
    if isinstance(r, Client) and r.by_fcall:
        return r.fcall(script.function.decode(), len(keys), *keys, *args)
    return r.eval(script.source, len(keys), *keys, *args)


PROC = "p1"  # the caller's process id


def acquire(
    r: redis.Redis, lease_id: str, ttl: int = 10_000, ticket: str = "", proc: str = PROC
) -> object:
    return run(r, scripts.ACQUIRE, KEYS, [lease_id, ttl, ticket, 3_000, RUN_ID, proc])


def release(r: redis.Redis, lease_id: str, proc: str = PROC) -> object:
    return run(r, scripts.RELEASE, KEYS, list(release_args(lease_id, "n", proc, RUN_ID)))


def undo(r: redis.Redis, lease_id: str, ticket: str, ttl: int = 10_000, token: str = "") -> object:
    """Undo a failed try's grant, as a waiter with ``ticket`` does; a queued waiter
    names the grant's ``token``."""
    args = undo_args(lease_id, "n", PROC, RUN_ID, ticket=ticket, spec=str(ttl), grant=token)
    return run(r, scripts.UNDO, KEYS, list(args))


def listen(r: redis.Redis, *channels: str) -> redis.client.PubSub:
    pubsub = r.pubsub()
    pubsub.subscribe(*channels)
    for _ in channels:
        pubsub.get_message(timeout=1)
    return pubsub


def member(lease_id: str, proc: str = PROC) -> bytes:
    return f"{lease_id}@{proc}".encode()


def test_acquire_grants_and_issues_token_above_base(r: redis.Redis) -> None:
    assert acquire(r, ID_A) == [BASE + 1, 0]
    assert r.get(LOCK) == f"{ID_A}:{BASE + 1}".encode()  # all 16 digits, no float format
    assert 9_000 < r.pttl(LOCK) <= 10_000


def test_acquire_refuses_other_lease_with_its_pttl(r: redis.Redis) -> None:
    acquire(r, ID_A, 5_000)
    token, pttl, counter = acquire(r, ID_B)  # type: ignore[misc]
    assert token == 0
    assert 4_000 < pttl <= 5_000
    assert counter == BASE + 1  # a hand-over after this answer counts above it
    assert int(r.get(FENCE)) == BASE + 1  # a refusal issues nothing


def test_acquire_counts_up_and_never_below_an_existing_counter(r: redis.Redis) -> None:
    r.set(FENCE, BASE + 500)
    assert acquire(r, ID_A)[0] == BASE + 501  # type: ignore[index]


def test_acquire_on_unsynced_or_quarantined_node(r: redis.Redis) -> None:
    r.set(QUAR, 1, px=3_000)
    code, pttl = acquire(r, ID_A)  # type: ignore[misc]
    assert code == -1
    assert 2_000 < pttl <= 3_000
    r.delete(QUAR)
    r.set(SYNCED, f"{BASE} {'x' * 40}")  # synced in an earlier run of the server
    assert acquire(r, ID_A) == [-2, 0]
    r.delete(SYNCED)
    assert acquire(r, ID_A) == [-2, 0]
    assert r.get(LOCK) is None
    assert r.get(FENCE) is None


def test_release_only_by_owner_keeps_counter_and_tells_nobody_when_none_waits(
    r: redis.Redis,
) -> None:
    acquire(r, ID_A)
    pubsub = listen(r, CHAN, f"{CHAN}:{PROC}")
    assert release(r, ID_B) == 0
    assert release(r, ID_A[:-1]) == 0  # a prefix is no owner
    assert r.get(LOCK) is not None
    assert release(r, ID_A) == 1
    assert pubsub.get_message(timeout=0.1) is None  # nobody queued: no message at all
    assert r.get(LOCK) is None
    assert int(r.get(FENCE)) == BASE + 1
    pubsub.close()


def test_extend_only_by_owner_and_never_recreates(r: redis.Redis) -> None:
    acquire(r, ID_A, 1_000)
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_B, 60_000]) == 0
    assert (
        run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 60_000]) == BASE + 1
    )  # the lease's token
    assert r.pttl(LOCK) > 50_000
    r.delete(LOCK)
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 60_000]) == 0
    assert r.get(LOCK) is None


def test_raise_fence_is_a_max_and_records_the_token(r: redis.Redis) -> None:
    acquire(r, ID_A)
    target = BASE + 7
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [target, ID_A]) == target
    assert r.get(LOCK) == f"{ID_A}:{target}".encode()
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 2, ""]) == 0  # A holds it
    assert int(r.get(FENCE)) == target  # never lowers
    assert r.get(LOCK) == f"{ID_A}:{target}".encode()


def test_raise_fence_does_not_count_a_node_another_lease_holds(r: redis.Redis) -> None:
    """That lease's grant is older than the raise: its quorum may not be above it."""
    acquire(r, ID_A)
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 9, ID_B]) == 0
    assert int(r.get(FENCE)) == BASE + 9  # raised all the same
    assert r.get(LOCK) == f"{ID_A}:{BASE + 1}".encode()
    release(r, ID_A)
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 10, ID_B]) == BASE + 10  # free


def test_inspect_never_reveals_the_lease_id(r: redis.Redis) -> None:
    assert run(r, scripts.INSPECT, INSPECT_KEYS, [RUN_ID]) == [0, 0, 0, 0, 0, 0]
    acquire(r, ID_A)
    token, pttl, counter, holders, kind, permits = run(r, scripts.INSPECT, INSPECT_KEYS, [RUN_ID])  # type: ignore[misc]
    assert token == counter == BASE + 1
    assert pttl > 0
    assert (holders, kind, permits) == (1, 1, 0)  # one exclusive holder
    r.delete(SYNCED)
    assert run(r, scripts.INSPECT, INSPECT_KEYS, [RUN_ID]) == [-2]


def test_resync_raises_counters_only_upwards(r: redis.Redis) -> None:
    r.set("fence:{x}", 50)
    r.set("fence:{y}", 5)
    raised = run(r, scripts.RESYNC, ["fence:{x}", "fence:{y}", "fence:{z}"], [40, 9, BASE + 3])
    assert raised == 2
    assert [int(r.get(k)) for k in ("fence:{x}", "fence:{y}", "fence:{z}")] == [50, 9, BASE + 3]


def test_mark_synced_sets_base_upwards_and_quarantines(r: redis.Redis) -> None:
    new_run = "n" * 40
    assert run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE - 1, 2_000, new_run]) == 1
    assert r.get(SYNCED) == f"{BASE} {new_run}".encode()
    assert 1_000 < r.pttl(QUAR) <= 2_000
    # another process already synced it in this run: no new quarantine, and only a
    # larger base is taken (resyncs that start a cluster together end with one base)
    r.delete(QUAR)
    assert run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE - 7, 9_000, new_run]) == 0
    assert r.get(SYNCED) == f"{BASE} {new_run}".encode()
    assert run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE + 5, 9_000, new_run]) == 0
    assert r.get(SYNCED) == f"{BASE + 5} {new_run}".encode()
    assert r.get(QUAR) is None
    later_run = "m" * 40  # the server restarted: a new run is synced, base only upwards
    run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE + 9, 0, later_run])
    assert r.get(SYNCED) == f"{BASE + 9} {later_run}".encode()
    run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE + 2, 0, "l" * 40])
    assert r.get(SYNCED) == f"{BASE + 9} {'l' * 40}".encode()


def test_recopied_clears_the_flag_and_raises_the_base_only_upwards(r: redis.Redis) -> None:
    run_id = "n" * 40
    flag = QUAR + ":recopy"
    assert run(r, scripts.MARK_SYNCED, [SYNCED, QUAR], [BASE, 2_000, run_id]) == 1
    assert r.exists(flag) == 1
    assert run(r, scripts.RECOPIED, [SYNCED, QUAR], [run_id, BASE - 7]) == 1
    assert r.get(SYNCED) == f"{BASE} {run_id}".encode()  # a lower base changes nothing
    assert r.exists(flag) == 0
    r.set(flag, 1)
    assert run(r, scripts.RECOPIED, [SYNCED, QUAR], [run_id, BASE + 7]) == 1  # R18's fallback
    assert r.get(SYNCED) == f"{BASE + 7} {run_id}".encode()
    r.set(flag, 1)
    assert run(r, scripts.RECOPIED, [SYNCED, QUAR], ["m" * 40, BASE + 9]) == 0  # another run
    assert r.get(SYNCED) == f"{BASE + 7} {run_id}".encode()
    assert r.exists(flag) == 1


def test_script_shas_match_their_sources(r: redis.Redis) -> None:
    for script in scripts.ALL:
        assert r.script_load(script.source) == script.sha.decode()


def test_over_maxmemory_a_lease_is_extended_and_released_and_no_grant_is_made(
    r: redis.Redis,
) -> None:
    """A full node (noeviction, over maxmemory), by EVAL and by FCALL alike: the scripts
    that only delete or expire, and the read-only ones, run (functions flagged
    ``allow-oom`` or ``no-writes``); a grant is refused and leaves nothing behind."""
    assert acquire(r, ID_A) == [BASE + 1, 0]
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.set("x", 1)
        assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 60_000]) == BASE + 1
        assert r.pttl(LOCK) > 30_000
        inspected = run(r, scripts.INSPECT, INSPECT_KEYS, [RUN_ID])
        assert isinstance(inspected, list)
        assert [inspected[0], inspected[2], inspected[3]] == [BASE + 1, BASE + 1, 1]
        assert run(r, scripts.STATE, [SYNCED, QUAR], [RUN_ID]) == [1, 0]
        assert run(r, scripts.FIND, KEYS, ["t" * 32, RUN_ID]) == [0]
        assert run(r, scripts.RECOPIED, [SYNCED, QUAR], [RUN_ID]) == 1
        assert undo(r, ID_B, "") == 0
        assert release(r, ID_A) == 1
        assert r.exists(LOCK) == 0
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            acquire(r, ID_B)
        assert r.exists(LOCK) == 0
        assert r.get(FENCE) == str(BASE + 1).encode()  # no token issued
    finally:
        r.config_set("maxmemory", 0)
    assert acquire(r, ID_B) == [BASE + 2, 0]


def test_release_hands_the_lock_to_the_earliest_queued_waiter(r: redis.Redis) -> None:
    id_c = "c" * 32
    acquire(r, ID_A)
    assert acquire(r, ID_B, ttl=7_000, ticket="1000.5", proc="p2")[0] == 0  # type: ignore[index]
    assert acquire(r, id_c, ticket="2000")[0] == 0  # type: ignore[index]
    pubsub = listen(r, CHAN, f"{CHAN}:p1", f"{CHAN}:p2")
    assert release(r, ID_A) == 1
    message = pubsub.get_message(timeout=1)
    assert message is not None
    # only the head waiter's process hears it: name, released lease, new holder, its token
    assert message["channel"] == f"{CHAN}:p2".encode()
    assert message["data"] == f"n\n{ID_A}\n{ID_B}\n{BASE + 2}".encode()
    assert pubsub.get_message(timeout=0.1) is None
    assert r.get(LOCK) == f"{ID_B}:{BASE + 2}".encode()
    assert 6_000 < r.pttl(LOCK) <= 7_000  # the ttl B asked for
    assert r.zrange(WAITQ, 0, -1) == [member(id_c)]
    assert r.hkeys(WAITT) == [member(id_c)]
    assert acquire(r, ID_A, ticket="3000")[0] == 0  # type: ignore[index]  # no barging back
    assert acquire(r, id_c, ticket="2000")[0] == 0  # type: ignore[index]  # nor jumping ahead
    # B's own try, on its way while the hand-over happened: the grant issued anew
    r.pexpire(LOCK, 1_000)
    assert acquire(r, ID_B, ttl=7_000, ticket="1000.5", proc="p2") == [BASE + 3, 0]
    assert r.pttl(LOCK) > 6_000
    assert r.get(LOCK) == f"{ID_B}:{BASE + 3}".encode()
    # so an undo of the handed-over grant, delivered late, finds nothing to take
    assert undo(r, ID_B, ticket="1000.5", token=str(BASE + 2)) == 0
    assert r.get(LOCK) == f"{ID_B}:{BASE + 3}".encode()
    assert r.zrange(WAITQ, 0, -1) == [member(id_c), member(ID_A)]
    pubsub.close()


def test_a_node_that_cannot_grant_wakes_the_waiter_instead(r: redis.Redis) -> None:
    acquire(r, ID_A)
    acquire(r, ID_B, ticket="1")
    pubsub = listen(r, f"{CHAN}:{PROC}")
    r.set(QUAR, 1, px=60_000)  # quarantined meanwhile: grants nothing
    assert release(r, ID_A) == 1
    message = pubsub.get_message(timeout=1)
    assert message is not None
    assert message["data"] == f"n\n{ID_A}\n{ID_B}".encode()  # no token: try again
    assert r.get(LOCK) is None
    assert r.zrange(WAITQ, 0, -1) == [member(ID_B)]
    assert int(r.get(FENCE)) == BASE + 1
    pubsub.close()


def test_dead_waiters_expire_from_the_queue(r: redis.Redis) -> None:
    acquire(r, ID_A, ttl=100)
    run(r, scripts.ACQUIRE, KEYS, [ID_B, 10_000, "1", 50, RUN_ID, PROC])  # keepalive 50 ms
    time.sleep(0.2)  # B never comes back; A's lock expired too
    assert acquire(r, "c" * 32, ticket="5")[0] == BASE + 2  # type: ignore[index]
    assert r.exists(WAITQ, WAITX, WAITT) == 0  # empty queues leave no keys behind


def test_a_dead_waiter_is_not_handed_the_lock(r: redis.Redis) -> None:
    acquire(r, ID_A)
    run(r, scripts.ACQUIRE, KEYS, [ID_B, 10_000, "1", 50, RUN_ID, PROC])  # keepalive 50 ms
    acquire(r, "c" * 32, ticket="2")
    time.sleep(0.1)  # B's process died; C keeps trying
    acquire(r, "c" * 32, ticket="2")
    assert release(r, ID_A) == 1
    assert r.get(LOCK) == f"{'c' * 32}:{BASE + 2}".encode()
    assert r.exists(WAITQ, WAITX, WAITT) == 0


def test_giving_up_leaves_the_queue_and_hands_the_lock_to_the_next(r: redis.Redis) -> None:
    acquire(r, ID_A, ttl=100)
    acquire(r, ID_B, ticket="1")
    acquire(r, "c" * 32, ticket="2")
    time.sleep(0.15)  # A expired, B was about to take it but gives up
    pubsub = listen(r, f"{CHAN}:{PROC}")
    assert release(r, ID_B) == 0
    assert r.get(LOCK) == f"{'c' * 32}:{BASE + 2}".encode()
    message = pubsub.get_message(timeout=1)
    assert message is not None
    assert message["data"] == f"n\n{ID_B}\n{'c' * 32}\n{BASE + 2}".encode()
    assert r.exists(WAITQ) == 0
    pubsub.close()


def test_undoing_a_partial_grant_keeps_the_queue_place(r: redis.Redis) -> None:
    acquire(r, ID_A, ticket="1")
    acquire(r, ID_B, ticket="2")  # queued behind A's hold
    assert 0 < r.pttl(WAITQ) <= 6_000  # queues of forgotten names expire
    assert undo(r, ID_B, ticket="") == 0  # not its grant: the queue stays
    assert r.zrange(WAITQ, 0, -1) == [member(ID_B)]
    assert release(r, ID_B) == 0
    assert r.exists(WAITQ) == 0


def test_undo_of_a_try_without_waiting_gives_the_grant_up(r: redis.Redis) -> None:
    acquire(r, ID_A)
    acquire(r, ID_B, ticket="1")  # queued meanwhile
    assert undo(r, ID_A, ticket="") == -(BASE + 1)
    assert r.get(LOCK) == f"{ID_B}:{BASE + 2}".encode()  # handed to the waiter
    assert undo(r, ID_A, ticket="") == 0  # holds nothing any more


def test_undo_keeps_a_handed_over_grant_unless_an_earlier_waiter_is_queued(
    r: redis.Redis,
) -> None:
    acquire(r, ID_A)
    acquire(r, ID_B, ticket="2")
    release(r, ID_A)  # handed to B
    assert undo(r, ID_B, ticket="2", token=str(BASE + 2)) == BASE + 2  # nobody earlier: kept
    assert r.get(LOCK) == f"{ID_B}:{BASE + 2}".encode()
    id_c = "c" * 32
    acquire(r, id_c, ticket="1")  # an earlier waiter this node had not seen
    assert undo(r, ID_B, ticket="2", ttl=5_000, token=str(BASE + 2)) == -(BASE + 2)
    assert r.get(LOCK) == f"{id_c}:{BASE + 3}".encode()
    assert r.zrange(WAITQ, 0, -1) == [member(ID_B)]  # B queues again with its ticket
    assert r.zscore(WAITQ, member(ID_B)) == 2
    assert r.hget(WAITT, member(ID_B)) == b"5000"


def test_an_undo_naming_an_older_grant_takes_nothing(r: redis.Redis) -> None:
    """R13: a queued waiter's undo names its grant, so one delivered late (stuck in a
    dropped connection) cannot take a grant issued anew after it (R12)."""
    acquire(r, ID_A)
    acquire(r, ID_B, ticket="2")
    release(r, ID_A)  # handed to B with BASE + 2
    assert acquire(r, ID_B, ticket="2")[0] == BASE + 3  # type: ignore[index]  # confirmed anew
    assert undo(r, ID_B, ticket="", token=str(BASE + 2)) == 0  # the late undo of the old one
    assert r.get(LOCK) == f"{ID_B}:{BASE + 3}".encode()
    assert undo(r, ID_B, ticket="") == -(BASE + 3)  # unnamed, it would have taken it


def test_a_waiter_the_node_had_not_seen_takes_its_place_by_ticket(r: redis.Redis) -> None:
    """After a node restart its queue is rebuilt in ticket order, not arrival order."""
    acquire(r, ID_A, ttl=100)
    acquire(r, ID_B, ticket="2000")  # B reached this node, the earlier A-waiter C had not
    time.sleep(0.15)  # the holder expired
    id_c = "c" * 32
    assert acquire(r, id_c, ticket="1000")[0] == BASE + 2  # type: ignore[index]
    assert r.zrange(WAITQ, 0, -1) == [member(ID_B)]


def test_undo_breaks_a_ticket_tie_like_the_queue(r: redis.Redis) -> None:
    """Two waiters with the same ticket: the queue orders them by member, on every
    node alike, and the undo follows that order (else each would keep its node)."""
    id_c = "c" * 32
    acquire(r, id_c)
    acquire(r, ID_B, ticket="5")
    release(r, id_c)  # handed to B
    acquire(r, ID_A, ticket="5")  # same ticket, a member that sorts first
    assert undo(r, ID_B, ticket="5", token=str(BASE + 2)) == -(BASE + 2)
    assert r.get(LOCK) == f"{ID_A}:{BASE + 3}".encode()
    assert r.zrange(WAITQ, 0, -1) == [member(ID_B)]  # B queued again, behind A


# lock kinds (R22-R26)
ID_C, ID_D = "c" * 32, "d" * 32


def take(
    r: redis.Redis,
    lease_id: str,
    mode: str,
    permits: int = 0,
    *,
    ticket: str = "",
    tag: str = "",
    proc: str = PROC,
    ttl: int = 10_000,
) -> object:
    args = [lease_id, ttl, ticket, 3_000, RUN_ID, proc, mode, permits, tag]
    return run(r, scripts.ACQUIRE, KEYS, args)


def test_shared_leases_join_a_group_and_each_gets_a_token_of_its_own(r: redis.Redis) -> None:
    assert take(r, ID_A, "shared") == [BASE + 1, 0]
    assert take(r, ID_B, "shared", ttl=20_000) == [BASE + 2, 0]
    assert r.get(LOCK) == b"=shared 0"
    assert r.zrange(HOLDERS, 0, -1) == [ID_A.encode(), ID_B.encode()]
    assert r.pttl(LOCK) > 19_000  # the group ends with its last member
    assert take(r, ID_C, "exclusive")[0] == 0  # type: ignore[index]
    assert take(r, ID_C, "semaphore", 2)[0] == 0  # type: ignore[index]
    token, pttl, counter, holders, kind, permits = run(r, scripts.INSPECT, INSPECT_KEYS, [RUN_ID])  # type: ignore[misc]
    assert (token, counter, holders, kind, permits) == (BASE + 2, BASE + 2, 2, 2, 0)
    assert 19_000 < pttl <= 20_000  # until the last member ends
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 30_000]) == BASE + 1
    assert r.pttl(LOCK) > 29_000
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_C, 30_000]) == 0
    assert release(r, ID_A) == 1
    assert release(r, ID_A) == 0
    assert r.get(LOCK) == b"=shared 0"
    assert release(r, ID_B) == 1
    assert r.exists(LOCK, HOLDERS, HOLDERT) == 0  # the group's keys go with it
    assert take(r, ID_C, "exclusive") == [BASE + 3, 0]


def test_a_semaphore_holds_up_to_its_permits_and_refuses_other_permits(r: redis.Redis) -> None:
    assert take(r, ID_A, "semaphore", 2) == [BASE + 1, 0]
    assert take(r, ID_B, "semaphore", 3) == [-3, 2]  # R22: a mismatch, at once
    assert take(r, ID_B, "semaphore", 2) == [BASE + 2, 0]
    assert take(r, ID_C, "semaphore", 2)[0] == 0  # type: ignore[index]  # full
    assert take(r, ID_C, "shared")[0] == 0  # type: ignore[index]
    # an extend says the lease holds a permit: a handle labelled exclusive counts N (R32)
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 10_000]) == [BASE + 1, 1]
    assert release(r, ID_A) == 1
    assert take(r, ID_C, "semaphore", 2) == [BASE + 3, 0]  # a permit came free


def test_a_full_semaphore_says_when_its_first_permit_comes_free(r: redis.Redis) -> None:
    """The retry hint of a refused semaphore request is the first permit's end; any
    other refused request is told the lock's (the group's last member's) end."""
    take(r, ID_A, "semaphore", 2, ttl=2_000)
    take(r, ID_B, "semaphore", 2, ttl=20_000)
    refused = take(r, ID_C, "semaphore", 2)
    assert refused[0] == 0  # type: ignore[index]
    assert 0 < refused[1] <= 2_000  # type: ignore[index]  # A's permit, not the group's end
    refused = take(r, ID_C, "exclusive")
    assert refused[0] == 0  # type: ignore[index]
    assert 19_000 < refused[1] <= 20_000  # type: ignore[index]


def test_expired_members_leave_the_group(r: redis.Redis) -> None:
    take(r, ID_A, "shared", ttl=50)
    take(r, ID_B, "shared", ttl=10_000)
    time.sleep(0.06)
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 10_000]) == 0  # R6
    assert take(r, ID_C, "shared")[0] > 0  # type: ignore[index,operator]
    assert r.zrange(HOLDERS, 0, -1) == [ID_B.encode(), ID_C.encode()]


def test_a_release_hands_the_lock_to_every_shared_waiter_at_the_head(r: redis.Redis) -> None:
    take(r, ID_A, "exclusive")
    for lease_id, ticket in ((ID_B, "1"), (ID_C, "2")):
        assert take(r, lease_id, "shared", ticket=ticket, proc="p2")[0] == 0  # type: ignore[index]
    assert take(r, ID_D, "exclusive", ticket="3", proc="p3")[0] == 0  # type: ignore[index]
    assert take(r, "e" * 32, "shared", ticket="4", proc="p2")[0] == 0  # type: ignore[index]
    pubsub = listen(r, f"{CHAN}:p2", f"{CHAN}:p3")
    assert release(r, ID_A) == 1
    heard = [pubsub.get_message(timeout=1) for _ in range(2)]
    assert [m["data"] for m in heard if m] == [
        f"n\n{ID_A}\n{ID_B}\n{BASE + 2}".encode(),
        f"n\n{ID_A}\n{ID_C}\n{BASE + 3}".encode(),
    ]
    assert pubsub.get_message(timeout=0.1) is None  # the exclusive waiter is next, alone
    assert r.zrange(HOLDERS, 0, -1) == [ID_B.encode(), ID_C.encode()]
    assert r.zrange(WAITQ, 0, -1) == [member(ID_D, "p3"), member("e" * 32, "p2")]
    release(r, ID_B, proc="p2")
    assert pubsub.get_message(timeout=0.1) is None
    release(r, ID_C, proc="p2")
    message = pubsub.get_message(timeout=1)
    assert message is not None
    assert message["data"] == f"n\n{ID_C}\n{ID_D}\n{BASE + 4}".encode()
    assert r.get(LOCK) == f"{ID_D}:{BASE + 4}".encode()
    pubsub.close()


def test_an_undo_of_a_member_names_its_token(r: redis.Redis) -> None:
    take(r, ID_A, "shared")
    take(r, ID_B, "shared")
    args = undo_args(ID_B, "n", PROC, RUN_ID, ticket="", spec="10000 shared 0", grant="")
    assert run(r, scripts.UNDO, KEYS, [*args[:-1], str(BASE + 1)]) == 0  # A's token: not B's
    assert run(r, scripts.UNDO, KEYS, list(args)) == -(BASE + 2)
    assert r.zrange(HOLDERS, 0, -1) == [ID_A.encode()]


def test_raise_fence_counts_a_group_only_for_its_members(r: redis.Redis) -> None:
    take(r, ID_A, "semaphore", 2)
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 9, ID_B]) == 0  # not a member
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 10, ID_A]) == BASE + 10
    assert r.hget(HOLDERT, ID_A) == f"{BASE + 10} ".encode()  # R16: the lease's token


def commit(r: redis.Redis, lease_id: str, tag: str, token: int) -> object:
    return run(r, scripts.TAG, KEYS, [lease_id, tag, token, RUN_ID])


def test_a_tag_answers_only_once_its_lease_committed_it(r: redis.Redis) -> None:
    tag = "t" * 32
    keys_find = [tag, RUN_ID]
    assert run(r, scripts.FIND, KEYS, keys_find) == [0]
    take(r, ID_A, "exclusive", tag=tag)
    assert r.exists(HOLDERT) == 0  # a grant is no lease yet: no tag stored (R26)
    assert run(r, scripts.FIND, KEYS, keys_find) == [0]
    assert commit(r, ID_B, tag, BASE + 1) == [0]  # B does not hold it
    assert commit(r, ID_A, tag, BASE + 7) == [1]  # the decided token, not this node's
    code, token, pttl, lease_id = take(r, ID_B, "exclusive", tag=tag, ticket="5")  # type: ignore[misc]
    assert (code, token, lease_id) == (-4, BASE + 7, ID_A.encode())
    assert 9_000 < pttl <= 10_000
    assert r.zcard(WAITQ) == 0  # answered, not queued
    found = run(r, scripts.FIND, KEYS, keys_find)
    assert found[:1] + found[2:] == [BASE + 7, ID_A.encode()]  # type: ignore[index,operator]
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 20_000]) == BASE + 7
    assert r.pttl(HOLDERT) > 19_000  # the committed tag lives as long as the hold
    release(r, ID_A)
    assert run(r, scripts.FIND, KEYS, keys_find) == [0]
    take(r, ID_C, "shared", tag=tag)
    take(r, ID_D, "shared", tag=tag)  # S3: two grants with one tag...
    assert commit(r, ID_C, tag, BASE + 2) == [1]
    code, token, _, lease_id = commit(r, ID_D, tag, BASE + 3)  # type: ignore[misc]
    assert (code, token, lease_id) == (-4, BASE + 2, ID_C.encode())  # ...one lease per tag
    assert take(r, ID_D, "shared", tag=tag)[::3] == [-4, ID_C.encode()]  # type: ignore[index]
    r.set(QUAR, 1, px=5_000)
    assert run(r, scripts.FIND, KEYS, keys_find)[0] == -1  # type: ignore[index]  # L3
    r.delete(QUAR, SYNCED)
    assert run(r, scripts.FIND, KEYS, keys_find) == [-2, 0]
    assert commit(r, ID_C, tag, BASE + 2) == [-2, 0]


def test_a_waiter_leaving_while_a_group_holds_hands_over_to_a_joinable_head(
    r: redis.Redis,
) -> None:
    take(r, ID_A, "shared")
    assert take(r, ID_B, "exclusive", ticket="1", proc="p2")[0] == 0  # type: ignore[index]
    assert take(r, ID_C, "shared", ticket="2", proc="p3")[0] == 0  # type: ignore[index]
    pubsub = listen(r, f"{CHAN}:p3")
    assert release(r, ID_B, proc="p2") == 0  # the exclusive waiter leaves the queue
    message = pubsub.get_message(timeout=1)
    assert message is not None
    assert message["data"] == f"n\n{ID_B}\n{ID_C}\n{BASE + 2}".encode()
    assert r.zrange(HOLDERS, 0, -1) == [ID_A.encode(), ID_C.encode()]
    assert r.zcard(WAITQ) == 0
    pubsub.close()


def test_raise_fence_does_not_count_an_expired_member(r: redis.Redis) -> None:
    take(r, ID_A, "semaphore", 2, ttl=50)
    take(r, ID_B, "semaphore", 2, ttl=10_000)  # keeps the group (and A's entry) alive
    time.sleep(0.06)
    assert r.zscore(HOLDERS, ID_A) is not None  # nothing purged it yet
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 9, ID_A]) == 0
    assert run(r, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 10, ID_B]) == BASE + 10


# the uncontended cycle's shortcuts: same answers, fewer commands
RECOPY = f"{QUAR}:recopy"


def test_a_pending_recopy_refuses_grants_with_or_without_a_quarantine(r: redis.Redis) -> None:
    """R21: one EXISTS of both keys lets the common case through; either key refuses."""
    r.set(RECOPY, 1)
    assert acquire(r, ID_A) == [-1, 0]
    r.set(QUAR, 1, px=3_000)
    code, pttl = acquire(r, ID_A)  # type: ignore[misc]
    assert code == -1
    assert 2_000 < pttl <= 3_000  # the quarantine's time comes first
    r.persist(QUAR)  # a quarantine key without a ttl does not refuse: the recopy does
    assert acquire(r, ID_A) == [-1, 0]
    r.delete(RECOPY)
    assert acquire(r, ID_A) == [BASE + 1, 0]
    assert r.get(LOCK) is not None


# every command acquire.lua and release.lua may run
SCRIPT_COMMANDS = [
    "get",
    "set",
    "del",
    "exists",
    "pttl",
    "incr",
    "time",
    "publish",
    "zadd",
    "zrem",
    "zrange",
    "zrangebyscore",
    "zcard",
    "zscore",
    "hset",
    "hget",
    "hdel",
    "hexists",
    "hgetall",
    "pexpire",
    "pexpireat",
    "eval",
    "fcall",
]


def commands(r: redis.Redis) -> dict[str, int]:
    """Calls of each command the scripts may run (their own included) since the last
    CONFIG RESETSTAT; other clients of the session's node do not count."""
    stats = r.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {name: n for name, n in calls.items() if name in SCRIPT_COMMANDS}


def test_an_uncontended_cycle_runs_nine_commands(r: redis.Redis) -> None:
    """An exclusive acquire + release with nobody queued: GET synced, EXISTS of the
    quarantine and recopy keys, GET lock, EXISTS waitx, INCR, SET; GET lock, DEL,
    EXISTS waitx; no queue commands (ZREM, HDEL) and no DEL of the group keys."""
    acquire(r, ID_A, ticket="1")  # a waiting acquire that finds the lock free
    release(r, ID_A)
    r.config_resetstat()
    assert acquire(r, ID_B, ticket="2") == [BASE + 2, 0]
    assert release(r, ID_B) == 1
    calls = commands(r)
    assert calls.pop("fcall" if isinstance(r, Client) and r.by_fcall else "eval") == 2
    assert calls == {"get": 3, "exists": 3, "incr": 1, "set": 1, "del": 1}


def test_a_group_s_keys_expire_together(r: redis.Redis) -> None:
    """holders:{name} never outlives lock:{name}: an exclusive grant relies on it and
    deletes neither (a stale member would otherwise count as a holder: member_entry)."""

    def expiries() -> set[int]:
        return {r.pexpiretime(key) for key in (LOCK, HOLDERS, HOLDERT)}

    take(r, ID_A, "shared", ttl=5_000)
    take(r, ID_B, "shared", ttl=20_000)
    assert len(expiries()) == 1
    assert commit(r, ID_A, "t" * 32, BASE + 1) == [1]
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 30_000]) == BASE + 1
    assert len(expiries()) == 1
    assert release(r, ID_A) == 1
    assert len(expiries()) == 1
    assert undo(r, ID_B, "") == -(BASE + 2)
    assert r.exists(LOCK, HOLDERS, HOLDERT) == 0


def test_a_tag_entry_left_after_its_exclusive_lock_names_nobody(r: redis.Redis) -> None:
    """R26: holdert:{name} of an exclusive holder expires with the lock, give or take a
    clock tick (PTTL then PEXPIRE). An entry that outlives it is inert: the next
    exclusive grant does not delete it, and nothing takes it for a holder."""
    tag = "t" * 32
    take(r, ID_A, "exclusive", tag=tag)
    assert commit(r, ID_A, tag, BASE + 1) == [1]
    r.persist(HOLDERT)  # far more than a tick
    r.delete(LOCK)  # A's hold ended
    assert take(r, ID_B, "exclusive", tag=tag) == [BASE + 2, 0]  # not -4: A holds nothing
    assert r.hget(HOLDERT, ID_A) is not None  # left alone by the grant
    assert run(r, scripts.FIND, KEYS, [tag, RUN_ID]) == [0]
    assert take(r, ID_C, "exclusive", tag=tag)[0] == 0  # type: ignore[index]  # B holds it
    assert acquire(r, ID_A, ticket="1")[0] == 0  # type: ignore[index]  # not issued anew
    assert run(r, scripts.EXTEND, [LOCK, HOLDERS, HOLDERT], [ID_A, 10_000]) == 0
    assert commit(r, ID_A, tag, BASE + 1) == [0]
    assert release(r, ID_A) == 0
    assert undo(r, ID_A, "") == 0
    assert r.get(LOCK) == f"{ID_B}:{BASE + 2}".encode()
    assert commit(r, ID_B, tag, BASE + 2) == [1]
    found = run(r, scripts.FIND, KEYS, [tag, RUN_ID])
    assert found[::2] == [BASE + 2, ID_B.encode()]  # type: ignore[index]
    assert release(r, ID_B) == 1
    assert r.exists(LOCK, HOLDERT) == 0


def test_a_grant_issued_anew_carries_no_tag(r: redis.Redis) -> None:
    """R12, R26: a try that finds its lease already holding (handed over) is granted
    anew: a new grant, whose tag is committed only once its owner decides."""
    tag = "t" * 32
    take(r, ID_A, "exclusive", tag=tag, ticket="1")
    assert commit(r, ID_A, tag, BASE + 1) == [1]
    assert take(r, ID_A, "exclusive", tag=tag, ticket="1") == [BASE + 2, 0]
    assert run(r, scripts.FIND, KEYS, [tag, RUN_ID]) == [0]
    assert take(r, ID_B, "exclusive", tag=tag)[0] == 0  # type: ignore[index]  # held, no -4


def test_a_clock_jump_where_two_quorums_meet_lets_two_exclusive_leases_share_a_token(
    redis1: list[RedisNode],
) -> None:
    """Campaign seed 34 (``files/k1``), step by step on three keyspaces of one
    redis-server (a node each): c3 through the gateway cut from node 1, i1 through
    the other. Only node 0's clock jumps. R3/R4 keep the two leases' tokens apart
    while node 0 keeps c3's grant for its ttl; once a jump expires it early, i1 is
    granted node 0 with the next token and c3's round 2 later counts node 0 as free
    at that same token (I1's clock assumption void; the checker excuses it)."""
    id_c3, id_i0, id_i1 = "c" * 32, "0" * 32, "1" * 32
    nodes = [redis.Redis(host="127.0.0.1", port=redis1[0].port, db=n) for n in range(3)]
    try:
        for node in nodes:
            node.set(SYNCED, f"{BASE} {RUN_ID}")
            node.set(FENCE, BASE + 130)
        n0, n1, n2 = nodes
        assert acquire(n0, id_c3, ttl=1_500, proc="p3")[0] == BASE + 131  # type: ignore[index]
        assert acquire(n1, id_i0)[0] == BASE + 131  # type: ignore[index]  # i0: {1, 2}
        assert acquire(n2, id_i0)[0] == BASE + 131  # type: ignore[index]
        # While node 0 keeps c3's grant, i1 cannot have it: no quorum for i1.
        assert acquire(n0, id_i1)[0] == 0  # type: ignore[index]
        # Node 0's clock jumps: c3's grant there expires early (c3's gateway counts it).
        n0.pexpire(LOCK, 1)
        time.sleep(0.05)
        assert n0.get(LOCK) is None
        assert acquire(n0, id_i1)[0] == BASE + 132  # type: ignore[index]
        release(n1, id_i0)
        release(n2, id_i0)
        assert acquire(n1, id_i1)[0] == BASE + 132  # type: ignore[index]  # i1: {0, 1} at 132
        assert acquire(n2, id_c3, proc="p3")[0] == BASE + 132  # type: ignore[index]
        # c3 holds {0: 131, 2: 132} by its gateway's clock: round 2 raises to 132 (R4).
        assert run(n2, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 132, id_c3]) == BASE + 132
        assert run(n0, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 132, id_c3]) == 0  # i1 holds it
        release(n0, id_i1)  # i1 releases (or node 0 jumps again)
        # node 0 is free now: it counts, so c3 too has a quorum ({0, 2}) at 132
        assert run(n0, scripts.RAISE_FENCE, RAISE_KEYS, [BASE + 132, id_c3]) == BASE + 132
    finally:
        for node in nodes:
            node.flushdb()
            node.close()
