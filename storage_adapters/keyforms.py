"""One text form per row: the keys a legacy table's key column accepts.

A lock name is ``{store}/{key}``, so two texts of one row ("7" and "007" of an
integer column, "Key" and "key" under a case-insensitive collation) would be
two fence scopes over one row, each checked only against its own mark. Each
store learns its key column's type at start and accepts only the canonical
text of each value; any other text of the same value is ``400 bad_request``
naming the canonical form. A column whose values have no such form (numeric,
dates, case-insensitive or non-deterministic collations) is refused at start.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Final

from storage_adapters.errors import BadValue

__all__ = ["EXACT", "UUID_KEYS", "IntegerKeys", "KeyForm", "integer_range"]

_INTEGER: Final = re.compile(r"-?[0-9]+")
_CANONICAL_INTEGER: Final = re.compile(r"0|-?[1-9][0-9]*")


class KeyForm:
    """Exact text: every key is its own row (a byte-exact text column)."""

    def check(self, column: str, key: str) -> None:
        """Raise ``BadValue`` when ``key`` is not the canonical text of a value of the column."""


@dataclass(frozen=True, slots=True)
class IntegerKeys(KeyForm):
    """Decimal integers in ``[low, high]``, without sign or leading zeros: ``-?(0|[1-9][0-9]*)``."""

    low: int
    high: int

    def check(self, column: str, key: str) -> None:
        if not _INTEGER.fullmatch(key):
            raise BadValue(
                f"key {key!r} is not an integer, as the key column {column!r} is;"
                " write it as -?(0|[1-9][0-9]*)",
                key=key,
            )
        value = int(key)
        if not self.low <= value <= self.high:
            raise BadValue(
                f"key {key!r} is out of the range {self.low}..{self.high}"
                f" of the key column {column!r}",
                key=key,
            )
        if not _CANONICAL_INTEGER.fullmatch(key):
            raise BadValue(
                f"key {key!r} names the row of key {str(value)!r}: write the integer"
                " without leading zeros or '-0' (one text per row)",
                key=key,
            )


class _UuidKeys(KeyForm):
    """Lowercase hyphenated UUIDs, ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""

    def check(self, column: str, key: str) -> None:
        try:
            canonical = str(uuid.UUID(key))
        except ValueError:
            canonical = ""
        if not canonical:
            raise BadValue(
                f"key {key!r} is not a UUID, as the key column {column!r} is;"
                " write it lowercase and hyphenated (8-4-4-4-12 hex digits)",
                key=key,
            )
        if key != canonical:
            raise BadValue(
                f"key {key!r} names the row of key {canonical!r}: write UUIDs lowercase"
                " and hyphenated (one text per row)",
                key=key,
            )


EXACT: Final = KeyForm()
UUID_KEYS: Final = _UuidKeys()


def integer_range(bits: int, *, unsigned: bool = False) -> IntegerKeys:
    """The keys of a ``bits``-bit integer column."""
    if unsigned:
        return IntegerKeys(0, (1 << bits) - 1)
    return IntegerKeys(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
