"""An opt-in per-node trace of one lock name, taken by the fault proxies.

``benchmarks.campaign --trace-name files/k1`` gives every ``FaultProxy`` a
``LinkTrace`` per connection: it parses the bytes the proxy forwards (RESP, with
hiredis) and writes one JSON line per script call whose keys name the lock
(``{files/k1}``), per reply to such a call, per pushed hand-over message of the
name, and per chunk of such a call the link lost (``drop_*``). The nemesis adds
a line per clock jump of a node (with the traced keys it expired, their PTTL and
value just before) and per fault window. Without ``--trace-name`` no proxy
parses anything.

Each line has ``mono`` (``time.monotonic()``: the clock of the history, and the
gateways' monotonic clock, which libfaketime leaves alone) and ``node_ms`` (the
node's own clock in ms: the machine's wall clock, which every redis-server here
reads; a node's clock jump is applied by its effect, keys expired, recorded as a
``jump`` line, not by moving that clock), ``g`` (the gateway), ``node`` and
``conn`` (the proxy's connection number on that link). What the node saw is what
passed the proxy: a call line is written when the command left the proxy for the
node, a reply line when the reply left it for the gateway.

``python -m tests.campaign.trace RUN_DIR [--from MONO] [--to MONO]`` prints the
trace merged with the fault windows and the history's ops of the name, by time.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import hiredis

from lockservice import scripts

__all__ = ["LinkTrace", "Tracer", "main", "merged"]

SCRIPT_NAMES = {s.sha: s.name for s in scripts.ALL}
FUNCTION_NAMES = {s.function: s.name for s in scripts.ALL}  # FCALL, Redis 7
SOURCE_NAMES = {hashlib.sha1(s.source).hexdigest().encode(): s.name for s in scripts.ALL}


def _plain(value: Any) -> Any:
    """A RESP value as JSON: bytes as text, an error reply as ``{"error": ...}``."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Exception):
        return {"error": str(value)}
    return value


class Tracer:
    """One trace file for one lock name; shared by every proxy and the nemesis."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.tag = b"{" + name.encode() + b"}"  # in every key of the name (protocol.lock_keys)
        self.message = name.encode() + b"\n"  # how a hand-over message starts (queue.lua)
        self._out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed by close()
        self._calls = 0
        self._lock = threading.Lock()  # the nemesis jumps from a thread of its own
        self.write({"ev": "start", "name": name})

    def write(self, record: dict[str, Any]) -> None:
        """One line, stamped now: the file is in time order."""
        with self._lock:
            record.setdefault("mono", time.monotonic())
            record.setdefault("node_ms", int(time.time() * 1000))
            self._out.write(json.dumps(record) + "\n")

    def next_call(self) -> int:
        self._calls += 1
        return self._calls

    def link(self, gateway: int, node: int, conn: int) -> LinkTrace:
        return LinkTrace(self, gateway, node, conn)

    def close(self) -> None:
        self._out.close()


class LinkTrace:
    """One proxied connection: commands going up, replies coming down, matched in order."""

    def __init__(self, tracer: Tracer, gateway: int, node: int, conn: int) -> None:
        self.tracer = tracer
        self.where = {"g": gateway, "node": node, "conn": conn}
        self._up = hiredis.Reader()
        self._down = hiredis.Reader()
        self._pending: collections.deque[int | None] = collections.deque()  # call ids, in order
        self._pubsub = False

    def feed(self, direction: str, data: bytes) -> None:
        """Bytes the proxy forwarded: ``up`` to the node, ``down`` to the gateway."""
        if direction == "up":
            self._up.feed(data)
            while (command := self._up.gets()) is not False:
                self._command(command)
        else:
            self._down.feed(data)
            while (reply := self._down.gets()) is not False:
                self._reply(reply)

    def lost(self, direction: str, data: bytes) -> None:
        """A chunk the link lost (the connection ends with it)."""
        if self.tracer.tag in data or self.tracer.message in data:
            self.tracer.write({"ev": "lost", **self.where, "dir": direction, "bytes": len(data)})

    def closed(self) -> None:
        """The connection ended: calls still waiting for a reply get none."""
        waiting = [c for c in self._pending if c is not None]
        if waiting:
            self.tracer.write({"ev": "closed", **self.where, "unanswered": waiting})
        self._pending.clear()

    def _command(self, command: Any) -> None:
        if not isinstance(command, list) or not command:
            return
        verb = bytes(command[0]).upper()
        if verb in (b"SUBSCRIBE", b"PSUBSCRIBE"):
            self._pubsub = True
        if self._pubsub:
            return  # replies on it are pushes
        if not any(isinstance(a, bytes) and self.tracer.tag in a for a in command[1:]):
            self._pending.append(None)
            return
        call = self.tracer.next_call()
        self._pending.append(call)
        record: dict[str, Any] = {"ev": "call", "call": call, **self.where}
        if verb in (b"FCALL", b"EVALSHA", b"EVAL") and len(command) >= 3:
            sha = command[1] if verb != b"EVAL" else hashlib.sha1(command[1]).hexdigest().encode()
            names = {b"FCALL": FUNCTION_NAMES, b"EVALSHA": SCRIPT_NAMES}.get(verb, SOURCE_NAMES)
            nkeys = int(command[2])
            record["script"] = names.get(sha, sha.decode(errors="replace"))
            record["key"] = _plain(command[3]) if nkeys else None
            record["args"] = _plain(command[3 + nkeys :])
        else:
            record["command"] = _plain(command)
        self.tracer.write(record)

    def _reply(self, reply: Any) -> None:
        if self._pubsub:
            if isinstance(reply, list) and any(
                isinstance(p, bytes) and p.startswith(self.tracer.message) for p in reply
            ):
                self.tracer.write({"ev": "push", **self.where, "message": _plain(reply)})
            return
        call = self._pending.popleft() if self._pending else None
        if call is not None:
            self.tracer.write({"ev": "reply", "call": call, **self.where, "reply": _plain(reply)})


def merged(run: Path, start: float = float("-inf"), end: float = float("inf")) -> list[str]:
    """The trace of a run (``RUN_DIR/trace.jsonl``) merged with its fault windows and the
    history's operations of the traced name, one line each, by monotonic time."""
    rows: list[tuple[float, str]] = []
    trace = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    name = next((r["name"] for r in trace if r.get("ev") == "start"), None)
    for r in trace:
        rows.append((r["mono"], "trace " + json.dumps({k: v for k, v in r.items() if k != "mono"})))
    faults = run / "faults.jsonl"
    for line in faults.read_text().splitlines() if faults.exists() else ():
        w = json.loads(line)
        rows.append((w["start"], f"fault {w['kind']} until {w['end']:.3f}: {w['detail']}"))
    for path in sorted((run / "history").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if name is None or f"{e.get('store')}/{e.get('key')}" == name:
                rows.append(
                    (e["mono"], "op " + json.dumps({k: v for k, v in e.items() if k != "mono"}))
                )
    rows.sort(key=lambda r: r[0])
    return [f"{mono:.4f} {text}" for mono, text in rows if start <= mono <= end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign.trace", description=__doc__)
    parser.add_argument("run", type=Path, help="the run's folder (it holds trace.jsonl)")
    parser.add_argument("--from", dest="start", type=float, default=float("-inf"))
    parser.add_argument("--to", dest="end", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    for line in merged(args.run, args.start, args.end):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
