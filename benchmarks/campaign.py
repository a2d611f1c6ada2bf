"""The long fault campaign: fencegate as a black box over HTTP, under a seeded nemesis.

Three redis-server nodes, two gateway processes (each behind a fault proxy per
Redis link), a private PostgreSQL and a shared files folder, all on loopback and
all of the run's own; client processes do fenced read-modify-write increments
(lock, fenced GET, PUT value + 1, release; some pause past their TTL) and
direct writers take the lock through the gateways and update the ``ledger``
table in PostgreSQL themselves, fenced by the trigger (``tests/campaign/direct.py``),
while the nemesis pauses, kills, rolls back, partitions, delays and skews (see
``tests/campaign/nemesis.py``). At the end every key is read once and the
checker (``tests/campaign/checker.py``) looks at the merged history.

    .venv/bin/python -m benchmarks.campaign --seconds 600 --seed 1
    .venv/bin/python -m benchmarks.campaign --seconds 60 --seed 1 --sabotage
    .venv/bin/python -m benchmarks.campaign --seconds 60 --seed 1 --unfenced-direct
    .venv/bin/python -m benchmarks.campaign --seconds 60 --seed 1 --shared-writes
    .venv/bin/python -m benchmarks.campaign --seconds 60 --seed 1 --split-nodes
    .venv/bin/python -m benchmarks.campaign --seconds 300 --seed 1 --groups 2
    .venv/bin/python -m benchmarks.campaign --seconds 480 --seed 34 --trace-name files/k1

A progress line every few seconds; the result is a row of the table in
``benchmarks/results/campaign.md`` (built from ``campaign.json``; a rerun of a
seed with the same length and mode replaces its row). On a violation the
history is kept: its folder is printed and the first violations are written
into the report. The exit status is 1 when a violation was found (except with
``--sabotage`` or ``--unfenced-direct`` (the trigger is uninstalled a third of
the way in), which must find one: there it is 1 when none was found).

The lock kinds run in every mode: shared readers, semaphore holders and
idempotent acquires (``tests/campaign/kinds.py``). Their sabotages, which must
find violations too: ``--shared-writes`` (shared readers write with their shared
token) and ``--split-nodes`` (each gateway configured with a different single
Redis node: exclusion, permits and one lease per key all break). ``--groups 2``
runs the gateways over ``[locks] groups`` of two Redlock groups of three nodes
(six nodes), the nemesis acting on all of them. ``--trace-name files/k1`` logs
every script call and reply of that lock name on every proxied link, each clock
jump and each fault into the run's ``trace.jsonl`` (the run's folder is kept;
``python -m tests.campaign.trace RUN_DIR`` prints it merged with the history;
``tests/campaign/trace.py``); its row's mode says ``traced``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from tests.campaign.checker import Report
from tests.campaign.runner import CampaignResult, run_campaign

RESULTS: Final = Path(__file__).resolve().parent / "results"
KEPT: Final = 5  # violations written into the report per run


SABOTAGES: Final = ("sabotage", "unfenced-direct", "shared-writes", "split-nodes")


def mode_of(r: dict[str, Any]) -> str:
    """normal | one of ``SABOTAGES`` (rows before direct writers have no ``mode``)."""
    return str(r.get("mode") or ("sabotage" if r["sabotage"] else "normal"))


def run_mode(result: CampaignResult) -> str:
    """The mode of a run; ``traced`` is added with ``--trace-name`` (the proxies parse every
    byte then: a row of its own, not a rerun of the untraced one)."""
    mode = _base_mode(result)
    return f"{mode}, traced" if result.trace_name else mode


def _base_mode(result: CampaignResult) -> str:
    if result.unfenced_direct:
        return "unfenced-direct"
    if result.sabotage:
        return "sabotage"
    if result.shared_writes:
        return "shared-writes"
    if result.split_nodes:
        return "split-nodes"
    return f"groups {result.groups}" if result.groups else "normal"


def row(result: CampaignResult, wall: float) -> dict[str, Any]:
    r: Report = result.report
    ops: dict[str, dict[str, int]] = {}
    for name, count in r.ops.items():
        f, kind = name.split(":")
        ops.setdefault(f, {})[kind] = count
    return {
        "seed": result.seed,
        "seconds": result.seconds,
        "sabotage": result.sabotage,
        "mode": run_mode(result),
        "load": _load(),
        "wall_seconds": round(wall, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "faults": dict(sorted(result.injected.items())),
        "ops": ops,
        "direct_writes": dict(sorted(r.direct.items())),
        "kinds": dict(sorted(r.kinds.items())),
        "idempotency_excused": r.idempotency_excused,
        "pg_deadlocks": result.pg_deadlocks,
        "violations": dict(r.by_kind()),
        "violation_excerpt": [
            {"kind": v.kind, "scope": v.scope, "detail": v.detail, "ops": [_op(op) for op in v.ops]}
            for v in r.violations[:KEPT]
        ],
        "overlaps": [
            {
                "scope": o.scope,
                "seconds": round(o.seconds, 3),
                "tokens": [o.first.token, o.second.token],
                "faults": list(o.faults),
                "lifetime_faults": list(o.lifetime_faults),
            }
            for o in r.overlaps
        ],
        "availability": {k: dict(v) for k, v in sorted(r.availability.items())},
        "direct_availability": {k: dict(v) for k, v in sorted(r.direct_availability.items())},
    }


def _commit() -> str:
    """The code under test: ``main@<commit>`` this checkout is based on, else HEAD's commit
    (a branch's own commit names change when it is rebased; main's do not)."""
    for args, label in ((["merge-base", "HEAD", "main"], "main@"), (["rev-parse", "HEAD"], "")):
        try:
            out = subprocess.run(
                ["git", *args], cwd=RESULTS.parent.parent,
                capture_output=True, text=True, timeout=10, check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            continue
        if out.stdout.strip():
            return label + out.stdout.strip()[:7]
    return "?"


def _load() -> str:
    """The machine's 1/5/15-minute load averages at the end of the run (it is shared)."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _op(op: Any) -> dict[str, Any]:
    fields = ("process", "op", "f", "result", "start", "end", "token", "lease_id", "value",
              "gateway", "status", "error")  # fmt: skip
    return {k: getattr(op, k) for k in fields}


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Fault campaign",
        "",
        "`python -m benchmarks.campaign --seconds N --seed S [--sabotage | --unfenced-direct |"
        " --shared-writes | --split-nodes] [--groups 2]`:",
        "three Redis nodes, two gateway processes behind a fault proxy per Redis link, a private",
        "PostgreSQL, a shared files folder; six client processes doing fenced read-modify-write",
        "increments on two keys of the `kv` (postgres), `ledger` (postgres legacy table, with the",
        "fencing trigger) and `files` stores, and two direct writers (tests/campaign/direct.py)",
        "that take the lock through the gateways and increment the same `ledger` rows in",
        "PostgreSQL themselves, inside `fenced_transaction` (`--sabotage` adds `blind`, a files",
        'store with `fencing = "none"`, and pauses four times as often; `--unfenced-direct`',
        "uninstalls the trigger a third of the way in). Lock kinds (rows with a kinds cell):",
        "two shared readers on the same names (fenced read with the shared token), three",
        "semaphore holders (`sem/s0`, 2 permits, renewing sometimes) and two clients whose",
        "acquires of every kind carry an `Idempotency-Key`, some sent and dropped unread, then",
        "repeated through the other gateway (`--shared-writes`: the shared readers read",
        "unfenced and write with their token; `--split-nodes`: each gateway is given a",
        "different single Redis node; mode `groups 2`: `--groups 2`, the gateways over two",
        "Redlock groups of three nodes). A seeded nemesis",
        "(tests/campaign/nemesis.py); the checker (tests/campaign/checker.py) over the merged",
        "history. Ops: ok / fail / info (info: no answer or 5xx, the outcome is unknown).",
        "",
        "| seed | mode | commit | length s (wall) | faults injected | acquire | read | write |"
        " release | direct writes | kinds | violations | lease overlaps | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        faults = ", ".join(f"{k} {v}" for k, v in r["faults"].items()) or "-"
        cells = [
            "/".join(str(r["ops"].get(f, {}).get(k, 0)) for k in ("ok", "fail", "info"))
            for f in ("acquire", "read", "write", "release")
        ]
        violations = ", ".join(f"{k} {v}" for k, v in sorted(r["violations"].items())) or "none"
        lines.append(
            f"| {r['seed']} | {mode_of(r)} | {r.get('commit', '?')} | {r['seconds']:g} "
            f"({r['wall_seconds']:g}) | {faults} | "
            + " | ".join(cells)
            + f" | {_direct_cell(r)} | {_kinds_cell(r)} | {violations} | {len(r['overlaps'])}"
            f" | {r.get('load', '?')} |"
        )
    lines += [
        "",
        "Lease overlaps: pairs of leases of one name that both surely held it at once (from",
        "the grant's answer to its invocation + remaining validity, or its release). One",
        "without a Redis clock fault (`clock_jump_node`, `kleppmann`) in the two leases'",
        "lifetime (from the first acquire to the later grant) is also counted as a",
        "`mutual_exclusion` violation; a duplicate exclusive token is excused the same",
        "way. Only pairs with an",
        "exclusive lease count (shared leases hold together); semaphores are checked by",
        "`semaphore_overcount` (more leases surely held than permits), keys by `idempotency`",
        "(a repeat answered while its key's lease was surely held named another lease).",
        "",
        "Kinds: acquires ok of shared / semaphore leases; idempotent acquires ok, keys",
        "answered more than once with one lease / with several (several is no violation",
        "when the first was no longer surely held), splits a fault excused (a node may",
        "have forgotten the tag: a clock jump, or a restart for shared and semaphore",
        "leases); renews ok / refused.",
        "",
        "Direct writes: UPDATEs of the direct writers committed / refused by the trigger",
        "(FG409) / other failures / unknown (the connection broke at COMMIT), then the late",
        "ones (sent after the lease's validity ended): refused / accepted (accepted is right",
        "when nobody wrote the row meanwhile); and PostgreSQL deadlocks (40P01) seen in its",
        "log. Load: the machine's 1/5/15-minute load averages at the end of the run (shared).",
        "",
        "## Availability per fault kind (ops ok / fail / info while it was active)",
        "",
    ]
    for r in rows:
        parts = [
            f"{k} {v.get('ok', 0)}/{v.get('fail', 0)}/{v.get('info', 0)}"
            for k, v in r["availability"].items()
        ]
        lines.append(f"- seed {r['seed']} ({mode_of(r)}, {r['seconds']:g} s): " + "; ".join(parts))
        if r.get("direct_availability"):
            parts = [
                f"{k} {v.get('ok', 0)}/{v.get('fail', 0)}/{v.get('info', 0)}"
                for k, v in r["direct_availability"].items()
            ]
            lines.append("  - of which the direct writers' ops: " + "; ".join(parts))
    found = [
        r for r in rows if r["violation_excerpt"] and mode_of(r).split(",")[0] not in SABOTAGES
    ]
    if found:
        lines += ["", "## Violations found", ""]
        for r in found:
            lines.append(f"Seed {r['seed']}, {r['seconds']:g} s ({r.get('commit', '?')}):")
            for v in r["violation_excerpt"]:
                lines.append(f"- {v['kind']} on `{v['scope']}`: {v['detail']}")
                lines += [f"  - `{json.dumps(op)}`" for op in v["ops"]]
    noted = [r for r in rows if r.get("note")]
    if noted:
        lines += ["", "## Notes", ""]
        lines += [
            f"- Seed {r['seed']} ({mode_of(r)}, {r['seconds']:g} s): {r['note']}" for r in noted
        ]
    return "\n".join(lines) + "\n"


