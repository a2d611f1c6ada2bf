"""An existing PostgreSQL table, protected as it is: one row per key, fenced.

The table is not changed: fencegate keeps the marks in ``fencegate_fence`` and
the token of each key's last accepted write in ``fencegate_legacy_token``
(both in ``fence_schema``), written in the same statement as the row.

* ``put`` body: a JSON object of column values, e.g. ``{"balance": "10.50"}``.
  Only the columns present are written (others keep their value, or their
  default on insert); ``null`` stores NULL. PostgreSQL converts each value to
  its column's type (``jsonb_to_record`` with the catalog types), so a value
  the type rejects fails the whole statement: nothing is written.
* ``get`` body: the row as a JSON object (key column and configured columns;
  numbers stay JSON numbers, dates and timestamps become ISO strings, as
  PostgreSQL's ``row_to_json`` renders them), ``application/json``.

Identifiers in SQL are only those found in the catalog by ``start``, always
quoted; values and keys are always bound parameters. Fenced reads and deletes
use two statements for the reason given in ``postgres.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from storage_adapters._pg import (
    PgStoreBase,
    check_exact_keys,
    ensure_tables,
    fence_ddl,
    quote_ident,
    raise_mark_sql,
)
from storage_adapters.base import (
    NO_HOOKS,
    Record,
    StoreHooks,
    compact_json,
    validate_legacy_columns,
)
from storage_adapters.errors import BadValue, NotFound, TableMismatch
from storage_adapters.keyforms import EXACT, UUID_KEYS, KeyForm, integer_range

__all__ = ["PostgresLegacyStore", "fence_tables"]

_TOKENS: Final = "fencegate_legacy_token"
_JSON: Final = "application/json"
# $1 scope, $2 token: the settings the in-database trigger reads (pg_fencing.py),
# local to the transaction.
_SETTINGS_CTE: Final = (
    "cfg AS (SELECT set_config('fencegate.token', $2::bigint::text, true) AS t,"
    " set_config('fencegate.lock', $1::text, true) AS l)"
)

# The key column types whose values each have one text form (keyforms.py).
_KEY_FORMS: Final[dict[str, KeyForm]] = {
    "smallint": integer_range(16),
    "integer": integer_range(32),
    "bigint": integer_range(64),
    "uuid": UUID_KEYS,
    "text": EXACT,
    "character varying": EXACT,
}

_COLUMNS_SQL: Final = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS full_type,"
    " format_type(a.atttypid, -1) AS base_type, a.attgenerated <> '' AS generated,"
    " COALESCE((SELECT co.collisdeterministic FROM pg_collation co"
    "   WHERE co.oid = a.attcollation), true) AS deterministic,"
    " (SELECT co.collname FROM pg_collation co WHERE co.oid = a.attcollation) AS collation,"
    " EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique"
    "   AND i.indimmediate AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL"
    "   AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum) AS unique_key"
    " FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped"
)


def fence_tables(schema_q: str) -> dict[str, str]:
    """fencegate's tables for legacy-table stores in ``schema_q``: name -> DDL."""
    return {
        "fencegate_fence": fence_ddl(schema_q),
        _TOKENS: (
            f"CREATE TABLE {schema_q}.{_TOKENS} ("
            " store text NOT NULL, key text NOT NULL, token bigint,"
            " PRIMARY KEY (store, key))"
        ),
    }


