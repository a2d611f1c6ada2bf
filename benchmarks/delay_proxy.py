"""A TCP proxy that delays every byte by a fixed time each way: a LAN on loopback.

The kernel's netem is not available on the benchmark machine, so the delay is
made here, in userspace: every chunk read from one side is written to the
other ``--delay-ms`` after it was read. The delay is constant, so one FIFO of
(due, socket, bytes) in arrival order is also ordered by due time. The loop
polls the sockets, writes what is due, and while anything is in flight sleeps
in short steps (timer slack set to 1 µs, so a step is close to what was asked)
instead of epoll's whole milliseconds; idle, it blocks in epoll. Its own CPU is
what it costs: ``benchmarks.locks --rtt-ms`` reports it.

    python -m benchmarks.delay_proxy --delay-ms 0.25 LISTEN_PORT:TARGET_PORT ...

Prints ``ready`` once every listener is open; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import select
import signal
import socket
import sys
import time
from typing import Final

PR_SET_TIMERSLACK: Final = 29
STEP: Final = 50e-6  # the longest sleep while bytes are in flight


def _slack(ns: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: sleeps are just coarser
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0)


def serve(pairs: list[tuple[int, int]], delay: float) -> None:
    _slack(1000)
    ep = select.epoll()
    listeners: dict[int, tuple[socket.socket, int]] = {}
    peer: dict[int, socket.socket] = {}  # fd -> the socket its bytes go to
    socks: dict[int, socket.socket] = {}
    for listen, target in pairs:
        srv = socket.create_server(("127.0.0.1", listen), backlog=512)
        listeners[srv.fileno()] = (srv, target)
        ep.register(srv.fileno(), select.EPOLLIN)
    inflight: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("ready", flush=True)

    def close(fd: int) -> None:
        for f in (fd, peer[fd].fileno()):
            s = socks.pop(f, None)
            peer.pop(f, None)
            if s is not None:
                ep.unregister(f)
                s.close()

    while not stop:
        if inflight:
            wait = inflight[0][0] - time.perf_counter()
            events = ep.poll(0)
            if not events and wait > 0:
                time.sleep(min(wait, STEP))
        else:
            try:
                events = ep.poll(0.1)
            except InterruptedError:
                continue
        now = time.perf_counter()
        for fd, _ in events:
            if fd in listeners:
                srv, target = listeners[fd]
                client, _addr = srv.accept()
                upstream = socket.create_connection(("127.0.0.1", target))
                for s in (client, upstream):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    socks[s.fileno()] = s
                    ep.register(s.fileno(), select.EPOLLIN)
                peer[client.fileno()], peer[upstream.fileno()] = upstream, client
                continue
            sock = socks.get(fd)
            if sock is None:
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                close(fd)
                continue
            inflight.append((now + delay, peer[fd], data))
        now = time.perf_counter()
        while inflight and inflight[0][0] <= now:
            _, dest, data = inflight.popleft()
            if dest.fileno() >= 0:
                with contextlib.suppress(OSError):  # that side went away; its reader closes both
                    dest.sendall(data)
    for s in list(socks.values()):
        s.close()
    for srv, _ in listeners.values():
        srv.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="added each way")
    parser.add_argument("pairs", nargs="+", help="LISTEN_PORT:TARGET_PORT on 127.0.0.1")
    args = parser.parse_args(argv)
    pairs = [(int(a), int(b)) for a, _, b in (p.partition(":") for p in args.pairs)]
    serve(pairs, args.delay_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