def _direct_cell(r: dict[str, Any]) -> str:
    d = r.get("direct_writes")
    if d is None:
        return "-"  # a run from before the direct writers
    other = sum(v for k, v in d.items() if k.startswith("fail") and k != "fail FG409")
    return (
        f"{d.get('ok', 0)}/{d.get('fail FG409', 0)}/{other}/{d.get('info', 0)}, late "
        f"{d.get('late refused', 0)}/{d.get('late ok', 0)}, deadlocks {r.get('pg_deadlocks', 0)}"
    )


def _kinds_cell(r: dict[str, Any]) -> str:
    k = r.get("kinds")
    if k is None:
        return "-"  # a run from before the lock kinds' clients
    return (
        f"{k.get('shared:ok', 0)}/{k.get('semaphore:ok', 0)}, idem {k.get('idempotent:ok', 0)} "
        f"({k.get('repeat:same', 0)}/{k.get('repeat:other', 0)}, excused "
        f"{r.get('idempotency_excused', 0)}), renew {k.get('renew:ok', 0)}/"
        f"{k.get('renew:fail', 0)}"
    )


def save(entry: dict[str, Any]) -> None:
    store = RESULTS / "campaign.json"
    rows: list[dict[str, Any]] = json.loads(store.read_text()) if store.exists() else []
    same = (entry["seed"], entry["seconds"], mode_of(entry))
    rows = [r for r in rows if (r["seed"], r["seconds"], mode_of(r)) != same] + [entry]
    # A row's ``note`` (written by hand into campaign.json: what a run showed) is rendered
    # under "Notes"; a rerun of the row's seed, length and mode drops it with the row.
    rows.sort(key=lambda r: (mode_of(r) != "normal", mode_of(r), r["date"], r["seed"]))
    store.write_text(json.dumps(rows, indent=1) + "\n")
    (RESULTS / "campaign.md").write_text(render(rows))


