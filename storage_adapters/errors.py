"""Errors of the storage adapters, one class per condition, each with its API code.

Driver and OS errors never leave this package as they are: each adapter turns
them into one of these at its edge (``raise StorageUnavailable(...) from exc``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BadValue",
    "CorruptMetadata",
    "NotFound",
    "StaleToken",
    "StorageError",
    "StorageUnavailable",
    "StoreMisconfigured",
    "StoreNotStarted",
    "TableMismatch",
    "TokenNotIssued",
    "UnfencedRefused",
]


class StorageError(Exception):
    """Base class for every storage_adapters error."""

    code = "storage_error"


class StaleToken(StorageError):
    """The token is older than the newest token the scope has seen; nothing was applied."""

    code = "stale_token"

    def __init__(self, token: int, high_water: int, *, scope: str = "") -> None:
        where = f" of scope {scope!r}" if scope else ""
        super().__init__(f"token {token} is older than the high-water mark {high_water}{where}")
        self.token = token
        self.high_water = high_water
        self.scope = scope


class TokenNotIssued(StorageError):
    """The token is greater than any token the lock service issued for the scope (forged)."""

    code = "token_not_issued"

    def __init__(self, token: int, issued: int, *, scope: str = "", hint: str = "") -> None:
        where = f" for scope {scope!r}" if scope else ""
        how = f"; {hint}" if hint else ""
        super().__init__(
            f"token {token} was never issued{where}; the newest issued is {issued}{how}"
        )
        self.token = token
        self.issued = issued
        self.scope = scope


class NotFound(StorageError):
    """The key does not exist in the store."""

    code = "not_found"

    def __init__(self, store: str, key: str) -> None:
        super().__init__(f"key {key!r} not found in store {store!r}")
        self.store = store
        self.key = key


class StorageUnavailable(StorageError):
    """The storage cannot be reached or failed underneath (connection, pool, disk)."""

    code = "storage_unavailable"

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"store {store!r} is unavailable: {reason}")
        self.store = store
        self.reason = reason


class StoreNotStarted(StorageUnavailable):
    """The store has not started (its server was unreachable at start) or was closed."""

    def __init__(self, store: str) -> None:
        super().__init__(store, "not started: its server was unreachable at start, or it closed")


class BadValue(StorageError):
    """The request cannot be stored as given: key path, body, column or value."""

    code = "bad_request"

    def __init__(self, reason: str, *, key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


class TableMismatch(StorageError):
    """A configured legacy table does not match the catalog (raised by ``start``)."""

    code = "storage_config"

    def __init__(self, store: str, table: str, problems: Sequence[str]) -> None:
        super().__init__(
            f"store {store!r}: table {table!r} does not match its configuration: "
            + "; ".join(problems)
        )
        self.store = store
        self.table = table
        self.problems = list(problems)


class StoreMisconfigured(StorageError):
    """The storage answered, but the store's configuration does not fit it (raised by ``start``).

    A missing bucket, credentials the server refuses: retrying will not help.
    """

    code = "storage_config"

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"store {store!r} is misconfigured: {reason}")
        self.store = store
        self.reason = reason


class UnfencedRefused(StorageError):
    """The table's in-database fencing trigger refused a write that carried no token."""

    code = "token_required"

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(
            f"store {store!r}: the table's fencing trigger refuses writes without a token"
            f" ({reason}); send X-Fencing-Token, or reinstall it with --allow-unfenced"
        )
        self.store = store


class CorruptMetadata(StorageError):
    """A key's fencing metadata (its high-water mark or token) is not what fencegate
    writes: someone wrote it around the gateway. The key is refused, the mark never
    guessed (fail closed), until it is repaired; nothing of the request was applied."""

    code = "storage_corrupt"

    def __init__(self, store: str, key: str, what: str) -> None:
        super().__init__(
            f"store {store!r}: the fencing metadata of key {key!r} is corrupt ({what});"
            " nothing was changed; repair or remove it outside fencegate"
        )
        self.store = store
        self.key = key
        self.what = what
