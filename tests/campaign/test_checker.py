"""The checker on small synthetic histories: each violation is found, a clean one has none."""

from __future__ import annotations

from typing import Any

import pytest

from tests.campaign.checker import check, overlaps
from tests.campaign.history import Event, FaultWindow, pair_ops


class History:
    """Builds events as clients record them: ``op()`` adds an invoke and its completion."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ops = 0

    def op(
        self, process: str, f: str, start: float, end: float | None, result: str = "ok",
        key: str = "kv/k", **fields: Any,
    ) -> None:  # fmt: skip
        self.ops += 1
        store, name = key.split("/", 1)
        base = {"process": process, "op": self.ops, "f": f, "store": store, "key": name}
        self.events.append({**base, "type": "invoke", "mono": start, "wall": start, **fields})
        if end is not None:
            self.events.append({**base, "type": result, "mono": end, "wall": end, **fields})

    def cycle(
        self, process: str, t: float, token: int, value: int, *, lease: str | None = None,
        key: str = "kv/k", write: str = "ok",
    ) -> None:  # fmt: skip
        """acquire at t, fenced read at t+1, write value at t+2, release at t+3 (each 0.5 s)."""
        lease_id = lease or f"lease-{token}"
        self.op(process, "acquire", t, t + 0.5, key=key, token=token, lease_id=lease_id,
                valid_ms=10_000)  # fmt: skip
        self.op(process, "read", t + 1, t + 1.5, key=key, token=token, lease_id=lease_id,
                value=value - 1, fenced=True, status=200)  # fmt: skip
        self.op(process, "write", t + 2, t + 2.5 if write != "info" else None, write,
                key=key, token=token, lease_id=lease_id, value=value, status=200)  # fmt: skip
        self.op(process, "release", t + 3, t + 3.5, key=key, lease_id=lease_id, status=204)

    def final(self, value: int, key: str = "kv/k", t: float = 1000.0) -> None:
        self.op("final", "final_read", t, t + 0.1, key=key, value=value, status=200)


def clean() -> History:
    h = History()
    for i in range(5):
        h.cycle(f"c{i % 2}", 10.0 * i, token=100 + i, value=i + 1)
    h.final(5)
    return h


def test_a_clean_history_has_no_violation() -> None:
    report = check(clean().events)
    assert report.ok, report.violations
    assert report.overlaps == []
    assert report.ops["write:ok"] == 5


def test_two_acknowledged_writes_of_one_value_are_a_lost_update() -> None:
    h = History()
    h.cycle("c0", 0.0, token=1, value=1)
    h.cycle("c1", 10.0, token=2, value=1)  # read 0 as well: c0's increment is lost
    h.final(1)
    kinds = [(v.kind, v.detail) for v in check(h.events).violations]
    assert ("lost_update", "2 acknowledged writes of 1") in kinds
    assert any("final value 1 outside [2, 2]" in d for _, d in kinds), kinds


def test_final_value_below_acknowledged_writes_is_a_lost_update() -> None:
    h = clean()
    h.events = [e for e in h.events if e["f"] != "final_read"]
    h.final(4)  # 5 acknowledged increments, one vanished
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["lost_update"]
    assert "final value 4 outside [5, 5]" in violations[0].detail


def test_indeterminate_writes_widen_the_final_range() -> None:
    h = History()
    h.cycle("c0", 0.0, token=1, value=1)
    h.cycle("c1", 10.0, token=2, value=2, write="info")  # timed out: applied or not
    h.final(2)
    assert check(h.events).ok
    h.events = [e for e in h.events if e["f"] != "final_read"]
    h.final(3)  # more than every write that could have been applied
    assert [v.kind for v in check(h.events).violations] == ["lost_update"]


def test_one_token_granted_to_two_leases_is_a_duplicate_token() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.5, token=7, lease_id="a", valid_ms=1000)
    h.op("c1", "acquire", 0.2, 0.6, token=7, lease_id="b", valid_ms=1000)
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["duplicate_token", "mutual_exclusion"]
    assert violations[0].detail == "token 7 granted to 2 leases"


def test_a_grant_after_a_completed_grant_with_a_smaller_token_is_out_of_order() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.5, token=9, lease_id="a", valid_ms=100)
    h.op("c1", "acquire", 1.0, 1.5, token=8, lease_id="b", valid_ms=100)
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["token_order"]
    assert "token 8 after token 9" in violations[0].detail


def test_a_later_grant_with_an_equal_token_is_out_of_order() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.5, token=9, lease_id="a", valid_ms=100)
    h.op("c1", "acquire", 1.0, 1.5, token=9, lease_id="b", valid_ms=100)
    kinds = sorted(v.kind for v in check(h.events).violations)
    assert kinds == ["duplicate_token", "token_order"]


def test_concurrent_grants_may_be_in_any_token_order() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 2.0, token=9, lease_id="a", valid_ms=100)
    # invoked before c0's grant was answered
    h.op("c1", "acquire", 1.0, 1.5, token=8, lease_id="b", valid_ms=100)
    assert check(h.events).ok


def test_a_write_below_an_earlier_fenced_read_is_a_stale_write() -> None:
    h = History()
    h.op("c0", "read", 0.0, 0.5, token=5, value=0, fenced=True, status=200)
    h.op("c1", "write", 1.0, 1.5, token=4, value=1, status=200)  # accepted: wrong
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["stale_write"]
    assert "token 4 after token 5 of an earlier read" in violations[0].detail


def test_a_write_below_an_earlier_write_is_a_stale_write() -> None:
    h = History()
    h.op("c0", "write", 0.0, 0.5, token=5, value=1, status=200)
    h.op("c1", "write", 1.0, 1.5, token=4, value=2, status=200)
    assert [v.kind for v in check(h.events).violations] == ["stale_write"]


def test_unfenced_reads_refused_writes_and_equal_tokens_establish_nothing_stale() -> None:
    h = History()
    h.op("c0", "read", 0.0, 0.5, token=9, value=0, fenced=False, status=200)
    h.op("c0", "write", 0.6, 0.7, "fail", token=8, value=1, status=409)
    h.op("c1", "write", 1.0, 1.5, token=4, value=1, status=200)
    h.op("c1", "write", 2.0, 2.5, token=4, value=2, status=200)  # a holder writes again
    assert check(h.events).ok


@pytest.mark.parametrize("released", [False, True])
def test_overlapping_leases_are_reported_with_the_active_faults(released: bool) -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=1, lease_id="a", valid_ms=2000)  # held 0.1 .. 2.0
    if released:
        h.op("c0", "release", 0.5, 0.6, lease_id="a", status=204)  # held 0.1 .. 0.5
    h.op("c1", "acquire", 1.0, 1.1, token=2, lease_id="b", valid_ms=2000)
    fault = FaultWindow("clock_jump_node", 0.9, 1.5)
    found = overlaps(pair_ops(h.events), [fault])
    if released:
        assert found == []
    else:
        assert [(o.scope, round(o.seconds, 3), o.faults) for o in found] == [
            ("kv/k", 0.9, ("clock_jump_node",))
        ]
    assert check(h.events, [fault]).ok  # a clock fault was active: reported only
    report = check(h.events, [FaultWindow("kill_node", 0.9, 1.5)])
    assert [v.kind for v in report.violations] == ([] if released else ["mutual_exclusion"])


def test_an_overlap_after_a_clock_jump_window_closed_is_still_the_jump() -> None:
    """Kleppmann's timeline: the jump expires lease a on one node during the fault;
    lease b is granted just after the fault's window closed, while a is still valid."""
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=1, lease_id="a", valid_ms=2000)  # held 0.1 .. 2.0
    h.op("c1", "acquire", 0.8, 1.1, token=2, lease_id="b", valid_ms=2000)
    report = check(h.events, [FaultWindow("kleppmann", 0.5, 1.0)])
    assert [o.faults for o in report.overlaps] == [()]  # nothing active during the overlap
    assert report.ok, report.violations
    # A clock fault that was over before either lease was asked for excuses nothing.
    report = check(h.events, [FaultWindow("clock_jump_node", -5.0, -1.0)])
    assert [v.kind for v in report.violations] == ["mutual_exclusion"]


