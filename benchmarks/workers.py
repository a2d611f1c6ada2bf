"""HTTP lock throughput of ``fencegate serve`` with 1 and with 2 workers, gateway-bound.

The load generator (``benchmarks/loadgen.py``) does lock cycles on distinct
names over 64 keep-alive connections: ``POST /v1/locks/{name}``, then
``DELETE`` with the lease id it got. By default it is ``cyclegen``
(``benchmarks/cyclegen.c``, C and epoll, built with ``cc -O2`` the first
time): the cheapest per cycle, and exact: it finishes every request and
releases every lease it took, and each run checks its counts against the
gateway's own ``/metrics``. It drives ``--depth`` cycles at once on each
connection (default 4), HTTP/1.1-pipelined: the D POSTs in one write, then
the D DELETEs in one write, so the load generator's sends and the gateway's
reads are 1/D per request; the generator's reads are not (the gateway answers
a connection's requests one after the other, each in a write of its own).
``--loadgen wrk`` runs wrk
(the Debian package ``wrk``: installed with apt-get when running as root)
with the Lua script the benchmark used first, ``--loadgen wrk-lean`` wrk
with a cheaper one, one request in flight on each connection; wrk stops with
requests in flight, so its counts may trail the gateway's by up to one per
connection. ``python -m benchmarks.loadgen`` compares their CPU per cycle,
cyclegen's at several depths (``--generators cyclegen,cyclegen:4,cyclegen:8``).
The locks live on redis-server nodes of the run's own, on unix sockets
(``--tcp``: loopback TCP, ``tests._servers.RedisNode``). Redis, the load
generator and the gateway share the machine's cores, so 2 workers on 2 cores
can at most serve

    ceiling = 2 g / (g + r + w)

times the cycles of one worker, where g, r and w are the CPU per cycle of the
gateway, Redis and the load generator with one worker (one worker is held by
its one core, two fill the machine). The scaling table therefore runs on ONE
Redis node (r is a third of three nodes'): ``--nodes`` lists the node counts,
one table each, the first the scaling table; the default ``1,3`` adds the same
run on three nodes. Every gateway runs in a session of its own, as the workers
do (the kernel's autogroup scheduling shares CPU between sessions).

Three cases, each started fresh in every round (the order rotates):

* ``1 worker``: ``workers = 1``, one process, plain in-process metrics (what
  a user runs);
* ``1 worker, supervised``: the supervisor of ``--workers`` with one worker:
  prometheus-client multiprocess metrics in the shared directory, hot-lock
  snapshots, the supervisor process; set against ``1 worker`` it is what the
  machinery of ``--workers`` costs per cycle at the same concurrency;
* ``2 workers``.

Per case: cycles per second (released leases / seconds); CPU per cycle of the
gateway's processes (the supervisor and its workers), of Redis (``/proc``) and
of the load generator (its rusage), the gateway's split into user and system
time; the cores each used; the gateway's read and write system calls and
context switches (voluntary: its loop found nothing to do and slept;
involuntary: another process took its core) per cycle. The report gives the
medians over rounds and their ranges, the ratios per round, the ceiling, how
busy the machine was with other work, the leases the load generator left held
and whether its counts agree with the gateway's.

    .venv/bin/python -m benchmarks.workers                 # 4 rounds of 10 s a case, 1 and 3 nodes
    .venv/bin/python -m benchmarks.workers --quick         # 1 round of 3 s: a smoke run
    .venv/bin/python -m benchmarks.workers --nodes 1       # the scaling table alone
    .venv/bin/python -m benchmarks.workers --tcp           # Redis over loopback TCP
    .venv/bin/python -m benchmarks.workers --depth 1       # one request in flight a connection
    .venv/bin/python -m benchmarks.workers --loadgen wrk   # wrk and CYCLE_LUA
    .venv/bin/python -m benchmarks.workers --loadgen-cpu 1 # the load generator on CPU 1

Results: printed, and written to benchmarks/results/workers.md and workers.json
(workers-tcp.* with --tcp, workers-quick.* with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._report import command
from benchmarks.gateway import children, workers_listen
from benchmarks.loadgen import (
    CONNECTIONS,
    DESCRIBED,
    GENERATORS,
    MAX_DEPTH,
    LoadGen,
    agreement,
    count_delta,
    lock_route_counts,
    prepare,
)
from tests._servers import RedisNode, free_port

RESULTS: Final = Path(__file__).resolve().parent / "results"
ROOT: Final = Path(__file__).resolve().parent.parent
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
CASES: Final = ("1", "1s", "2")
# cyclegen's cycles pipelined on each connection: its sends and the gateway's reads per cycle
# drop to 1/4; deeper cuts little more (the reads of each answer remain) and doubles latency
DEPTH: Final = 4
CASE_NAMES: Final = {"1": "1 worker", "1s": "1 worker, supervised", "2": "2 workers"}
USAGE: Final = ("user", "system", "syscalls", "voluntary", "involuntary")
_SWITCHES: Final = {
    "voluntary_ctxt_switches": "voluntary",
    "nonvoluntary_ctxt_switches": "involuntary",
}
# The supervisor of --workers with one worker: ``workers = 1`` alone runs no supervisor.
SUPERVISED: Final = (
    "import sys; from pathlib import Path; from gateway.config import load_config; "
    "from gateway.logs import setup_logging; from gateway.supervisor import supervise; "
    "c = load_config(Path(sys.argv[1])); setup_logging(c.log_level, c.log_format); "
    "raise SystemExit(supervise(c))"
)


class UnixRedis:
    """A redis-server on a unix socket only (no TCP): the cheapest transport on one host."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.socket = workdir / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        args = [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
            "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start; see {self.workdir}/redis.log")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


