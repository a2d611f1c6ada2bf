"""Checks over a campaign history: pure functions of the paired operations.

Violations (a correct fencegate never shows one):

* ``lost_update``: per key, two acknowledged writes of the same value (each client
  writes the value it read plus one), or a final value outside
  ``[acknowledged writes, acknowledged + indeterminate writes]``;
* ``duplicate_token``: two different leases of one lock name with the same token;
* ``token_order``: a grant that completed before another grant of the name was
  invoked has a token that is not smaller;
* ``stale_write``: an acknowledged write whose token is below a token that an
  acknowledged write or fenced read of the same scope had established before the
  write was invoked (the store had already seen it, so it had to refuse this one).

``overlaps`` of two leases of one name that both surely held it (from the grant's
answer to the earlier of ``invoke + valid_ms`` and the invocation of their release;
the gateway's deadline lies after that; every process reads the same monotonic
clock) are reported with the faults active then. An overlap is also a
``mutual_exclusion`` violation unless a fault that breaks Redlock's timing
assumption was active while either lease was being taken or held
(``CLOCK_FAULTS``: a Redis node's clock jumping forward expires a lease early on
that node, Kleppmann's third scenario, and the second grant may come after the
jump's window closed; there only the fencing checks above must hold).
``availability``: operations by result while each fault kind was active
(``none``: while no fault was), and the same for the direct writers' ops alone.
``direct_writes``: what became of the direct writers' UPDATEs (``direct.py``),
and of the late ones among them.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.campaign.history import Event, FaultWindow, Op, pair_ops

__all__ = [
    "CLOCK_FAULTS",
    "Overlap",
    "Report",
    "Violation",
    "availability",
    "check",
    "direct_writes",
    "duplicate_tokens",
    "lost_updates",
    "overlaps",
    "stale_writes",
    "token_order",
]

CLOCK_FAULTS = frozenset({"clock_jump_node", "kleppmann"})
ESTABLISHING_READS = (200, 404)  # a fenced read that answered raised the mark to its token


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    scope: str
    detail: str
    ops: tuple[Op, ...] = ()


@dataclass(frozen=True, slots=True)
class Overlap:
    scope: str
    first: Op
    second: Op
    seconds: float
    faults: tuple[str, ...]  # active during the overlap
    lifetime_faults: tuple[str, ...]  # active from the first of the two acquires on


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    availability: dict[str, Counter[str]] = field(default_factory=dict)
    ops: Counter[str] = field(default_factory=Counter)
    direct: Counter[str] = field(default_factory=Counter)
    direct_availability: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)


def _by_scope(ops: Iterable[Op], f: str) -> dict[str, list[Op]]:
    grouped: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == f:
            grouped[op.scope].append(op)
    return grouped


def lost_updates(ops: Sequence[Op]) -> list[Violation]:
    """Duplicate acknowledged values per key; final value outside the possible range."""
    found: list[Violation] = []
    writes = _by_scope(ops, "write")
    finals = {op.scope: op for op in ops if op.f == "final_read" and op.result == "ok"}
    for scope in sorted(set(writes) | set(finals)):
        acked = [w for w in writes.get(scope, []) if w.result == "ok"]
        unknown = [w for w in writes.get(scope, []) if w.result == "info"]
        by_value: dict[int | None, list[Op]] = defaultdict(list)
        for w in acked:
            by_value[w.value].append(w)
        for value, same in sorted(by_value.items(), key=lambda kv: kv[0] or 0):
            if len(same) > 1:
                found.append(
                    Violation(
                        "lost_update",
                        scope,
                        f"{len(same)} acknowledged writes of {value}",
                        tuple(same),
                    )
                )
        final = finals.get(scope)
        if final is None:
            continue
        value = final.value or 0
        if not len(acked) <= value <= len(acked) + len(unknown):
            found.append(
                Violation(
                    "lost_update",
                    scope,
                    f"final value {value} outside [{len(acked)}, {len(acked) + len(unknown)}]"
                    f" ({len(acked)} acknowledged, {len(unknown)} indeterminate writes)",
                    (final,),
                )
            )
    return found


def duplicate_tokens(ops: Sequence[Op]) -> list[Violation]:
    """Two different ``lease_id`` granted with the same token for one lock name."""
    found: list[Violation] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        by_token: dict[int, dict[str, Op]] = defaultdict(dict)
        for g in grants:
            if g.result == "ok" and g.token is not None and g.lease_id is not None:
                by_token[g.token].setdefault(g.lease_id, g)
        for token, leases in sorted(by_token.items()):
            if len(leases) > 1:
                found.append(
                    Violation(
                        "duplicate_token",
                        scope,
                        f"token {token} granted to {len(leases)} leases",
                        tuple(leases.values()),
                    )
                )
    return found


def _precedence(
    earlier: Sequence[Op], later: Sequence[Op], kind: str, scope: str, what: str, strict: bool
) -> list[Violation]:
    """Ops of ``later`` whose token is below the largest token of an ``earlier`` op that
    completed before they were invoked (below or equal, when ``strict``)."""
    done = sorted((op for op in earlier if op.end is not None), key=lambda o: o.end or 0.0)
    ends = [op.end or 0.0 for op in done]
    best: list[Op] = []  # best[i]: the op with the largest token among done[: i + 1]
    for op in done:
        top = best[-1] if best else None
        best.append(op if top is None or (op.token or 0) > (top.token or 0) else top)
    found: list[Violation] = []
    for op in later:
        i = bisect.bisect_left(ends, op.start)  # done[:i] completed before op was invoked
        if i == 0 or op.token is None:
            continue
        top = best[i - 1]
        top_token = top.token or 0
        if op.token < top_token or (strict and op.token == top_token):
            found.append(
                Violation(
                    kind,
                    scope,
                    f"{what}: token {op.token} after token {top_token} of an earlier "
                    f"{top.f} that completed {op.start - (top.end or 0.0):.3f} s before",
                    (top, op),
                )
            )
    return found


def token_order(ops: Sequence[Op]) -> list[Violation]:
    """A grant completed before another was invoked must have the smaller token."""
    found: list[Violation] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        ok = [g for g in grants if g.result == "ok"]
        found += _precedence(ok, ok, "token_order", scope, "grant", strict=True)
    return found


def stale_writes(ops: Sequence[Op]) -> list[Violation]:
    """An acknowledged write below the high-water mark established before it was invoked."""
    found: list[Violation] = []
    marks: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.result != "ok" or op.token is None:
            continue
        if op.f == "write" or (op.f == "read" and op.fenced and op.status in ESTABLISHING_READS):
            marks[op.scope].append(op)
    for scope, established in sorted(marks.items()):
        writes = [op for op in established if op.f == "write"]
        found += _precedence(established, writes, "stale_write", scope, "write", strict=False)
    return found


def _held(grant: Op, releases: dict[tuple[str, str], float]) -> tuple[float, float] | None:
    """When the holder surely held the lease, or None if never surely."""
    if grant.result != "ok" or grant.end is None or grant.valid_ms is None:
        return None
    until = grant.start + grant.valid_ms / 1000
    if grant.lease_id is not None:
        until = min(until, releases.get((grant.scope, grant.lease_id), until))
    return (grant.end, until) if until > grant.end else None


def _active(faults: Sequence[FaultWindow], start: float, end: float) -> tuple[str, ...]:
    return tuple(sorted({f.kind for f in faults if f.start < end and start < f.end}))


def overlaps(ops: Sequence[Op], faults: Sequence[FaultWindow] = ()) -> list[Overlap]:
    """Pairs of leases of one name that both surely held it at the same time."""
    releases = {
        (op.scope, op.lease_id): op.start
        for op in ops
        if op.f == "release" and op.lease_id is not None
    }
    found: list[Overlap] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        held = sorted(
            (span, g) for g in grants if (span := _held(g, releases)) is not None
        )  # fmt: skip
        for i, ((_start, end), first) in enumerate(held):
            for (other_start, other_end), second in held[i + 1 :]:
                if other_start >= end:
                    break
                if first.lease_id == second.lease_id:
                    continue
                both = (other_start, min(end, other_end))
                # A clock jump expires the leases alive then; the second grant can come
                # after the jump's window closed: count the faults of both leases' lives.
                lives = (min(first.start, second.start), both[1])
                found.append(
                    Overlap(
                        scope,
                        first,
                        second,
                        both[1] - both[0],
                        _active(faults, *both),
                        _active(faults, *lives),
                    )
                )
    return found


def availability(ops: Sequence[Op], faults: Sequence[FaultWindow]) -> dict[str, Counter[str]]:
    """Client operations by result (ok/fail/info) while each fault kind was active."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for op in ops:
        if op.f == "final_read":
            continue
        kinds = {f.kind for f in faults if f.start <= op.start < f.end} or {"none"}
        for kind in kinds:
            table[kind][op.result] += 1
    return dict(table)


