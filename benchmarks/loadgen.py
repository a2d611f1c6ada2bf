"""Load generators for the gateway-bound benchmarks, and what each costs per lock cycle.

Every generator does the same lock cycles on distinct names, one request in
flight per connection: ``POST /v1/locks/bench/<tag>/<conn or thread>/<n>``
with ``{"ttl_ms": 10000}``, then ``DELETE`` of that name with the lease id of
the answer (``X-Lease-Id``); ``cyclegen:D`` pipelines D of them on each
connection (HTTP/1.1: D POSTs in one write, their D answers, then the DELETEs
in one write). What differs is the CPU each spends per cycle (w), which the
gateway's benchmarks take from the same cores:

* ``cyclegen`` (the default): ``benchmarks/cyclegen.c``, built here with
  ``cc -O2`` into ``$XDG_CACHE_HOME/fencegate-bench`` (``~/.cache``) the first
  time, again when the source changes. One epoll loop, keep-alive
  connections, the name kept from the request, the lease id found with
  ``memmem``, no allocation per request. When the duration is up it starts no
  new cycle and releases every lease it still holds (within 5 s), so its
  acquired and released counts are exact, and equal the gateway's own.
  ``cyclegen:D`` (``--depth D``) drives D cycles at once on each connection,
  pipelined, so its sends and the gateway's reads are 1/D per request (its
  reads are not: the gateway writes each answer on its own). A connection
  that breaks is made again (one that breaks before its first answer after a
  backoff, bounded); what was in flight is counted.
* ``wrk-lean``: wrk (the Debian package) with ``LEAN_LUA``: requests
  concatenated from fixed parts, name and lease id found with plain
  ``string.find``, kept on a flat stack. wrk still builds a table of the
  headers and a string of the body for every answer to call ``response()``,
  and its Lua has no way to know which connection an answer came on, so the
  name is parsed from the answer, not kept from the request.
* ``wrk``: wrk with ``CYCLE_LUA``, the script the workers benchmark used
  first (``wrk.format``, ``string.match`` with patterns, a table per lease).

wrk stops on the dot: the requests in flight then are neither counted nor
finished, so up to one lease per connection stays held (until its ttl) and the
gateway counts up to one more answer per connection than wrk.

``python -m benchmarks.loadgen`` measures them side by side against one
gateway (one worker, ``workers = 1``) on one Redis node on a unix socket, each
generator in turn in every round (the order rotating): cycles per second, the
CPU per cycle of each generator (user and system, from its rusage), of the
gateway and of Redis (``/proc``), the ceiling ``2g/(g+r+w)`` that each w
gives the workers benchmark, and whether the generator's counts agree with
the gateway's ``/metrics`` (``http_requests_total`` of the lock route).

    .venv/bin/python -m benchmarks.loadgen                 # 3 rounds of 5 s each
    .venv/bin/python -m benchmarks.loadgen --rounds 1 --seconds 2
    .venv/bin/python -m benchmarks.loadgen --generators cyclegen,cyclegen:4,cyclegen:8

Results: printed, and written to benchmarks/results/loadgen.md and loadgen.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._report import RESULTS, command

__all__ = [
    "CONNECTIONS",
    "CYCLE_LUA",
    "DEFAULT_GENERATORS",
    "DESCRIBED",
    "GENERATORS",
    "LEAN_LUA",
    "LoadGen",
    "agreement",
    "build_cyclegen",
    "count_delta",
    "ensure_wrk",
    "lock_route_counts",
    "prepare",
]

CONNECTIONS: Final = 64
TTL_MS: Final = 10_000  # of each acquire; the wrk scripts have it in their text
GENERATORS: Final = ("cyclegen", "wrk-lean", "wrk")
"""The generators by name; ``cyclegen:D`` is cyclegen with ``--depth D``."""
DEFAULT_GENERATORS: Final = ("cyclegen", "cyclegen:8", "wrk-lean", "wrk")
SOURCE: Final = Path(__file__).resolve().with_name("cyclegen.c")
MAX_DEPTH: Final = 64  # cyclegen.c's MAX_DEPTH
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
"""
# The same done() for both scripts: one RESULT line over every thread.
_DONE_LUA: Final = r"""
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
LEAN_LUA: Final = r"""
-- The cycles of CYCLE_LUA at less CPU per answer: requests concatenated from fixed
-- parts, the name and lease id found with plain find, kept on a flat stack (name,
-- lease, name, lease, ...). wrk's Lua cannot tell which connection an answer came on,
-- so the name of the lease is read from the answer (the gateway's JSON: {"name": ...).
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
local find, sub = string.find, string.sub
local stack, top, count = {}, 0, 0
local post_a, post_b, del_a, del_b
acquired, released, other, run, codes = 0, 0, 0, "0", {}
function init(args)
  run = args[1] or "0"
  local host = "Host: " .. wrk.host .. ":" .. wrk.port .. "\r\n"
  post_a = "POST /v1/locks/bench/" .. run .. "/" .. tid .. "/"
  post_b = " HTTP/1.1\r\n" .. host .. "Content-Type: application/json\r\n" ..
           'Content-Length: 17\r\n\r\n{"ttl_ms": 10000}'
  del_a = "DELETE /v1/locks/"
  del_b = " HTTP/1.1\r\n" .. host .. "X-Lease-Id: "
end
function request()
  if top > 0 then
    local name, lease = stack[top - 1], stack[top]
    top = top - 2
    return del_a .. name .. del_b .. lease .. "\r\n\r\n"
  end
  count = count + 1
  return post_a .. count .. post_b
end
function response(status, headers, body)
  if status == 200 then
    local _, n = find(body, '"name": "', 1, true)
    local n2 = find(body, '"', n + 1, true)
    local _, l = find(body, '"lease_id": "', n2, true)
    local l2 = find(body, '"', l + 1, true)
    stack[top + 1] = sub(body, n + 1, n2 - 1)
    stack[top + 2] = sub(body, l + 1, l2 - 1)
    top = top + 2
    acquired = acquired + 1
  elseif status == 204 then
    released = released + 1
  else
    other = other + 1
    local code = tostring(status)
    codes[code] = (codes[code] or 0) + 1
  end
end
"""
_SCRIPTS: Final = {"wrk": CYCLE_LUA, "wrk-lean": LEAN_LUA}
DESCRIBED: Final = {
    "cyclegen": "`cyclegen` (C, epoll: `benchmarks/cyclegen.c`; it finishes every request "
    "and releases every lease it took, its counts checked against the gateway's /metrics)",
    "wrk-lean": "wrk (1 thread) with the Lua script `LEAN_LUA` (`--loadgen wrk-lean`)",
    "wrk": "wrk (1 thread) with the Lua script `CYCLE_LUA` (`--loadgen wrk`)",
}
"""How the reports name each generator."""


def cache_dir() -> Path:
    """Where built generators are kept: ``$XDG_CACHE_HOME/fencegate-bench`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fencegate-bench"


def build_cyclegen(cache: Path | None = None) -> Path:
    """The path of the built ``cyclegen``: compiled with ``cc -O2`` the first time, and
    again whenever ``cyclegen.c`` changes (the binary's name carries the source's hash)."""
    source = SOURCE.read_bytes()
    cache = cache or cache_dir()
    exe = cache / f"cyclegen-{hashlib.sha256(source).hexdigest()[:16]}"
    if exe.is_file():
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("benchmarks need a C compiler for cyclegen: sudo apt-get install gcc")
    cache.mkdir(parents=True, exist_ok=True)
    partial = exe.with_name(f"{exe.name}.{os.getpid()}.tmp")
    built = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(partial), str(SOURCE)], capture_output=True, text=True
    )
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"cc could not build {SOURCE}:\n{built.stderr}")
    os.replace(partial, exe)  # another run building at once gets a whole file too
    return exe


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
        raise SystemExit("this load generator needs wrk: sudo apt-get install wrk")
    return found


@dataclass(frozen=True, slots=True)
class LoadGen:
    """One prepared generator: ``run`` it against a gateway's port."""

    name: str
    exe: str
    script: Path | None = None  # wrk's Lua script
    depth: int = 1  # cycles pipelined on each connection (cyclegen only)

    @property
    def exact(self) -> bool:
        """It finishes every request it sends: its counts equal the gateway's (cyclegen)."""
        return self.script is None

    def argv(
        self, port: int, seconds: float, tag: str, connections: int, ttl_ms: int, depth: int
    ) -> list[str]:
        if self.script is None:
            return [self.exe, "-p", str(port), "-c", str(connections), "-d", f"{seconds:g}",
                    "-t", tag, "-l", str(ttl_ms), "--depth", str(depth)]  # fmt: skip
        if depth != 1:
            raise ValueError(f"wrk sends one request at a time on a connection, not {depth}")
        if ttl_ms != TTL_MS:
            raise ValueError(f"the wrk scripts ask for ttl_ms {TTL_MS}, not {ttl_ms}")
        # wrk takes whole seconds
        return [self.exe, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                "-s", str(self.script), f"http://127.0.0.1:{port}", "--", tag]  # fmt: skip

    def run(
        self,
        port: int,
        seconds: float,
        tag: str,
        *,
        connections: int = CONNECTIONS,
        cpu: int | None = None,
        ttl_ms: int = TTL_MS,
        depth: int | None = None,
    ) -> dict[str, Any]:
        """One run (on CPU ``cpu`` alone if given): its RESULT line as a dict, with the
        CPU seconds the generator itself used (``cpu_s``, ``user_s``, ``system_s``).
        ``ttl_ms``: of each acquire; ``depth``: cycles pipelined on each connection
        (default: the generator's own); both cyclegen only."""
        pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
        proc = subprocess.Popen(
            self.argv(port, seconds, tag, connections, ttl_ms, depth or self.depth),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=pin,
        )
        assert proc.stdout is not None
        with proc.stdout:
            out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"{self.name} failed (exit {proc.returncode}):\n{out}")
        result: dict[str, Any] = json.loads(line[len("RESULT ") :])
        result["user_s"], result["system_s"] = usage.ru_utime, usage.ru_stime
        result["cpu_s"] = usage.ru_utime + usage.ru_stime
        return result


def prepare(name: str, workdir: Path) -> LoadGen:
    """Build or find generator ``name`` (one of ``GENERATORS``, or ``cyclegen:D``); wrk's
    script goes in ``workdir``."""
    base, _, depth = name.partition(":")
    if base == "cyclegen":
        if depth and not (depth.isdigit() and 1 <= int(depth) <= MAX_DEPTH):
            raise SystemExit(f"{name!r}: cyclegen:D takes a depth D from 1 to {MAX_DEPTH}")
        return LoadGen(name, str(build_cyclegen()), depth=int(depth or 1))
    if name not in _SCRIPTS:
        raise SystemExit(f"unknown load generator {name!r}: use one of {', '.join(GENERATORS)}")
    script = workdir / f"{name}.lua"
    script.write_text(_SCRIPTS[name] + _DONE_LUA)
    return LoadGen(name, ensure_wrk(), script)


def lock_route_counts(port: int) -> dict[str, float]:
    """The gateway's ``http_requests_total`` of ``/v1/locks/{name}``, by "METHOD STATUS"
    (summed over its workers: any worker's /metrics describes the whole server)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("fencegate_http_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        fields = dict(part.split("=", 1) for part in labels[labels.index("{") + 1 : -1].split(","))
        if fields.get("route") == '"/v1/locks/{name}"':
            key = f"{fields['method'].strip(chr(34))} {fields['status'].strip(chr(34))}"
            counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def count_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    """What ``lock_route_counts`` counted between ``before`` and ``after``."""
    return {k: round(v - before.get(k, 0.0)) for k, v in after.items() if v != before.get(k)}


def agreement(
    result: dict[str, Any],
    counted: dict[str, int],
    *,
    exact: bool,
    connections: int = CONNECTIONS,
) -> str | None:
    """Why the generator's counts and the gateway's (``counted``: "METHOD STATUS" ->
    answers during the run) disagree, or None. ``exact``: the generator finished every
    request it sent (cyclegen); else up to one answer per connection may be uncounted."""
    slack = 0 if exact else connections
    posts, deletes = counted.get("POST 200", 0), counted.get("DELETE 204", 0)
    others = sum(n for k, n in counted.items() if k not in ("POST 200", "DELETE 204"))
    problems = []
    for what, theirs, ours in (
        ("POST 200", posts, result["acquired"]),
        ("DELETE 204", deletes, result["released"]),
        ("other answers", others, result["other"]),
    ):
        if not 0 <= theirs - ours <= slack:
            problems.append(f"{what}: gateway {theirs}, generator {ours}")
    if exact and result["acquired"] != result["released"]:
        problems.append(f"{result['acquired'] - result['released']} leases left held")
    return "; ".join(problems) or None


def main() -> None:
    from benchmarks.workers import UnixRedis, start_server, stop_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--generators",
        default=",".join(DEFAULT_GENERATORS),
        help="comma-separated: cyclegen, cyclegen:D (pipelined D deep), wrk-lean, wrk",
    )
    args = parser.parse_args()
    names = [n for n in args.generators.split(",") if n]
    load_before = os.getloadavg()
    per_round: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fencegate-bench-loadgen-") as tmp_name:
        tmp = Path(tmp_name)
        gens = {name: prepare(name, tmp) for name in names}
        redis = UnixRedis(tmp / "r")
        redis.start()
        try:
            for round_no in range(args.rounds):
                server = start_server("1", [redis], tmp)
                rows: dict[str, dict[str, Any]] = {}
                try:
                    first = gens[names[0]]
                    first.run(server.port, 1, f"warm{round_no}")
                    for i in range(len(names)):
                        name = names[(i + round_no) % len(names)]
                        tag = f"{round_no}{name}"
                        rows[name] = _measure(gens[name], server, redis, args.seconds, tag)
                        print(f"round {round_no + 1}, {name}: {_line(rows[name])}", flush=True)
                finally:
                    stop_server(server)
                per_round.append(rows)
        finally:
            redis.stop()
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "command": command(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "connections": CONNECTIONS,
        "load_before": load_before,
        "generators": {n: _summary([r[n] for r in per_round]) for n in names},
        "per_round": per_round,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "loadgen.json").write_text(json.dumps(report, indent=2) + "\n")
    text = _markdown(report)
    (RESULTS / "loadgen.md").write_text(text)
    print(text)


def _measure(gen: LoadGen, server: Any, redis: Any, seconds: float, tag: str) -> dict[str, Any]:
    """One run of ``gen`` against ``server`` (benchmarks.workers' Server, UnixRedis)."""
    from benchmarks.workers import CLK_TCK, _sum_usage

    pids = [redis.proc.pid]
    counts0, gw0, r0 = lock_route_counts(server.port), server.usage(), _sum_usage(pids)
    started = time.monotonic()
    result = gen.run(server.port, seconds, tag)
    elapsed = time.monotonic() - started
    gw1, r1 = server.usage(), _sum_usage(pids)
    counted = count_delta(lock_route_counts(server.port), counts0)
    cycles = max(result["released"], 1)

    def per_cycle(a: dict[str, int], b: dict[str, int]) -> float:
        return (b["user"] + b["system"] - a["user"] - a["system"]) / CLK_TCK / cycles * 1e6

    g, r = per_cycle(gw0, gw1), per_cycle(r0, r1)
    w = result["cpu_s"] / cycles * 1e6
    calls = result.get("syscalls")  # cyclegen's sends, reads and epoll_waits
    return {
        "cycles_per_s": result["released"] / elapsed,
        "w_us": w,
        "w_user_us": result["user_s"] / cycles * 1e6,
        "w_system_us": result["system_s"] / cycles * 1e6,
        "w_syscalls": None if calls is None else sum(calls.values()) / cycles,
        "g_us": g,
        "r_us": r,
        "g_syscalls": (gw1["syscalls"] - gw0["syscalls"]) / cycles,
        "ceiling": 2 * g / (g + r + w),
        "w_share": w / (g + r + w),
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "result": result,
        "gateway_counted": counted,
        "disagreement": agreement(result, counted, exact=gen.exact),
    }


def _line(row: dict[str, Any]) -> str:
    verdict = row["disagreement"] or "counts agree with the gateway's"
    return (
        f"{row['cycles_per_s']:,.0f} cycles/s; CPU us/cycle w {row['w_us']:.1f} "
        f"(user {row['w_user_us']:.1f}, system {row['w_system_us']:.1f}"
        + ("" if row["w_syscalls"] is None else f", {row['w_syscalls']:.2f} syscalls")
        + f"), g {row['g_us']:.0f}, "
        f"r {row['r_us']:.0f}; gateway reads + writes {row['g_syscalls']:.1f}; "
        f"ceiling {row['ceiling']:.2f}x; {verdict}"
    )


_KEYS: Final = (
    "cycles_per_s", "w_us", "w_user_us", "w_system_us", "w_syscalls", "g_us", "r_us",
    "g_syscalls", "ceiling", "w_share", "p50_ms", "p99_ms",
)  # fmt: skip


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _KEYS:
        values = [row[key] for row in rows if row[key] is not None]  # w_syscalls: cyclegen's
        out[key] = (
            {"median": statistics.median(values), "min": min(values), "max": max(values)}
            if values
            else None
        )
    out["disagreements"] = [row["disagreement"] for row in rows if row["disagreement"]]
    out["held_after"] = [row["result"]["acquired"] - row["result"]["released"] for row in rows]
    return out


def _markdown(report: dict[str, Any]) -> str:
    gens = report["generators"]

    def row(label: str, key: str, fmt: str) -> str:
        cells = []
        for s in gens.values():
            v = s[key]
            if v is None:
                cells.append("n/a")
                continue
            cells.append(
                f"{fmt.format(v['median'])} ({fmt.format(v['min'])}-{fmt.format(v['max'])})"
            )
        return f"| {label} | " + " | ".join(cells) + " |"

    def agree(s: dict[str, Any]) -> str:
        return "yes" if not s["disagreements"] else "no: " + "; ".join(s["disagreements"])

    lines = [
        "# Load generators: CPU per lock cycle",
        "",
        f"{report['when']}; {report['machine']}; `{report['command']}`: {report['rounds']} "
        f"rounds of {report['seconds']:g} s per generator (order rotating) against one gateway "
        f"(`workers = 1`) on one Redis node (unix socket), {report['connections']} "
        "connections, one request in flight each (`cyclegen:D`: D, pipelined), POST lock + "
        "DELETE release cycles on distinct names. Medians over rounds (min-max). CPU from "
        "each generator's rusage "
        "and the gateway's and Redis's /proc.",
        "",
        "| | " + " | ".join(f"`{n}`" for n in gens) + " |",
        "| --- |" + " --- |" * len(gens),
        row("lock cycles/s", "cycles_per_s", "{:,.0f}"),
        row("CPU µs per cycle: load generator (w)", "w_us", "{:.1f}"),
        row("... user", "w_user_us", "{:.1f}"),
        row("... system (kernel: its sockets)", "w_system_us", "{:.1f}"),
        row("its sends + reads + epoll_waits per cycle (cyclegen's count)", "w_syscalls", "{:.2f}"),
        row("CPU µs per cycle: gateway (g)", "g_us", "{:.0f}"),
        row("CPU µs per cycle: redis (r)", "r_us", "{:.0f}"),
        row("gateway reads + writes per cycle (/proc/PID/io)", "g_syscalls", "{:.1f}"),
        row("w / (g + r + w)", "w_share", "{:.1%}"),
        row("ceiling 2g/(g+r+w) for 2 workers on 2 cores", "ceiling", "{:.2f}"),
        row("request latency p50 ms", "p50_ms", "{:.1f}"),
        row("request latency p99 ms", "p99_ms", "{:.1f}"),
        "| leases left held after a run | "
        + " | ".join(", ".join(str(n) for n in s["held_after"]) for s in gens.values())
        + " |",
        "| counts agree with the gateway's /metrics | "
        + " | ".join(agree(s) for s in gens.values())
        + " |",
        "",
        "CPU per cycle is the generator's whole CPU time (user + system, exact) over the "
        "cycles; its split into user and system comes from the kernel's tick samples, coarse "
        "for a generator that used a tenth of a second.",
        "",
        "wrk stops with requests in flight (up to one per connection, uncounted by wrk), so "
        "its counts may trail the gateway's by that much and it leaves leases held until "
        "their ttl; cyclegen finishes every request and releases every lease it took.",
        "",
        "Load average before the run: "
        + ", ".join(f"{v:.2f}" for v in report["load_before"])
        + ". Other load on the machine moves throughput and CPU per cycle of every column "
        "alike (the generators take turns against the same gateway): compare the columns.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
