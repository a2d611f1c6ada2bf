"""Fenced storage: check the fencing token and write, atomically, for each kind of storage.

Knows nothing about Redis or HTTP; the gateway maps ``StorageError.code`` to a status.
``S3Store`` is imported on first use: aiobotocore takes about half a second to load,
which every CLI call would pay.
"""

from typing import TYPE_CHECKING, Any

from storage_adapters.base import FencedStore, NoHooks, Record, StoreHooks, validate_key
from storage_adapters.errors import (
    BadValue,
    CorruptMetadata,
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
from storage_adapters.mysql import MysqlStore
from storage_adapters.mysql_legacy import MysqlLegacyStore
from storage_adapters.postgres import PostgresStore
from storage_adapters.postgres_legacy import PostgresLegacyStore

if TYPE_CHECKING:
    from storage_adapters.s3 import S3Store

__all__ = [
    "BadValue",
    "CorruptMetadata",
    "FencedStore",
    "FileStore",
    "MysqlLegacyStore",
    "MysqlStore",
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


def __getattr__(name: str) -> Any:
    if name == "S3Store":
        from storage_adapters.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
