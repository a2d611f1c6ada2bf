"""One campaign run: cluster up, clients and nemesis, quiet period, final reads, check.

``run_campaign(workdir, seed=..., seconds=...)`` is what the CI test and
``benchmarks/campaign.py`` call. Timeline of a run of ``seconds``::

    start-up | warm-up 1 s | faults (seeded schedule) | heal, quiet | clients stop | final reads

Client processes run for ``seconds`` (longer if the first fault of every kind
takes longer); the nemesis injects faults until the quiet period (the last
``quiet`` seconds), then heals everything. After every client
has exited, each key is read once through a gateway (plain GET) and recorded
as a ``final_read`` in the history; the checker gets the merged history.

Clients: ``clients`` HTTP clients over every store, and ``direct_clients``
direct writers (``direct.py``) that take the lock through the gateways and
write the ``ledger`` table in PostgreSQL themselves, on the same rows as the
HTTP clients' writes through the ``ledger`` store. ``unfenced_direct`` is the
trigger's sabotage: ``fencegate pg uninstall-fencing`` runs a third of the way
into the run, after which nothing checks the direct writers' tokens. Direct
writers pause past their TTL in ``direct_pause_share`` of their cycles (more
than the HTTP clients: a late UPDATE is refused only when another writer of the
row came in during the pause, and the check needs such refusals to mean anything).

Lock kinds (``kinds.py``): ``readers`` shared readers on the writers' names,
``semaphore_holders`` on ``SEMAPHORES`` with ``permits``, and ``idempotent``
clients whose acquires (of every kind) carry an ``Idempotency-Key`` and are
repeated through the other gateway. Two sabotages of the kinds:
``shared_writes`` (the shared readers read unfenced and write with their token) and
``split_nodes`` (each gateway is configured with a different single Redis node:
two lock services that know nothing of each other, as a wrong ``[locks] redis``
would make; every exclusion and the one-lease-per-key promise are gone).
``groups`` G > 0 runs the gateways over ``[locks] groups``: G Redlock groups of three
nodes (``cluster.py``), the nemesis acting on every node.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.campaign.checker import Report, check
from tests.campaign.client import ClientSpec, decode, request
from tests.campaign.cluster import LEDGER, ROOT, Cluster, faketime_works
from tests.campaign.history import FaultWindow, Op, load_events, pair_ops, write_jsonl
from tests.campaign.nemesis import KINDS, Nemesis, plan
from tests.campaign.trace import Tracer

__all__ = ["CampaignResult", "run_campaign"]

STORES = ("kv", LEDGER, "files")
KEYS = ("k0", "k1")
SEMAPHORES = ("s0",)  # names sem/s0, ...: not stores, never read at the end


@dataclass
class CampaignResult:
    seed: int
    seconds: float
    sabotage: bool
    unfenced_direct: bool
    planned: Counter[str]
    injected: Counter[str]
    report: Report
    statuses: Counter[str]
    history: Path
    faults: list[FaultWindow] = field(default_factory=list)
    pg_deadlocks: int = 0  # "deadlock detected" (40P01) in PostgreSQL's log, either side
    shared_writes: bool = False
    split_nodes: bool = False
    groups: int = 0
    trace_name: str | None = None

    def ops(self) -> list[Op]:
        """The paired operations of the history (read again from its files)."""
        return pair_ops(load_events(sorted(self.history.glob("*.jsonl"))))


def default_kinds() -> tuple[str, ...]:
    return tuple(k for k in KINDS if k != "skew_gateway" or faketime_works())


async def run_campaign(
    workdir: Path,
    *,
    seed: int,
    seconds: float,
    sabotage: bool = False,
    unfenced_direct: bool = False,
    kinds: Sequence[str] | None = None,
    clients: int = 6,
    direct_clients: int = 2,
    ttl_ms: int = 1500,
    pause_share: float = 0.1,
    direct_pause_share: float = 0.3,
    quiet: float = 4.0,
    readers: int = 2,
    semaphore_holders: int = 3,
    idempotent: int = 2,
    permits: int = 2,
    shared_writes: bool = False,
    split_nodes: bool = False,
    groups: int = 0,
    trace_name: str | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 5.0,
) -> CampaignResult:
    """Run the campaign and check its history; every process it started is stopped."""
    rng = random.Random(seed)
    kinds = default_kinds() if kinds is None else tuple(kinds)
    history = workdir / "history"
    history.mkdir(parents=True, exist_ok=True)
    stores = (*STORES, "blind") if sabotage else STORES
    targets = [[s, k] for s in stores for k in KEYS]
    schedule = plan(rng, kinds, max(seconds - quiet - 1.0, 1.0), ttl_ms / 1000)
    say = progress or (lambda _line: None)
    stop = workdir / "stop-clients"
    ledger = [[LEDGER, k] for k in KEYS]
    cluster_dir = workdir / "cluster"
    # ``trace_name``: the proxies and the nemesis log that lock name's traffic (trace.py)
    tracer = None if trace_name is None else Tracer(workdir / "trace.jsonl", trace_name)
    async with Cluster(
        cluster_dir, rows=KEYS, split_nodes=split_nodes, groups=groups, trace=tracer
    ) as cluster:
        procs: list[subprocess.Popen[bytes]] = []
        nemesis = Nemesis(cluster, procs, rng, tracer=tracer)
        try:
            kinds_of = [("client", "writer", "c", i, targets) for i in range(clients)]
            kinds_of += [("direct", "writer", "d", i, ledger) for i in range(direct_clients)]
            kinds_of += [("kinds", "reader", "r", i, targets) for i in range(readers)]
            kinds_of += [("kinds", "semaphore", "s", i, targets) for i in range(semaphore_holders)]
            kinds_of += [("kinds", "idempotent", "i", i, targets) for i in range(idempotent)]
            for module, role, prefix, i, where in kinds_of:
                spec = ClientSpec(
                    process=f"{prefix}{i}", gateways=cluster.urls, targets=where,
                    history=str(history / f"{prefix}{i}.jsonl"), seed=rng.randrange(1 << 30),
                    seconds=seconds + 300, stop_file=str(stop), ttl_ms=ttl_ms, wait_ms=2000,
                    pause_share=direct_pause_share
                    if module == "direct"
                    else pause_share * (4 if sabotage else 1),
                    row_stores=[LEDGER],
                    direct_dsn=cluster.pg.dsn if module == "direct" else None,
                    role=role, permits=permits, semaphores=list(SEMAPHORES),
                    shared_writes=shared_writes,
                )  # fmt: skip
                procs.append(_spawn(module, spec, workdir / f"{prefix}{i}.log"))
            started = time.monotonic()
            await asyncio.sleep(1.0)
            fault_end = started + seconds - quiet
            watch = asyncio.create_task(_watch(history, nemesis, started, say, progress_every))
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(nemesis.run(schedule, fault_end))
                    if unfenced_direct:
                        tg.create_task(_remove_trigger(cluster, started + seconds / 3, say))
                await asyncio.sleep(max(quiet, started + seconds - time.monotonic()))
            finally:
                stop.touch()
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)  # never eats our cancel
            await _wait_exit(procs, time.monotonic() + 60)
            await cluster.wait_ready(within=60.0)
            await asyncio.to_thread(_final_reads, cluster.urls[0], targets, history)
            deadlocks = cluster.pg.log_text().count("deadlock detected")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    if tracer is not None:
        tracer.close()
    faults_path = workdir / "faults.jsonl"
    write_jsonl(faults_path, (asdict(w) for w in nemesis.windows))
    events = load_events(sorted(history.glob("*.jsonl")))
    report = check(events, nemesis.windows)
    statuses = Counter(_status(e) for e in events if e["type"] != "invoke")
    return CampaignResult(
        seed, seconds, sabotage, unfenced_direct, Counter(p.kind for p in schedule),
        nemesis.injected, report, statuses, history, nemesis.windows, deadlocks,
        shared_writes, split_nodes, groups, trace_name,
    )  # fmt: skip


def _status(event: dict[str, Any]) -> str:
    """``write 409 stale_token``, ``direct write 409 FG409``, ``read None ReadTimeout``."""
    parts = ("direct" if event.get("direct") else "", event["f"], str(event.get("status")))
    return " ".join(filter(None, (*parts, event.get("error"))))


def _spawn(module: str, spec: ClientSpec, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"tests.campaign.{module}", json.dumps(asdict(spec))],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def _remove_trigger(cluster: Cluster, at: float, say: Callable[[str], None]) -> None:
    """The sabotage of ``unfenced_direct``: uninstall the trigger at ``at`` (monotonic)."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    say(await asyncio.to_thread(cluster.fencing, "uninstall-fencing"))


