"""An extend answers the token its lease was decided with (R26, R16), over three nodes.

A lease can hold another token on a minority of its nodes: a lower round-1 grant
that round 2 missed, or a grant after the decision (a hand-over on a node where
it was still queued), higher until R16 settles it. An extend of a bare handle
(an HTTP renew) must answer the token a quorum holds, never the largest it saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from lockservice import QuorumUnavailable, scripts
from lockservice.cleanup import release_args
from lockservice.protocol import lock_key, lock_keys
from tests._servers import RedisNode
from tests.faults.conftest import Connect, cut_off, redlock, reply_bulk, wait_until

pytestmark = pytest.mark.faults

OTHER = "f" * 32  # a lease of another gateway, holding node 1 alone
PROC = "gone"  # that gateway's process


@pytest.fixture
def node1(own_redis3: list[RedisNode]) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis3[1].url)
    yield client
    client.close()


def _value(node: RedisNode, name: str) -> bytes | None:
    return reply_bulk(node.command("GET", lock_key(name)))


async def test_an_extend_during_a_late_hand_over_answers_the_decided_token(
    own_redis3: list[RedisNode], node1: redis.Redis, connect: Connect
) -> None:
    """The model's schedule (tests/model, R26): the lease is decided on nodes 0 and 2
    while queued on node 1 behind another lease; that lease's release hands node 1
    over to it with a higher token; an extend runs before R16's settle, and node 2
    answers last. The largest of the first quorum ({0, 1}) is the hand-over's token,
    which the next lease on nodes 0 and 2 would get too (I2)."""
    mgr = await connect(own_redis3, max_ttl=30.0)
    name = "late-handover"
    run_id = redlock(mgr).nodes[1].run_id or ""
    keys = lock_keys(name)
    other = node1.eval(scripts.ACQUIRE.source, len(keys), *keys,
                       OTHER, 10_000, "", 3_000, run_id, PROC)  # fmt: skip
    assert isinstance(other, list), other
    assert other[0] > 0, other
    lease = await mgr.acquire(name, ttl=10.0, wait=5.0)  # granted by nodes 0 and 2
    assert _value(own_redis3[1], name) == f"{OTHER}:{other[0]}".encode()
    # The other lease's release hands node 1 over to the lease (sync: the loop of
    # the manager sees the hand-over message only once the extend below was sent).
    args = release_args(OTHER, name, PROC, run_id)
    assert node1.eval(scripts.RELEASE.source, len(keys), *keys, *args) == 1
    late = _value(own_redis3[1], name)
    assert late is not None
    assert late.startswith(lease.lease_id.encode())
    assert int(late.split(b":")[1]) > lease.token  # a late grant, above the decided token
    own_redis3[2].pause()  # node 2 answers last
    asyncio.get_running_loop().call_later(0.1, own_redis3[2].resume)
    renewed = await mgr.extend(mgr.handle(name, lease.lease_id), ttl=10.0)
    assert renewed.token == lease.token
    # R16 (the message's settle, and the extend's) writes the decided token on node 1.
    await wait_until(
        lambda: _value(own_redis3[1], name) == f"{lease.lease_id}:{lease.token}".encode(),
        3.0, "node 1 holds the decided token",
    )  # fmt: skip


async def test_an_extend_settles_a_node_round_2_missed(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """Node 1 holds a lower round-1 token of the lease (round 2 missed it). An extend
    over every node answers the decided token and writes it on node 1 (R16), so that
    an extend after node 0 is cut off still finds a quorum ({1, 2}) agreeing."""
    mgr = await connect(own_redis3, max_ttl=30.0)
    name = "missed-round-2"
    lease = await mgr.acquire(name, ttl=10.0)
    decided = f"{lease.lease_id}:{lease.token}".encode()
    # Fresh nodes may start from token bases a millisecond apart: round 2 then
    # rewrites the lease's token on every node, and a quorum's acks decide the lease
    # before the third raise lands. Let it land: only node 1 is to be stale.
    await wait_until(
        lambda: all(_value(n, name) == decided for n in own_redis3), 3.0, "round 2 landed"
    )
    stale = f"{lease.lease_id}:{lease.token - 1}"
    assert own_redis3[1].command("SET", lock_key(name), stale, "KEEPTTL") == b"+OK\r\n"
    renewed = await mgr.extend(mgr.handle(name, lease.lease_id), ttl=10.0)
    assert renewed.token == lease.token
    await wait_until(lambda: _value(own_redis3[1], name) == decided, 3.0, "node 1 settled")
    await cut_off(mgr, own_redis3[0], 0)
    renewed = await mgr.extend(mgr.handle(name, lease.lease_id), ttl=10.0)
    assert renewed.token == lease.token
    own_redis3[0].resume()


async def test_an_extend_whose_nodes_do_not_agree_on_the_token_is_refused(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """Nodes 1 and 2 hold two tokens of the lease and node 0 is cut off: the lease is
    extended on a quorum, but no quorum names its token, so the extend answers none
    (QuorumUnavailable: the caller keeps its old validity and retries)."""
    mgr = await connect(own_redis3, max_ttl=30.0)
    name = "no-agreement"
    lease = await mgr.acquire(name, ttl=10.0)
    stale = f"{lease.lease_id}:{lease.token - 1}"
    assert own_redis3[1].command("SET", lock_key(name), stale, "KEEPTTL") == b"+OK\r\n"
    await cut_off(mgr, own_redis3[0], 0)
    with pytest.raises(QuorumUnavailable, match="agree"):
        await mgr.extend(mgr.handle(name, lease.lease_id), ttl=10.0)
    own_redis3[0].resume()
