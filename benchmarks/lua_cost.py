"""Redis-side cost of one uncontended exclusive acquire+release pair, this tree against git refs.

One redis-server (optionally under ``valgrind --tool=callgrind``) serves every variant in
turn, in alternating rounds: this tree's ``lockservice`` and that of each ``--against``
ref (``git archive``). Each round drives ``--cycles`` acquire+release pairs through a
``LockManager`` on that node from a process of its own, after ``CONFIG RESETSTAT``, and
reads per pair: the scripts' calls and their usec (``INFO commandstats``, the commands the
scripts ran included), the server's CPU time, and under callgrind the instructions of
``call()`` (command execution: robust when the machine is loaded, unlike the other two).
``--evalsha`` adds this tree as a Redis user without FCALL: the same code, its
scripts sent by EVALSHA instead of FCALL (the fallback of a node that refuses functions).

    .venv/bin/python -m benchmarks.lua_cost --against main --callgrind
    .venv/bin/python -m benchmarks.lua_cost --evalsha --cycles 20000 --rounds 5

Results: printed, and written to benchmarks/results/lua_cost.md.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._report import command

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


async def drive(url: str, cycles: int) -> None:
    """The driver process: warm up, say ``go``, wait for a line, run, say the rate."""
    from lockservice import LockManager

    mgr = await LockManager.connect([url], node_timeout=5.0)  # callgrind is slow
    for _ in range(200):  # a new node is synced first
        try:
            await mgr.release(await mgr.acquire("warm", ttl=10.0, wait=2.0))
            break
        except Exception:
            await asyncio.sleep(0.05)
    print("go", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    for i in range(cycles):
        lease = await mgr.acquire(f"bench-{i % 64}", ttl=10.0, wait=10.0)
        await mgr.release(lease)
    rate = cycles / (time.perf_counter() - start)
    await mgr.close()
    print(f"{rate:.0f}", flush=True)


class Server:
    """redis-server on a free port, maybe under callgrind, answering one-shot commands."""

    def __init__(self, workdir: Path, *, callgrind: bool) -> None:
        from tests._servers import free_port

        self.workdir = workdir
        self.port = free_port()
        self.callgrind = callgrind
        args = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--logfile", str(workdir / "redis.log"),
        ]  # fmt: skip
        if callgrind:
            out = f"--callgrind-out-file={workdir}/cg.out"
            args = ["valgrind", "--tool=callgrind", out, *args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.command("PING")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def command(self, *args: str) -> str:
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            payload += b"$%d\r\n%s\r\n" % (len(arg.encode()), arg.encode())
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
        return data.decode(errors="replace")

    def commandstats(self) -> dict[str, tuple[int, int]]:
        found = re.finditer(
            r"cmdstat_([\w|]+):calls=(\d+),usec=(\d+)", self.command("INFO", "commandstats")
        )
        return {m[1]: (int(m[2]), int(m[3])) for m in found}

    def instructions(self, function: str) -> int:
        """Inclusive instructions of ``function`` since the last call (a callgrind dump)."""
        subprocess.run(
            ["callgrind_control", "-d", str(self.proc.pid)], capture_output=True, check=True
        )
        dumps = sorted(
            glob.glob(f"{self.workdir}/cg.out.*"), key=lambda f: int(f.rsplit(".", 1)[1])
        )
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", dumps[-1]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.search(
            r"^\s*([\d,]+) \([ \d.]+%\)\s+\S*:" + re.escape(function) + r" ", text, re.M
        )
        return int(found[1].replace(",", "")) if found else 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


# A user allowed everything but FUNCTION and FCALL: this tree's scripts then go by
# EVALSHA (without FCALL: another variant's library is on the server).
EVALSHA_USER = ("fg_evalsha", "fg-evalsha")


def one_round(server: Server, tree: Path, cycles: int, *, evalsha: bool) -> dict[str, float]:
    """``cycles`` pairs driven by ``tree``'s lockservice; figures per pair."""
    from benchmarks.gateway import proc_cpu  # not in the driver: it imports this tree's code

    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}")
    user = "{}:{}@".format(*EVALSHA_USER) if evalsha else ""
    url = f"redis://{user}127.0.0.1:{server.port}/0"
    driver = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.lua_cost", "--drive", url, "--cycles", str(cycles)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, cwd=tree,
    )  # fmt: skip
    assert driver.stdin is not None
    assert driver.stdout is not None
    if driver.stdout.readline().strip() != "go":
        raise RuntimeError("the driver did not start")
    server.command("CONFIG", "RESETSTAT")
    if server.callgrind:
        server.instructions("call")  # a dump: count from here
    cpu = proc_cpu(server.proc.pid)
    driver.stdin.write("\n")
    driver.stdin.flush()
    rate = float(driver.stdout.readline())
    driver.wait(timeout=60)
    cpu = proc_cpu(server.proc.pid) - cpu
    stats = server.commandstats()
    scripts = [v for k, v in stats.items() if k in ("evalsha", "eval", "fcall")]
    nested = sum(
        c
        for k, (c, _) in stats.items()
        if k not in ("evalsha", "eval", "fcall", "config|resetstat")
    )
    figures = {
        "scripts": sum(c for c, _ in scripts) / cycles,
        "commands": nested / cycles,
        "script_us": sum(u for _, u in scripts) / cycles,
        "cpu_us": cpu * 1e6 / cycles,
        "rate": rate,
    }
    if server.callgrind:
        figures["call_ir"] = server.instructions("call") / cycles
    return figures


