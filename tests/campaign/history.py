"""The campaign's history: one JSON line per event, as Jepsen records it.

Every client process appends events to its own file; the orchestrator appends
the final reads and the faults. An operation is an ``invoke`` event followed by
one completion with the same ``(process, op)``:

* ``ok``: it happened (the gateway said so);
* ``fail``: it certainly did not happen (refused, or the connection was refused);
* ``info``: unknown (timeout, reset, 5xx): it may or may not have taken effect.

Times: ``mono`` is ``time.monotonic()`` (one clock for every process on the
machine, so "completed before invoked" is comparable across clients), ``wall``
is ``time.time()`` of the recording process (for reading logs only).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["Event", "FaultWindow", "Op", "load_events", "pair_ops", "read_jsonl", "write_jsonl"]

Kind = Literal["invoke", "ok", "fail", "info"]
Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: its invocation and its completion (``end`` is None for ``info``)."""

    process: str
    op: int
    f: str  # acquire | renew | read | write | release | final_read
    store: str
    key: str
    result: Kind  # ok | fail | info
    start: float
    end: float | None
    token: int | None = None
    lease_id: str | None = None
    value: int | None = None
    valid_ms: int | None = None
    gateway: int | None = None
    status: int | None = None
    error: str | None = None
    fenced: bool = False  # a read that carried the token
    direct: bool = False  # an op of a direct writer (direct.py): its reads and writes bypass HTTP
    mode: str = "exclusive"  # an acquire's kind: exclusive | shared | semaphore
    permits: int | None = None  # a semaphore acquire's permits
    idem_key: str | None = None  # an acquire's Idempotency-Key

    @property
    def scope(self) -> str:
        """The lock name and fence scope of the key: ``{store}/{key}``."""
        return f"{self.store}/{self.key}"


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """A fault the nemesis injected at ``start`` and healed at ``end`` (monotonic)."""

    kind: str
    start: float
    end: float
    detail: str = ""
    # When the fault took entries from a node, for the faults that do it at one moment
    # (a kill, a clock jump, a rollback): just before and just after the act.
    struck_from: float | None = None
    struck_until: float | None = None


def pair_ops(events: Iterable[Event]) -> list[Op]:
    """Match each ``invoke`` with its completion; an invoke without one counts as ``info``."""
    pending: dict[tuple[str, int], Event] = {}
    ops: list[Op] = []
    for event in sorted(events, key=lambda e: (e["mono"], e["type"] != "invoke")):
        ident = (str(event["process"]), int(event["op"]))
        if event["type"] == "invoke":
            pending[ident] = event
            continue
        invoke = pending.pop(ident, None)
        if invoke is None:
            raise ValueError(f"completion without invocation: {event}")
        ops.append(_op(invoke, event))
    ops.extend(_op(invoke, None) for invoke in pending.values())
    return sorted(ops, key=lambda o: o.start)


def _op(invoke: Event, done: Event | None) -> Op:
    both = {**invoke, **(done or {})}
    result: Kind = "info" if done is None else done["type"]
    return Op(
        process=str(invoke["process"]),
        op=int(invoke["op"]),
        f=str(invoke["f"]),
        store=str(invoke["store"]),
        key=str(invoke["key"]),
        result=result,
        start=float(invoke["mono"]),
        end=None if result == "info" or done is None else float(done["mono"]),
        token=both.get("token"),
        lease_id=both.get("lease_id"),
        value=both.get("value"),
        valid_ms=both.get("valid_ms"),
        gateway=both.get("gateway"),
        status=None if done is None else done.get("status"),
        error=None if done is None else done.get("error"),
        fenced=bool(invoke.get("fenced", False)),
        direct=bool(invoke.get("direct", False)),
        mode=str(invoke.get("mode", "exclusive")),
        permits=invoke.get("permits"),
        idem_key=invoke.get("idem_key"),
    )


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of one file; a torn last line (a process killed mid-write) is skipped."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.endswith("\n"):
                yield json.loads(line)


def load_events(paths: Iterable[Path]) -> list[Event]:
    """The merged history of every file."""
    return [event for path in paths for event in read_jsonl(path)]
