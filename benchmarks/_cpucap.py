"""A CPU budget per process: one cgroup-v1 ``cpu`` group each, with a CFS quota.

``CpuCaps.create()`` makes ``/sys/fs/cgroup/cpu/fencegate-bench-<pid>/``;
``cap(key, pid, pct)`` puts a process (every thread of it) in the child group
``key``, allowed ``pct`` % of one core. The quota is 1 ms per period and the
period ``100 / pct`` ms (4 % = 1 ms every 25 ms; at least 10 ms), so a capped
process waits at most one period, not the 100 ms of the default period. The
parent group has ``cpu.shares`` ``SHARES`` (8 times a process's 1024): on a
busy machine what is in it gets its CPU first, so the capped processes use
their whole budget and a group made with ``cap(key, pid, None)`` (no quota:
the client processes) runs ahead of others. ``close()`` moves the processes
still there back to the root group and removes every group it made; it runs
at exit too (``atexit``), and twice is harmless. Where cgroups are not
writable, ``create`` returns None and says why.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["CpuCaps", "Throttling"]

ROOT: Final = Path("/sys/fs/cgroup/cpu")
_MIN_QUOTA_US: Final = 1000  # the kernel's minimum cfs_quota_us
SHARES: Final = 8192


@dataclass(frozen=True, slots=True)
class Throttling:
    """``cpu.stat`` of one group: periods run, periods throttled, seconds throttled."""

    periods: int = 0
    throttled: int = 0
    throttled_s: float = 0.0

    def __sub__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods - other.periods,
            self.throttled - other.throttled,
            self.throttled_s - other.throttled_s,
        )

    def __add__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods + other.periods,
            self.throttled + other.throttled,
            self.throttled_s + other.throttled_s,
        )


def period_and_quota(pct: float) -> tuple[int, int]:
    """CFS (period, quota) in µs for ``pct`` % of one core: quota 1 ms, or a 10 ms
    period above 10 %."""
    if not 0 < pct <= 400:
        raise ValueError(f"--node-cpu-pct {pct:g}: use more than 0 and at most 400")
    period = min(1_000_000, max(10_000, round(_MIN_QUOTA_US * 100 / pct)))
    return period, max(_MIN_QUOTA_US, round(period * pct / 100))


@dataclass
class CpuCaps:
    """cgroup-v1 ``cpu`` groups, one per key, each with the same quota."""

    base: Path
    _groups: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path = ROOT) -> tuple[CpuCaps | None, str]:
        """The groups' parent, or None and why not (no cgroup-v1 cpu controller, not
        writable)."""
        base = root / f"fencegate-bench-{os.getpid()}"
        try:
            base.mkdir()
        except OSError as exc:
            return None, f"cgroups not writable ({base}: {exc.strerror or exc})"
        caps = cls(base)
        atexit.register(caps.close)
        try:
            (base / "cpu.shares").write_text(str(SHARES))
        except OSError as exc:
            caps.close()
            return None, f"cgroup cpu.shares not writable ({exc.strerror or exc})"
        return caps, f"cgroup-v1 cpu groups under {base}"

    def cap(self, key: str, pid: int, pct: float | None) -> None:
        """Put ``pid`` (all its threads; children it starts later too) in group ``key``,
        made on first use with ``pct`` % of one core (None: no quota, the parent's shares)."""
        group = self._groups.get(key)
        if group is None:
            group = self.base / key
            group.mkdir(exist_ok=True)
            self._groups[key] = group
            if pct is not None:
                period, us = period_and_quota(pct)
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(us))
        (group / "cgroup.procs").write_text(str(pid))

    def throttling(self, key: str) -> Throttling:
        stat = dict(
            line.split()[:2] for line in (self._groups[key] / "cpu.stat").read_text().splitlines()
        )
        return Throttling(
            int(stat["nr_periods"]), int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e9
        )

    def close(self) -> None:
        """Move what is left to the root group and remove the groups (idempotent)."""
        for group in [*self._groups.values(), self.base]:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):  # it may have exited meanwhile
                        (self.base.parent / "cgroup.procs").write_text(pid)
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                print(f"warning: could not remove {group}: {exc}", file=sys.stderr)
        self._groups.clear()