def main(args: argparse.Namespace) -> None:
    if args.drive:
        asyncio.run(drive(args.drive, args.cycles))
        return
    with tempfile.TemporaryDirectory(prefix="lua_cost_") as tmp:
        trees = {"this tree": ROOT}
        if args.evalsha:
            trees["this tree, EVALSHA"] = ROOT
        for ref in args.against:
            tree = Path(tmp) / f"ref-{len(trees)}"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", ref, "lockservice"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            trees[ref] = tree
        server = Server(Path(tmp), callgrind=args.callgrind)
        user, password = EVALSHA_USER
        server.command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all",
                       "-function", "-fcall")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        try:
            for r in range(args.rounds):
                for name, tree in trees.items():
                    evalsha = name.endswith("EVALSHA")
                    figures = one_round(server, tree, args.cycles, evalsha=evalsha)
                    results[name].append(figures)
                    shown = " ".join(f"{k}={v:,.1f}" for k, v in figures.items())
                    print(f"round {r} {name}: {shown}", flush=True)
        finally:
            server.stop()
    write_report(results, args)


def write_report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    columns = [
        ("scripts", "scripts / pair"),
        ("commands", "other commands / pair (mostly the scripts')"),
        ("script_us", "script µs / pair (commandstats)"),
        ("cpu_us", "redis-server CPU µs / pair"),
        ("call_ir", "instructions in call() / pair"),
        ("rate", "pairs/s"),
    ]
    columns = [c for c in columns if all(c[0] in f for runs in results.values() for f in runs)]
    first = next(iter(results))
    lines = [
        "# Redis-side cost of an uncontended exclusive acquire+release pair",
        "",
        f"`{command()}`, {args.cycles} pairs a round, {args.rounds} rounds, medians; one node;",
        f"(ratios: that tree / {first}). Under callgrind only the instructions count.",
        "",
        "| tree | " + " | ".join(title for _, title in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for name, runs in results.items():
        cells = []
        for key, _ in columns:
            value = statistics.median(f[key] for f in runs)
            base = statistics.median(f[key] for f in results[first])
            ratio = f" ({value / base:.2f}x)" if name != first and base else ""
            cells.append(f"{value:,.1f}{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lua_cost.md").write_text(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against", action="append", default=[], help="a git ref to compare (repeatable)"
    )
    parser.add_argument("--cycles", type=int, default=2000, help="acquire+release pairs a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true", help="run redis-server under callgrind")
    parser.add_argument(
        "--evalsha", action="store_true", help="also this tree with its scripts sent by EVALSHA"
    )
    parser.add_argument("--drive", metavar="URL", help=argparse.SUPPRESS)
    main(parser.parse_args())
