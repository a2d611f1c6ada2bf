"""Checks over a campaign history: pure functions of the paired operations.

Violations (a correct fencegate never shows one):

* ``lost_update``: per key, two acknowledged writes of the same value (each client
  writes the value it read plus one), or a final value outside
  ``[acknowledged writes, acknowledged + indeterminate writes]``;
* ``duplicate_token``: two different leases of one lock name with the same token
  (excused, like an overlap below, by a clock fault that struck between the first of
  their acquires and the later answer: ``duplicate_tokens``);
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
assumption was active between the first of the two acquires' invocation and the
later grant's answer (``CLOCK_FAULTS``: a Redis node's clock jumping forward
expires a lease early on that node, Kleppmann's third scenario, and the second
grant may come after the jump's window closed; a jump after both grants were
answered made neither; there only the fencing checks above must hold). A fault
counts where it strikes a node (``_strike``): ``clock_jump_node`` and
``kill_node`` at their window's start, ``rollback_node`` at its end,
``kleppmann``'s repeated jumps all along its window.
``availability``: operations by result while each fault kind was active
(``none``: while no fault was), and the same for the direct writers' ops alone.
``direct_writes``: what became of the direct writers' UPDATEs (``direct.py``),
and of the late ones among them.

Lock kinds (``mode`` of an acquire: exclusive, shared, semaphore; protocol.py
R22-R26, I1, I2, I5): an overlap is one only when one of the two leases is
exclusive (shared leases hold together, I1); ``duplicate_token`` likewise
(overlapping shared or semaphore grants may share a token, R23, R24);
``token_order`` is I2 for every kind (a grant completed before another's acquire
began has the smaller token; a repeat of an idempotent acquire that names the same
lease is no new grant, when it names the same token). Which answers are one lease
(``_lease``): those naming one ``lease_id`` *and* carrying one ``Idempotency-Key``
and kind, the first request and its repeats, sent together or one after the other
(R26: one lease per key; the key's digest covers the kind). Only those: any other
answer naming a lease id that another request was answered with (no key, another
key, another kind) is a lease of its own for every check, so its token counts as a
grant of its own (``duplicate_token``, ``token_order``) and its holder as another
holder (overlaps); a gateway that gave one request's lease to another would
otherwise pass unseen. A repeat is not bound in time: one racing its lease's
release may be answered with the lease until the release lands (README), and a
release can be replayed on a node after its answer (R7). Two more checks:

* ``semaphore_overcount``: more semaphore leases of a name surely held at one
  instant than their ``permits`` (I5, R32); excused like an overlap by a clock
  fault in the leases' lifetime;
* ``idempotency``: two successful acquires with one ``Idempotency-Key`` that name
  different leases or tokens, the second asked after the first was answered and
  answered while the first's lease was surely held, or the two sent together and
  their leases both surely held at one instant (R26: one lease per key).
  An acquire whose tag commit reached fewer than a quorum fails (503), so no fault
  during the first acquire excuses a split. The tag lives with the lease's entry on
  each node, so a node that forgets the entry between the first acquire and the
  second's answer (``FORGETTING_FAULTS``) can leave fewer than a quorum naming the
  lease: a restart empty or from an old snapshot (the node is quarantined, R19,
  so only a repeat that may join a held lock, shared or semaphore, gets a second
  lease), or a clock jump that expires it early (I1 is void then: any kind).
  Those are counted in ``idempotency_excused``.

A lease's sure interval: from its grant's answer to the earlier of its release's
invocation and ``invoke + valid_ms``, stretched by each successful renew invoked
inside it to the renew's ``invoke + valid_ms``.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.campaign.history import Event, FaultWindow, Op, pair_ops

__all__ = [
    "CLOCK_FAULTS",
    "FORGETTING_FAULTS",
    "Overlap",
    "Report",
    "Violation",
    "availability",
    "check",
    "direct_writes",
    "duplicate_tokens",
    "idempotency",
    "kind_counts",
    "lost_updates",
    "overlaps",
    "semaphore_overcount",
    "stale_writes",
    "token_order",
]

CLOCK_FAULTS = frozenset({"clock_jump_node", "kleppmann"})
# Faults after which a node no longer holds a lease's entry, and so its idempotency
# tag (R26): a restart that lost data (the node is quarantined, R19: it grants
# nothing, but a repeat that finds no quorum naming the lease may join a shared or
# semaphore lock held on the other nodes), and a clock jump (expires the entry
# early; the node is free again, so even an exclusive repeat may be granted).
RESTART_FAULTS = frozenset({"kill_node", "rollback_node"})
FORGETTING_FAULTS = RESTART_FAULTS | CLOCK_FAULTS
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
    lifetime_faults: tuple[str, ...]  # struck from the first of the two acquires to the later grant


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    availability: dict[str, Counter[str]] = field(default_factory=dict)
    ops: Counter[str] = field(default_factory=Counter)
    direct: Counter[str] = field(default_factory=Counter)
    direct_availability: dict[str, Counter[str]] = field(default_factory=dict)
    idempotency_excused: int = 0  # splits of one key under a fault R26 does not cover
    kinds: Counter[str] = field(default_factory=Counter)  # ``kind_counts``

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


def _lease(op: Op) -> object:
    """Which lease an acquire's answer is for the checks: one ``lease_id`` answered to
    requests with one idempotency key and kind is one lease (the first request and its
    repeats, R26); any other answer is a lease of its own, whatever id it names."""
    if op.idem_key is not None:
        return (op.lease_id, op.mode, op.idem_key)
    return (op.lease_id, op.process, op.op)


def duplicate_tokens(ops: Sequence[Op], faults: Sequence[FaultWindow] = ()) -> list[Violation]:
    """Two different ``lease_id`` granted with the same token for one lock name, one of
    them exclusive; excused, like an overlap, when a clock fault struck a node between
    the first of their acquires' invocation and the last grant's answer.

    Why a clock jump can do it (R3, R4): two quorums meet on a node, and the later
    lease's grant there is normally issued above the earlier's token. When that node's
    clock jumps, the first lease's entry there expires while its gateway still counts
    it (I1's assumption is void): the second lease is granted the node with the next
    token, and the first lease's round 2 (R4) later finds the node "free" and counts
    it at that same token. ``token_order`` stays strict: an acquire invoked after a
    grant completed finds that token on a quorum, counters never go down (R2), and a
    jump expires entries, not counters."""
    found: list[Violation] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        by_token: dict[int, dict[object, Op]] = defaultdict(dict)
        for g in grants:
            if g.result == "ok" and g.token is not None and g.lease_id is not None:
                by_token[g.token].setdefault(_lease(g), g)
        for token, leases in sorted(by_token.items()):
            # Overlapping shared or semaphore grants may share a token (R23, R24).
            if len(leases) > 1 and any(g.mode == "exclusive" for g in leases.values()):
                lives = (min(g.start for g in leases.values()),
                         max(g.end or g.start for g in leases.values()))  # fmt: skip
                if CLOCK_FAULTS & set(_struck(faults, *lives)):
                    continue
                ids = {g.lease_id for g in leases.values()}
                detail = f"token {token} granted to {len(leases)} leases"
                if len(ids) < len(leases):
                    detail += (
                        f" ({len(ids)} lease ids: one answered to requests that are not"
                        " repeats of one idempotency key)"
                    )
                found.append(Violation("duplicate_token", scope, detail, tuple(leases.values())))
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
    """A grant completed before another was invoked must have the smaller token (I2, every
    kind); an acquire that answers a lease an earlier-invoked one answered, with its token,
    is a repeat when both carry one idempotency key and kind (``_lease``)."""
    found: list[Violation] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        ok = [g for g in grants if g.result == "ok"]
        first: dict[object, Op] = {}
        for g in sorted(ok, key=lambda o: o.start):
            first.setdefault(_lease(g), g)
        # A repeat answers the lease's decided token (R26): one with another token
        # is a grant of its own.
        new = [g for g in ok if first[_lease(g)].token != g.token or first[_lease(g)] is g]
        found += _precedence(ok, new, "token_order", scope, "grant", strict=True)
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


Renews = dict[tuple[str, str], list[Op]]


def _lease_ends(ops: Sequence[Op]) -> tuple[dict[tuple[str, str], float], Renews]:
    """Per (scope, lease_id): the first release's invocation, and the successful renews."""
    releases: dict[tuple[str, str], float] = {}
    renews: Renews = defaultdict(list)
    for op in ops:
        if op.lease_id is None:
            continue
        if op.f == "release":
            ident = (op.scope, op.lease_id)
            releases[ident] = min(op.start, releases.get(ident, op.start))
        elif op.f == "renew" and op.result == "ok" and op.valid_ms is not None:
            renews[(op.scope, op.lease_id)].append(op)
    return releases, renews


def _held(
    grant: Op, releases: dict[tuple[str, str], float], renews: Renews | None = None
) -> tuple[float, float] | None:
    """When the holder surely held the lease, or None if never surely: from the answer to
    invoke + valid_ms, stretched by renews invoked while surely held, cut at the release."""
    if grant.result != "ok" or grant.end is None or grant.valid_ms is None:
        return None
    until = grant.start + grant.valid_ms / 1000
    if grant.lease_id is not None:
        ident = (grant.scope, grant.lease_id)
        for renew in sorted((renews or {}).get(ident, ()), key=lambda o: o.start):
            if grant.end <= renew.start < until and renew.valid_ms is not None:
                until = max(until, renew.start + renew.valid_ms / 1000)
        until = min(until, releases.get(ident, until))
    return (grant.end, until) if until > grant.end else None


def _active(faults: Sequence[FaultWindow], start: float, end: float) -> tuple[str, ...]:
    return tuple(sorted({f.kind for f in faults if f.start < end and start < f.end}))


# For a history whose windows do not say when the fault struck: how long after a
# window's start a node is killed or its clock jumps (the nemesis does it first:
# ``kill_node``, ``clock_jump_node``), and before its end a rollback's node is killed
# and restarted from the old snapshot (``rollback_node``), in seconds.
STRIKE_S = 2.0
ROLLBACK_S = 3.0


def _strike(fault: FaultWindow) -> tuple[float, float]:
    """When a fault takes entries from a node: a kill and a clock jump at the window's
    start (the rest of the window is the node down, or nothing), a rollback at its end
    (the nemesis notes each act: ``struck_from`` .. ``struck_until``), ``kleppmann``'s
    jumps all along it; any other fault acts all along its window."""
    if fault.struck_from is not None and fault.struck_until is not None:
        return fault.struck_from, fault.struck_until
    if fault.kind in ("kill_node", "clock_jump_node"):
        return fault.start, min(fault.end, fault.start + STRIKE_S)
    if fault.kind == "rollback_node":
        return max(fault.start, fault.end - ROLLBACK_S), fault.end
    return fault.start, fault.end


def _struck(faults: Sequence[FaultWindow], start: float, end: float) -> tuple[str, ...]:
    """The kinds of the faults that struck a node between ``start`` and ``end``."""
    return tuple(sorted({f.kind for f in faults if _strike(f)[0] < end and start < _strike(f)[1]}))


def _sure_spans(ops: Sequence[Op], scope_grants: Iterable[Op]) -> list[tuple[float, float, Op]]:
    """Each lease's sure interval (over every answer that is it: repeats of one key,
    ``_lease``)."""
    releases, renews = _lease_ends(ops)
    leases: dict[object, tuple[float, float, Op]] = {}
    for g in scope_grants:
        span = _held(g, releases, renews)
        if span is None:
            continue
        ident = _lease(g)
        if ident in leases:
            start, end, first = leases[ident]
            span = (min(start, span[0]), max(end, span[1]))
            g = first if first.start <= g.start else g
        leases[ident] = (*span, g)
    return sorted(leases.values(), key=lambda s: (s[0], s[1]))


def overlaps(ops: Sequence[Op], faults: Sequence[FaultWindow] = ()) -> list[Overlap]:
    """Pairs of leases of one name that both surely held it at the same time, one of them
    exclusive (shared leases hold together; semaphores are counted by
    ``semaphore_overcount``)."""
    found: list[Overlap] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        held = [((start, end), g) for start, end, g in _sure_spans(ops, grants)]
        for i, ((_start, end), first) in enumerate(held):
            for (other_start, other_end), second in held[i + 1 :]:
                if other_start >= end:
                    break
                if _lease(first) == _lease(second):
                    continue
                if "exclusive" not in (first.mode, second.mode):
                    continue
                both = (other_start, min(end, other_end))
                # A clock jump expires the leases alive then; the second grant can come
                # after the jump's window closed: count the faults from the first of the
                # two acquires to the later grant's answer (after it, a jump makes no
                # grant that was already decided overlap).
                lives = (min(first.start, second.start), other_start)
                found.append(
                    Overlap(
                        scope,
                        first,
                        second,
                        both[1] - both[0],
                        _active(faults, *both),
                        _struck(faults, *lives),
                    )
                )
    return found


def semaphore_overcount(ops: Sequence[Op], faults: Sequence[FaultWindow] = ()) -> list[Violation]:
    """Instants at which more semaphore leases of a name were surely held than their permits
    (I5); excused by a clock fault in the lifetime of the leases held then."""
    found: list[Violation] = []
    for scope, grants in sorted(_by_scope(ops, "acquire").items()):
        sems = [g for g in grants if g.mode == "semaphore"]
        spans = _sure_spans(ops, sems)
        over_until = float("-inf")  # one violation per stretch of too many holders
        for start, _end, _grant in spans:
            held: dict[object, tuple[float, float, Op]] = {}
            for span in spans:
                if span[0] <= start < span[1]:
                    held.setdefault(_lease(span[2]), span)
            permits = min((s[2].permits or 0) for s in held.values())
            if len(held) <= permits or start < over_until:
                continue
            over_until = min(s[1] for s in held.values())
            lives = (min(s[2].start for s in held.values()), start)
            if CLOCK_FAULTS & set(_struck(faults, *lives)):
                continue
            tokens = sorted(s[2].token or 0 for s in held.values())
            found.append(
                Violation(
                    "semaphore_overcount",
                    scope,
                    f"{len(held)} leases of {permits} permits surely held at once (tokens "
                    f"{tokens}), no clock fault in their lifetime "
                    f"(struck then: {list(_struck(faults, *lives))})",
                    tuple(s[2] for s in held.values()),
                )
            )
    return found


def idempotency(
    ops: Sequence[Op], faults: Sequence[FaultWindow] = ()
) -> tuple[list[Violation], int]:
    """One lease per key (R26): a successful acquire asked after another with the same key
    was answered, and answered while that one's lease was surely held, names the same
    lease and token; two sent together (the second asked before the first was answered)
    that name different leases were never both surely held at one instant (each returns
    its own lease only once a quorum took its tag, and a node holding one lease tagged
    refuses the other's tag: the one committed first is the key's lease, README).
    Returns the violations and how many splits a fault excused."""
    releases, renews = _lease_ends(ops)
    by_key: dict[tuple[str, str, str], list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "acquire" and op.result == "ok" and op.idem_key is not None:
            by_key[(op.scope, op.mode, op.idem_key)].append(op)
    found: list[Violation] = []
    excused = 0
    for (scope, _mode, key), answers in sorted(by_key.items()):
        answers.sort(key=lambda o: o.start)
        for i, first in enumerate(answers):
            span = _held(first, releases, renews)
            if span is None:
                continue
            for second in answers[i + 1 :]:
                if second.end is None:
                    continue
                if (second.lease_id, second.token) == (first.lease_id, first.token):
                    continue
                together = second.start < span[0]
                if together:
                    other = _held(second, releases, renews)
                    if other is None or max(span[0], other[0]) >= min(span[1], other[1]):
                        continue
                elif not second.start < second.end <= span[1]:
                    continue
                later = max(span[0], second.end)  # the later answer
                forgot = FORGETTING_FAULTS & set(_struck(faults, first.start, later))
                if forgot and (first.mode != "exclusive" or forgot & CLOCK_FAULTS):
                    excused += 1
                    continue
                found.append(
                    Violation(
                        "idempotency",
                        scope,
                        f"key {key!r}: lease {second.lease_id} token {second.token} answered "
                        f"while lease {first.lease_id} token {first.token} of the same key "
                        + (
                            "(asked together) was surely held too"
                            if together
                            else "was surely held"
                        ),
                        (first, second),
                    )
                )
    return found, excused


def kind_counts(ops: Sequence[Op]) -> Counter[str]:
    """Acquires by kind and result (``shared:ok``), renews (``renew:ok``), and the keys of
    idempotent acquires answered more than once: ``repeat:same`` (one lease) or
    ``repeat:other`` (several leases; a violation only while the first was surely held)."""
    counts: Counter[str] = Counter()
    leases: dict[str, set[str | None]] = defaultdict(set)
    answers: Counter[str] = Counter()
    for op in ops:
        if op.f == "acquire":
            counts[f"{op.mode}:{op.result}"] += 1
            if op.idem_key is not None:
                counts[f"idempotent:{op.result}"] += 1
                if op.result == "ok":
                    leases[op.idem_key].add(op.lease_id)
                    answers[op.idem_key] += 1
        elif op.f == "renew":
            counts[f"renew:{op.result}"] += 1
    for key, named in leases.items():
        if answers[key] > 1:
            counts["repeat:same" if len(named) == 1 else "repeat:other"] += 1
    return counts


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
        *duplicate_tokens(ops, faults),
        *token_order(ops),
        *stale_writes(ops),
    ]
    report.overlaps = overlaps(ops, faults)
    report.violations += [
        Violation(
            "mutual_exclusion",
            o.scope,
            f"two leases ({o.first.mode}, {o.second.mode}) held it for {o.seconds:.3f} s "
            f"(tokens {o.first.token} and {o.second.token}) with no clock fault in their lifetime "
            f"(struck then: {list(o.lifetime_faults)})",
            (o.first, o.second),
        )
        for o in report.overlaps
        if not CLOCK_FAULTS & set(o.lifetime_faults)
    ]
    report.violations += semaphore_overcount(ops, faults)
    idem, report.idempotency_excused = idempotency(ops, faults)
    report.violations += idem
    report.kinds = kind_counts(ops)
    report.availability = availability(ops, faults)
    report.ops = Counter(f"{op.f}:{op.result}" for op in ops if op.f != "final_read")
    report.direct = direct_writes(ops)
    report.direct_availability = availability([op for op in ops if op.direct], faults)
    return report