Redis = RedisNode | UnixRedis


def _usage(pid: int) -> dict[str, int]:
    """CPU ticks (user, system), read and write system calls and context switches of
    ``pid``, all its threads (zeros for a process that is gone)."""
    usage = dict.fromkeys(USAGE, 0)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        usage["user"], usage["system"] = int(fields[11]), int(fields[12])
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        usage["syscalls"] = int(io["syscr"]) + int(io["syscw"])
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in _SWITCHES:
                    usage[_SWITCHES[key]] += int(value)
    except (OSError, KeyError, ValueError):
        pass
    return usage


def _sum_usage(pids: list[int]) -> dict[str, int]:
    total = dict.fromkeys(USAGE, 0)
    for pid in pids:
        for key, value in _usage(pid).items():
            total[key] += value
    return total


def _machine_busy() -> tuple[int, int]:
    """(busy ticks, all ticks) of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    case: str

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)]

    def usage(self) -> dict[str, int]:
        return _sum_usage(self.pids())


def start_server(case: str, redis: list[Redis], tmp: Path) -> Server:
    port = free_port()
    workers = 2 if case == "2" else 1
    config = tmp / f"fencegate-{case}.toml"
    urls = ", ".join(f'"{node.url}"' for node in redis)
    config.write_text(
        f'listen = "127.0.0.1:{port}"\nworkers = {workers}\nshutdown_grace_ms = 0\n'
        f'log_level = "warning"\n[locks]\nredis = [{urls}]\n'
        f'[stores.files]\ntype = "files"\nroot = "{tmp / "data"}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    run = ["-c", SUPERVISED] if case == "1s" else ["-m", "gateway", "serve", "--config"]
    # A session of its own, as each worker has: with the kernel's autogroup scheduling a
    # gateway in this script's session would share one group's CPU share with the load
    # generator and Redis.
    with (tmp / f"gateway-{case}.log").open("ab") as log:  # the gateway has its own copy
        proc = subprocess.Popen(
            [sys.executable, *run, str(config)],
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    server = Server(proc, port, case)
    processes = 1 if case == "1" else workers + 1
    deadline = time.monotonic() + 60
    while True:  # every worker answers /readyz: connections land on any of them
        ready = 0
        for _ in range(4 * workers):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    ready += r.status == 200
            except OSError:
                pass
        if (
            ready == 4 * workers
            and len(server.pids()) == processes
            and (workers == 1 or workers_listen(proc.pid, workers))
        ):
            return server
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the gateway did not start; see {tmp}/gateway-{case}.log")
        time.sleep(0.2)


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def measure(
    gen: LoadGen, server: Server, redis: list[Redis], args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{server.case}w{time.monotonic_ns()}"
    gen.run(server.port, args.warmup, tag + "warm", cpu=args.loadgen_cpu, depth=args.depth)
    redis_pids = [node.proc.pid for node in redis if node.proc is not None]
    counts0 = lock_route_counts(server.port)  # scraped outside the measured window
    gw0, redis0, (busy0, all0) = server.usage(), _sum_usage(redis_pids), _machine_busy()
    started = time.monotonic()
    result = gen.run(server.port, args.seconds, tag, cpu=args.loadgen_cpu, depth=args.depth)
    elapsed = time.monotonic() - started
    gw1, redis1, (busy1, all1) = server.usage(), _sum_usage(redis_pids), _machine_busy()
    counted = count_delta(lock_route_counts(server.port), counts0)
    cycles = max(result["released"], 1)
    gateway_user = (gw1["user"] - gw0["user"]) / CLK_TCK
    gateway_cpu = gateway_user + (gw1["system"] - gw0["system"]) / CLK_TCK
    redis_cpu = (redis1["user"] + redis1["system"] - redis0["user"] - redis0["system"]) / CLK_TCK
    loadgen_cpu = result["cpu_s"]
    machine_cpu = (busy1 - busy0) / CLK_TCK
    return {
        "case": server.case,
        "cycles_per_s": result["released"] / elapsed,
        "gateway_us": gateway_cpu / cycles * 1e6,
        "gateway_user_us": gateway_user / cycles * 1e6,
        "gateway_system_us": (gateway_cpu - gateway_user) / cycles * 1e6,
        "redis_us": redis_cpu / cycles * 1e6,
        "loadgen_us": loadgen_cpu / cycles * 1e6,
        "gateway_cores": gateway_cpu / elapsed,
        "redis_cores": redis_cpu / elapsed,
        "loadgen_cores": loadgen_cpu / elapsed,
        "other_cores": max(0.0, machine_cpu - gateway_cpu - redis_cpu - loadgen_cpu) / elapsed,
        "machine_cores": (all1 - all0) / CLK_TCK / elapsed,
        "syscalls": (gw1["syscalls"] - gw0["syscalls"]) / cycles,
        "voluntary": (gw1["voluntary"] - gw0["voluntary"]) / cycles,
        "involuntary": (gw1["involuntary"] - gw0["involuntary"]) / cycles,
        "refused": result["other"],
        "refused_codes": result["codes"],
        "socket_errors": result["errors"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "leases_left": result["acquired"] - result["released"],
        "disagreement": agreement(result, counted, exact=gen.exact),
    }


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_nodes(gen: LoadGen, tmp: Path, nodes: int, args: argparse.Namespace) -> Any:
    """Every round of every case on ``nodes`` fresh Redis nodes: [{case: row}] per round."""
    redis: list[Redis] = [
        RedisNode(tmp / f"redis{nodes}-{i}") if args.tcp else UnixRedis(tmp / f"r{nodes}-{i}")
        for i in range(nodes)
    ]
    per_round: list[dict[str, dict[str, Any]]] = []
    try:
        for node in redis:
            node.start()
        for round_no in range(args.rounds):
            results: dict[str, dict[str, Any]] = {}
            for i in range(len(CASES)):
                case = CASES[(i + round_no) % len(CASES)]  # each case first in turn
                server = start_server(case, redis, tmp)
                try:
                    results[case] = row = measure(gen, server, redis, args)
                finally:
                    stop_server(server)
                print(
                    f"{nodes} node(s), round {round_no + 1}, {CASE_NAMES[case]}: "
                    f"{row['cycles_per_s']:,.0f} cycles/s, CPU us/cycle gateway "
                    f"{row['gateway_us']:,.0f} redis {row['redis_us']:,.0f} {gen.name} "
                    f"{row['loadgen_us']:,.1f}; cores gateway {row['gateway_cores']:.2f} redis "
                    f"{row['redis_cores']:.2f} {gen.name} {row['loadgen_cores']:.2f} other "
                    f"{row['other_cores']:.2f}",
                    flush=True,
                )
            per_round.append(results)
    finally:
        for node in redis:
            node.stop()
    return per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s per case")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--nodes",
        default="1,3",
        help="Redis node counts, one table each; the first is the scaling table (default 1,3)",
    )
    parser.add_argument(
        "--tcp", action="store_true", help="Redis over loopback TCP (default: unix sockets)"
    )
    parser.add_argument(
        "--loadgen",
        choices=GENERATORS,
        default=GENERATORS[0],
        help="the load generator (default cyclegen; see benchmarks.loadgen)",
    )
    parser.add_argument(
        "--loadgen-cpu",
        "--wrk-cpu",
        type=int,
        help="pin the load generator to this CPU (default: not pinned)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        help=f"cycles cyclegen pipelines on each connection (default {DEPTH}; wrk: 1)",
    )
    args = parser.parse_args()
    if args.depth is None:
        args.depth = DEPTH if args.loadgen == "cyclegen" else 1
    if not 1 <= args.depth <= (MAX_DEPTH if args.loadgen == "cyclegen" else 1):
        parser.error(f"--depth {args.depth}: cyclegen takes 1 to {MAX_DEPTH}, wrk only 1")
    try:
        node_counts = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes {args.nodes!r}: use node counts such as 1,3")
    if not node_counts or min(node_counts) < 1:
        parser.error(f"--nodes {args.nodes!r}: use node counts such as 1,3")
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 3.0, 1.0
    load_before = os.getloadavg()
    runs: dict[int, list[dict[str, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="fencegate-bench-workers-") as tmp_name:
        tmp = Path(tmp_name)
        gen = prepare(args.loadgen, tmp)
        for nodes in node_counts:
            runs[nodes] = run_nodes(gen, tmp, nodes, args)
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "command": command(),
        "rounds": args.rounds,
        "redis_transport": "tcp" if args.tcp else "unix",
        "seconds": args.seconds,
        "connections": CONNECTIONS,
        "depth": args.depth,
        "loadgen": args.loadgen,
        "loadgen_cpu": args.loadgen_cpu,
        "load_before": load_before,
        "runs": {str(nodes): build_run(per_round) for nodes, per_round in runs.items()},
    }
    write_report(report, args)


ROWS: Final = (
    "cycles_per_s", "gateway_us", "gateway_user_us", "gateway_system_us", "redis_us",
    "loadgen_us", "gateway_cores", "redis_cores", "loadgen_cores", "other_cores", "syscalls",
    "voluntary", "involuntary", "p50_ms", "p99_ms",
)  # fmt: skip


def build_run(per_round: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians and ranges per case, and the ratios and the ceiling per round."""
    cases: dict[str, Any] = {}
    for case in CASES:
        rows = [r[case] for r in per_round]
        cases[case] = {key: summarize([row[key] for row in rows]) for key in ROWS}
        codes: dict[str, int] = {}
        for row in rows:
            for code, n in row["refused_codes"].items():
                codes[code] = codes.get(code, 0) + n
        cases[case]["refused"] = sum(r["refused"] for r in rows)
        cases[case]["refused_codes"] = codes
        cases[case]["socket_errors"] = sum(r["socket_errors"] for r in rows)
        cases[case]["leases_left"] = sum(r["leases_left"] for r in rows)
        cases[case]["disagreements"] = [r["disagreement"] for r in rows if r["disagreement"]]

    def ratio(f: Any) -> dict[str, Any]:
        values = [f(r["1"], r["1s"], r["2"]) for r in per_round]
        return {**summarize(values), "per_round": values}

    return {
        "cases": cases,
        "speedup": ratio(lambda one, sup, two: two["cycles_per_s"] / one["cycles_per_s"]),
        "cpu_2_over_1": ratio(lambda one, sup, two: two["gateway_us"] / one["gateway_us"]),
        "cpu_2_over_supervised": ratio(lambda one, sup, two: two["gateway_us"] / sup["gateway_us"]),
        "cpu_supervised_over_1": ratio(lambda one, sup, two: sup["gateway_us"] / one["gateway_us"]),
        # 2 cores over what a cycle costs the machine, against one worker on its core (1/g)
        "ceiling": ratio(
            lambda one, sup, two: (
                2 * one["gateway_us"] / (one["gateway_us"] + one["redis_us"] + one["loadgen_us"])
            )
        ),
        "ceiling_at_2": ratio(
            lambda one, sup, two: (
                2 * one["gateway_us"] / (two["gateway_us"] + two["redis_us"] + two["loadgen_us"])
            )
        ),
        "per_round": per_round,
    }