def direct_writes(ops: Sequence[Op]) -> Counter[str]:
    """Direct writes by outcome (``ok``, ``fail FG409``, ``info``, ...), and the late ones
    (sent after the lease's validity had ended: after the grant's answer plus the
    validity it reported) as ``late ok`` / ``late refused`` (FG409) / ``late other``."""
    grants = {
        (op.scope, op.lease_id): op
        for op in ops
        if op.f == "acquire" and op.result == "ok" and op.lease_id is not None
    }
    counts: Counter[str] = Counter()
    for op in ops:
        if op.f != "write" or not op.direct:
            continue
        counts[" ".join(filter(None, (op.result, op.error if op.result == "fail" else None)))] += 1
        grant = grants.get((op.scope, op.lease_id or ""))
        if grant is None or grant.end is None or grant.valid_ms is None:
            continue
        if op.start > grant.end + grant.valid_ms / 1000:
            if op.result == "ok":
                counts["late ok"] += 1
            elif op.error == "FG409":
                counts["late refused"] += 1
            else:
                counts["late other"] += 1
    return counts


def check(events: Iterable[Event], faults: Sequence[FaultWindow] = ()) -> Report:
    """Every check over a merged history."""
    ops = pair_ops(events)
    report = Report()
    report.violations = [
        *lost_updates(ops),
        *duplicate_tokens(ops),
        *token_order(ops),
        *stale_writes(ops),
    ]
    report.overlaps = overlaps(ops, faults)
    report.violations += [
        Violation(
            "mutual_exclusion",
            o.scope,
            f"two leases held it for {o.seconds:.3f} s (tokens {o.first.token} and "
            f"{o.second.token}) with no clock fault in their lifetime "
            f"(active then: {list(o.lifetime_faults)})",
            (o.first, o.second),
        )
        for o in report.overlaps
        if not CLOCK_FAULTS & set(o.lifetime_faults)
    ]
    report.availability = availability(ops, faults)
    report.ops = Counter(f"{op.f}:{op.result}" for op in ops if op.f != "final_read")
    report.direct = direct_writes(ops)
    report.direct_availability = availability([op for op in ops if op.direct], faults)
    return report
