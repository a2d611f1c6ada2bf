"""The lock scripts as Redis 7 functions (FCALL of one library), and the EVALSHA fallback.

A node loads the library (``scripts.LIBRARY``) when it connects and calls its
functions; a library gone from the node (FUNCTION FLUSH, a restart, a promoted
replica) is loaded again by the call that misses it; a node that refuses
functions (an ACL user without FUNCTION or FCALL, Redis before 7) runs the same
scripts by EVALSHA. Every test here runs on real redis-server nodes of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lockservice import LockManager, QuorumUnavailable, scripts
from lockservice.protocol import QUARANTINE_KEY, SYNCED_KEY, fence_key, lock_key, lock_keys
from tests._servers import RedisNode
from tests.faults.conftest import redlock, wait_until

FUNCTIONS = sorted(f"{s.name}_{scripts.VERSION}" for s in scripts.ALL)
USER, PASSWORD = "fg_limited", "pw-limited"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RedisNode]:
    """A node of this test's own: ACL users and maxmemory stay with it."""
    own = RedisNode(tmp_path / "node")
    own.start()
    yield own
    own.stop()


def client(node: RedisNode) -> redis.Redis:
    return redis.Redis.from_url(node.url)


def calls(node: RedisNode) -> dict[str, int]:
    """Calls of each command that did not fail since the last CONFIG RESETSTAT."""
    with client(node) as r:
        stats = r.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"]) - int(v.get("failed_calls", 0))
        for name, v in stats.items()
    }


def libraries(node: RedisNode) -> dict[str, list[str]]:
    """The node's function libraries and the names of their functions."""
    with client(node) as r:
        listed = r.function_list()
    found: dict[str, list[str]] = {}
    for entry in listed:
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        functions = [dict(zip(f[::2], f[1::2], strict=True)) for f in fields[b"functions"]]
        found[fields[b"library_name"].decode()] = sorted(f[b"name"].decode() for f in functions)
    return found


def limited_url(node: RedisNode, rule: str) -> str:
    """A user allowed everything but ``rule`` takes away (e.g. ``-function``)."""
    with client(node) as r:
        r.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["~*"],
                      channels=["&*"], commands=["+@all", rule])  # fmt: skip
    return f"redis://{USER}:{PASSWORD}@127.0.0.1:{node.port}/0"


async def cycles(mgr: LockManager, count: int, prefix: str) -> None:
    for i in range(count):
        lease = await mgr.acquire(f"{prefix}/{i % 3}", ttl=10.0)
        await mgr.release(mgr.handle(lease.name, lease.lease_id))  # awaits the node


async def test_the_scripts_run_as_functions_of_one_library_loaded_at_connect(
    node: RedisNode,
) -> None:
    managers = [await LockManager.connect([node.url]) for _ in range(2)]  # two gateways
    try:
        assert all(redlock(m).nodes[0].functions for m in managers)
        assert libraries(node) == {scripts.LIBRARY_NAME: FUNCTIONS}  # loaded once
        await cycles(managers[0], 2, "fn/warm")
        node.command("CONFIG", "RESETSTAT")
        for mgr in managers:
            await cycles(mgr, 10, "fn")
        done = calls(node)
        assert done.get("fcall", 0) >= 40  # an acquire and a release each, per cycle
        assert [done.get(c, 0) for c in ("evalsha", "eval", "function|load")] == [0, 0, 0]
    finally:
        for mgr in managers:
            await mgr.close()
    assert calls(node).get("script|load", 0) == 0  # no script cache to fill either


