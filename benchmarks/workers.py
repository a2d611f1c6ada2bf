"""HTTP lock throughput of ``fencegate serve`` with 1 and with 2 workers, gateway-bound.

The load generator is ``wrk`` (C, epoll; the Debian package ``wrk``: this
script installs it with apt-get when it runs as root, or says how) with a Lua
script (``CYCLE_LUA``) doing lock cycles on distinct names: ``POST
/v1/locks/{name}``, then ``DELETE`` with the lease id it got. wrk costs a few
microseconds of CPU per request, the gateway about a millisecond, so on this
2-core machine the gateway is the bottleneck. The locks live on three
redis-server nodes of the run's own, on unix sockets (``--tcp``: loopback TCP,
``tests._servers.RedisNode``): Redis, wrk and the gateway share the same two
cores, and the cheaper Redis's share, the more of them the gateway can use.

Each round starts a fresh gateway for each case (1 worker, then 2, or the
other way round on every second round), warms it up, then measures: cycles
per second (released leases / seconds), and the CPU seconds the gateway's
processes used per cycle (``/proc``: the supervisor and its workers). The
report gives the medians over rounds and their ranges, the ratio of 2 workers
to 1 per round, and how busy the machine was with other work.

    .venv/bin/python -m benchmarks.workers             # 4 rounds of 10 s per case
    .venv/bin/python -m benchmarks.workers --quick     # 1 round of 3 s: a smoke run
    .venv/bin/python -m benchmarks.workers --tcp       # Redis over loopback TCP

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

from tests._servers import RedisNode, free_port

RESULTS: Final = Path(__file__).resolve().parent / "results"
ROOT: Final = Path(__file__).resolve().parent.parent
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
CONNECTIONS: Final = 64
CYCLE_LUA: Final = r"""
-- Lock cycles on distinct names: POST /v1/locks/bench/<run>/<thread>/<n>, then DELETE
-- it with the lease id of the answer. One request in flight per connection; a thread's
-- connections share its queue of leases to release.
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
local pending, count = {}, 0
acquired, released, other, run, codes = 0, 0, 0, "0", {}
function init(args)
  run = args[1] or "0"
end
function request()
  local lease = table.remove(pending)
  if lease then
    return wrk.format("DELETE", "/v1/locks/" .. lease[1], {["X-Lease-Id"] = lease[2]})
  end
  count = count + 1
  local name = "bench/" .. run .. "/" .. tid .. "/" .. count
  return wrk.format("POST", "/v1/locks/" .. name,
                    {["Content-Type"] = "application/json"}, '{"ttl_ms": 10000}')
end
function response(status, headers, body)
  if status == 200 then
    local name = string.match(body, '"name":%s*"([^"]+)"')
    local lease = string.match(body, '"lease_id":%s*"([^"]+)"')
    table.insert(pending, {name, lease})
    acquired = acquired + 1
  elseif status == 204 then
    released = released + 1
  else
    other = other + 1
    local code = tostring(status)
    codes[code] = (codes[code] or 0) + 1
  end