async def main(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix=f"fg-campaign-{args.seed}-"))
    print(f"campaign seed {args.seed}, {args.seconds} s, in {workdir} on {platform.node()}")
    started = time.monotonic()
    # SIGINT or SIGTERM (SIGINT is ignored in a background job): cancel the run, which
    # stops every process it started on the way out.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        result = await run_campaign(
            workdir, seed=args.seed, seconds=args.seconds, sabotage=args.sabotage,
            unfenced_direct=args.unfenced_direct, shared_writes=args.shared_writes,
            split_nodes=args.split_nodes, groups=args.groups, trace_name=args.trace_name,
            clients=args.clients, progress=lambda line: print(line, flush=True),
        )  # fmt: skip
    except asyncio.CancelledError:
        print(f"interrupted: every process of the run was stopped; nothing recorded ({workdir})")
        return 130
    wall = time.monotonic() - started
    entry = row(result, wall)
    save(entry)
    report = result.report
    print(f"faults: {dict(result.injected)}")
    print(f"ops: {dict(report.ops)}")
    print(f"direct writes: {dict(report.direct)}; PostgreSQL deadlocks: {result.pg_deadlocks}")
    print(f"kinds: {dict(report.kinds)}; idempotency excused: {report.idempotency_excused}")
    print(f"violations: {dict(report.by_kind()) or 'none'}; lease overlaps: {len(report.overlaps)}")
    for v in report.violations[:KEPT]:
        print(f"  {v.kind} {v.scope}: {v.detail}")
    if report.violations:
        print(f"history kept in {result.history}")
    if args.trace_name:
        print(f"trace of {args.trace_name} kept: python -m tests.campaign.trace {workdir}")
    elif not report.violations and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    found = bool(report.violations)
    return int(found != (_base_mode(result) in SABOTAGES))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="length of the run")
    parser.add_argument("--seed", type=int, default=1)
    sabotage = parser.add_mutually_exclusive_group()
    sabotage.add_argument("--sabotage", action="store_true", help="add the unfenced store")
    sabotage.add_argument(
        "--unfenced-direct",
        action="store_true",
        help="uninstall the trigger a third of the way in (direct writes go unchecked)",
    )
    sabotage.add_argument(
        "--shared-writes", action="store_true", help="shared readers write with their token"
    )
    sabotage.add_argument(
        "--split-nodes",
        action="store_true",
        help="each gateway locks on a different single Redis node (two lock services)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=0,
        help="run the gateways over [locks] groups: this many Redlock groups of 3 nodes",
    )
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument(
        "--trace-name",
        metavar="NAME",
        help="log every script call and reply of this lock name per node (e.g. files/k1) "
        "into the run's trace.jsonl (kept; tests/campaign/trace.py)",
    )
    args = parser.parse_args(argv)
    if not 10 <= args.seconds <= 3600:
        parser.error("--seconds must be between 10 and 3600")
    if not 0 <= args.groups <= 3:
        parser.error("--groups must be between 0 and 3")
    if args.groups and args.split_nodes:
        parser.error("--groups and --split-nodes do not go together")
    if not 1 <= args.clients <= 32:
        parser.error("--clients must be between 1 and 32")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
