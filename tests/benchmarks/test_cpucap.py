"""benchmarks/_cpucap.py: a CPU budget per process in a cgroup, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks._cpucap import ROOT, CpuCaps, period_and_quota


def test_a_budget_is_a_1_ms_quota_per_period_of_100_over_pct_ms() -> None:
    assert period_and_quota(4) == (25_000, 1000)
    assert period_and_quota(2) == (50_000, 1000)
    assert period_and_quota(100) == (10_000, 10_000)  # never a period under 10 ms
    for bad in (0, -1, 401):
        with pytest.raises(ValueError, match="--node-cpu-pct"):
            period_and_quota(bad)


def test_without_a_writable_cgroup_root_there_is_no_budget_and_a_reason(tmp_path: Path) -> None:
    caps, why = CpuCaps.create(tmp_path / "no-such-controller")
    assert caps is None
    assert "not writable" in why


def _cgroup(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":")[2] for line in lines if "cpu," in line or ":cpu:" in line)


@pytest.mark.skipif(not ROOT.is_dir(), reason="no cgroup-v1 cpu controller here")
def test_a_capped_process_gets_its_budget_and_close_leaves_nothing() -> None:
    caps, why = CpuCaps.create()
    if caps is None:
        pytest.skip(why)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        caps.cap("spin", spin.pid, 5)
        assert _cgroup(spin.pid).endswith(f"/{caps.base.name}/spin")
        before = caps.throttling("spin")
        time.sleep(1.0)
        used = caps.throttling("spin") - before
        assert used.throttled >= used.periods // 2 > 0  # it wants more than 5 %
        caps.close()
        assert not caps.base.exists()
        assert caps.base.name not in _cgroup(spin.pid)  # moved back, still running
        assert spin.poll() is None
    finally:
        spin.kill()
        spin.wait()
        caps.close()