async def _wait_exit(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    # Child processes have no event to wait on without a thread per process: poll.
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)


async def _watch(
    history: Path, nemesis: Nemesis, started: float, say: Callable[[str], None], every: float
) -> None:
    """A progress line every ``every`` seconds: elapsed, operations by result, faults."""
    sizes: dict[Path, int] = {}
    counts: Counter[str] = Counter()
    while True:
        await asyncio.sleep(every)
        await asyncio.to_thread(_count_new, history, sizes, counts)
        faults = sum(nemesis.injected.values())
        say(
            f"t={time.monotonic() - started:5.0f}s ok={counts['ok']} fail={counts['fail']} "
            f"info={counts['info']} faults={faults}"
        )


def _count_new(history: Path, sizes: dict[Path, int], counts: Counter[str]) -> None:
    """Count the completions appended to the history files since the last call."""
    for path in history.glob("*.jsonl"):
        with open(path, "rb") as lines:
            lines.seek(sizes.get(path, 0))
            chunk = lines.read()
        done = chunk.rfind(b"\n") + 1
        sizes[path] = sizes.get(path, 0) + done
        for line in chunk[:done].splitlines():
            kind = json.loads(line)["type"]
            if kind != "invoke":
                counts[kind] += 1


def _final_reads(base: str, targets: list[list[str]], history: Path) -> None:
    """Read every key once (retrying while the cluster recovers) into the history."""
    events: list[dict[str, Any]] = []
    for op, (store, key) in enumerate(targets):
        deadline = time.monotonic() + 60
        while True:
            invoke = {
                "process": "final", "op": op, "f": "final_read", "store": store, "key": key,
                "type": "invoke", "mono": time.monotonic(), "wall": time.time(),
            }  # fmt: skip
            outcome = request(base, "GET", f"/v1/stores/{store}/{key}", ok=(200, 404))
            if outcome.kind == "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        done = {**invoke, "type": outcome.kind, "mono": time.monotonic(), "wall": time.time(),
                "status": outcome.status, "error": outcome.error}  # fmt: skip
        if outcome.kind == "ok":
            done["value"] = decode(outcome, row=store == LEDGER)
        events += [invoke, done]
    write_jsonl(history / "final.jsonl", events)