def write_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "workers" + ("-tcp" if args.tcp else "") + ("-quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    transport = "loopback TCP" if report["redis_transport"] == "tcp" else "unix sockets"
    cpu = report["loadgen_cpu"]
    pinned = "not pinned" if cpu is None else f"pinned to CPU {cpu}"
    depth = report.get("depth", 1)
    in_flight = (
        "one request in flight each"
        if depth == 1
        else f"**depth {depth}**: {depth} cycles at once on each, their requests "
        "HTTP/1.1-pipelined, one write for each round of POSTs or DELETEs"
    )
    lines = [
        "# `fencegate serve --workers`: 1 vs 2 workers",
        "",
        f"{report['when']}; {report['machine']}; `{report['command']}`: {report['rounds']} "
        f"rounds of {report['seconds']:.0f} s per case (order rotating), the load generator "
        f"{DESCRIBED[report['loadgen']]} ({pinned}) with {report['connections']} connections "
        f"({in_flight}) doing POST lock + DELETE release cycles on distinct "
        f"names, redis-server nodes on the same machine (over {transport}). "
        "Medians over rounds (min-max). *1 worker*: `workers = 1`, one process, plain "
        "metrics; *1 worker, supervised*: the `--workers` supervisor with one worker "
        "(multiprocess metrics, shared directory); *2 workers*: `--workers 2`.",
    ]
    other = 0.0
    for index, (nodes, run) in enumerate(report["runs"].items()):
        lines += ["", *run_lines(int(nodes), run, headline=index == 0)]
        other = max([other, *(run["cases"][c]["other_cores"]["median"] for c in CASES)])
    if other > 0.2:
        lines += [
            "",
            f"**Other work loaded the machine**: it used a median of up to {other:.2f} of the "
            "cores during the measurements (rows above), so the gateway got less than a "
            "quiet machine gives it; read the throughput ratios with that in mind.",
        ]
    else:
        lines += ["", f"Other work on the machine used at most {other:.2f} cores (median)."]
    load = ", ".join(f"{v:.2f}" for v in report["load_before"])
    lines += ["", f"Load average before the run: {load}."]
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


def run_lines(nodes: int, run: dict[str, Any], *, headline: bool) -> list[str]:
    """One table (``nodes`` Redis nodes) and its ratios."""
    cases = run["cases"]

    def row(label: str, key: str, fmt: str = "{:,.0f}") -> str:
        cells = []
        for case in CASES:
            s = cases[case][key]
            cells.append(
                f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"
            )
        return f"| {label} | " + " | ".join(cells) + " |"

    def refused(case: str) -> str:
        c = cases[case]
        codes = ", ".join(f"{n} x {code}" for code, n in sorted(c["refused_codes"].items()))
        return f"{c['refused']}{f' ({codes})' if codes else ''}; {c['socket_errors']}"

    def agrees(case: str) -> str:
        c = cases[case]
        return f"{c['leases_left']}; " + (
            "yes" if not c["disagreements"] else "no: " + "; ".join(c["disagreements"])
        )

    def ratio(key: str, target: str = "") -> str:
        r = run[key]
        return f"**{r['median']:.2f}x** ({r['min']:.2f}-{r['max']:.2f}{target})"

    title = "the scaling table" if headline else "for comparison"
    return [
        f"## {nodes} Redis node{'s' if nodes > 1 else ''} ({title})",
        "",
        "| | " + " | ".join(CASE_NAMES[c] for c in CASES) + " |",
        "| --- |" + " --- |" * len(CASES),
        row("lock cycles/s", "cycles_per_s"),
        row("CPU µs per cycle: gateway (g)", "gateway_us"),
        row("... of it in the gateway's code (user)", "gateway_user_us"),
        row("... of it in the kernel (system: sockets, scheduling)", "gateway_system_us"),
        row("CPU µs per cycle: redis (r)", "redis_us"),
        row("CPU µs per cycle: load generator (w)", "loadgen_us", "{:,.1f}"),
        row("cores used: gateway", "gateway_cores", "{:.2f}"),
        row(f"cores used: redis ({nodes} node{'s' if nodes > 1 else ''})", "redis_cores", "{:.2f}"),
        row("cores used: load generator", "loadgen_cores", "{:.2f}"),
        row("cores used: other work on the machine", "other_cores", "{:.2f}"),
        row("gateway reads + writes per cycle (/proc/PID/io syscr + syscw)", "syscalls", "{:.1f}"),
        row("gateway context switches per cycle: voluntary", "voluntary", "{:.2f}"),
        row("gateway context switches per cycle: involuntary", "involuntary", "{:.2f}"),
        row("request latency p50 ms", "p50_ms", "{:.1f}"),
        row("request latency p99 ms", "p99_ms", "{:.1f}"),
        "| answers other than 200/204; socket errors | "
        + " | ".join(refused(c) for c in CASES)
        + " |",
        "| leases left held; counts as the gateway's (/metrics) | "
        + " | ".join(agrees(c) for c in CASES)
        + " |",
        "",
        "Per round: 2 workers / 1 worker throughput "
        + ratio("speedup", "; target ≥ 1.6x" if headline else "")
        + ", gateway CPU per cycle "
        + ratio("cpu_2_over_1", "; target ≤ 1.0x" if headline else "")
        + "; 2 workers / 1 worker supervised, gateway CPU per cycle "
        + ratio("cpu_2_over_supervised")
        + "; 1 worker supervised / 1 worker, gateway CPU per cycle "
        + ratio("cpu_supervised_over_1")
        + " (what the supervisor, multiprocess metrics and shared directory cost).",
        "",
        "What the machine allows: the ceiling 2g/(g+r+w) with one worker's g, r and w "
        "(2 cores shared by the gateway, Redis and the load generator, CPU per cycle as with "
        "one worker) "
        + ratio("ceiling")
        + "; with the CPU per cycle measured with 2 workers in the denominator, "
        "2g₁/(g₂+r₂+w₂) " + ratio("ceiling_at_2") + ".",
    ]


if __name__ == "__main__":
    main()
