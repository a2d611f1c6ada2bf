"""One worker process of ``fencegate serve --workers N`` (``gateway.worker.main``).

The supervisor (``gateway/supervisor.py``) starts it with a ``Setup`` on its
stdin (a 4-byte big-endian length, then the pickled ``Setup``) and keeps that
pipe open for as long as it runs. The worker then serves as a gateway of its
own (``gateway.serve.serve_one``). When the pipe ends (the supervisor died,
even by SIGKILL) the worker sends itself SIGTERM and drains as on any SIGTERM,
so no worker outlives its supervisor.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from dataclasses import dataclass

from gateway.config import Config
from gateway.logs import setup_logging
from gateway.serve import Worker, serve_one
from gateway.shared import SharedDir

__all__ = ["Setup", "main"]


@dataclass(frozen=True, slots=True)
class Setup:
    """What the supervisor tells a worker."""

    config: Config
    index: int
    shared: str
    access_log: bool
    log_level: str

    def encode(self) -> bytes:
        data = pickle.dumps(self)
        return len(data).to_bytes(4, "big") + data


def _read_setup(fd: int) -> Setup:
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    setup = pickle.loads(_read_exactly(fd, size))  # from our parent, over a private pipe
    if not isinstance(setup, Setup):
        raise TypeError(f"expected a worker Setup on stdin, got {type(setup).__name__}")
    return setup


def _read_exactly(fd: int, size: int) -> bytes:
    # os.read on the fd, not sys.stdin.buffer: the watcher thread below must not hold the
    # buffer's lock when the interpreter exits
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("stdin ended before the worker setup was read")
        data += chunk
    return data


def _exit_with_parent(fd: int) -> None:
    while os.read(fd, 4096):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    """Run the worker the supervisor describes on stdin; the exit status."""
    try:
        setup = _read_setup(sys.stdin.fileno())
    except (EOFError, TypeError, pickle.UnpicklingError) as exc:
        print(f"fencegate worker: {exc} (a worker is started by fencegate serve)", file=sys.stderr)
        return 2
    setup_logging(setup.log_level, setup.config.log_format)
    threading.Thread(target=_exit_with_parent, args=(sys.stdin.fileno(),), daemon=True).start()
    worker = Worker(setup.index, SharedDir(setup.shared))
    return serve_one(setup.config, access_log=setup.access_log, worker=worker)
