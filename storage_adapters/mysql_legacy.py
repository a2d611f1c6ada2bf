"""An existing MySQL / MariaDB table, protected as it is: one row per key, fenced.

The table is not changed: fencegate keeps the marks in ``fencegate_fence``
and the token of each key's last accepted write in ``fencegate_legacy_token``
(both in the DSN's database), written in the same transaction as the row.

* ``put`` body: a JSON object of column values, e.g. ``{"balance": "10.50"}``.
  Only the columns present are written (others keep their value, or their
  default on insert); ``null`` stores NULL; an object or array is stored as
  its JSON text (for a JSON column). The server converts each value to its
  column's type in strict mode, so a value the type rejects fails the whole
  transaction: nothing is written. Where MySQL would convert a value that
  PostgreSQL refuses for the same column (its input functions, as
  ``postgres_legacy``'s ``jsonb_to_record`` applies them), it is refused
  before any SQL: in an integer column a number whose text has a fraction
  (``1.5``, ``2.0``; ``1e2`` is 100), a string that is not an integer's
  text (``"5.5"``, ``"1e2"``), a boolean (but in ``TINYINT(1)``, MySQL's
  ``BOOLEAN``); in a decimal or float column a boolean.
* ``get`` body: the row as a JSON object (key column and configured columns),
  rendered by the server's ``JSON_OBJECT`` (numbers stay numbers, dates
  become strings), ``application/json``.

Identifiers in SQL are only those found in ``information_schema`` by
``start``, always quoted; values and keys are always bound parameters. The
key column must be an integer or a (VAR)CHAR column with a ``_bin`` collation
and a single-column unique index; a key in the URL must be the one text form
of its row (keyforms.py): an integer without sign or leading zeros, in the
column's range. A case-insensitive collation is refused at start: "Key" and
"key" would be one row under two lock names.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

from storage_adapters._mysql import (
    FENCE_DDL,
    MysqlStoreBase,
    check_exact_keys,
    ensure_tables,
    quote_ident,
)
from storage_adapters.base import (
    NO_HOOKS,
    Record,
    StoreHooks,
    compact_json,
    validate_legacy_columns,
)
from storage_adapters.errors import BadValue, NotFound, StoreNotStarted, TableMismatch
from storage_adapters.keyforms import EXACT, KeyForm, integer_range

__all__ = ["MysqlLegacyStore"]

_JSON: Final = "application/json"
_TOKENS_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS fencegate_legacy_token ("
    " store VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,"
    " `key` VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,"
    " token BIGINT NULL,"
    " PRIMARY KEY (store, `key`)"
    ") ENGINE=InnoDB"
)
_INTEGER_BITS: Final = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
_TEXT_TYPES: Final = frozenset({"char", "varchar"})
_NUMERIC_TYPES: Final = frozenset({"decimal", "float", "double"})  # NUMERIC, REAL are these
_INTEGER_TEXT: Final = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+[ \t\n\v\f\r]*")  # int4in's
_MAX_ADJUSTED: Final = 20  # a number with more integer digits is beyond any integer column


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class MysqlLegacyStore(MysqlStoreBase):
    """An existing table, with ``key_column`` as the key and ``columns`` writable.

    Args:
        name: the store name.
        dsn: ``mysql://user:password@host:3306/database``; the table is in that database.
        table: the table name (not quoted, as in ``information_schema``).
        key_column: an integer or (VAR)CHAR column with a single-column unique index.
        columns: the columns a client may write (and reads return).
        The other options are those of ``MysqlStore``.
    """

    kind = "mysql_legacy"

    def __init__(
        self,
        name: str,
        dsn: str,
        *,
        table: str,
        key_column: str,
        columns: Sequence[str],
        pool_min: int = 1,
        pool_max: int = 10,
        hooks: StoreHooks = NO_HOOKS,
        acquire_timeout: float = 5.0,
        command_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(
            name,
            dsn,
            pool_min=pool_min,
            pool_max=pool_max,
            hooks=hooks,
            acquire_timeout=acquire_timeout,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
        )
        columns = validate_legacy_columns(name, table, key_column, columns)
        self.table = table
        self.key_column = key_column
        self.columns: tuple[str, ...] = columns
        self._table_q = quote_ident(table)
        self._key_q = quote_ident(key_column)
        self._integer_key = False
        self._key_form: KeyForm | None = None
        self._types: dict[str, tuple[str, str]] = {}  # column -> (DATA_TYPE, COLUMN_TYPE)
        self._get_sql = ""

    async def _prepare(self, cur: Any) -> None:
        # The table first: a wrong configuration creates nothing in the database.
        await self._check_catalog(cur)
        await ensure_tables(
            cur, {"fencegate_fence": FENCE_DDL, "fencegate_legacy_token": _TOKENS_DDL}
        )
        await check_exact_keys(cur, self.name, "fencegate_legacy_token", _TOKENS_DDL)
        pairs = ", ".join(
            f"%s, d.{quote_ident(c)}" for c in (self.key_column, *self.columns)
        )  # the names are bound values; the columns are checked identifiers
        self._get_sql = (
            f"SELECT JSON_OBJECT({pairs}) AS doc, t.token FROM {self._table_q} AS d"
            " LEFT JOIN fencegate_legacy_token AS t ON t.store = %s AND t.`key` = %s"
            f" WHERE d.{self._key_q} = %s"
        )

    async def _check_catalog(self, cur: Any) -> None:
        """Find the table and its columns in information_schema; name everything missing."""
        where = f"{self.database}.{self.table}"
        await cur.execute(
            "SELECT TABLE_TYPE, ENGINE FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (self.table,),
        )
        found = await cur.fetchone()
        if found is None:
            raise TableMismatch(self.name, where, [f"table {where!r} does not exist"])
        if found[0] != "BASE TABLE":
            raise TableMismatch(self.name, where, [f"{where!r} is not a table ({found[0]})"])
        if str(found[1]).lower() != "innodb":
            raise TableMismatch(
                self.name, where, [f"engine {found[1]!r}: only InnoDB has row locks"]
            )
        await cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, EXTRA, COLLATION_NAME, COLUMN_TYPE"
            " FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (self.table,),
        )
        found_columns = await cur.fetchall()
        rows = {r[0]: (str(r[1]).lower(), str(r[2]).lower()) for r in found_columns}
        collations = {r[0]: str(r[3] or "") for r in found_columns}
        types = {r[0]: str(r[4]).lower() for r in found_columns}
        unsigned = {c: "unsigned" in t for c, t in types.items()}
        # Single-column unique indexes (and the primary key) on the full column.
        await cur.execute(
            "SELECT INDEX_NAME, MAX(COLUMN_NAME), MAX(SUB_PART) FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND NON_UNIQUE = 0"
            " GROUP BY INDEX_NAME HAVING COUNT(*) = 1",
            (self.table,),
        )
        unique = {r[1] for r in await cur.fetchall() if r[2] is None}
        problems: list[str] = []
        key = rows.get(self.key_column)
        if key is None:
            problems.append(f"key column {self.key_column!r} does not exist")
        elif self.key_column not in unique:
            problems.append(
                f"key column {self.key_column!r} has no single-column unique index or constraint"
            )
        elif key[0] not in _INTEGER_BITS.keys() | _TEXT_TYPES:
            problems.append(
                f"key column {self.key_column!r} is {key[0]}; use an integer or (var)char column"
            )
        elif key[0] in _TEXT_TYPES and not collations[self.key_column].endswith("_bin"):
            collation = collations[self.key_column]
            problems.append(
                f"key column {self.key_column!r} has collation {collation!r}: keys that differ"
                " only in case name one row under two lock names; give it a _bin collation"
                f" (ALTER TABLE ... MODIFY {self.key_column} ... COLLATE"
                f" {collation.split('_')[0]}_bin) if its keys are case-sensitive"
            )
        for column in self.columns:
            row = rows.get(column)
            if row is None:
                problems.append(f"column {column!r} does not exist")
            elif "generated" in row[1]:
                problems.append(f"column {column!r} is generated and cannot be written")
        if problems:
            raise TableMismatch(self.name, where, problems)
        assert key is not None
        self._types = {c: (rows[c][0], types[c]) for c in self.columns}
        self._integer_key = key[0] in _INTEGER_BITS
        if self._integer_key:
            self._key_form = integer_range(
                _INTEGER_BITS[key[0]], unsigned=unsigned[self.key_column]
            )
        else:
            self._key_form = EXACT

    def check_key(self, key: str) -> None:
        """Also refuse any text of a key value but its canonical one (keyforms.py)."""
        super().check_key(key)
        if self._key_form is not None:  # not started: the call fails as not started
            self._key_form.check(self.key_column, key)

    def _key_value(self, key: str) -> str | int:
        """The key as bound: an int for an integer column (``check_key`` passed)."""
        self._require_started()
        return int(key) if self._integer_key else key

    def _parse_body(self, key: str, body: bytes) -> dict[str, Any]:
        """Check the body is a JSON object of writable columns; return column -> bound value."""
        try:
            doc = json.loads(
                body.decode("utf-8"), parse_constant=_reject_constant, parse_float=Decimal
            )
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
        unknown = sorted(c for c in doc if c not in self.columns)
        if unknown:
            raise BadValue(
                f"unknown column(s) {', '.join(map(repr, unknown))} for store {self.name!r};"
                f" writable columns: {', '.join(map(repr, self.columns))}",
                key=key,
            )
        return {c: _bindable(self._as_postgres(key, c, doc[c])) for c in self.columns if c in doc}

    def _as_postgres(self, key: str, column: str, value: object) -> object:
        """Refuse what PostgreSQL refuses for a column of this type, where MySQL would
        convert it (1.5 -> 2, true -> 1 in an INT); a number with a fraction is a float
        from here on, as JSON numbers were before. Raises ``BadValue``."""
        data_type, column_type = self._types[column]
        why = ""
        if data_type in _INTEGER_BITS:
            if isinstance(value, bool):
                if column_type.startswith("tinyint(1)"):  # BOOLEAN: true and false are its values
                    return int(value)
                why = "a boolean is not an integer"
            elif isinstance(value, Decimal):
                if int(value.as_tuple().exponent) < 0:
                    why = "a number with a fraction is not an integer"
                elif value.adjusted() > _MAX_ADJUSTED:
                    why = "out of range"
                else:
                    return int(value)
            elif isinstance(value, str) and not _INTEGER_TEXT.fullmatch(value):
                why = "the text is not an integer"
        elif data_type in _NUMERIC_TYPES and isinstance(value, bool):
            why = "a boolean is not a number"
        if why:
            raise BadValue(
                f"store {self.name!r} refused the value: column {column!r} is {column_type},"
                f" and {why}: {_json_text(value)}",
                key=key,
            )
        return float(value) if isinstance(value, Decimal) else value

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        self._require_started()
        values = self._parse_body(key, body)
        key_value = self._key_value(key)
        names = [quote_ident(c) for c in values]
        insert = (
            f"INSERT INTO {self._table_q} ({', '.join([self._key_q, *names])})"
            f" VALUES ({', '.join(['%s'] * (len(names) + 1))})"
        )
        update = (
            f"UPDATE {self._table_q} SET {', '.join(f'{n} = %s' for n in names)}"
            f" WHERE {self._key_q} = %s"
        )

        async def once() -> None:
            async with self._transaction() as cur:
                if token is not None:
                    await self._hold_fence(cur, scope, token)
                await cur.execute(
                    f"SELECT 1 FROM {self._table_q} WHERE {self._key_q} = %s FOR UPDATE",
                    (key_value,),
                )
                if await cur.fetchone() is None:
                    await cur.execute(insert, (key_value, *values.values()))
                elif names:
                    await cur.execute(update, (*values.values(), key_value))
                await cur.execute(
                    "INSERT INTO fencegate_legacy_token (store, `key`, token) VALUES (%s, %s, %s)"
                    " ON DUPLICATE KEY UPDATE token = %s",
                    (self.name, key, token, token),
                )

        await self._retrying(once)
        return token

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        key_value = self._key_value(key)
        args = (*(c for c in (self.key_column, *self.columns)), self.name, key, key_value)
        if token is None:
            async with self._cursor() as cur:
                await cur.execute(self._get_sql, args)
                row = await cur.fetchone()
        else:

            async def once() -> Any:
                async with self._transaction() as cur:
                    await self._hold_fence(cur, scope, token)
                    await cur.execute(self._get_sql + " LOCK IN SHARE MODE", args)
                    return await cur.fetchone()

            row = await self._retrying(once)
        if row is None:
            raise NotFound(self.name, key)
        # A BLOB column holds any bytes; a byte that is not UTF-8 (written by another
        # writer: a JSON string is UTF-8) reads as U+FFFD, so the answer stays JSON.
        doc = row[0] if isinstance(row[0], str) else bytes(row[0]).decode(errors="replace")
        return Record(body=compact_json(doc).encode(), token=row[1], content_type=_JSON)

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        key_value = self._key_value(key)

        async def once() -> None:
            async with self._transaction() as cur:
                if token is not None:
                    await self._hold_fence(cur, scope, token)
                await cur.execute(
                    f"DELETE FROM {self._table_q} WHERE {self._key_q} = %s", (key_value,)
                )
                await cur.execute(
                    "DELETE FROM fencegate_legacy_token WHERE store = %s AND `key` = %s",
                    (self.name, key),
                )

        await self._retrying(once)

    def _require_started(self) -> None:
        if not self._get_sql:
            raise StoreNotStarted(self.name)


def _json_text(value: object) -> str:
    return str(value) if isinstance(value, Decimal) else json.dumps(value)


def _bindable(value: object) -> object:
    """A JSON value as the driver binds it; objects and arrays as their JSON text."""
    if isinstance(value, dict | list):
        try:
            return json.dumps(value, default=float)  # numbers with a fraction: Decimal
        except RecursionError:  # parsed near the limit, a few frames deeper here
            raise BadValue("body is not JSON: nested too deeply") from None
    if isinstance(value, str):
        try:  # JSON's "\ud800" parses to a lone surrogate, which has no UTF-8 form
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadValue(
                f"a string value is not valid Unicode ({exc.reason} at character {exc.start})"
            ) from None
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise BadValue(f"value {value!r} is out of range for any column")
    return value
