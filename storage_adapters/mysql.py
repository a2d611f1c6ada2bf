"""A key-value store owned by fencegate, in MySQL 8 or MariaDB 10.6+, fenced by the mark table.

Tables (created by ``start`` in the DSN's database when missing, InnoDB)::

    fencegate_fence(scope_sha BINARY(32) PRIMARY KEY, scope, token BIGINT, updated_at)
    fencegate_kv(store, `key` VARCHAR(512) ascii_bin, value LONGBLOB, content_type,
                 token BIGINT, updated_at, PRIMARY KEY (store, `key`))

Keys compare byte for byte (``ascii_bin``), as in the other stores; ``start``
refuses an existing ``fencegate_kv`` whose key column does not (it tells the ALTER). Each
fenced call is one transaction that locks the fence row, then the data row
(see ``_mysql.py``); a plain read is one autocommit SELECT. A row missing at
the time of a fenced write is inserted; two writers of one key under two
different scopes (``X-Fencing-Lock``) can deadlock on that insert, and the
one InnoDB rolls back runs again.
"""

from __future__ import annotations

from typing import Any, Final

from storage_adapters._mysql import FENCE_DDL, MysqlStoreBase, check_exact_keys, ensure_tables
from storage_adapters.base import Record
from storage_adapters.errors import NotFound

__all__ = ["MysqlStore"]

_KV_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS fencegate_kv ("
    " store VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,"
    " `key` VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,"
    " value LONGBLOB NOT NULL,"
    " content_type VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,"
    " token BIGINT NULL,"
    " updated_at DATETIME(6) NOT NULL,"
    " PRIMARY KEY (store, `key`)"
    ") ENGINE=InnoDB"
)
_WHERE: Final = " WHERE store = %s AND `key` = %s"
_LOCK_ROW: Final = f"SELECT 1 FROM fencegate_kv{_WHERE} FOR UPDATE"
_INSERT: Final = (
    "INSERT INTO fencegate_kv (store, `key`, value, content_type, token, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, NOW(6))"
)
_UPDATE: Final = (
    "UPDATE fencegate_kv SET value = %s, content_type = %s, token = %s, updated_at = NOW(6)"
    + _WHERE
)


class MysqlStore(MysqlStoreBase):
    """A key-value store in fencegate's own table, one row per ``(store, key)``.

    Args:
        name: the store name (``[stores.<name>]``), also the ``store`` column.
        dsn: ``mysql://user:password@host:3306/database``.
        pool_min, pool_max: connection pool bounds.
        hooks: metrics hooks.
        acquire_timeout: seconds to wait for a pooled connection.
        command_timeout: seconds one call may take on its connection (also the
            session's ``innodb_lock_wait_timeout``, rounded up).
        connect_timeout: seconds to open one connection.
    """

    kind = "mysql"

    async def _prepare(self, cur: Any) -> None:
        await ensure_tables(cur, {"fencegate_fence": FENCE_DDL, "fencegate_kv": _KV_DDL})
        await check_exact_keys(cur, self.name, "fencegate_kv", _KV_DDL)

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        async def once() -> None:
            async with self._transaction() as cur:
                if token is not None:
                    await self._hold_fence(cur, scope, token)
                await cur.execute(
                    f"SELECT 1 FROM fencegate_kv{_WHERE} FOR UPDATE", (self.name, key)
                )
                if await cur.fetchone() is None:
                    await cur.execute(_INSERT, (self.name, key, body, content_type, token))
                else:
                    await cur.execute(_UPDATE, (body, content_type, token, self.name, key))

        await self._retrying(once)
        return token

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        select = f"SELECT value, content_type, token FROM fencegate_kv{_WHERE}"
        if token is None:
            async with self._cursor() as cur:
                await cur.execute(select, (self.name, key))
                row = await cur.fetchone()
        else:

            async def once() -> Any:
                async with self._transaction() as cur:
                    await self._hold_fence(cur, scope, token)
                    await cur.execute(select + " LOCK IN SHARE MODE", (self.name, key))
                    return await cur.fetchone()

            row = await self._retrying(once)
        if row is None:
            raise NotFound(self.name, key)
        value, content_type, row_token = row
        return Record(body=bytes(value), token=row_token, content_type=content_type)

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        async def once() -> None:
            async with self._transaction() as cur:
                if token is not None:
                    await self._hold_fence(cur, scope, token)
                await cur.execute(f"DELETE FROM fencegate_kv{_WHERE}", (self.name, key))

        await self._retrying(once)