end
function done(summary, latency, requests)
  local a, r, o, seen = 0, 0, 0, {}
  for _, t in ipairs(threads) do
    a = a + t:get("acquired"); r = r + t:get("released"); o = o + t:get("other")
    for code, n in pairs(t:get("codes")) do seen[#seen + 1] = '"' .. code .. '": ' .. n end
  end
  io.write(string.format('RESULT {"acquired": %d, "released": %d, "other": %d, ' ..
    '"codes": {%s}, "errors": %d, "p50_ms": %.3f, "p99_ms": %.3f}\n', a, r, o,
    table.concat(seen, ", "),
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


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


def ensure_wrk() -> str:
    """The path of ``wrk``; installs the Debian package when missing and running as root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing wrk (Debian package)", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        found = shutil.which("wrk")
    if not found:
        raise SystemExit("benchmarks.workers needs wrk: sudo apt-get install wrk")
    return found


def _ticks(pid: int) -> int:
    """utime + stime of ``pid``, in clock ticks (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _machine_busy() -> tuple[int, int]:
    """(busy ticks, all ticks) of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    workers: int

    def pids(self) -> list[int]:
        return [self.proc.pid, *_children(self.proc.pid)]

    def cpu_ticks(self) -> int:
        return sum(_ticks(pid) for pid in self.pids())


def start_server(workers: int, redis: list[Redis], tmp: Path) -> Server:
    port = free_port()
    config = tmp / f"fencegate-{workers}.toml"
    urls = ", ".join(f'"{node.url}"' for node in redis)
    config.write_text(
        f'listen = "127.0.0.1:{port}"\nworkers = {workers}\nshutdown_grace_ms = 0\n'
        f'log_level = "warning"\n[locks]\nredis = [{urls}]\n'
        f'[stores.files]\ntype = "files"\nroot = "{tmp / "data"}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    log = (tmp / f"gateway-{workers}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=log,
    )
    server = Server(proc, port, workers)
    deadline = time.monotonic() + 60
    while True:  # every worker answers /readyz: connections land on any of them
        ready = 0
        for _ in range(4 * workers):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    ready += r.status == 200
            except OSError:
                pass
        if ready == 4 * workers and len(server.pids()) == (1 if workers == 1 else workers + 1):
            return server
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the gateway did not start; see {tmp}/gateway-{workers}.log")
        time.sleep(0.2)


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def run_wrk(wrk: str, script: Path, port: int, seconds: float, tag: str) -> dict[str, Any]:
    """One wrk run; its RESULT line, with the CPU seconds wrk itself used."""
    env = {**os.environ}
    proc = subprocess.Popen(
        [wrk, "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "-s", str(script),
         f"http://127.0.0.1:{port}", "--", tag],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed:\n{out}")
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    result["wrk_cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def measure(
    wrk: str, script: Path, server: Server, redis: list[Redis], args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{server.workers}w{time.monotonic_ns()}"
    run_wrk(wrk, script, server.port, args.warmup, tag + "warm")
    redis_pids = [node.proc.pid for node in redis if node.proc is not None]
    gw0, redis0, (busy0, all0) = server.cpu_ticks(), sum(map(_ticks, redis_pids)), _machine_busy()
    started = time.monotonic()
    result = run_wrk(wrk, script, server.port, args.seconds, tag)
    elapsed = time.monotonic() - started
    gw1, redis1, (busy1, all1) = server.cpu_ticks(), sum(map(_ticks, redis_pids)), _machine_busy()
    cycles = result["released"]
    gateway_cpu = (gw1 - gw0) / CLK_TCK
    redis_cpu = (redis1 - redis0) / CLK_TCK
    machine_cpu = (busy1 - busy0) / CLK_TCK
    cores = (all1 - all0) / CLK_TCK / elapsed
    return {
        "workers": server.workers,
        "cycles_per_s": cycles / elapsed,
        "gateway_cpu_us_per_cycle": gateway_cpu / max(cycles, 1) * 1e6,
        "gateway_cores": gateway_cpu / elapsed,
        "redis_cores": redis_cpu / elapsed,
        "wrk_cores": result["wrk_cpu_s"] / elapsed,
        "other_cores": max(0.0, machine_cpu - gateway_cpu - redis_cpu - result["wrk_cpu_s"])
        / elapsed,
        "machine_cores": cores,
        "refused": result["other"],
        "refused_codes": result["codes"],
        "socket_errors": result["errors"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
    }


def summarize(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [row[key] for row in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s per case")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--tcp", action="store_true", help="Redis over loopback TCP (default: unix sockets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 3.0, 1.0
    wrk = ensure_wrk()
    load_before = os.getloadavg()
    per_round: list[dict[int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fencegate-bench-workers-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "cycle.lua"
        script.write_text(CYCLE_LUA)
        redis: list[Redis] = [
            RedisNode(tmp / f"redis{i}") if args.tcp else UnixRedis(tmp / f"redis{i}")
            for i in range(3)
        ]
        try:
            for node in redis:
                node.start()
            for round_no in range(args.rounds):
                order = (1, 2) if round_no % 2 == 0 else (2, 1)
                results: dict[int, dict[str, Any]] = {}
                for workers in order:
                    server = start_server(workers, redis, tmp)
                    try:
                        results[workers] = measure(wrk, script, server, redis, args)
                    finally:
                        stop_server(server)
                    row = results[workers]
                    print(
                        f"round {round_no + 1} workers {workers}: "
                        f"{row['cycles_per_s']:,.0f} cycles/s, "
                        f"{row['gateway_cpu_us_per_cycle']:,.0f} us CPU/cycle, gateway "
                        f"{row['gateway_cores']:.2f} cores, redis {row['redis_cores']:.2f}, "
                        f"wrk {row['wrk_cores']:.2f}, other {row['other_cores']:.2f}",
                        flush=True,
                    )
                per_round.append(results)
        finally:
            for node in redis:
                node.stop()
    report = build_report(per_round, args, load_before)
    write_report(report, args)


def build_report(
    per_round: list[dict[int, dict[str, Any]]],
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for workers in (1, 2):
        rows = [r[workers] for r in per_round]
        cases[str(workers)] = {
            key: summarize(rows, key)
            for key in (
                "cycles_per_s",
                "gateway_cpu_us_per_cycle",
                "gateway_cores",
                "redis_cores",
                "wrk_cores",
                "other_cores",
                "p50_ms",
                "p99_ms",
            )
        }
        cases[str(workers)]["refused"] = sum(r["refused"] for r in rows)
        codes: dict[str, int] = {}
        for row in rows:
            for code, n in row["refused_codes"].items():
                codes[code] = codes.get(code, 0) + n
        cases[str(workers)]["refused_codes"] = codes
        cases[str(workers)]["socket_errors"] = sum(r["socket_errors"] for r in rows)
    speedups = [r[2]["cycles_per_s"] / r[1]["cycles_per_s"] for r in per_round]
    cpu = [r[2]["gateway_cpu_us_per_cycle"] / r[1]["gateway_cpu_us_per_cycle"] for r in per_round]
    return {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "rounds": args.rounds,
        "redis_transport": "tcp" if args.tcp else "unix",
        "seconds": args.seconds,
        "connections": CONNECTIONS,
        "load_before": load_before,
        "cases": cases,
        "speedup_2_over_1": {
            "median": statistics.median(speedups),
            "min": min(speedups),
            "max": max(speedups),
            "per_round": speedups,
        },
        "cpu_per_cycle_2_over_1": {
            "median": statistics.median(cpu),
            "min": min(cpu),
            "max": max(cpu),
            "per_round": cpu,
        },
        "per_round": [{str(k): v for k, v in r.items()} for r in per_round],
    }


def write_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "workers" + ("-tcp" if args.tcp else "") + ("-quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")

    def cell(case: str, key: str, fmt: str = "{:,.0f}") -> str:
        s = report["cases"][case][key]
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"

    def refused(case: str) -> str:
        c = report["cases"][case]
        codes = ", ".join(f"{n} x {code}" for code, n in sorted(c["refused_codes"].items()))
        return f"{c['refused']}{f' ({codes})' if codes else ''}; {c['socket_errors']}"

    speed, cpu = report["speedup_2_over_1"], report["cpu_per_cycle_2_over_1"]
    other = max(report["cases"][c]["other_cores"]["median"] for c in ("1", "2"))
    if other > 0.2:
        load = (
            f"**Other work loaded the machine**: it used a median of up to {other:.2f} of "
            "the 2 cores during the measurements (row above), so the gateway got less than "
            "the cores a quiet machine gives it; read the throughput ratio with that in "
            "mind. CPU per cycle is measured per process and moves less with load."
        )
    else:
        load = f"Other work on the machine used at most {other:.2f} cores (median)."
    lines = [
        "# `fencegate serve --workers`: 1 vs 2 workers",
        "",
        f"{report['when']}; {report['machine']}; `python -m benchmarks.workers"
        f"{' --quick' if args.quick else ''}`: {report['rounds']} rounds of "
        f"{report['seconds']:.0f} s per case (order alternating), wrk with 1 thread and "
        f"{report['connections']} connections doing POST lock + DELETE release cycles on "
        "distinct names, 3 redis-server nodes on the same machine (over "
        f"{'loopback TCP' if report['redis_transport'] == 'tcp' else 'unix sockets'}). "
        "Medians over rounds (min-max).",
        "",
        "| | 1 worker | 2 workers |",
        "| --- | --- | --- |",
        f"| lock cycles/s | {cell('1', 'cycles_per_s')} | {cell('2', 'cycles_per_s')} |",
        f"| gateway CPU µs per cycle | {cell('1', 'gateway_cpu_us_per_cycle')} | "
        f"{cell('2', 'gateway_cpu_us_per_cycle')} |",
        f"| cores used: gateway | {cell('1', 'gateway_cores', '{:.2f}')} | "
        f"{cell('2', 'gateway_cores', '{:.2f}')} |",
        f"| cores used: redis (3 nodes) | {cell('1', 'redis_cores', '{:.2f}')} | "
        f"{cell('2', 'redis_cores', '{:.2f}')} |",
        f"| cores used: wrk | {cell('1', 'wrk_cores', '{:.2f}')} | "
        f"{cell('2', 'wrk_cores', '{:.2f}')} |",
        f"| cores used: other work on the machine | {cell('1', 'other_cores', '{:.2f}')} | "
        f"{cell('2', 'other_cores', '{:.2f}')} |",
        f"| request latency p50 / p99 ms | {cell('1', 'p50_ms', '{:.1f}')} / "
        f"{cell('1', 'p99_ms', '{:.1f}')} | {cell('2', 'p50_ms', '{:.1f}')} / "
        f"{cell('2', 'p99_ms', '{:.1f}')} |",
        f"| answers other than 200/204; socket errors | {refused('1')} | {refused('2')} |",
        "",
        f"2 workers / 1 worker, per round: throughput **{speed['median']:.2f}x** "
        f"({speed['min']:.2f}-{speed['max']:.2f}; target ≥ 1.6x), gateway CPU per cycle "
        f"**{cpu['median']:.2f}x** ({cpu['min']:.2f}-{cpu['max']:.2f}; target ≤ 1.0x).",
        "",
        load,
        "",
        f"Load average before the run: {', '.join(f'{v:.2f}' for v in report['load_before'])}.",
    ]
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
