"""The model's state: bounds, clients and the whole system, all hashable tuples."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from tests.model.node_scripts import Node
from tests.model.waiter import Pending

__all__ = [
    "FAIL",
    "FAULTS",
    "Bounds",
    "Client",
    "Label",
    "Msg",
    "State",
    "believes",
    "canonical",
    "put",
]

FAIL = "FAIL"  # a call's future failed with ConnectionError
# timeout: a round decided without a node's answer (a slow node); drop: a client's
# connection to a node drops; lose/duplicate: a hand-over message; crash: a node
# restarts with its data lost
FAULTS = frozenset({"timeout", "drop", "lose", "duplicate", "crash"})
Msg = tuple[object, ...]  # (kind, lease, ...): see the senders in protocol_model.py
Label = tuple[object, ...]
T = TypeVar("T")


class Bounds(NamedTuple):
    clients: int = 2
    nodes: int = 3
    acquires: int | tuple[int, ...] = 1  # per client (a tuple: client by client)
    tries: int = 2  # round-1 tries per acquire
    extends: int = 0  # per lease
    ttl: int = 2  # ticks
    drift: int = 0  # ticks
    max_time: int = 3
    faults: int = 2  # dropped connections, lost or duplicated messages, crashes
    crashes: int = 1
    capacity: int = 2  # requests in flight per link, and hand-overs
    reorders: int = 2  # messages taken before an earlier-sent message of another link
    kinds: frozenset[str] = FAULTS  # the kinds of fault that may happen
    counter: int = 0  # fence:{name} on every node at the start (earlier leases)
    modes: tuple[str, ...] = ()  # each client's lock kind (R22): exclusive when not listed
    permits: int = 1  # of every semaphore client
    keyed: int = 0  # clients 0 .. keyed - 1 carry one idempotency key (R26)
    # nodes down throughout (connection refused): a call to one fails at once, unsent
    down: frozenset[int] = frozenset()


class Client(NamedTuple):
    phase: str = "idle"  # idle, finding, trying, waiting, raising, committing, holding, extending
    acquires: int = 0  # acquires started; the lease is (client, acquires)
    pending: Pending | None = None  # the queued acquire's grants (Handovers)
    tries: int = 0  # tries sent in this acquire; a try is named by its number
    start: int = 0  # send time of the round under way
    replies: tuple[object, ...] = ()  # this round's answers per node (None: not yet)
    before: frozenset[int] = frozenset()  # nodes already granted when the try was sent
    deaf: frozenset[int] = frozenset()  # tries decided with a lease: late answers ignored
    ticket: int = 0
    token: int = 0
    valid_until: int = 0
    extends: int = 0
    floor: int = 0  # the largest token of a lease completed before this acquire began (I2)
    # a keyed client's lease, as returned (R26): (lease, token); another client's lease
    # when the tag answered it
    held: tuple[tuple[int, int], int] | None = None


class State(NamedTuple):
    now: int
    nodes: tuple[Node, ...]
    clients: tuple[Client, ...]
    # messages in flight as (link, message), in the order they were sent: requests on
    # link client * nodes + node (FIFO), hand-overs ("handover", lease, token, node) on
    # link (clients + client) * nodes + node. Taking one before an earlier message of
    # another link is a reordering (``Bounds.reorders``)
    inflight: tuple[tuple[int, Msg], ...]
    stuck: tuple[tuple[int, Msg], ...]  # requests of dropped connections: a bag
    faults: int = 0
    crashes: int = 0
    leases: tuple[int, ...] = ()  # tokens of the leases granted, in order of creation
    reorders: int = 0
    broken: str = ""  # I2 of a lease whose token was not above its acquire's floor
    decided: tuple[tuple[tuple[int, int], int], ...] = ()  # keyed leases' decided tokens (R26)


def put(items: tuple[T, ...], i: int, value: T) -> tuple[T, ...]:
    return (*items[:i], value, *items[i + 1 :])


def believes(cl: Client, now: int) -> bool:
    """The client holds a lease whose validity has not passed."""
    return cl.phase in ("holding", "extending") and cl.valid_until > now


def canonical(cl: Client) -> Client:
    """Forget what the client's phase does not use, so that equal situations are one state."""
    phase = cl.phase
    if phase == "idle":
        return Client(acquires=cl.acquires)
    if phase == "holding":
        return Client(
            phase, cl.acquires, valid_until=cl.valid_until, extends=cl.extends, held=cl.held
        )
    if phase == "extending":
        return Client(
            phase, cl.acquires, start=cl.start, replies=cl.replies, valid_until=cl.valid_until,
            extends=cl.extends, held=cl.held,
        )  # fmt: skip
    if phase == "finding":
        return Client(
            phase, cl.acquires, cl.pending, start=cl.start, replies=cl.replies, ticket=cl.ticket,
            floor=cl.floor,
        )  # fmt: skip
    if phase == "committing":
        return Client(
            phase, cl.acquires, start=cl.start, replies=cl.replies, token=cl.token,
            valid_until=cl.valid_until, held=cl.held,
        )  # fmt: skip
    if phase == "waiting":
        return cl._replace(start=0, replies=(), before=frozenset(), token=0, valid_until=0)
    if phase == "raising":
        return cl._replace(start=0, before=frozenset())
    return cl._replace(token=0, valid_until=0)
