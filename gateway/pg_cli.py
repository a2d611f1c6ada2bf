"""``fencegate pg``: install or remove fencing inside PostgreSQL for a legacy-table store.

::

    fencegate pg install-fencing --config F --store NAME [--require-token|--allow-unfenced]
    fencegate pg uninstall-fencing --config F --store NAME

Exit status: 0 done, 1 refused (bad config, not a legacy-table store, table or
key column missing), 3 PostgreSQL unreachable. See ``storage_adapters.pg_fencing``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from gateway.exit_codes import REFUSED, UNAVAILABLE, USAGE

if TYPE_CHECKING:
    from gateway.store_config import StoreConfig

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register ``fencegate pg ...`` on the ``fencegate`` command's subparsers."""
    pg = subparsers.add_parser("pg", help="PostgreSQL: fencing inside the database")
    verbs = pg.add_subparsers(required=True, metavar="VERB")
    for name, help in (
        ("install-fencing", "install the fencing trigger on a legacy-table store's table"),
        ("uninstall-fencing", "remove the fencing trigger (the data stays)"),
    ):
        p = verbs.add_parser(name, help=help)
        p.add_argument(
            "--config",
            default=os.environ.get("FENCEGATE_CONFIG"),
            help="the gateway's TOML file ($FENCEGATE_CONFIG)",
        )
        p.add_argument("--store", required=True, help="a [stores.NAME] with table = ...")
        if name == "install-fencing":
            mode = p.add_mutually_exclusive_group()
            mode.add_argument(
                "--require-token",
                dest="require_token",
                action="store_true",
                default=True,
                help="refuse writes without fencegate.token, SQLSTATE FG428 (the default)",
            )
            mode.add_argument(
                "--allow-unfenced",
                dest="require_token",
                action="store_false",
                help="let writes without fencegate.token through unchecked",
            )
        p.set_defaults(handler=_handler, pg_verb=name)


# The server's modules (config, asyncpg, storage_adapters) load when a pg verb
# runs, not when the ``fencegate`` command builds its parser.
def _handler(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError, load_config

    if not args.config:
        print("fencegate pg: --config FILE is required (or FENCEGATE_CONFIG)", file=sys.stderr)
        return USAGE
    try:
        config = load_config(args.config, env=os.environ)
    except ConfigError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return REFUSED
    store = config.stores.get(args.store)
    if store is None:
        known = ", ".join(sorted(config.stores)) or "none"
        print(
            f"fencegate pg: no store {args.store!r} in {args.config} (stores: {known})",
            file=sys.stderr,
        )
        return REFUSED
    if store.type != "postgres" or store.table is None:
        print(
            f"fencegate pg: store {args.store!r} is not a postgres legacy-table store"
            " (it needs type = 'postgres' and table, key_column, columns)",
            file=sys.stderr,
        )
        return REFUSED
    return asyncio.run(_apply(args, store))


async def _apply(args: argparse.Namespace, store: StoreConfig) -> int:
    import asyncpg

    from gateway.config import redact
    from storage_adapters.errors import StorageError, TableMismatch
    from storage_adapters.pg_fencing import install_fencing, uninstall_fencing

    assert store.dsn is not None
    assert store.table is not None
    assert store.key_column is not None
    where = f"{store.schema}.{store.table}"
    try:
        conn = await asyncpg.connect(store.dsn, timeout=10.0)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        print(
            f"fencegate pg: cannot connect to {redact(store.dsn)}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return UNAVAILABLE
    try:
        if args.pg_verb == "install-fencing":
            await install_fencing(
                conn,
                store=store.name,
                table=store.table,
                key_column=store.key_column,
                schema=store.schema,
                require_token=args.require_token,
            )
            mode = "a token required" if args.require_token else "unfenced writes allowed"
            print(f"installed trigger fencegate_fence on {where} ({mode})")
        else:
            if await uninstall_fencing(conn, table=store.table, schema=store.schema):
                print(f"removed trigger fencegate_fence from {where} (data kept)")
            else:
                print(f"nothing to remove: {where} has no trigger fencegate_fence")
        return 0
    except TableMismatch as exc:
        print(f"fencegate pg: {exc}", file=sys.stderr)
        return REFUSED
    except (asyncpg.PostgresError, StorageError) as exc:
        state = getattr(exc, "sqlstate", "")
        print(f"fencegate pg: PostgreSQL refused: {exc} (SQLSTATE {state})", file=sys.stderr)
        return REFUSED
    except (OSError, asyncpg.InterfaceError) as exc:
        print(f"fencegate pg: connection lost: {exc}", file=sys.stderr)
        return UNAVAILABLE
    finally:
        await conn.close()
