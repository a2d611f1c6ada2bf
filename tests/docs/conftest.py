"""The docs tests reuse the gateway tests' PostgreSQL legacy table (README's ``accounts``)."""

from tests.gateway.conftest import legacy_table

__all__ = ["legacy_table"]