def test_availability_counts_operations_by_result_per_active_fault() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=1, lease_id="a", valid_ms=100)
    h.op("c0", "acquire", 1.0, 1.1, "fail", status=409)
    h.op("c1", "acquire", 1.2, None)  # no answer: info
    report = check(h.events, [FaultWindow("kill_node", 0.9, 2.0)])
    assert report.availability == {"none": {"ok": 1}, "kill_node": {"fail": 1, "info": 1}}


def test_a_completion_without_invocation_is_refused() -> None:
    event = {"process": "c0", "op": 1, "f": "read", "store": "kv", "key": "k",
             "type": "ok", "mono": 1.0, "wall": 1.0}  # fmt: skip
    with pytest.raises(ValueError, match="completion without invocation"):
        pair_ops([event])


def test_direct_writes_are_counted_and_the_late_ones_told_apart() -> None:
    """A direct write after the grant's answer + its validity is late; refused is FG409."""
    h = History()
    lease: dict[str, Any] = {"token": 7, "lease_id": "l7", "direct": True}
    h.op("d0", "acquire", 0.0, 0.1, key="ledger/k", valid_ms=1000, **lease)
    h.op("d0", "write", 0.5, 0.6, key="ledger/k", value=1, **lease)  # in time
    h.op("d0", "write", 1.2, 1.3, "fail", key="ledger/k", value=2, status=409, error="FG409",
         **lease)  # fmt: skip
    h.op("d0", "write", 1.4, 1.5, key="ledger/k", value=3, **lease)
    h.op("d0", "write", 1.6, None, key="ledger/k", value=4, **lease)
    h.op("c0", "write", 1.7, 1.8, key="ledger/k", value=5, token=9, lease_id="l9")  # proxy
    direct = check(h.events).direct
    assert direct == {
        "ok": 2, "fail FG409": 1, "info": 1, "late refused": 1, "late ok": 1, "late other": 1,
    }  # fmt: skip


