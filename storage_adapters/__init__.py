"""Fenced storage: check the fencing token and write, atomically, for each kind of storage.

Knows nothing about Redis or HTTP; the gateway maps ``StorageError.code`` to a status.
"""

from storage_adapters.base import FencedStore, NoHooks, Record, StoreHooks, validate_key
from storage_adapters.errors import (
    BadValue,
    NotFound,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreNotStarted,
    TableMismatch,
    TokenNotIssued,
)
from storage_adapters.files import FileStore
from storage_adapters.postgres import PostgresStore
from storage_adapters.postgres_legacy import PostgresLegacyStore

__all__ = [
    "BadValue",
    "FencedStore",
    "FileStore",
    "NoHooks",
    "NotFound",
    "PostgresLegacyStore",
    "PostgresStore",
    "Record",
    "StaleToken",
    "StorageError",
    "StorageUnavailable",
    "StoreHooks",
    "StoreNotStarted",
    "TableMismatch",
    "TokenNotIssued",
    "validate_key",
]
