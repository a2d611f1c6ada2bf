"""Pieces of the benchmark reports: the results folder, Markdown table cells and rows, saving."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["RESULTS", "cell", "command", "md_table", "save", "write_json"]

RESULTS: Final = Path(__file__).resolve().parent / "results"


def command() -> str:
    """How this run was started, as a reader reruns it (``python -m benchmarks.x ARGS``),
    never the path of this machine's checkout."""
    return " ".join(["python -m benchmarks." + Path(sys.argv[0]).stem, *sys.argv[1:]])


def cell(value: Any) -> str:
    """A table cell: ``-`` for no value, 3 significant digits for a float."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def md_table(
    first: str, cols: Sequence[tuple[str, str]], rows: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """A Markdown table, a row per label, ``cols`` as (field, heading); then each row's errors."""
    lines = ["| " + first + " | " + " | ".join(h for _, h in cols) + " |"]
    lines.append("| --- |" + " --- |" * len(cols))
    for label, row in rows.items():
        lines.append(f"| {label} | " + " | ".join(cell(row.get(m)) for m, _ in cols) + " |")
    for label, row in rows.items():
        if "error_kinds" in row:
            lines.append(f"\nErrors in {label}: {row['error_kinds']}")
    return lines


def write_json(stem: str, results: Mapping[str, Any]) -> None:
    """Write ``results/<stem>.json``."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=2))


def save(stem: str, lines: Sequence[str]) -> None:
    """Write ``results/<stem>.md`` and print it."""
    text = "\n".join(lines)
    path = RESULTS / f"{stem}.md"
    path.write_text(text)
    print(text)
    print(f"wrote {path}")
