"""What prometheus-client's multiprocess mode (``serve --workers N``) costs a lock cycle.

With several workers every metric update is written through to the worker's
mmap'ed file in the shared directory (``gateway/shared.py``); one process
(``workers = 1``) keeps plain in-process values. Three measurements, each mode
in a fresh process of its own:

1. CPU per ``Counter.inc`` and per ``Histogram.observe`` (a labelled child, as
   ``gateway/metrics.py`` keeps them), best of 5 runs of 200,000 calls;
2. metric value updates per HTTP lock cycle (POST lock + DELETE release) in
   the real app on 1 and on 3 redis-server nodes (a histogram observation is
   two updates: its sum and one bucket), counted by wrapping the value class;
3. CPU per cycle of the real app with either kind of metrics, the client in
   the same process (best of 5 batches of 800 cycles, 8 at a time, the modes
   alternating over 3 runs each): the difference is what multiprocess metrics
   add in place, the rest (HTTP, Redis, the client) being the same.

    .venv/bin/python -m benchmarks.metrics_cost

Results: printed, and written to benchmarks/results/metrics_cost.md and .json.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from benchmarks._report import command, save, write_json

ROOT: Final = Path(__file__).resolve().parent.parent
MODES: Final = ("plain", "multiprocess")
CALLS: Final = 200_000


def _best(call: Callable[[], object], n: int = CALLS, runs: int = 5) -> float:
    """The least CPU seconds per call of ``call`` over ``runs`` runs of ``n`` calls."""
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        for _ in range(n):
            call()
        best = min(best, (time.thread_time() - started) / n)
    return best


def child(mode: str, what: str) -> dict[str, Any]:
    """One measurement in this process (its metrics mode set by the parent)."""
    from gateway.metrics import MULTIPROCESS

    assert (mode == "multiprocess") == MULTIPROCESS, "PROMETHEUS_MULTIPROC_DIR not as asked"
    if what == "ops":
        from prometheus_client import CollectorRegistry, Counter, Histogram

        registry = CollectorRegistry()
        counter = Counter("c", "c", ["x"], registry=registry).labels("a")
        histogram = Histogram("h", "h", ["x"], registry=registry).labels("a")
        return {
            "inc_us": _best(counter.inc) * 1e6,
            "observe_us": _best(lambda: histogram.observe(0.003)) * 1e6,
        }
    return asyncio.run(_cycles(int(what)))


async def _cycles(nodes: int) -> dict[str, Any]:
    from aiohttp.test_utils import TestClient
    from prometheus_client import values

    from gateway.app import create_app
    from gateway.config import parse_config
    from tests._gateway import GatewayServer
    from tests._servers import RedisNode

    updates = 0
    value_class = values.ValueClass
    for name in ("inc", "set"):
        original = getattr(value_class, name)

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            nonlocal updates
            updates += 1
            return _original(self, *args, **kwargs)

        setattr(value_class, name, counted)
    with tempfile.TemporaryDirectory(prefix="fencegate-bench-metrics-") as tmp_name:
        tmp = Path(tmp_name)
        redis = [RedisNode(tmp / f"redis{i}") for i in range(nodes)]
        try:
            for node in redis:
                node.start()
            config = parse_config(
                {
                    "locks": {"redis": [n.url for n in redis], "node_timeout_ms": 5000},
                    "stores": {"files": {"type": "files", "root": str(tmp / "data")}},
                }
            )
            async with TestClient(GatewayServer(create_app(config))) as client:

                async def cycles(prefix: str, count: int) -> None:
                    for i in range(count):
                        name = f"/v1/locks/{prefix}/{i}"
                        async with client.post(name, json={"ttl_ms": 10_000}) as reply:
                            lease = (await reply.json())["lease_id"]
                        async with client.delete(name, headers={"X-Lease-Id": lease}) as reply:
                            if reply.status != 204:
                                raise SystemExit(f"release answered {reply.status}")

                await cycles("warm", 300)
                updates = 0
                await cycles("count", 200)
                per_cycle = updates / 200
                best = float("inf")
                for run in range(5):
                    started = time.process_time()
                    await asyncio.gather(*(cycles(f"run{run}/{j}", 100) for j in range(8)))
                    best = min(best, (time.process_time() - started) / 800)
        finally:
            for node in redis:
                node.stop()
    return {"updates_per_cycle": per_cycle, "cycle_cpu_us": best * 1e6}


def _run_child(mode: str, what: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with tempfile.TemporaryDirectory(prefix="fencegate-bench-metrics-mp-") as shared:
        if mode == "multiprocess":
            env["PROMETHEUS_MULTIPROC_DIR"] = shared
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.metrics_cost", "--child", mode, what],
            env={**env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    if out.returncode != 0:
        raise SystemExit(f"{mode} {what} failed:\n{out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
        return
    load_before = os.getloadavg()
    ops = {mode: _run_child(mode, "ops") for mode in MODES}
    counts = {nodes: _run_child("plain", str(nodes))["updates_per_cycle"] for nodes in (1, 3)}
    cycle: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(3):
        for mode in MODES:
            cycle[mode].append(_run_child(mode, "1")["cycle_cpu_us"])
    added_inc = ops["multiprocess"]["inc_us"] - ops["plain"]["inc_us"]
    added_observe = ops["multiprocess"]["observe_us"] - ops["plain"]["observe_us"]
    per_update = (added_inc + added_observe / 2) / 2  # an observation is two updates
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command(),
        "load_before": load_before,
        "ops": ops,
        "updates_per_cycle": counts,
        "added_us_per_update": per_update,
        "cycle_cpu_us": cycle,
    }
    write_json("metrics_cost", results)
    best = {mode: min(values) for mode, values in cycle.items()}
    lines = [
        "# What multiprocess metrics (`--workers N`) cost a lock cycle",
        "",
        f"{results['when']}; `{results['command']}`; load average before the run: "
        + ", ".join(f"{v:.2f}" for v in load_before)
        + ". CPU time of the measuring thread or process (less moved by other load than "
        "wall time).",
        "",
        "| CPU µs per call | plain (`workers = 1`) | multiprocess (`--workers N`) | added |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {ops['plain'][key]:.2f} | {ops['multiprocess'][key]:.2f} | "
            f"{ops['multiprocess'][key] - ops['plain'][key]:+.2f} |"
            for label, key in (("`Counter.inc`", "inc_us"), ("`Histogram.observe`", "observe_us"))
        ),
        "",
        "Metric value updates per HTTP lock cycle (POST + DELETE): "
        + ", ".join(f"{counts[n]:.1f} with {n} Redis node{'s' if n > 1 else ''}" for n in counts)
        + f"; at {per_update:.2f} µs added per update, multiprocess metrics add about "
        + ", ".join(f"{counts[n] * per_update:.0f} µs" for n in counts)
        + " per cycle.",
        "",
        "CPU µs per cycle of the whole app and its client in one process (1 Redis node), "
        f"best of each run: plain {', '.join(f'{v:.0f}' for v in cycle['plain'])}; "
        f"multiprocess {', '.join(f'{v:.0f}' for v in cycle['multiprocess'])}: the least "
        f"differ by {best['multiprocess'] - best['plain']:+.0f} µs "
        f"({best['multiprocess'] / best['plain'] - 1:+.1%}). Where the runs of one mode "
        "spread more than that, other load on the machine hides the difference and the "
        "estimate above (from the per-call costs) is the better one.",
    ]
    save("metrics_cost", lines)


if __name__ == "__main__":
    main()