def test_a_late_direct_write_accepted_after_a_newer_fenced_read_is_a_stale_write() -> None:
    """Direct ops go through the same checks: the trigger must refuse this write."""
    h = History()
    h.cycle("c0", 0.0, token=100, value=1, key="ledger/k")
    h.op("d0", "acquire", 10.0, 10.1, key="ledger/k", token=101, lease_id="l101",
         valid_ms=1000, direct=True)  # fmt: skip
    h.op("c1", "read", 12.0, 12.1, key="ledger/k", token=102, lease_id="l102", value=1,
         fenced=True, status=200)  # fmt: skip
    h.op("d0", "write", 13.0, 13.1, key="ledger/k", token=101, lease_id="l101", value=2,
         direct=True)  # fmt: skip
    report = check(h.events)
    assert [v.kind for v in report.violations] == ["stale_write"], report.violations
    assert report.direct["late ok"] == 1


# Lock kinds (protocol.py R22-R26, I1, I2, I5)


def test_shared_leases_hold_together_but_an_exclusive_one_overlaps_none() -> None:
    h = History()
    h.op("r0", "acquire", 0.0, 0.1, token=5, lease_id="s1", valid_ms=2000, mode="shared")
    h.op("r1", "acquire", 0.05, 0.3, token=5, lease_id="s2", valid_ms=2000, mode="shared")
    assert check(h.events).ok  # shared grants asked together may share a token (R23)
    h.op("c0", "acquire", 0.25, 1.0, token=6, lease_id="x", valid_ms=2000)  # held 1.0 .. 2.25
    report = check(h.events)
    assert [v.kind for v in report.violations] == ["mutual_exclusion", "mutual_exclusion"]
    assert "(shared, exclusive)" in report.violations[0].detail


