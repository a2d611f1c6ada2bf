"""I1, I2 and I5 for a mix of every kind of lease on one name, over two managers."""

from __future__ import annotations

import asyncio

from tests.lockservice.conftest import MakeManager
from tests.lockservice.kinds_check import run_workload


async def test_every_kind_keeps_its_invariants_across_two_managers(
    make_manager: MakeManager,
) -> None:
    managers = [await make_manager(), await make_manager()]
    check = await asyncio.wait_for(run_workload(managers, "kinds/mix"), 60)
    assert check.violations == []
    assert set(check.grants) == {"exclusive", "shared", "semaphore"}
    assert sum(check.grants.values()) >= 12 * 15 * 0.9  # few ran out of wait
    # the kinds really overlapped: readers together, and both permits in use
    assert check.most_together["shared"] >= 2
    assert check.most_together["semaphore"] == 2
