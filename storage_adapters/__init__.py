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
    StoreMisconfigured,
    StoreNotStarted,
    TableMismatch,
    TokenNotIssued,
)
from storage_adapters.files import FileStore
from storage_adapters.postgres import PostgresStore
from storage_adapters.postgres_legacy import PostgresLegacyStore
from storage_adapters.s3 import S3Store

__all__ = [
    "BadValue",
    "FencedStore",
    "FileStore",
    "NoHooks",
    "NotFound",
    "PostgresLegacyStore",
    "PostgresStore",
    "Record",
    "S3Store",
    "StaleToken",
    "StorageError",
    "StorageUnavailable",
    "StoreHooks",
    "StoreMisconfigured",
    "StoreNotStarted",
    "TableMismatch",
    "TokenNotIssued",
    "validate_key",
]