def test_an_exclusive_grant_sharing_a_shared_grants_token_is_a_duplicate() -> None:
    h = History()
    h.op("r0", "acquire", 0.0, 0.1, token=5, lease_id="s1", valid_ms=100, mode="shared")
    h.op("c0", "acquire", 0.05, 0.3, token=5, lease_id="x", valid_ms=100)  # concurrent asks
    assert [v.kind for v in check(h.events).violations] == ["duplicate_token"]


@pytest.mark.parametrize("mode", ["shared", "semaphore"])
def test_a_grant_asked_after_another_ended_needs_a_larger_token(mode: str) -> None:
    permits = {"permits": 2} if mode == "semaphore" else {}
    h = History()
    h.op("r0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=100, mode=mode, **permits)
    h.op("r1", "acquire", 0.05, 0.2, token=5, lease_id="b", valid_ms=100, mode=mode, **permits)
    assert check(h.events).ok  # asked before a was answered: not ordered
    h.op("r2", "acquire", 0.3, 0.4, token=5, lease_id="c", valid_ms=100, mode=mode, **permits)
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["token_order"]
    assert "token 5 after token 5" in violations[0].detail


def test_a_repeat_naming_the_same_lease_is_no_new_grant() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1")
    h.op("c0", "acquire", 0.2, 0.3, token=5, lease_id="a", valid_ms=1800, idem_key="k1")
    assert check(h.events).ok


def sem(h: History, process: str, start: float, end: float, lease: str, token: int) -> None:
    h.op(process, "acquire", start, end, key="sem/s", token=token, lease_id=lease,
         valid_ms=1000, mode="semaphore", permits=2)  # fmt: skip


def test_more_semaphore_leases_surely_held_than_permits_is_an_overcount() -> None:
    h = History()
    sem(h, "s0", 0.0, 0.1, "a", 1)  # held 0.1 .. 1.0
    sem(h, "s1", 0.2, 0.3, "b", 2)  # held 0.3 .. 1.2
    h.op("s0", "release", 0.5, 0.6, key="sem/s", lease_id="a", status=204)  # a: 0.1 .. 0.5
    sem(h, "s2", 0.55, 0.7, "c", 3)  # held 0.7 .. 1.55
    assert check(h.events).ok  # never more than 2 at once
    h.events = [e for e in h.events if e["f"] != "release"]  # a held until 1.0
    violations = check(h.events).violations
    assert [v.kind for v in violations] == ["semaphore_overcount"]
    assert "3 leases of 2 permits" in violations[0].detail
    # A Redis node's clock jump expires leases early: reported as an overlap would be.
    assert check(h.events, [FaultWindow("clock_jump_node", 0.4, 0.6)]).ok
    assert not check(h.events, [FaultWindow("kill_node", 0.4, 0.6)]).ok


def test_a_renew_stretches_the_sure_interval() -> None:
    h = History()
    sem(h, "s0", 0.0, 0.1, "a", 1)  # held 0.1 .. 1.0
    sem(h, "s1", 0.2, 0.3, "b", 2)  # held 0.3 .. 1.2
    sem(h, "s2", 1.05, 1.1, "c", 3)  # held 1.1 .. 2.05
    assert check(h.events).ok
    h.op("s0", "renew", 0.9, 0.95, key="sem/s", lease_id="a", token=1, valid_ms=1000)
    assert [v.kind for v in check(h.events).violations] == ["semaphore_overcount"]
    # A renew asked after the sure interval ended stretches nothing.
    h.events = [e for e in h.events if e["f"] != "renew"]
    h.op("s0", "renew", 1.01, 1.03, key="sem/s", lease_id="a", token=1, valid_ms=1000)
    assert check(h.events).ok


def idem_pair(mode: str) -> History:
    """Two answers for key k1: lease a (held 0.1 .. 2.0), then lease b asked at 0.2."""
    permits = {"permits": 2} if mode == "semaphore" else {}
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1",
         mode=mode, **permits)  # fmt: skip
    h.op("c0", "acquire", 0.2, 0.3, token=6, lease_id="b", valid_ms=2000, idem_key="k1",
         mode=mode, **permits)  # fmt: skip
    return h