@dataclass(frozen=True, slots=True)
class _Column:
    quoted: str
    full_type: str  # with typmod, e.g. numeric(12,2): what a written value must fit
    base_type: str  # without typmod: for casting a key without truncating it


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class PostgresLegacyStore(PgStoreBase):
    """An existing table, with ``key_column`` as the key and ``columns`` writable.

    Args:
        name: the store name.
        dsn: a libpq connection string or URL.
        table: the table name (not quoted, as in the catalog).
        key_column: a column with a single-column unique index or constraint.
        columns: the columns a client may write (and reads return).
        schema: the table's schema.
        fence_schema: where fencegate's tables live; the table's schema by default.
        The other options are those of ``PostgresStore``.
    """

    kind = "postgres_legacy"

    def __init__(
        self,
        name: str,
        dsn: str,
        *,
        table: str,
        key_column: str,
        columns: Sequence[str],
        schema: str = "public",
        fence_schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        hooks: StoreHooks = NO_HOOKS,
        acquire_timeout: float = 5.0,
        command_timeout: float | None = 10.0,
        connect_timeout: float = 5.0,
        server_settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            name,
            dsn,
            schema=fence_schema or schema,
            pool_min=pool_min,
            pool_max=pool_max,
            hooks=hooks,
            acquire_timeout=acquire_timeout,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            server_settings=server_settings,
        )
        columns = validate_legacy_columns(name, table, key_column, columns)
        self.table_schema = schema
        self.table = table
        self.key_column = key_column
        self.columns: tuple[str, ...] = columns
        self._table_q = f"{quote_ident(schema)}.{quote_ident(table)}"
        self._tokens_q = f"{self._schema_q}.{_TOKENS}"
        self._catalog: dict[str, _Column] = {}
        self._key_form: KeyForm | None = None
        self._put_cache: dict[tuple[bool, tuple[str, ...]], str] = {}
        self._get_sql = ""
        self._delete_sql = ""

    async def _prepare(self, conn: Any) -> None:
        await ensure_tables(conn, self.schema, fence_tables(self._schema_q))
        await check_exact_keys(conn, self.name, self.schema, _TOKENS)
        self._catalog = await self._check_catalog(conn)
        self._build_sql()

    async def _check_catalog(self, conn: Any) -> dict[str, _Column]:
        """Find the table and its columns in the catalog; name everything that is missing."""
        where = f"{self.table_schema}.{self.table}"
        rel = await conn.fetchrow(
            "SELECT c.oid, c.relkind::text AS relkind"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relname = $2",
            self.table_schema,
            self.table,
        )
        if rel is None:
            raise TableMismatch(self.name, where, [f"table {where!r} does not exist"])
        if rel["relkind"] not in ("r", "p"):
            raise TableMismatch(self.name, where, [f"{where!r} is not a table"])
        rows = {row["attname"]: row for row in await conn.fetch(_COLUMNS_SQL, rel["oid"])}
        problems: list[str] = []
        key = rows.get(self.key_column)
        if key is None:
            problems.append(f"key column {self.key_column!r} does not exist")
        elif not key["unique_key"]:
            problems.append(
                f"key column {self.key_column!r} has no single-column unique index or constraint"
            )
        elif key["base_type"] not in _KEY_FORMS:
            problems.append(
                f"key column {self.key_column!r} has type {key['base_type']!r}, whose values"
                " have more than one text form (two lock names for one row); use one of"
                f" {', '.join(sorted(_KEY_FORMS))}"
            )
        elif not key["deterministic"]:
            problems.append(
                f"key column {self.key_column!r} has the non-deterministic collation"
                f" {key['collation']!r}: keys that differ in case or form would name one row"
                ' under two lock names; use a deterministic collation (e.g. COLLATE "C")'
            )
        for column in self.columns:
            row = rows.get(column)
            if row is None:
                problems.append(f"column {column!r} does not exist")
            elif row["generated"]:
                problems.append(f"column {column!r} is generated and cannot be written")
        if problems:
            raise TableMismatch(self.name, where, problems)
        self._key_form = _KEY_FORMS[rows[self.key_column]["base_type"]]
        return {
            name: _Column(quote_ident(name), rows[name]["full_type"], rows[name]["base_type"])
            for name in (self.key_column, *self.columns)
        }

    def check_key(self, key: str) -> None:
        """Also refuse any text of a key value but its canonical one (keyforms.py)."""
        super().check_key(key)
        if self._key_form is not None:  # not started: the call fails as not started
            self._key_form.check(self.key_column, key)

    def _build_sql(self) -> None:
        key = self._catalog[self.key_column]
        cols = ", ".join(f"d.{self._catalog[c].quoted}" for c in self.columns)
        # $1 key, $2 store.
        self._get_sql = (
            "SELECT row_to_json(x)::text AS doc, t.token"
            f" FROM (SELECT d.{key.quoted}, {cols} FROM {self._table_q} AS d"
            f"  WHERE d.{key.quoted} = CAST($1::text AS {key.base_type})) AS x"
            f" LEFT JOIN {self._tokens_q} AS t ON t.store = $2 AND t.key = x.{key.quoted}::text"
        )
        self._delete_sql = (
            f"WITH gone AS (DELETE FROM {self._table_q} AS d"
            f"  WHERE d.{key.quoted} = CAST($1::text AS {key.base_type})"
            f"  RETURNING d.{key.quoted}::text AS key)"
            f" DELETE FROM {self._tokens_q} AS t USING gone WHERE t.store = $2 AND t.key = gone.key"
        )

    def _lock_row_sql(self, key_arg: str) -> str:
        """Lock the row of the key ``key_arg`` (if it exists) for the rest of the transaction."""
        key = self._catalog[self.key_column]
        return (
            f"SELECT 1 FROM {self._table_q} AS d"
            f" WHERE d.{key.quoted} = CAST({key_arg}::text AS {key.base_type}) FOR UPDATE"
        )

    def _put_sql(self, fenced: bool, present: tuple[str, ...]) -> str:
        """The upsert for the columns ``present`` in the body, built once per column set.

        Fenced: $1 scope, $2 token, $3 store, $4 key, $5 body (JSON text), $6 key column.
        Unfenced (the baseline, no fence CTE): $1 store, $2 key, $3 body, $4 key column.
        """
        cached = self._put_cache.get((fenced, present))
        if cached is not None:
            return cached
        cols = [self._catalog[c] for c in (self.key_column, *present)]
        names = [c.quoted for c in cols]
        key = names[0]
        if present:
            action = "DO UPDATE SET " + ", ".join(f"{n} = EXCLUDED.{n}" for n in names[1:])
        else:
            action = "DO NOTHING"
        store, key_arg, body, key_name = (
            ("$3", "$4", "$5", "$6") if fenced else ("$1", "$2", "$3", "$4")
        )
        # PostgreSQL converts each JSON value with the column's own type and typmod.
        record = (
            f"jsonb_to_record({body}::jsonb"
            f" || jsonb_build_object({key_name}::text, {key_arg}::text))"
            f" AS r({', '.join(f'{c.quoted} {c.full_type}' for c in cols)})"
        )
        if fenced:
            # Lock order (as the in-database trigger, pg_fencing.py): the data row of
            # the key first (``held``, when it exists), then the fence row. ``cfg``
            # tells that trigger, if installed, the token and scope of this write.
            after = "cfg, (SELECT count(*) FROM held) AS h"
            head = (
                f"WITH {_SETTINGS_CTE},"
                f" held AS ({self._lock_row_sql(key_arg)}),"
                f" fence AS ({raise_mark_sql(self._schema_q, '$1', '$2', after=after)}),"
                f" src AS (SELECT r.* FROM fence, {record}),"
            )
            token, tail = "(SELECT token FROM fence)", "SELECT token FROM fence"
        else:
            head = f"WITH src AS (SELECT r.* FROM {record}),"
            token, tail = "NULL::bigint", "SELECT 1"
        sql = (
            f"{head}"
            f" mark AS (INSERT INTO {self._tokens_q} AS t (store, key, token)"
            f" SELECT {store}::text, src.{key}::text, {token} FROM src"
            " ON CONFLICT (store, key) DO UPDATE SET token = EXCLUDED.token RETURNING 1),"
            # ``data`` reads ``mark`` so that the token row is written first: a trigger
            # on the table (pg_fencing.py) writes that row again, in a later command.
            f" data AS (INSERT INTO {self._table_q} AS d ({', '.join(names)})"
            f" SELECT {', '.join(f'src.{n}' for n in names)}"
            " FROM src, (SELECT count(*) FROM mark) AS m"
            f" ON CONFLICT ({key}) {action})"
            f" {tail}"
        )
        self._put_cache[(fenced, present)] = sql
        return sql

    def _parse_body(self, key: str, body: bytes) -> tuple[str, tuple[str, ...]]:
        """Check the body is a JSON object of writable columns; return its text and columns."""
        try:
            text = body.decode("utf-8")
            doc = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise BadValue(f"body is not JSON: {exc}", key=key) from exc
        except RecursionError:
            raise BadValue("body is not JSON: nested too deeply", key=key) from None
        if not isinstance(doc, dict):
            raise BadValue(
                f"body must be a JSON object of column values, not {type(doc).__name__}", key=key
            )
        if self.key_column in doc:
            raise BadValue(
                f"the key column {self.key_column!r} is set by the key in the URL, not the body",
                key=key,
            )
        unknown = sorted(c for c in doc if c not in self._catalog)
        if unknown:
            raise BadValue(
                f"unknown column(s) {', '.join(map(repr, unknown))} for store {self.name!r};"
                f" writable columns: {', '.join(map(repr, self.columns))}",
                key=key,
            )
        return text, tuple(c for c in self.columns if c in doc)

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        self._require_started()
        text, present = self._parse_body(key, body)
        async with self._conn() as conn:
            if token is None:
                await conn.fetchval(
                    self._put_sql(False, present), self.name, key, text, self.key_column
                )
                return None
            accepted = await conn.fetchval(
                self._put_sql(True, present), scope, token, self.name, key, text, self.key_column
            )
            if accepted is None:
                raise await self._stale(conn, scope, token)
        return token

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        async with self._conn() as conn:
            if token is not None:
                await self._raise_mark(conn, scope, token)
            row = await conn.fetchrow(self._get_sql, key, self.name)
        if row is None:
            raise NotFound(self.name, key)
        return Record(
            body=compact_json(row["doc"]).encode(), token=row["token"], content_type=_JSON
        )

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        async with self._conn() as conn:
            if token is None:
                await conn.execute(self._delete_sql, key, self.name)
                return
            async with conn.transaction():
                # The row, then the fence row: the order of every fenced writer.
                await conn.execute(
                    f"WITH {_SETTINGS_CTE} SELECT count(*) FROM cfg,"
                    f" (SELECT count(*) FROM ({self._lock_row_sql('$3')}) AS l) AS h",
                    scope,
                    token,
                    key,
                )
                await self._raise_mark(conn, scope, token)
                await conn.execute(self._delete_sql, key, self.name)
