"""A direct writer: takes the lock through the gateways, then writes PostgreSQL itself.

``python -m tests.campaign.direct SPEC_JSON`` runs the cycles of ``client.py``
(lock ``{store}/{key}`` with POST /v1/locks, release with DELETE, on a gateway
chosen at random) but does the read-modify-write on the legacy table itself, as
a batch job that bypasses the proxy would, in transactions opened by
``fenced_transaction_sync(conn, token, lock="{store}/{key}")`` (psycopg 3): the
scope of the proxy's writes of that row, checked by the trigger that
``fencegate pg install-fencing`` put on the table. Two styles, chosen per cycle:

``locked`` (README's advice: the row stays yours until the write), one transaction::

    SELECT v FROM ledger WHERE id = $key FOR UPDATE   -> "read" (raises no mark)
    maybe pause past the TTL, holding the row lock    (DirectClient.pause)
    UPDATE ledger SET v = $read + 1 WHERE id = $key   -> "write" (the trigger checks the token)
    COMMIT

``touch`` (as the proxy's fenced GET then PUT), two transactions::

    UPDATE ledger SET v = v WHERE id = $key RETURNING v; COMMIT  -> a fenced "read":
                                   the trigger raised the mark to the token
    maybe pause past the TTL, holding nothing
    UPDATE ledger SET v = $read + 1 WHERE id = $key; COMMIT      -> "write"

A ``locked`` writer paused past its TTL blocks other writers of the row; its
late UPDATE is refused only if a fenced read raised the mark meanwhile. A
``touch`` writer's pause blocks nobody, so other writers' touches and reads
come in and its late UPDATE is refused (what the campaign must see happen).

Each op is recorded as the HTTP clients' are, with ``direct: true`` (so are
this process's lock operations) and ``style``:

* ``ok``: the read answered (``locked``) or committed (``touch``); the write committed;
* read ``fail`` / ``info``: no connection (PostgreSQL down) or the statement
  raised / the connection broke (a touch may have raised the mark);
* write ``fail``: the UPDATE raised, so the transaction never committed: status
  409 with error ``FG409`` (stale token) or 428 with ``FG428`` (no token), else
  the SQLSTATE or the exception's name (a connection lost before COMMIT);
* write ``info``: COMMIT raised (the connection broke under it): it may have committed.

The rows exist before the run (the cluster inserts them): without a row to
lock or touch, two writers of a new key could both read "no row" and the
second write would not be refused.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Final

import psycopg

from storage_adapters.pg_fencing import (
    STALE_SQLSTATE,
    TOKEN_REQUIRED_SQLSTATE,
    fenced_transaction_sync,
)
from tests.campaign.client import ROW_COLUMN, Client, ClientSpec

__all__ = ["KEY_COLUMN", "STYLES", "TABLE", "DirectClient", "main"]

TABLE: Final = "ledger"
KEY_COLUMN: Final = "id"
REFUSALS: Final = {STALE_SQLSTATE: 409, TOKEN_REQUIRED_SQLSTATE: 428}
# A writer SIGSTOPped inside its transaction holds the row lock; these bound how
# long others wait for it and how long PostgreSQL keeps such a session.
OPTIONS: Final = (
    "-c lock_timeout=5000 -c statement_timeout=10000 -c idle_in_transaction_session_timeout=20000"
)
_SELECT: Final = f"SELECT {ROW_COLUMN} FROM {TABLE} WHERE {KEY_COLUMN} = %s FOR UPDATE"
_UPDATE: Final = f"UPDATE {TABLE} SET {ROW_COLUMN} = %s WHERE {KEY_COLUMN} = %s"
_TOUCH: Final = (
    f"UPDATE {TABLE} SET {ROW_COLUMN} = {ROW_COLUMN} WHERE {KEY_COLUMN} = %s RETURNING {ROW_COLUMN}"
)
STYLES: Final = ("locked", "touch")


class DirectClient(Client):
    """``Client`` whose read-modify-write goes to PostgreSQL, not to a gateway."""

    def __init__(self, spec: ClientSpec) -> None:
        if spec.direct_dsn is None:
            raise ValueError("a direct writer needs direct_dsn")
        super().__init__(spec)
        self.dsn = spec.direct_dsn
        self.direct = True
        self.stage = "read"  # where the current cycle is: read, pause, write, commit
        self.conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self._drop()
            self.conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=3, options=OPTIONS
            )
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def _begin(self, f: str, store: str, key: str, fields: dict[str, Any]) -> None:
        self.op += 1
        self._record("invoke", {"f": f, "store": store, "key": key, **fields})

    def _end(self, kind: str, f: str, **fields: Any) -> None:
        self._record(kind, {"f": f, "status": None, "error": None, **fields})

    def modify(self, store: str, key: str, lease: dict[str, Any]) -> None:
        self.read_modify_write(store, key, lease, style=self.rng.choice(STYLES))

    def read_modify_write(self, store: str, key: str, lease: dict[str, Any], *, style: str) -> None:
        """One read-modify-write in ``style``; every outcome recorded."""
        scope = f"{store}/{key}"
        token = int(lease["token"])
        self.stage = "read"  # connecting counts as part of the read
        self._begin("read", store, key, {**lease, "fenced": style == "touch", "style": style})
        try:
            conn = self._connection()
            if style == "locked":
                with fenced_transaction_sync(conn, token, lock=scope):
                    row = conn.execute(_SELECT, (key,)).fetchone()
                    self._read(row)
                    self.pause()
                    self._write(conn, store, key, lease, style, row)
            else:
                with fenced_transaction_sync(conn, token, lock=scope):
                    row = conn.execute(_TOUCH, (key,)).fetchone()
                self._read(row)
                self.pause()
                with fenced_transaction_sync(conn, token, lock=scope):
                    self._write(conn, store, key, lease, style, row)
            self._end("ok", "write", status=200)
        except (psycopg.Error, LookupError) as exc:
            self._failed(exc)
            if self.conn is None:
                time.sleep(self.rng.uniform(0.05, 0.2))  # no connection: PostgreSQL is down
        finally:
            if self.conn is not None and (self.conn.broken or self.conn.closed):
                self._drop()

    def pause(self) -> None:
        """As ``Client.pause``, but a pause past the TTL lasts longer (1.2 to 2 TTLs): the
        window in which another writer can come in before the late UPDATE."""
        if self.rng.random() < self.spec.pause_share:
            time.sleep(self.rng.uniform(1.2, 2.0) * self.spec.ttl_ms / 1000)
        else:
            time.sleep(self.rng.uniform(0, 0.02))

    def _read(self, row: tuple[Any, ...] | None) -> None:
        if row is None:
            raise LookupError("no row")  # the cluster inserts every row before the run
        self._end("ok", "read", status=200, value=int(row[0]))
        self.stage = "pause"

    def _write(
        self, conn: psycopg.Connection[Any], store: str, key: str, lease: dict[str, Any],
        style: str, row: tuple[Any, ...] | None,
    ) -> None:  # fmt: skip
        assert row is not None
        value = int(row[0]) + 1
        self.stage = "write"
        self._begin("write", store, key, {**lease, "value": value, "style": style})
        if conn.execute(_UPDATE, (value, key)).rowcount != 1:
            raise LookupError("no row")
        self.stage = "commit"  # the block's end commits

    def _failed(self, exc: Exception) -> None:
        state = getattr(exc, "sqlstate", None)
        error = state or type(exc).__name__
        broken = isinstance(exc, psycopg.OperationalError) and state is None
        if self.stage == "read":
            self._end("info" if broken else "fail", "read", error=error,
                      status=REFUSALS.get(state or ""))  # fmt: skip
        elif self.stage == "write":
            self._end("fail", "write", status=REFUSALS.get(state or ""), error=error)
        elif self.stage == "commit":
            self._end("info", "write", error=error)

    def close(self) -> None:
        """Close the PostgreSQL connection and the history file."""
        self._drop()
        self.out.close()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.close()


def main(argv: list[str]) -> int:
    spec = ClientSpec(**json.loads(argv[0]))
    DirectClient(spec).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