def test_two_leases_answered_for_one_key_while_the_first_was_held_break_idempotency() -> None:
    h = idem_pair("shared")
    report = check(h.events)
    assert [v.kind for v in report.violations] == ["idempotency"]
    assert "key 'k1': lease b token 6 answered while lease a token 5" in report.violations[0].detail


@pytest.mark.parametrize("kind", ["partition", "pause_gateway", "drop_replies", "delay"])
def test_a_fault_that_costs_commit_acks_during_the_first_acquire_excuses_no_split(
    kind: str,
) -> None:
    """An acquire whose tag commit missed a quorum fails with 503 (R26): the first answer
    named a lease a quorum had tagged, and a link fault then cannot untag it."""
    h = idem_pair("shared")
    report = check(h.events, [FaultWindow(kind, 0.05, 0.5)])
    assert [v.kind for v in report.violations] == ["idempotency"]
    assert report.idempotency_excused == 0


@pytest.mark.parametrize("mode", ["shared", "semaphore"])
@pytest.mark.parametrize("kind", ["kill_node", "rollback_node", "clock_jump_node", "kleppmann"])
def test_a_node_forgetting_the_tag_excuses_a_split_of_a_joinable_kind(kind: str, mode: str) -> None:
    h = idem_pair(mode)
    report = check(h.events, [FaultWindow(kind, 0.15, 0.5)])
    assert report.ok, report.violations
    assert report.idempotency_excused == 1
    # Over before the first acquire began: the node had nothing of it to forget.
    assert not check(h.events, [FaultWindow(kind, -2.0, -0.5)]).ok
    # Begun after the second was answered: the split came before it.
    assert not check(h.events, [FaultWindow(kind, 0.35, 0.5)]).ok


def test_a_restart_excuses_no_exclusive_split_but_a_clock_jump_does() -> None:
    """A restarted node is quarantined (R19): an exclusive repeat that finds too few tags
    queues behind the lease held on the other nodes. A clock jump frees the node."""
    h = idem_pair("exclusive")
    for kind in ("kill_node", "rollback_node"):
        report = check(h.events, [FaultWindow(kind, 0.15, 0.5)])
        assert sorted(v.kind for v in report.violations) == ["idempotency", "mutual_exclusion"]
        assert report.idempotency_excused == 0
    for kind in ("clock_jump_node", "kleppmann"):
        report = check(h.events, [FaultWindow(kind, 0.15, 0.5)])
        assert report.ok, report.violations
        assert report.idempotency_excused == 1


def test_a_clock_jump_after_the_later_grant_was_answered_excuses_no_overlap() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=1, lease_id="a", valid_ms=3000)  # held 0.1 .. 3.0
    h.op("c1", "acquire", 0.5, 1.0, token=2, lease_id="b", valid_ms=3000)  # held 1.0 .. 3.5
    # While the leases overlap, but after b was granted: it made neither grant.
    report = check(h.events, [FaultWindow("clock_jump_node", 1.5, 2.0)])
    assert [v.kind for v in report.violations] == ["mutual_exclusion"]
    assert [o.faults for o in report.overlaps] == [("clock_jump_node",)]
    # Before b was answered: the jump could have expired a on the nodes b got.
    assert check(h.events, [FaultWindow("clock_jump_node", 0.6, 0.9)]).ok
    assert check(h.events, [FaultWindow("kleppmann", 0.9, 2.0)]).ok


def test_a_repeat_naming_its_lease_with_another_token_is_a_grant_of_its_own() -> None:
    """A repeat answers the lease's decided token (R26); another token is not a repeat."""
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1")
    h.op("c0", "acquire", 0.2, 0.3, token=4, lease_id="a", valid_ms=1800, idem_key="k1")
    violations = check(h.events).violations
    assert "token_order" in [v.kind for v in violations]
    assert any("token 4 after token 5" in v.detail for v in violations)


