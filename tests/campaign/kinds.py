"""The lock kinds' campaign clients: shared readers, semaphore holders, idempotent acquires.

``python -m tests.campaign.kinds SPEC_JSON`` runs cycles as ``client.py`` does
(same history format, same stop file, deadline and cycle budget), by ``role``:

* ``reader``: a shared lock (``"mode": "shared"``) on a name the exclusive writers
  use (``{store}/{key}``) -> fenced GET with the shared token (it raises the store's
  mark, R23) -> hold a moment -> release. With ``shared_writes`` (a sabotage) it
  reads without the token, holds on for part of the TTL and PUTs the value it read
  + 1 with its token, as an exclusive holder would: shared holders write together
  and lose updates;
* ``semaphore``: ``/v1/semaphores/{name}`` with ``permits`` on one of ``semaphores``
  -> hold a while, renew sometimes (``renew`` ops with the new validity) -> release;
* ``idempotent``: an exclusive write cycle, a shared read or a semaphore hold whose
  acquire carries an ``Idempotency-Key``. In ``drop_share`` of them the first
  request is sent and its connection closed unread (``info``, error ``dropped``),
  then repeated with the same key through the *other* gateway; otherwise the
  answer is read and, half the time, the acquire is repeated anyway through the
  other gateway (the answer discarded). Every answer is recorded; every lease
  named by one is released.

Acquires record ``mode``, ``permits`` and ``idem_key`` in their invocation: the
checker's rules per kind (``checker.py``) read them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tests.campaign.client import Client, ClientSpec, Outcome, decode, encode

__all__ = ["KindsClient", "main"]

LOCKS = "/v1/locks/"
SEMAPHORES = "/v1/semaphores/"


class KindsClient(Client):
    def acquire(
        self, store: str, key: str, mode: str, *, idem_key: str | None = None,
        gateway: int | None = None, drop: bool = False,
    ) -> Outcome:  # fmt: skip
        spec = self.spec
        body: dict[str, Any] = {"ttl_ms": spec.ttl_ms, "wait_ms": spec.wait_ms}
        fields: dict[str, Any] = {"mode": mode}
        if mode == "semaphore":
            body["permits"] = fields["permits"] = spec.permits
        elif mode == "shared":
            body["mode"] = "shared"
        headers = {"Content-Type": "application/json"}
        if idem_key is not None:
            headers["Idempotency-Key"] = fields["idem_key"] = idem_key
        route = SEMAPHORES if mode == "semaphore" else LOCKS
        return self.call(
            "acquire", store, key, "POST", f"{route}{store}/{key}", fields=fields,
            body=json.dumps(body).encode(), headers=headers,
            timeout=spec.http_timeout + spec.wait_ms / 1000, gateway=gateway, drop=drop,
        )  # fmt: skip

    def release(self, store: str, key: str, mode: str, lease: dict[str, Any]) -> None:
        route = SEMAPHORES if mode == "semaphore" else LOCKS
        self.call(
            "release", store, key, "DELETE", f"{route}{store}/{key}", fields=lease,
            headers={"X-Lease-Id": str(lease["lease_id"])}, ok=(204,),
        )  # fmt: skip

    def renew(self, store: str, key: str, mode: str, lease: dict[str, Any]) -> Outcome:
        route = SEMAPHORES if mode == "semaphore" else LOCKS
        body = {"lease_id": lease["lease_id"], "ttl_ms": self.spec.ttl_ms}
        return self.call(
            "renew", store, key, "POST", f"{route}{store}/{key}/renew", fields=dict(lease),
            body=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
        )  # fmt: skip

    def hold(self, store: str, key: str, mode: str, lease: dict[str, Any]) -> None:
        """What a holder of ``mode`` does before its release."""
        if mode == "exclusive":
            self.modify(store, key, lease)
        elif mode == "shared":
            self.shared_read(store, key, lease)
        else:
            self.hold_permit(store, key, lease)

    def shared_read(self, store: str, key: str, lease: dict[str, Any]) -> None:
        """Fenced GET with the shared token; with ``shared_writes`` (sabotage) a write too."""
        if self.spec.shared_writes:
            self.shared_write(store, key, lease)
            return
        self.call(
            "read", store, key, "GET", f"/v1/stores/{store}/{key}",
            fields={**lease, "fenced": True}, headers={"X-Fencing-Token": str(lease["token"])},
            ok=(200, 404),
        )  # fmt: skip
        time.sleep(self.rng.uniform(0, 0.05))

    def shared_write(self, store: str, key: str, lease: dict[str, Any]) -> None:
        """The sabotage: read-modify-write under a shared lease, holding it between read and
        write for part of the TTL so that other shared holders read the same value. The
        read is plain: a fenced one would raise the mark to this token, and a shared
        holder with a lower token that wrote after it would be refused (fencing would
        still save the data unless two shared grants shared a token)."""
        name = f"{store}/{key}"
        row = store in self.spec.row_stores
        token = str(lease["token"])
        read = self.call(
            "read", store, key, "GET", f"/v1/stores/{name}", fields={**lease, "fenced": False},
            ok=(200, 404),
        )  # fmt: skip
        if read.kind != "ok":
            return
        value = decode(read, row=row)
        time.sleep(self.rng.uniform(0.05, 0.5) * self.spec.ttl_ms / 1000)
        self.call(
            "write", store, key, "PUT", f"/v1/stores/{name}",
            fields={**lease, "value": value + 1}, body=encode(value + 1, row=row),
            headers={"X-Fencing-Token": token},
        )  # fmt: skip

    def hold_permit(self, store: str, key: str, lease: dict[str, Any]) -> None:
        """Hold for part of the TTL; sometimes renew and hold on (or pause past the TTL)."""
        ttl = self.spec.ttl_ms / 1000
        time.sleep(self.rng.uniform(0.1, 0.5) * ttl)
        if self.rng.random() < 0.4:
            self.renew(store, key, "semaphore", lease)
            time.sleep(self.rng.uniform(0.1, 0.5) * ttl)
        elif self.rng.random() < self.spec.pause_share:
            time.sleep(self.rng.uniform(1.05, 1.5) * ttl)

    def simple(self, store: str, key: str, mode: str) -> None:
        grant = self.acquire(store, key, mode)
        if grant.kind != "ok":
            time.sleep(self.rng.uniform(0.01, 0.1))
            return
        lease = {"token": int(grant.json()["token"]), "lease_id": str(grant.json()["lease_id"])}
        try:
            self.hold(store, key, mode, lease)
        finally:
            self.release(store, key, mode, lease)

    def idempotent(self, store: str, key: str, mode: str) -> None:
        """Acquire with a key, lose or discard the answer, repeat (the other gateway)."""
        idem_key = f"{self.spec.process}-{self.op + 1}"
        first = self.rng.randrange(len(self.spec.gateways))
        other = (first + 1) % len(self.spec.gateways)
        answers: list[Outcome] = []
        if self.rng.random() < self.spec.drop_share:
            self.acquire(store, key, mode, idem_key=idem_key, gateway=first, drop=True)
            answers.append(self.acquire(store, key, mode, idem_key=idem_key, gateway=other))
        else:
            answers.append(self.acquire(store, key, mode, idem_key=idem_key, gateway=first))
            if answers[0].kind == "ok" and self.rng.random() < 0.5:
                answers.append(self.acquire(store, key, mode, idem_key=idem_key, gateway=other))
        leases: dict[str, dict[str, Any]] = {}
        for answer in answers:
            if answer.kind == "ok":
                grant = answer.json()
                lease_id = str(grant["lease_id"])
                leases.setdefault(lease_id, {"token": int(grant["token"]), "lease_id": lease_id})
        if not leases:
            time.sleep(self.rng.uniform(0.01, 0.1))
            return
        try:
            self.hold(store, key, mode, next(iter(leases.values())))
        finally:
            for lease in leases.values():
                self.release(store, key, mode, lease)

    def cycle(self, store: str, key: str) -> None:
        role = self.spec.role
        if role == "reader":
            self.simple(store, key, "shared")
        elif role == "semaphore":
            self.simple("sem", self.rng.choice(self.spec.semaphores), "semaphore")
        elif role == "idempotent":
            mode = self.rng.choice(("exclusive", "exclusive", "shared", "semaphore"))
            if mode == "semaphore":
                store, key = "sem", self.rng.choice(self.spec.semaphores)
            self.idempotent(store, key, mode)
        else:
            raise ValueError(f"unknown role {role!r}")


def main(argv: list[str]) -> int:
    spec = ClientSpec(**json.loads(argv[0]))
    KindsClient(spec).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
