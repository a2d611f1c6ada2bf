"""Multiprocess metrics (a worker of ``--workers N``): whose file each update goes to.

The mode is chosen when prometheus-client is imported (``PROMETHEUS_MULTIPROC_DIR``),
so each check runs in a fresh Python process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os
from pathlib import Path
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from gateway import metrics

shared = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
m = metrics.Metrics.create(CollectorRegistry())

def requests_of(pid):
    path = shared / f"counter_{pid}.db"
    if not path.exists():
        return 0
    return sum(
        s.value
        for family in MultiProcessCollector.merge([str(path)], accumulate=False)
        for s in family.samples
        if s.name == "fencegate_http_requests_total"
    )

def request():
    m.request_done("/v1/locks/{name}", "POST", 200, 0.001)

request()
child = os.fork()
if child == 0:  # a forked process counts in files of its own
    request()
    request()
    os._exit(0)
os.waitpid(child, 0)
request()
out = {"multiprocess": metrics.MULTIPROCESS, "parent": requests_of(os.getpid()),
       "child": requests_of(child)}
# the pid prometheus-client checks on each update is gateway.metrics' own (no getpid call)
metrics._PID[0] = 1
request()
out["as_pid_1"] = requests_of(1)
print(json.dumps(out))
"""


def test_updates_go_to_this_process_file_and_a_forked_child_gets_its_own(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**env, "PYTHONPATH": str(ROOT), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["multiprocess"] is True
    assert (out["parent"], out["child"]) == (2, 2)
    # updates ask gateway.metrics for the pid, which a fork hook keeps right
    assert out["as_pid_1"] == 1