def test_a_new_lease_for_a_key_after_its_lease_ended_is_fine() -> None:
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1")
    h.op("c0", "release", 0.2, 0.25, lease_id="a", status=204)
    h.op("c0", "acquire", 0.3, 0.4, token=6, lease_id="b", valid_ms=2000, idem_key="k1")
    assert check(h.events).ok
    h.op("c0", "acquire", 0.5, 0.6, token=6, lease_id="b", valid_ms=2000, idem_key="k1")
    h.op("c0", "acquire", 0.7, 0.8, token=7, lease_id="c", valid_ms=2000, idem_key="k1")
    kinds = sorted(v.kind for v in check(h.events).violations)
    assert kinds == ["idempotency", "idempotency", "mutual_exclusion"]  # c after both answers


def test_a_fault_counts_where_it_strikes_a_node_not_all_along_its_window() -> None:
    """A kill and a clock jump strike at their window's start (the rest of the window is
    the node down, or nothing), a rollback at its end, ``kleppmann`` all along."""
    h = History()
    h.op("c0", "acquire", 1.0, 1.1, token=1, lease_id="a", valid_ms=3000)  # held 1.1 .. 4.0
    h.op("c1", "acquire", 1.5, 2.0, token=2, lease_id="b", valid_ms=3000)  # held 2.0 .. 4.5
    # A jump 3.5 s before either acquire expired keys of neither lease.
    report = check(h.events, [FaultWindow("clock_jump_node", -2.5, 3.0)])
    assert [v.kind for v in report.violations] == ["mutual_exclusion"]
    assert check(h.events, [FaultWindow("clock_jump_node", 1.2, 3.0)]).ok
    assert check(h.events, [FaultWindow("kleppmann", -0.5, 3.0)]).ok  # jumps all along

    shared = idem_pair("shared")  # lease a held 0.1 .. 2.0; b asked at 0.2, answered 0.3
    for kind in ("kill_node", "clock_jump_node"):
        assert not check(shared.events, [FaultWindow(kind, -2.5, 0.5)]).ok  # struck at -2.5
        assert check(shared.events, [FaultWindow(kind, 0.05, 4.0)]).ok  # struck at 0.05
    # A rollback takes the node back at its window's end: after b was answered, too late.
    assert not check(shared.events, [FaultWindow("rollback_node", -5.0, 4.0)]).ok
    assert check(shared.events, [FaultWindow("rollback_node", -5.0, 0.25)]).ok


def test_a_strike_the_nemesis_noted_counts_instead_of_the_window() -> None:
    h = History()
    h.op("c0", "acquire", 1.0, 1.1, token=1, lease_id="a", valid_ms=3000)  # held 1.1 .. 4.0
    h.op("c1", "acquire", 1.5, 2.0, token=2, lease_id="b", valid_ms=3000)  # held 2.0 .. 4.5
    # The jump's EVAL ran 0.1 .. 0.2 s into a window that began at 0.0: before either
    # acquire, though within the slack a window without the note is given.
    noted = FaultWindow("clock_jump_node", 0.0, 3.0, "", 0.1, 0.2)
    assert [v.kind for v in check(h.events, [noted]).violations] == ["mutual_exclusion"]
    assert check(h.events, [FaultWindow("clock_jump_node", 0.0, 3.0)]).ok
    assert check(h.events, [FaultWindow("clock_jump_node", 0.0, 3.0, "", 1.2, 1.3)]).ok


