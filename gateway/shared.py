"""What the workers of one ``fencegate serve --workers N`` share: a private directory.

The supervisor creates it (mode 0700, under the system temp dir), hands it to
every worker as ``PROMETHEUS_MULTIPROC_DIR`` and removes it at exit. In it:

* ``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_<mode>_<pid>.db``:
  prometheus-client's multiprocess files. Any worker's ``/metrics`` merges
  them all (``scrape_registry``): counters and histograms are summed over
  every worker that ever ran (a restarted worker's counts stay), gauges by
  their ``multiprocess_mode`` over the live workers (``gateway/metrics.py``).
* ``hot-<pid>.json``: the worker's hot-lock snapshot (``gateway/hotlocks.py``),
  rewritten every ``SYNC_INTERVAL`` seconds.
* ``ready-<pid>``: the worker listens; ``workers``: the supervisor's pid and
  the live workers' pids, one a line, for the ``process_*`` metrics;
  ``restarts``: how many workers the supervisor started again.

When a worker dies the supervisor calls ``forget(pid)``: its live gauges,
snapshot and ready mark go; its counters stay.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from prometheus_client import PLATFORM_COLLECTOR, CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

__all__ = ["SYNC_INTERVAL", "SharedDir", "scrape_registry"]

SYNC_INTERVAL: Final = 1.0
"""Seconds between a worker's updates of its hot-lock snapshot and time-based gauges."""
_PIDS: Final = "workers"
_RESTARTS: Final = "restarts"


class SharedDir:
    """The shared directory of one server, and the few files fencegate keeps in it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    # the supervisor
    def set_pids(self, pids: Iterable[int]) -> None:
        """Record the supervisor's and the live workers' pids (first: the supervisor)."""
        self._write(_PIDS, "".join(f"{pid}\n" for pid in pids))

    def forget(self, pid: int) -> None:
        """A worker exited: drop its live gauges, hot snapshot and ready mark."""
        mark_process_dead(pid, str(self.path))  # type: ignore[no-untyped-call]  # untyped upstream
        for name in (f"hot-{pid}.json", f"ready-{pid}"):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()

    def count_restart(self) -> None:
        self._write(_RESTARTS, str(self.restarts() + 1))

    def restarts(self) -> int:
        try:
            return int((self.path / _RESTARTS).read_text())
        except (OSError, ValueError):
            return 0

    def is_ready(self, pid: int) -> bool:
        return (self.path / f"ready-{pid}").exists()

    # the workers
    def mark_ready(self, pid: int) -> None:
        self._write(f"ready-{pid}", "")

    def write_hot(self, pid: int, snapshot: dict[str, Any]) -> None:
        self._write(f"hot-{pid}.json", json.dumps(snapshot, separators=(",", ":")))

    def read_hot(self, *, exclude: int) -> list[dict[str, Any]]:
        """The hot-lock snapshots of the live workers other than ``exclude``."""
        snapshots = []
        for pid in self.pids()[1:]:
            if pid == exclude:
                continue
            try:
                snapshots.append(json.loads((self.path / f"hot-{pid}.json").read_bytes()))
            except (OSError, ValueError):
                continue  # not written yet, or the worker just exited
        return snapshots

    def pids(self) -> list[int]:
        """The supervisor's pid, then the live workers' (empty before the first record)."""
        try:
            text = (self.path / _PIDS).read_text()
        except OSError:  # not written yet, or not ours to read
            return []
        return [int(word) for word in text.split() if word.isdigit()]

    def _write(self, name: str, text: str) -> None:
        # write, then rename: a reader sees the old file or the new one, never half of one
        tmp = self.path / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)


def scrape_registry(shared: SharedDir) -> CollectorRegistry:
    """What a worker serves on ``/metrics``: the whole server, merged from ``shared``."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(shared.path))  # type: ignore[no-untyped-call]
    registry.register(_ServerProcessCollector(shared))
    registry.register(PLATFORM_COLLECTOR)
    return registry


class _ServerProcessCollector(Collector):
    """``process_*`` of the whole server: the supervisor and its live workers.

    CPU seconds, memory and open fds are summed; the start time is the
    supervisor's. A worker that exited takes its CPU seconds with it, so
    ``process_cpu_seconds_total`` drops after a restart (a counter reset, as
    when a single-process gateway restarts).
    """

    _SUMMED: Final = (
        "process_cpu_seconds",
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_open_fds",
    )

    def __init__(self, shared: SharedDir) -> None:
        self._shared = shared

    def collect(self) -> Iterator[Metric]:
        pids = self._shared.pids()
        totals: dict[str, Metric] = {}
        for i, pid in enumerate(pids):
            for metric in ProcessCollector(pid=_constant(pid), registry=None).collect():
                if i == 0 and metric.name not in self._SUMMED:
                    totals[metric.name] = metric  # start time and fd limit: the supervisor's
                elif metric.name in self._SUMMED:
                    seen = totals.setdefault(metric.name, metric)
                    if seen is not metric:
                        seen.samples[0] = seen.samples[0]._replace(
                            value=seen.samples[0].value + metric.samples[0].value
                        )
        yield from totals.values()
        yield GaugeMetricFamily(
            "fencegate_workers", "Gateway worker processes running now", max(0, len(pids) - 1)
        )
        yield CounterMetricFamily(
            "fencegate_worker_restarts",
            "Workers the supervisor started again after they exited on their own",
            self._shared.restarts(),
        )


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid
