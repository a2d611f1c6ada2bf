"""Redlock groups: lock throughput with 1, 2 and 3 groups, and 3 gateways x 2 groups
where one group loses nodes.

1. **Throughput**: 1, 2, 3 groups of 3 nodes; ``--clients`` client processes
   with ``--workers`` tasks per group each (the same load on every group:
   each node's pipelines are as deep with 3 groups as with 1) take and
   release locks of distinct names.
   Each Redis node is given a CPU budget of its own (``--node-cpu-pct``, % of
   one core, a cgroup-v1 ``cpu`` group per node: ``benchmarks/_cpucap.py``),
   as if each node had a small host of its own, so that Redis, not the client
   processes, is the bottleneck even on a busy machine. The rows alternate
   (1, 2, 3 then 3, 2, 1 groups ...) for ``--rounds`` rounds, each with a
   control row (1 group with the workers of 3 groups), and the table
   shows medians, the ratio to one group, the client processes' CPU (their
   headroom) and how much of their budget the nodes used and how often they
   were throttled. Where cgroups are not writable (or ``--node-cpu-pct 0``),
   every node is pinned to CPU 0 with ``taskset`` as before, and the report
   says so.
2. **Simulation**: 3 gateway processes x 2 groups of 3 nodes, all of them
   (with cgroups) in one group of ``--sim-cpu-pct`` % of a core, ahead of
   other work; each gateway has ``--sim-workers`` tasks per group, which take
   random names of that group from a set the gateways share (so they
   contend), hold them 1 ms and record when they held which token. Phases:
   all healthy; group b lost a node (still a quorum); group b lost two (no
   quorum). Checked across all gateways: no two holders of a name overlap in
   time (on the host's monotonic clock, which every process shares) and
   tokens rise in that order; each group's grants/s, acquire latency and
   refusals by reason (node timeout, node down, other) per phase.

    .venv/bin/python -m benchmarks.groups            # full run (about 6 minutes)
    .venv/bin/python -m benchmarks.groups --quick    # a short smoke run

Results: printed, and written to benchmarks/results/groups.md and groups.json
(``--quick``: groups-quick.*).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from benchmarks._cpucap import CpuCaps, Throttling, period_and_quota
from benchmarks._report import RESULTS, command, write_json
from lockservice import LockManager, LockServiceError, QuorumUnavailable
from lockservice.placement import GroupSpec, owner
from tests._servers import RedisNode

REDIS_CPU = "0"
CLIENT_CPUS = set(range(os.cpu_count() or 1))  # --pin-clients: every CPU but REDIS_CPU
WARMUP = 3.0  # seconds for the client processes to connect before a row starts


def _pin(node: RedisNode) -> None:
    assert node.proc is not None
    subprocess.run(["taskset", "-cp", REDIS_CPU, str(node.proc.pid)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def _redis_cpu(nodes: Sequence[RedisNode]) -> float:
    """CPU seconds (user + sys) the nodes used so far."""
    total = 0.0
    for node in nodes:
        text = node.command("INFO", "CPU").decode()
        for line in text.splitlines():
            if line.startswith(("used_cpu_sys:", "used_cpu_user:")):
                total += float(line.split(":")[1])
    return total


def _cpus(args: argparse.Namespace) -> set[int]:
    others = CLIENT_CPUS - {int(REDIS_CPU)}
    return others if args.pin_clients and others else CLIENT_CPUS


def _groups(nodes: Sequence[RedisNode], count: int) -> list[list[str]]:
    return [[n.url for n in nodes[3 * i : 3 * i + 3]] for i in range(count)]


def _specs(groups: list[list[str]]) -> list[GroupSpec]:
    return [GroupSpec.of(urls, chr(ord("a") + i)) for i, urls in enumerate(groups)]


# ---------------------------------------------------------------- 1. throughput
def _throughput_child(
    groups: list[list[str]], workers: int, start: float, seconds: float, tag: str, cpus: set[int]
) -> tuple[int, int, float, float, float]:
    os.sched_setaffinity(0, cpus)
    try:
        return uvloop.run(_throughput(groups, workers, start, seconds, tag))
    except Exception as exc:  # the pool cannot unpickle our errors: send a plain one
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


async def _throughput(
    groups: list[list[str]], workers: int, start: float, seconds: float, tag: str
) -> tuple[int, int, float, float, float]:
    """Cycles done in [start, start + seconds), acquires refused, this process's CPU
    seconds in that window, how late it was ready (0: in time), and how long it
    waited for a CPU in that window (a busy machine: the clients lack headroom)."""
    # A throttled node queues commands for up to a CFS period: a node timeout that
    # long is no refusal here (the period is at most 100 ms).
    mgr = await LockManager.connect(groups=_specs(groups), max_ttl=30.0, node_timeout=2.0)
    late = max(0.0, time.monotonic() - start)
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    done = refused = 0
    stop = start + seconds
    cpu0, wait0 = time.process_time(), _runqueue_wait()

    async def worker(i: int) -> None:
        nonlocal done, refused
        n = 0
        while time.monotonic() < stop:
            try:
                lease = await mgr.acquire(f"bench/{tag}/{i}/{n % 64}", ttl=10.0)
                await mgr.release(lease)
            except LockServiceError:
                refused += 1
                continue
            n += 1
        done += n

    await asyncio.gather(*(worker(i) for i in range(workers)))
    cpu, waited = time.process_time() - cpu0, _runqueue_wait() - wait0
    await mgr.close()
    return done, refused, cpu, late, waited


def _runqueue_wait() -> float:
    """Seconds this process's thread waited for a CPU while runnable (schedstat)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _row(
    pool: Any,
    nodes: list[RedisNode],
    count: int,
    tag: str,
    args: argparse.Namespace,
    caps: CpuCaps | None,
    workers: int = 0,
) -> dict[str, Any]:
    """One row: ``count`` groups, ``workers`` tasks per client (``--workers`` per group)."""
    for node in nodes:
        node.flushall()
    groups = _groups(nodes, count)
    used = nodes[: 3 * count]
    start = time.monotonic() + WARMUP
    pending = pool.starmap_async(
        _throughput_child,
        [(groups, workers or args.workers * count, start, args.seconds, f"{tag}/{c}", _cpus(args))
         for c in range(args.clients)],
    )  # fmt: skip
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0, t0 = _redis_cpu(used), time.perf_counter()
    keys = [f"node{i}" for i in range(len(used))]
    th0 = [caps.throttling(k) for k in keys] if caps else []
    time.sleep(max(0.0, start + args.seconds - time.monotonic()))
    wall = time.perf_counter() - t0
    redis = _redis_cpu(used) - cpu0
    th = Throttling()
    if caps:
        th = sum((caps.throttling(k) - b for k, b in zip(keys, th0, strict=True)), th)
    parts = pending.get(timeout=args.seconds + 120)
    cycles = sum(p[0] for p in parts)
    node_cpu = redis / len(used) / wall  # cores busy, per node
    row: dict[str, Any] = {
        "groups": count,
        "cycles_per_s": round(cycles / args.seconds),
        "refused": sum(p[1] for p in parts),
        "client_cpu_cores": round(sum(p[2] for p in parts) / args.seconds, 2),
        "clients_late_s": round(max(p[3] for p in parts), 2),
        # per client process, share of the row it was runnable but waiting for a CPU
        "client_cpu_wait": round(max(p[4] for p in parts) / args.seconds, 2),
        "node_cpu_cores": round(node_cpu, 3),
        "redis_cpu_us_per_cycle": round(redis / max(cycles, 1) * 1e6, 1),
    }
    if caps:
        row["node_cpu_of_budget"] = round(node_cpu / (args.node_cpu_pct / 100), 2)
        row["throttled_periods"] = round(th.throttled / max(th.periods, 1), 2)
        row["throttled_s_per_node_s"] = round(th.throttled_s / len(used) / wall, 2)
    print(row, flush=True)
    return row


def throughput(
    nodes: list[RedisNode], args: argparse.Namespace, caps: CpuCaps | None
) -> dict[str, Any]:
    """Alternating rounds (1, 2, 3 groups, then 3, 2, 1, ...): every row and the medians."""
    ctx = multiprocessing.get_context("spawn")
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    control = []  # 1 group with the workers of 3: does one group gain from more clients?
    with ctx.Pool(args.clients) as pool:
        for r in range(args.rounds):
            for count in (1, 2, 3) if r % 2 == 0 else (3, 2, 1):
                runs[count].append(_row(pool, nodes, count, f"{r}", args, caps))
            control.append(_row(pool, nodes, 1, f"{r}c", args, caps, workers=3 * args.workers))
    medians = []
    for count in (1, 2, 3):
        rows = runs[count]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "groups"}
        medians.append({"groups": count, "nodes": 3 * count, **med})
    base = medians[0]["cycles_per_s"] or 1
    for m in medians:
        m["ratio_to_one_group"] = round(m["cycles_per_s"] / base, 2)
    cycles = statistics.median(r["cycles_per_s"] for r in control)
    return {
        "medians": medians,
        "rows": {str(k): v for k, v in sorted(runs.items())},
        "one_group_3x_workers": {
            "cycles_per_s": cycles,
            "ratio_to_one_group": round(cycles / base, 2),
            "rows": control,
        },
    }


# ---------------------------------------------------------------- 2. simulation
def _gateway_child(
    groups: list[list[str]], names: list[str], workers: int, start: float, phase: float
) -> dict[str, Any]:
    try:
        return uvloop.run(_gateway(groups, names, workers, start, phase))
    except Exception as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


def _why(exc: QuorumUnavailable) -> str:
    """The kind of a refusal: every failed node's reason, as a small fixed set, with how
    many nodes failed so ("node down x2")."""
    kinds: Counter[str] = Counter()
    for text in exc.node_errors.values():
        if text.startswith("no reply"):
            kinds["node timeout"] += 1
        elif text.startswith("down"):
            kinds["node down"] += 1
        elif "quarantined" in text or "resynced" in text:
            kinds["resync"] += 1
        else:
            kinds["other"] += 1
    return "+".join(k + (f" x{n}" if n > 1 else "") for k, n in sorted(kinds.items())) or "none"


async def _gateway(
    groups: list[list[str]], names: list[str], workers: int, start: float, phase: float
) -> dict[str, Any]:
    specs = _specs(groups)
    ids = [g.id for g in specs]
    mgr = await LockManager.connect(groups=specs, max_ttl=5.0, node_timeout=0.5)
    records: list[tuple[str, int, float, float]] = []
    counts: dict[str, int] = defaultdict(int)  # "<phase> <group> <result>"
    took: dict[str, list[float]] = defaultdict(list)  # "<phase> <group>": acquire seconds
    end = start + 3 * phase
    await asyncio.sleep(max(0.0, start - time.monotonic()))  # every gateway starts at once

    async def worker(group: str) -> None:
        rng = random.Random()
        mine = [n for n in names if owner(n, ids) == group]  # clients of one group's names

        def phase_now() -> str:  # the phase an outcome came in (not the one its acquire began in)
            return f"{min(2, int((time.monotonic() - start) // phase))} {group}"

        while (now := time.monotonic()) < end:
            name = rng.choice(mine)
            try:
                lease = await mgr.acquire(name, ttl=2.0, wait=2.0)
            except QuorumUnavailable as exc:
                key = phase_now()
                counts[f"{key} unavailable"] += 1
                counts[f"{key} unavailable: {_why(exc)}"] += 1
                await asyncio.sleep(0.05)  # a client backs off before it retries
                continue
            except Exception as exc:
                counts[f"{phase_now()} {type(exc).__name__}"] += 1
                continue
            held, key = time.monotonic(), phase_now()
            took[key].append(held - now)
            await asyncio.sleep(0.001)
            left = time.monotonic()
            if lease.valid_until > asyncio.get_running_loop().time():
                records.append((name, lease.token, held, left))
                counts[key + " granted"] += 1
            else:
                counts[key + " expired"] += 1
            try:
                await mgr.release(lease)
            except Exception as exc:
                counts[f"{key} release {type(exc).__name__}"] += 1

    await asyncio.gather(*(worker(g) for g in ids for _ in range(workers)))
    await mgr.close()
    return {"records": records, "counts": dict(counts), "took": dict(took)}


def _violations(records: list[tuple[str, int, float, float]]) -> list[str]:
    """Holders of one name that overlap in time, or tokens not rising in time order."""
    by_name: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for name, token, held, left in records:
        by_name[name].append((token, held, left))
    found = []
    for name, held in by_name.items():
        held.sort(key=lambda r: r[1])
        for (t1, _, l1), (t2, h2, _) in itertools.pairwise(held):
            if h2 < l1:
                found.append(f"{name}: token {t2} held at {h2:.6f}, {t1} until {l1:.6f}")
            if t2 <= t1:
                found.append(f"{name}: token {t2} after {t1}")
    return found


def simulation(nodes: list[RedisNode], args: argparse.Namespace, pinned: bool) -> dict[str, Any]:
    for node in nodes:
        node.flushall()
    groups = _groups(nodes, 2)
    ids = ["a", "b"]
    names = [f"sim/{i}" for i in range(128)]
    phase = args.phase
    start = time.monotonic() + 10.0  # every gateway has connected and synced by then
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        pending = pool.starmap_async(
            _gateway_child, [(groups, names, args.sim_workers, start, phase)] * 3
        )
        b_nodes = nodes[3:6]
        time.sleep(max(0.0, start + phase - time.monotonic()))
        b_nodes[2].kill()  # phase 1: group b lost a node, still a quorum
        time.sleep(max(0.0, start + 2 * phase - time.monotonic()))
        b_nodes[1].kill()  # phase 2: group b lost its quorum
        results = pending.get(timeout=3 * phase + 120)
    for node in b_nodes[1:]:
        node.start()
        if pinned:
            _pin(node)
    records = [tuple(r) for res in results for r in res["records"]]
    counts: dict[str, int] = defaultdict(int)
    took: dict[str, list[float]] = defaultdict(list)
    for res in results:
        for key, value in res["counts"].items():
            counts[key] += value
        for key, values in res["took"].items():
            took[key] += values
    table = []
    for p, label in enumerate(("healthy", "b lost 1 of 3 nodes", "b lost 2 of 3 nodes")):
        row: dict[str, Any] = {"phase": label}
        for g in ids:
            row[f"{g}_granted_per_s"] = round(counts.get(f"{p} {g} granted", 0) / phase)
            row[f"{g}_unavailable"] = counts.get(f"{p} {g} unavailable", 0)
            row[f"{g}_refused_by_reason"] = {
                k.split(": ", 1)[1]: v
                for k, v in counts.items()
                if k.startswith(f"{p} {g} unavailable: ")
            }
            acquires = sorted(took.get(f"{p} {g}", [])) or [0.0]
            row[f"{g}_acquire_ms_p50"] = round(1000 * acquires[len(acquires) // 2], 2)
            row[f"{g}_acquire_ms_p99"] = round(1000 * acquires[int(len(acquires) * 0.99)], 2)
        table.append(row)
        print(row, flush=True)
    violations = _violations(records)  # type: ignore[arg-type]
    base = table[0]["a_granted_per_s"] or 1
    return {
        "phases": table,
        "a_ratio_vs_healthy": [round(r["a_granted_per_s"] / base, 2) for r in table],
        "grants_checked": len(records),
        "violations": violations[:20],
        "violation_count": len(violations),
        "other_outcomes": {
            k: v
            for k, v in counts.items()
            if not k.endswith((" granted", " unavailable")) and " unavailable: " not in k
        },
    }


# ---------------------------------------------------------------- report
def _setup_text(results: dict[str, Any], args: argparse.Namespace) -> str:
    if results["node_cpu_caps"]:
        return (
            f"Each Redis node had {args.node_cpu_pct:g} % of one core ({results['caps']}); "
            "the client processes ran on any CPU, in a cgroup beside the nodes' with "
            "cpu.shares 8192 (ahead of other work on a busy machine, without a quota)."
        )
    return (
        f"No CPU budget per node ({results['caps']}): every Redis node pinned to CPU 0, "
        f"client processes {'on the other CPU' if args.pin_clients else 'on any CPU'}."
    )


def _throughput_lines(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    capped = results["node_cpu_caps"]
    lines = [
        f"## Throughput: {args.workers} workers per group x {args.clients} client processes, "
        "distinct "
        f"names, {args.seconds:g} s per row, medians of {args.rounds} alternating round(s)",
        "",
        "| groups | nodes | acquire+release cycles/s | ratio to 1 group | refused "
        "| client CPU (cores) | client waiting for a CPU | Redis CPU per node (cores) "
        + ("| of its budget | periods throttled " if capped else "")
        + "| Redis CPU per cycle (all nodes) |",
        "| --- " * (9 + 2 * capped) + "|",
    ]
    for m in results["throughput"]["medians"]:
        lines.append(
            f"| {m['groups']} | {m['nodes']} | {m['cycles_per_s']:,.0f} | "
            f"{m['ratio_to_one_group']} | {m['refused']:g} | {m['client_cpu_cores']} | "
            f"{m['client_cpu_wait']} | "
            f"{m['node_cpu_cores']} | "
            + (f"{m['node_cpu_of_budget']} | {m['throttled_periods']} | " if capped else "")
            + f"{m['redis_cpu_us_per_cycle']} µs |"
        )
    lines.append("")
    rows = results["throughput"]["rows"]
    lines.append(
        "Each row's cycles/s: "
        + "; ".join(
            f"{g} group(s) " + ", ".join(f"{r['cycles_per_s']:,}" for r in rows[g]) for g in rows
        )
        + "."
    )
    ctl = results["throughput"]["one_group_3x_workers"]
    lines += [
        "",
        f"Control: 1 group with {3 * args.workers} workers per client process (those of 3 "
        f"groups): {ctl['cycles_per_s']:,.0f} cycles/s (median), {ctl['ratio_to_one_group']} "
        "of 1 group with its own workers: what more clients add to one group.",
    ]
    if capped:
        medians = results["throughput"]["medians"]
        low = min(m["node_cpu_of_budget"] for m in medians)
        wait = max(m["client_cpu_wait"] for m in medians)
        verdict = (
            f"The nodes used at least {low} of their CPU budget in every row (medians): Redis "
            "was the bottleneck"
            if low >= 0.85
            else f"In some rows the nodes used only {low} of their budget: there the clients, "
            "not Redis, set the pace"
        ) + (
            f"; a client process waited for a CPU up to {wait} of the time (a busy machine)."
            if wait >= 0.1
            else f"; the client processes had CPU headroom (waited for a CPU {wait} of the time)."
        )
        lines += ["", verdict]
    return lines


def _simulation_lines(sim: dict[str, Any], args: argparse.Namespace, capped: bool) -> list[str]:
    lines = [
        f"## Simulation: 3 gateway processes x 2 groups, {args.sim_workers} workers per "
        f"group in each, 128 shared names, {args.phase:g} s per phase"
        + (
            f"; gateways and nodes share {args.sim_cpu_pct:g} % of a core, ahead of other work"
            if capped
            else ""
        ),
        "",
        "| phase | a grants/s | a acquire p50 / p99 ms | a refused (by reason) "
        "| b grants/s | b acquire p50 / p99 ms | b refused (by reason) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sim["phases"]:
        cells = [r["phase"]]
        for g in ("a", "b"):
            why = ", ".join(f"{k}: {v:,}" for k, v in r[f"{g}_refused_by_reason"].items())
            cells += [
                f"{r[f'{g}_granted_per_s']:,}",
                f"{r[f'{g}_acquire_ms_p50']} / {r[f'{g}_acquire_ms_p99']}",
                f"{r[f'{g}_unavailable']:,}" + (f" ({why})" if why else ""),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Group a's grants/s relative to the healthy phase: {sim['a_ratio_vs_healthy']}. "
        f"Grants checked across the three gateways: {sim['grants_checked']:,}; "
        f"overlapping holders or tokens out of order: {sim['violation_count']}. "
        f"Other outcomes: {sim['other_outcomes'] or 'none'}.",
    ]
    return lines


def write_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    stem = "groups-quick" if args.quick else "groups"
    write_json(stem, results)
    lines = [
        "# Redlock groups benchmark",
        "",
        f"`{command()}`, {results['when']}; {results['machine']}; load average before the "
        f"run {results['load_before']}, after {results['load_after']}"
        + (" (a short run)" if args.quick or args.seconds < 20 or args.phase < 30 else "")
        + ". "
        + _setup_text(results, args),
        "",
        "Rerun on a quiet machine: `python -m benchmarks.groups` (as root, for the per-node "
        "CPU budgets; `--node-cpu-pct P` sets them, `--rounds R` the alternating rounds).",
        "",
        *_throughput_lines(results, args),
        "",
        *_simulation_lines(results["simulation"], args, results["node_cpu_caps"]),
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}, uvloop",
        "load_before": [round(x, 1) for x in os.getloadavg()],
    }
    # SIGTERM (timeout, kill) ends the run through the finally below, which removes the cgroups
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    caps: CpuCaps | None = None
    why = "--node-cpu-pct 0"
    if args.node_cpu_pct > 0:
        period_and_quota(args.node_cpu_pct)  # a bad value is an error, not a fallback
        caps, why = CpuCaps.create()
        if caps is None:
            print(f"no CPU budget per node: {why}; pinning every node to CPU {REDIS_CPU}")
    results["node_cpu_caps"] = caps is not None
    results["node_cpu_pct"] = args.node_cpu_pct if caps else None
    results["caps"] = why
    with tempfile.TemporaryDirectory(prefix="fencegate-groups-") as tmp:
        nodes = [RedisNode(Path(tmp) / f"node{i}") for i in range(9)]
        try:
            for i, node in enumerate(nodes):
                node.start()
                assert node.proc is not None
                if caps:
                    caps.cap(f"node{i}", node.proc.pid, args.node_cpu_pct)
                else:
                    _pin(node)
            if caps:  # the client processes it starts, ahead of the machine's other work
                caps.cap("clients", os.getpid(), None)
            results["throughput"] = throughput(nodes, args, caps)
            if caps:  # its nodes and gateways: one budget, ahead of other work
                for pid in [os.getpid(), *(n.proc.pid for n in nodes[:6] if n.proc)]:
                    caps.cap("simulation", pid, args.sim_cpu_pct)
            results["simulation"] = simulation(nodes[:6], args, pinned=caps is None)
        finally:
            for node in nodes:
                node.stop()
            if caps:
                caps.close()
    results["load_after"] = [round(x, 1) for x in os.getloadavg()]
    write_report(results, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=20.0, help="per throughput row")
    parser.add_argument("--rounds", type=int, default=3, help="alternating throughput rounds")
    parser.add_argument("--workers", type=int, default=32, help="tasks per group, per client")
    parser.add_argument(
        "--node-cpu-pct",
        type=float,
        default=2.0,
        help="CPU budget of each Redis node, %% of one core (0: none, pin to CPU 0)",
    )
    parser.add_argument("--phase", type=float, default=30.0, help="seconds per simulation phase")
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument(
        "--pin-clients", action="store_true", help="clients on the CPUs Redis does not use"
    )
    parser.add_argument("--sim-workers", type=int, default=16, help="tasks per gateway")
    parser.add_argument(
        "--sim-cpu-pct", type=float, default=100.0, help="the simulation's CPU, %% of one core"
    )
    ns = parser.parse_args()
    if ns.quick:  # shorter, unless given
        for key, value in {"seconds": 5.0, "phase": 4.0, "rounds": 1, "sim_workers": 4}.items():
            if getattr(ns, key) == parser.get_default(key):
                setattr(ns, key, value)
    main(ns)
