"""What the in-database fencing trigger costs per row: fenced UPDATE vs plain UPDATE.

Two identical tables in a schema of the run's own on the PostgreSQL at
``$FENCEGATE_TEST_PG_DSN`` (default postgresql://postgres@127.0.0.1:5432/test,
dropped after the run); one gets the ``fencegate_fence`` trigger. Two cases:

* bulk: one ``UPDATE ... SET v = v + 1`` of every row, in a transaction with
  ``fencegate.token`` set (default scope: one fence row per key);
* single: one transaction per row update (BEGIN, the settings, UPDATE, COMMIT
  for the fenced table; BEGIN, UPDATE, COMMIT for the plain one).

Rounds alternate the order (ABBA); a ratio is the median of per-round ratios.
The machine is small and shared: read the ratios, not the absolute times.

    .venv/bin/python -m benchmarks.pg_fencing [--rows N] [--rounds N]

Results: printed, and written to benchmarks/results/pg_fencing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from storage_adapters.pg_fencing import fenced_transaction, install_fencing, uninstall_fencing

DSN = os.environ.get("FENCEGATE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "pg_fencing.md"


async def _bulk(conn: Any, table: str, token: int | None) -> float:
    sql = f"UPDATE {table} SET v = v + 1"
    start = time.perf_counter()
    if token is None:
        async with conn.transaction():
            await conn.execute(sql)
    else:
        async with fenced_transaction(conn, token):
            await conn.execute(sql)
    return time.perf_counter() - start


async def _single(conn: Any, table: str, token: int | None, rows: int) -> float:
    sql = f"UPDATE {table} SET v = v + 1 WHERE id = $1"
    start = time.perf_counter()
    for key in range(rows):
        if token is None:
            async with conn.transaction():
                await conn.execute(sql, key)
        else:
            async with fenced_transaction(conn, token):
                await conn.execute(sql, key)
    return time.perf_counter() - start


def _median_ratio(fenced: list[float], plain: list[float]) -> float:
    return statistics.median(f / p for f, p in zip(fenced, plain, strict=True))


async def run(rows: int, single_rows: int, rounds: int) -> str:
    schema = f"fg_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        for name in ("plain", "fenced"):
            await conn.execute(f'CREATE TABLE "{schema}".{name} (id int PRIMARY KEY, v bigint)')
            await conn.execute(
                f'INSERT INTO "{schema}".{name} SELECT g, 0 FROM generate_series(0, $1 - 1) g',
                rows,
            )
        await install_fencing(conn, store="bench", table="fenced", key_column="id", schema=schema)
        plain, fenced = f'"{schema}".plain', f'"{schema}".fenced'
        times: dict[str, list[float]] = {k: [] for k in ("bulk", "bulk_f", "one", "one_f")}
        token = 1
        for r in range(rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for with_fence in order:
                token += 1
                t = token if with_fence else None
                table = fenced if with_fence else plain
                suffix = "_f" if with_fence else ""
                times["bulk" + suffix].append(await _bulk(conn, table, t))
                times["one" + suffix].append(await _single(conn, table, t, single_rows))
        bulk_ratio = _median_ratio(times["bulk_f"], times["bulk"])
        one_ratio = _median_ratio(times["one_f"], times["one"])

        def per_row(key: str, n: int) -> float:
            return statistics.median(times[key]) / n * 1e6

        version = await conn.fetchval("SHOW server_version")
    finally:
        await uninstall_fencing(conn, table="fenced", schema=schema)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
    return "\n".join(
        [
            "# In-database fencing: trigger cost per row",
            "",
            f"PostgreSQL {version}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
            f" (shared); {rounds} rounds, ABBA order; medians.",
            "",
            "| case | plain µs/row | fenced µs/row | ratio (fenced / plain) |",
            "| --- | ---: | ---: | ---: |",
            f"| bulk UPDATE of {rows} rows, one statement | {per_row('bulk', rows):.1f}"
            f" | {per_row('bulk_f', rows):.1f} | {bulk_ratio:.2f} |",
            f"| one row per transaction ({single_rows} transactions) |"
            f" {per_row('one', single_rows):.1f} | {per_row('one_f', single_rows):.1f}"
            f" | {one_ratio:.2f} |",
            "",
            "The fenced row pays one upsert of its fence row (`fencegate_fence`, one per",
            "scope) and, in its own transaction, one more statement for the settings.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--single-rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    report = asyncio.run(run(args.rows, args.single_rows, args.rounds))
    print(report)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)


if __name__ == "__main__":
    main()