def seed34_duplicate() -> History:
    """Campaign seed 34's duplicate (mono seconds from the kept run): c3 waits through
    gateway 1 from 6593.415 and is answered at 6595.139 with i1's token, i1 having been
    granted through gateway 0 (6594.174-6594.950) and released (6595.030-6595.034)."""
    h = History()
    h.op("c4", "acquire", 6593.335, 6593.337, key="files/k1", token=1795505361032130,
         lease_id="0f94", valid_ms=1482, mode="exclusive")  # fmt: skip
    h.op("c3", "acquire", 6593.415, 6595.139, key="files/k1", token=1795505361032132,
         lease_id="fd337b55", valid_ms=570, mode="exclusive")  # fmt: skip
    h.op("i1", "acquire", 6594.174, 6594.950, key="files/k1", token=1795505361032132,
         lease_id="efc16859", valid_ms=1394, mode="exclusive", idem_key="i1-249")  # fmt: skip
    h.op("i1", "release", 6595.030, 6595.034, key="files/k1", lease_id="efc16859", status=204)
    return h


def test_a_duplicate_exclusive_token_is_excused_by_a_clock_fault_that_struck_meanwhile() -> None:
    h = seed34_duplicate()
    # Node 0's clock jumping over the two acquires (kleppmann jumps all along its window).
    report = check(h.events, [FaultWindow("kleppmann", 6594.344, 6596.384)])
    assert report.ok, report.violations
    # A single jump that struck between the first acquire and the later answer.
    assert check(h.events, [FaultWindow("clock_jump_node", 6594.5, 6595.0)]).ok


def test_a_duplicate_exclusive_token_without_a_clock_fault_meanwhile_is_flagged() -> None:
    h = seed34_duplicate()
    for faults in (
        [],
        # The same history's other faults: a rollback (struck at 6590.23) and a skew of
        # gateway 0 are no clock fault of a Redis node.
        [
            FaultWindow(
                "rollback_node", 6587.474, 6590.254, struck_from=6590.228, struck_until=6590.254
            ),
            FaultWindow("skew_gateway", 6590.839, 6593.728),
        ],
        # A clock jump that struck before the first acquire, or after the later answer.
        [FaultWindow("clock_jump_node", 6591.0, 6593.0, struck_from=6591.0, struck_until=6591.001)],
        [FaultWindow("clock_jump_node", 6595.2, 6596.0, struck_from=6595.2, struck_until=6595.201)],
    ):
        violations = check(h.events, faults).violations
        assert [v.kind for v in violations] == ["duplicate_token"], faults
        assert violations[0].detail == "token 1795505361032132 granted to 2 leases"


def test_a_clock_fault_excuses_no_grant_out_of_token_order() -> None:
    # An acquire asked after a grant completed meets its token on a quorum: a jump
    # expires entries, not counters (R2), so no clock fault excuses a smaller or equal
    # token there.
    h = History()
    h.op("c0", "acquire", 0.0, 0.5, token=9, lease_id="a", valid_ms=100, mode="exclusive")
    h.op("c1", "acquire", 1.0, 1.5, token=9, lease_id="b", valid_ms=100, mode="exclusive")
    report = check(h.events, [FaultWindow("kleppmann", 0.0, 2.0)])
    assert [v.kind for v in report.violations] == ["token_order"]


# Which answers are one lease (``checker._lease``): a request and its repeats of one key.


@pytest.mark.parametrize(
    ("keys", "second_start"),
    [
        ((None, None), 0.2),  # no key, asked after the first was answered
        ((None, None), 0.05),  # no key, sent together
        (("k1", "k2"), 0.05),  # two keys, sent together
        (("k1", None), 0.2),  # the key's lease answered to a request without it
    ],
)
def test_one_lease_answered_to_requests_that_are_not_repeats_of_one_key_is_two_grants(
    keys: tuple[str | None, str | None], second_start: float
) -> None:
    """The checker used to take every answer naming one lease id for one lease (a repeat),
    key or no key: a gateway that handed one request's lease to another passed unseen."""
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key=keys[0])
    h.op("c1", "acquire", second_start, 0.3, token=5, lease_id="a", valid_ms=2000,
         idem_key=keys[1])  # fmt: skip
    violations = check(h.events).violations
    kinds = sorted(v.kind for v in violations)
    ordered = ["token_order"] if second_start > 0.1 else []  # asked after the first's answer
    assert kinds == sorted(["duplicate_token", "mutual_exclusion", *ordered]), violations
    duplicate = next(v for v in violations if v.kind == "duplicate_token")
    assert duplicate.detail == (
        "token 5 granted to 2 leases (1 lease ids: one answered to requests that are not"
        " repeats of one idempotency key)"
    )