async def test_two_versions_of_the_library_serve_side_by_side(node: RedisNode) -> None:
    """A gateway of another version loaded its own library first: both load, neither
    replaces the other, and each version's functions run on the same keys."""
    other = scripts._library("0ther0version")
    with client(node) as r:
        assert r.function_load(other.decode()) == b"fencegate_0ther0version"
    mgr = await LockManager.connect([node.url])
    try:
        assert redlock(mgr).nodes[0].functions
        assert set(libraries(node)) == {"fencegate_0ther0version", scripts.LIBRARY_NAME}
        lease = await mgr.acquire("v/a", ttl=10.0)
        run_id = redlock(mgr).nodes[0].run_id or ""
        keys = lock_keys("v/a")
        args = ["b" * 32, 10_000, "", 3_000, run_id, "other-gateway"]
        with client(node) as r:
            held = r.fcall("acquire_0ther0version", len(keys), *keys, *args)
            assert held[0] == 0  # the other version sees this version's lease
            await mgr.release(mgr.handle(lease.name, lease.lease_id))
            granted = r.fcall("acquire_0ther0version", len(keys), *keys, *args)
            assert granted[0] > lease.token  # and issues the next token
        assert (await mgr.acquire("v/b", ttl=10.0)).token > 0
        assert set(libraries(node)) == {"fencegate_0ther0version", scripts.LIBRARY_NAME}
    finally:
        await mgr.close()


