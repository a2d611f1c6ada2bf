"""A campaign client: one process doing fenced read-modify-write increments over HTTP.

``python -m tests.campaign.client SPEC_JSON`` runs cycles until its stop file
appears, its deadline passes or its cycle budget is spent: lock ``{store}/{key}``
(POST /v1/locks, wait) -> fenced GET with ``X-Fencing-Token`` -> maybe pause past
the TTL (``time.sleep``, as a GC pause would) -> PUT value + 1 with the token ->
DELETE the lock with ``X-Lease-Id``. The value is the body itself, or, on a
legacy-table store (``row_stores``), column ``v`` of the row (``{"v": 3}``).
Every step goes to a gateway chosen at random. Every operation is appended to
the client's history file before and after it runs (see ``history.py``), so a
client stopped with SIGSTOP or killed loses nothing it recorded. Only loopback
URLs are accepted.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ROW_COLUMN", "Client", "ClientSpec", "Outcome", "decode", "encode", "main", "request"]

TOKEN = "X-Fencing-Token"
ROW_COLUMN = "v"  # the counter column of a legacy-table store's rows
# Answers after which the operation certainly did not take effect.
REFUSED = {400, 403, 404, 409, 413, 428}


@dataclass(frozen=True)
class ClientSpec:
    process: str
    gateways: list[str]
    targets: list[list[str]]  # [store, key]
    history: str
    seed: int
    seconds: float  # a hard limit; the orchestrator normally stops the client first
    stop_file: str
    max_cycles: int = 100_000
    ttl_ms: int = 1500
    wait_ms: int = 2000
    pause_share: float = 0.1  # cycles that sleep past the TTL between read and write
    fenced_reads: bool = True
    http_timeout: float = 5.0
    row_stores: list[str] = field(default_factory=list)  # legacy-table stores: JSON rows
    direct_dsn: str | None = None  # a direct writer's PostgreSQL (tests/campaign/direct.py)
    # The lock kinds' clients (tests/campaign/kinds.py): reader | semaphore | idempotent
    role: str = "writer"
    permits: int = 2  # a semaphore's size
    semaphores: list[str] = field(default_factory=list)  # semaphore names
    drop_share: float = 0.3  # idempotent acquires whose first answer is never read
    shared_writes: bool = False  # sabotage: shared readers write with their shared token


@dataclass(frozen=True)
class Outcome:
    """An HTTP answer (``status`` None: no answer) and what it means for the history."""

    kind: str  # ok | fail | info
    status: int | None
    body: bytes
    error: str | None

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def request(
    base: str, method: str, path: str, *, body: bytes | None = None,
    headers: dict[str, str] | None = None, timeout: float = 5.0, ok: tuple[int, ...] = (200,),
    drop: bool = False,
) -> Outcome:  # fmt: skip
    """One request on a fresh connection; refused connection = ``fail``, no answer = ``info``.

    ``drop``: close the connection once the request is sent, never reading the answer
    (a client that lost it): ``info`` with error ``dropped``."""
    url = urlsplit(base)
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"campaign traffic goes to loopback only, not {base!r}")
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            return Outcome("fail", None, b"", "connection_refused")
        except OSError as exc:
            return Outcome("fail", None, b"", f"connect: {type(exc).__name__}")
        try:
            conn.request(method, path, body=body, headers=headers or {})
            if drop:
                return Outcome("info", None, b"", "dropped")
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            return Outcome("info", None, b"", type(exc).__name__)
    finally:
        conn.close()
    status = response.status
    try:
        code = json.loads(data).get("error") if status >= 400 else None
    except (ValueError, AttributeError):
        code = None
    if status in ok:
        return Outcome("ok", status, data, None)
    if status in REFUSED:
        return Outcome("fail", status, data, code)
    return Outcome("info", status, data, code)  # 5xx: it may have taken effect


def encode(value: int, *, row: bool) -> bytes:
    """The PUT body that stores ``value``."""
    return json.dumps({ROW_COLUMN: value}).encode() if row else b"%d" % value


def decode(outcome: Outcome, *, row: bool) -> int:
    """The value a GET answered (404: no value yet, 0)."""
    if outcome.status == 404:
        return 0
    return int(outcome.json()[ROW_COLUMN]) if row else int(outcome.body)


class Client:
    def __init__(self, spec: ClientSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.op = 0
        self.direct = False  # DirectClient: every event says so
        self.out = open(spec.history, "a", encoding="utf-8")  # noqa: SIM115  # closed in run()

    def _record(self, kind: str, fields: dict[str, Any]) -> None:
        event = {"process": self.spec.process, "op": self.op, "type": kind,
                 "mono": time.monotonic(), "wall": time.time(), **fields}  # fmt: skip
        if self.direct:
            event["direct"] = True
        self.out.write(json.dumps(event, sort_keys=True) + "\n")
        self.out.flush()

    def call(
        self, f: str, store: str, key: str, method: str, path: str, *,
        fields: dict[str, Any], body: bytes | None = None, headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,), timeout: float | None = None, gateway: int | None = None,
        drop: bool = False,
    ) -> Outcome:  # fmt: skip
        """One recorded request, to ``gateway`` or one chosen at random."""
        self.op += 1
        if gateway is None:
            gateway = self.rng.randrange(len(self.spec.gateways))
        base = {"f": f, "store": store, "key": key, "gateway": gateway, **fields}
        self._record("invoke", base)
        outcome = request(
            self.spec.gateways[gateway], method, path, body=body, headers=headers,
            timeout=timeout or self.spec.http_timeout, ok=ok, drop=drop,
        )  # fmt: skip
        done: dict[str, Any] = {"f": f, "status": outcome.status, "error": outcome.error}
        if outcome.kind == "ok":
            done.update(self._result(f, outcome, row=store in self.spec.row_stores))
        self._record(outcome.kind, done)
        return outcome

    @staticmethod
    def _result(f: str, outcome: Outcome, *, row: bool) -> dict[str, Any]:
        if f in ("acquire", "renew"):
            grant = outcome.json()
            # valid_ms (DESIGN.md): ttl - elapsed - drift at answer time. Gateways
            # before it was added answered that remaining validity as ttl_ms.
            valid = grant.get("valid_ms", grant.get("ttl_ms"))
            if f == "renew":  # its answer names no lease_id: the invocation's stands
                return {"token": grant.get("token"), "valid_ms": valid}
            return {"token": grant.get("token"), "lease_id": grant.get("lease_id"),
                    "valid_ms": valid}  # fmt: skip
        if f == "read":
            return {"value": decode(outcome, row=row)}
        return {}

    def cycle(self, store: str, key: str) -> None:
        """Lock ``{store}/{key}``, read-modify-write it (``modify``), release the lock."""
        spec = self.spec
        name = f"{store}/{key}"
        grant = self.call(
            "acquire", store, key, "POST", f"/v1/locks/{name}",
            fields={}, body=json.dumps({"ttl_ms": spec.ttl_ms, "wait_ms": spec.wait_ms}).encode(),
            headers={"Content-Type": "application/json"},
            timeout=spec.http_timeout + spec.wait_ms / 1000,
        )  # fmt: skip
        if grant.kind != "ok":
            time.sleep(self.rng.uniform(0.01, 0.1))
            return
        token, lease_id = int(grant.json()["token"]), str(grant.json()["lease_id"])
        lease = {"token": token, "lease_id": lease_id}
        try:
            self.modify(store, key, lease)
        finally:
            self.call(
                "release", store, key, "DELETE", f"/v1/locks/{name}",
                fields=lease, headers={"X-Lease-Id": lease_id}, ok=(204,),
            )  # fmt: skip

    def pause(self) -> None:
        """Between read and write: sometimes past the TTL (as a GC pause would), else briefly."""
        if self.rng.random() < self.spec.pause_share:
            time.sleep(self.rng.uniform(1.05, 1.5) * self.spec.ttl_ms / 1000)
        else:
            time.sleep(self.rng.uniform(0, 0.02))

    def modify(self, store: str, key: str, lease: dict[str, Any]) -> None:
        """Fenced GET, pause, PUT value + 1 with the token, all through the gateways."""
        spec = self.spec
        name = f"{store}/{key}"
        row = store in spec.row_stores
        token = str(lease["token"])
        headers = {TOKEN: token} if spec.fenced_reads else {}
        read = self.call(
            "read", store, key, "GET", f"/v1/stores/{name}",
            fields={**lease, "fenced": spec.fenced_reads}, headers=headers, ok=(200, 404),
        )  # fmt: skip
        if read.kind != "ok":
            return
        value = decode(read, row=row)
        self.pause()
        self.call(
            "write", store, key, "PUT", f"/v1/stores/{name}",
            fields={**lease, "value": value + 1}, body=encode(value + 1, row=row),
            headers={TOKEN: token},
        )  # fmt: skip

    def run(self) -> None:
        deadline = time.monotonic() + self.spec.seconds
        try:
            for _ in range(self.spec.max_cycles):
                if time.monotonic() >= deadline or os.path.exists(self.spec.stop_file):
                    break
                store, key = self.rng.choice(self.spec.targets)
                self.cycle(store, key)
        finally:
            self.out.close()


def main(argv: list[str]) -> int:
    spec = ClientSpec(**json.loads(argv[0]))
    Client(spec).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
