"""Short seeded fault campaigns: the real cluster keeps every invariant; sabotage is caught.

The long runs are ``python -m benchmarks.campaign``; these are the CI-sized ones
(about a minute each with start-up on a small machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.campaign.runner import CampaignResult, default_kinds, run_campaign

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]


def summary(result: CampaignResult) -> str:
    r = result.report
    lines = [
        f"seed {result.seed}: injected {dict(result.injected)}",
        f"ops {dict(r.ops)}",
        f"direct writes {dict(r.direct)}; PostgreSQL deadlocks {result.pg_deadlocks}",
        f"kinds {dict(r.kinds)}; idempotency excused {r.idempotency_excused}",
        f"statuses {result.statuses.most_common()}",
        *(f"{v.kind} {v.scope}: {v.detail} {v.ops}" for v in r.violations[:10]),
        *(f"overlap {o.scope} {o.seconds:.3f} s during {o.faults}" for o in r.overlaps[:10]),
        f"history: {result.history}",
    ]
    return "\n".join(lines)


async def test_seeded_campaign_with_every_fault_kind_finds_no_violation(tmp_path: Path) -> None:
    kinds = default_kinds()
    result = await run_campaign(tmp_path, seed=20261123, seconds=40, ttl_ms=1000, kinds=kinds)
    info = summary(result)
    print(info)
    assert result.report.violations == [], info
    assert set(result.injected) == set(kinds), info
    ops = result.report.ops
    assert ops["write:ok"] >= 30, f"too little load to mean anything:\n{info}"
    writes = {op.split(":")[0] for op in ops}
    assert {"acquire", "read", "write", "release"} <= writes, info
    assert not [s for s in result.statuses if " 500" in s], info  # never an internal error
    # Fencing did refuse late writers (the self-paused and the SIGSTOPped clients).
    assert result.statuses["write 409 stale_token"] >= 1, info
    # Direct writers wrote the ledger table next to the proxy's writers, and the trigger
    # refused a late UPDATE of one paused past its lease; nobody deadlocked (40P01).
    assert result.report.direct["ok"] >= 5, info  # about 15 at load 11 on two cores
    assert result.report.direct["late refused"] >= 1, info
    assert result.pg_deadlocks == 0, info
    # Whether a direct writer's operation starts inside a PostgreSQL restart window is
    # luck in 40 s with the lock kinds' clients sharing the load (it missed once in CI);
    # the long runs (benchmarks/results/campaign.md, seeds 11-13) show the trigger
    # across restarts. Here: the restart was injected (above) and is in the report.
    print("direct ops during restart_pg:", result.report.direct_availability.get("restart_pg"))
    # Every grant has its validity recorded, or no overlap could ever be seen.
    grants = [op for op in result.ops() if op.f == "acquire" and op.result == "ok"]
    assert grants, info
    assert all(op.valid_ms is not None and op.valid_ms >= 0 for op in grants), info
    # A grant decided just before its gateway was paused is answered after the pause
    # with its validity used up (valid_ms 0, as DESIGN's "ttl - elapsed - drift");
    # nearly all grants have time left, or the overlap check would have nothing to see.
    alive = [op for op in grants if op.valid_ms]
    assert len(alive) >= 0.9 * len(grants), info
    # The lock kinds ran too: shared readers, semaphore holders that renewed, and
    # idempotent acquires answered twice with one lease.
    kinds = result.report.kinds
    assert kinds["shared:ok"] >= 5, info
    assert kinds["semaphore:ok"] >= 5, info
    assert kinds["renew:ok"] >= 1, info
    assert kinds["repeat:same"] >= 1, info


async def test_sabotaged_store_without_fencing_shows_lost_updates(tmp_path: Path) -> None:
    """``blind`` has ``fencing = "none"``: pauses past the TTL lose updates there, and the
    checker must say so, while ``kv`` and ``files`` under the same load lose nothing."""
    result = await run_campaign(
        tmp_path, seed=7, seconds=18, ttl_ms=600, kinds=["pause_client"], sabotage=True,
        pause_share=0.15,
    )  # fmt: skip
    info = summary(result)
    print(info)
    lost = [v for v in result.report.violations if v.kind == "lost_update"]
    assert lost, f"the checker missed the lost updates of the unfenced store:\n{info}"
    assert {v.scope.split("/")[0] for v in result.report.violations} == {"blind"}, info
    assert result.report.direct["late refused"] >= 1, info  # the trigger held, under more pauses
    assert result.pg_deadlocks == 0, info


async def test_trigger_removed_mid_run_shows_lost_updates_of_direct_writers(
    tmp_path: Path,
) -> None:
    """``fencegate pg uninstall-fencing`` a third of the way in: the direct writers still set
    their token, but nothing checks it, so their late UPDATEs are accepted and the checker
    must report lost updates and stale writes on ``ledger``, and only there."""
    result = await run_campaign(
        tmp_path, seed=7, seconds=18, ttl_ms=600, kinds=["pause_client"], unfenced_direct=True,
        pause_share=0.15,
    )  # fmt: skip
    info = summary(result)
    print(info)
    found = result.report.by_kind()
    assert found["lost_update"] >= 1, f"the checker missed the unfenced direct writes:\n{info}"
    assert found["stale_write"] >= 1, info
    assert {v.scope.split("/")[0] for v in result.report.violations} == {"ledger"}, info
    assert result.report.direct["late ok"] >= 1, info


async def test_gateways_on_different_nodes_break_every_kind_and_the_checker_says_so(
    tmp_path: Path,
) -> None:
    """Each gateway configured with a different single Redis node: two lock services that
    know nothing of each other. Exclusive leases overlap shared ones, a semaphore has
    more holders than permits, and a repeat through the other gateway gets another
    lease: the kinds' checks must find each."""
    result = await run_campaign(
        tmp_path, seed=7, seconds=15, ttl_ms=1000, kinds=["pause_client"], split_nodes=True,
        readers=4,  # 2 overlapped writers 1-6 times a run: once none on a loaded machine
    )  # fmt: skip
    info = summary(result)
    print(info)
    found = result.report.by_kind()
    assert found["semaphore_overcount"] >= 1, info
    assert found["idempotency"] >= 1, info
    mixed = [
        v for v in result.report.violations
        if v.kind == "mutual_exclusion" and {op.mode for op in v.ops} == {"exclusive", "shared"}
    ]  # fmt: skip
    assert mixed, info