@pytest.mark.parametrize(("rule", "why"), [("-function", "FUNCTION LOAD"), ("-fcall", "FCALL")])
async def test_a_node_that_refuses_functions_runs_the_scripts_by_evalsha(
    node: RedisNode, rule: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server refusing: an ACL user without FUNCTION, or without FCALL. The
    node says why once at INFO, also across a reconnect, and every lock works."""
    url = limited_url(node, rule)
    caplog.set_level(logging.INFO, logger="lockservice.node")
    mgr = await LockManager.connect([url])
    try:
        state = redlock(mgr).nodes[0]
        assert not state.functions
        assert state.no_functions is not None
        assert state.no_functions.startswith(f"{why} refused: NOPERM")
        node.command("CONFIG", "RESETSTAT")
        await cycles(mgr, 5, "fb")
        old = state._conn
        with client(node) as r:
            r.client_kill_filter(_type="normal", user=USER)  # the node reconnects
        await wait_until(lambda: state._conn is not old and state.connected, 5.0, "a reconnect")
        await cycles(mgr, 5, "fb")
        assert not state.functions
        done = calls(node)
        assert done.get("evalsha", 0) >= 20
        assert done.get("fcall", 0) == 0  # the probe at the reconnect failed
        said = [r for r in caplog.records if "lock scripts run as EVALSHA" in r.getMessage()]
        assert len(said) == 1
        assert said[0].levelno == logging.INFO
    finally:
        await mgr.close()
    assert libraries(node) == ({} if rule == "-function" else {scripts.LIBRARY_NAME: FUNCTIONS})


@pytest.mark.parametrize("path", ["fcall", "evalsha"])
async def test_release_and_extend_work_on_a_node_over_maxmemory(node: RedisNode, path: str) -> None:
    """A full node (noeviction, over maxmemory) refuses new grants, but a lease can
    still be extended and released: with FCALL as with EVALSHA (``allow-oom``)."""
    mgr = await LockManager.connect(
        [node.url if path == "fcall" else limited_url(node, "-function")]
    )
    try:
        assert redlock(mgr).nodes[0].functions == (path == "fcall")
        lease = await mgr.acquire("oom/a", ttl=5.0)
        counter = node.command("GET", fence_key("oom/a"))
        with client(node) as r:
            r.config_set("maxmemory", 1)  # every command that may grow memory is refused
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                r.set("x", "1")
            node.command("CONFIG", "RESETSTAT")
            extended = await mgr.extend(lease, ttl=30.0)
            assert extended.token == lease.token
            assert r.pttl(lock_key("oom/a")) > 10_000
            await mgr.release(mgr.handle(lease.name, lease.lease_id))  # awaits the node
            assert r.exists(lock_key("oom/a")) == 0
            with pytest.raises(QuorumUnavailable, match="OOM"):
                await mgr.acquire("oom/a", ttl=5.0)
            # refused whole: no grant, no token issued
            assert r.exists(lock_key("oom/a")) == 0
            assert node.command("GET", fence_key("oom/a")) == counter
            done = calls(node)
            assert (done.get("fcall", 0) > 0) == (path == "fcall")
            assert (done.get("evalsha", 0) > 0) == (path == "evalsha")
            r.config_set("maxmemory", 0)
        assert (await mgr.acquire("oom/a", ttl=5.0)).token > lease.token
    finally:
        await mgr.close()


@pytest.mark.parametrize("refused", ["acl", "maxmemory"])
async def test_a_flushed_library_that_cannot_be_loaded_again_falls_back_to_eval(
    node: RedisNode, refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The library was there at connect (loaded by a gateway with FUNCTION), then
    FUNCTION FLUSH: a user without FUNCTION cannot load it again, nor can a node over
    maxmemory. The call that misses it misses again after the refused load and runs
    by EVAL, and the connection goes on by EVALSHA: locks keep working (before: every
    FCALL answered "Function not found" until a reconnect: the node was out of every
    quorum)."""
    with client(node) as r:
        r.function_load(scripts.LIBRARY.decode())
    url = limited_url(node, "-function") if refused == "acl" else node.url
    caplog.set_level(logging.INFO, logger="lockservice.resp")
    mgr = await LockManager.connect([url])
    try:
        state = redlock(mgr).nodes[0]
        assert state.functions
        lease = await mgr.acquire("gone/a", ttl=30.0)
        with client(node) as r:
            r.function_flush()
            if refused == "maxmemory":
                r.config_set("maxmemory", 1)
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    r.set("x", "1")
        extended = await mgr.extend(lease, ttl=30.0)  # the miss: EVAL, the load refused
        assert extended.token == lease.token
        node.command("CONFIG", "RESETSTAT")
        await mgr.release(mgr.handle(lease.name, lease.lease_id))  # awaits the node
        with client(node) as r:
            assert r.exists(lock_key("gone/a")) == 0
            r.config_set("maxmemory", 0)
        await cycles(mgr, 3, "gone")
        assert libraries(node) == {}  # never loaded again: refused
        done = calls(node)
        assert done.get("fcall", 0) == 0  # the connection went on by EVALSHA
        assert not state.functions  # and the node says so
        assert done.get("evalsha", 0) + done.get("eval", 0) >= 7  # a release, 3 cycles
        said = [r.getMessage() for r in caplog.records if r.name == "lockservice.resp"]
        assert len(said) == 1  # once per connection, naming the node
        assert said[0].startswith(f"redis node {state.label}: lock scripts run as EVALSHA: ")
        assert ("NOPERM" if refused == "acl" else "OOM") in said[0]
    finally:
        await mgr.close()


async def test_a_call_that_misses_after_the_refused_load_came_back_runs_by_eval(
    node: RedisNode,
) -> None:
    """An FCALL sent while a refused FUNCTION LOAD was on its way (nothing said yet
    that it is refused) misses after the connection turned to EVALSHA: it runs by
    EVAL, like the call whose miss sent the load. A BLPOP right behind the first
    call holds the node's answers back meanwhile, on a real server."""
    with client(node) as r:
        r.function_load(scripts.LIBRARY.decode())
    mgr = await LockManager.connect([limited_url(node, "-function")], node_timeout=2.0)
    try:
        state = redlock(mgr).nodes[0]
        assert state.functions
        with client(node) as r:
            r.function_flush()
        node.command("CONFIG", "RESETSTAT")
        keys, args = (SYNCED_KEY, QUARANTINE_KEY), (state.run_id or "",)
        first = state.call(scripts.STATE, keys, args)  # misses: the load, then FCALL again
        hold = state.command("BLPOP", "late:nothing", "0.3")  # what follows waits behind
        await asyncio.sleep(0.1)
        assert state.functions  # the load's refusal is not back yet
        second = state.call(scripts.STATE, keys, args)  # FCALL: misses after the refusal
        assert await hold is None
        assert [await first, await second] == [[1, 0], [1, 0]]
        assert not state.functions
        assert calls(node).get("eval", 0) == 2  # both misses
        await cycles(mgr, 2, "late")  # and the connection goes on by EVALSHA
        done = calls(node)
        assert done.get("evalsha", 0) >= 2
        assert done.get("fcall", 0) == 0
    finally:
        await mgr.close()