def test_a_key_for_another_kind_is_another_lease() -> None:
    """The key's digest covers the kind (R26): a shared request with the key of an exclusive
    lease is not its repeat."""
    h = History()
    h.op("c0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1")
    h.op("c1", "acquire", 0.2, 0.3, token=5, lease_id="a", valid_ms=2000, idem_key="k1",
         mode="shared")  # fmt: skip
    kinds = sorted(v.kind for v in check(h.events).violations)
    assert kinds == ["duplicate_token", "mutual_exclusion", "token_order"]


@pytest.mark.parametrize("mode", ["exclusive", "shared", "semaphore"])
def test_requests_with_one_key_sent_together_and_a_repeat_are_one_lease(mode: str) -> None:
    """Two requests with one key sent together end with one lease (R26: the one committed
    first; the other gives its grant up and answers it), and a later repeat answers it."""
    permits = {"permits": 2} if mode == "semaphore" else {}
    key = f"sem/s{mode}" if mode == "semaphore" else "kv/k"
    h = History()
    for process, start, end in (("i0", 0.0, 0.4), ("i1", 0.1, 0.3), ("i1", 0.5, 0.6)):
        h.op(process, "acquire", start, end, key=key, token=5, lease_id="a", valid_ms=2000,
             idem_key="k1", mode=mode, **permits)  # fmt: skip
    h.op("i0", "release", 1.0, 1.1, key=key, lease_id="a", status=204)
    report = check(h.events)
    assert report.ok, report.violations
    assert report.overlaps == []


@pytest.mark.parametrize("mode", ["shared", "semaphore"])
def test_two_requests_with_one_key_sent_together_holding_two_leases_break_idempotency(
    mode: str,
) -> None:
    """Sent together, both granted: the one committed first is the key's lease and the other
    answers it (R26, README). The checker compared only a repeat asked after an answer."""
    permits = {"permits": 2} if mode == "semaphore" else {}
    h = History()
    h.op("i0", "acquire", 0.0, 0.4, token=5, lease_id="a", valid_ms=2000, idem_key="k1",
         mode=mode, **permits)  # fmt: skip  # held 0.4 .. 2.0
    h.op("i1", "acquire", 0.1, 0.3, token=6, lease_id="b", valid_ms=2000, idem_key="k1",
         mode=mode, **permits)  # fmt: skip  # held 0.3 .. 2.1, asked before a's answer
    report = check(h.events)
    assert [v.kind for v in report.violations] == ["idempotency"], report.violations
    assert "(asked together) was surely held too" in report.violations[0].detail
    # A node that may have forgotten a tag meanwhile excuses it, as for a repeat.
    report = check(h.events, [FaultWindow("kill_node", 0.2, 1.0)])
    assert report.ok, report.violations
    assert report.idempotency_excused == 1
    # A fault that struck after the later answer does not.
    assert not check(h.events, [FaultWindow("kill_node", 0.45, 1.0)]).ok


def test_two_requests_with_one_key_sent_together_may_hold_leases_one_after_the_other() -> None:
    """The first's lease was released before the second was answered: the second may take
    a lease of its own (its commit found no lease holding the key's tag)."""
    h = History()
    h.op("i0", "acquire", 0.0, 0.1, token=5, lease_id="a", valid_ms=2000, idem_key="k1",
         mode="shared")  # fmt: skip
    h.op("i0", "release", 0.15, 0.2, lease_id="a", status=204)  # a held 0.1 .. 0.15
    h.op("i1", "acquire", 0.05, 0.5, token=6, lease_id="b", valid_ms=2000, idem_key="k1",
         mode="shared")  # fmt: skip
    assert check(h.events).ok
