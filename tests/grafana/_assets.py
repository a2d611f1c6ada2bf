"""The files under grafana/ as tests see them: dashboard targets, alert names, metric names.

Grafana's variables are replaced the way Grafana would for a short range:
``$__rate_interval`` and ``$__range`` by windows that cover the test's scrapes,
``$instance`` (multi-value, "All") by its ``allValue`` ``.*``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
GRAFANA: Final = ROOT / "grafana"
DASHBOARD: Final = GRAFANA / "dashboards" / "fencegate.json"
ALERTS: Final = GRAFANA / "prometheus" / "alerts.yml"
ALERT_TESTS: Final = ROOT / "tests" / "grafana" / "alerts_test.yml"
SCRAPE_CONFIG: Final = GRAFANA / "prometheus" / "prometheus.yml"
DEPLOY: Final = ROOT / "deploy"
PROMETHEUS: Final = Path("/usr/bin/prometheus")
PROMTOOL: Final = Path("/usr/bin/promtool")
NO_PROMETHEUS: Final = (
    "/usr/bin/prometheus is not installed (Debian package 'prometheus'; "
    "./dev test installs it): the real-Prometheus test cannot run"
)
NO_PROMTOOL: Final = "/usr/bin/promtool is not installed (Debian package 'prometheus')"
AMTOOL: Final = Path("/usr/bin/amtool")
NO_AMTOOL: Final = "/usr/bin/amtool is not installed (Debian package 'prometheus-alertmanager')"

VARIABLES: Final = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "1s",
    "${instance}": ".*",
    "$instance": ".*",
}
_METRIC: Final = re.compile(r"\bfencegate_[a-z0-9_]+")
_SERIES_SUFFIXES: Final = ("_bucket", "_count", "_sum")


@dataclass(frozen=True, slots=True)
class Target:
    """One query of one dashboard panel."""

    row: str
    panel: str
    ref_id: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.panel}/{self.ref_id}"

    @property
    def promql(self) -> str:
        """The expression with Grafana's variables replaced."""
        return substitute(self.expr)


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(board: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Every panel that is not a row, with the title of its row (collapsed rows too)."""
    board = dashboard() if board is None else board
    out: list[tuple[str, dict[str, Any]]] = []
    row = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            out += [(row, inner) for inner in panel.get("panels", [])]
        else:
            out.append((row, panel))
    return out


def targets() -> list[Target]:
    return [
        Target(row, panel["title"], target["refId"], target["expr"])
        for row, panel in panels()
        for target in panel.get("targets", [])
    ]


def variable_queries() -> dict[str, str]:
    """``label_values(metric, label)`` of each query variable, by variable name."""
    return {
        v["name"]: v["definition"]
        for v in dashboard()["templating"]["list"]
        if v["type"] == "query"
    }


def alert_names() -> list[str]:
    """The ``alert:`` names in alerts.yml (no YAML parser needed for this)."""
    return re.findall(r"^\s*- alert:\s*(\w+)\s*$", ALERTS.read_text(), re.MULTILINE)


def metric_names(text: str) -> set[str]:
    """Metric names in PromQL text, with _bucket/_count/_sum taken off histogram series."""
    names = set()
    for name in _METRIC.findall(text):
        for suffix in _SERIES_SUFFIXES:
            if name.endswith(suffix):
                name = name.removesuffix(suffix)
                break
        names.add(name)
    return names


def without_comparison(expr: str) -> str:
    """``selector > 0`` -> ``selector``: the part of an alert that has data when all is well."""
    stripped = re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.eE+-]+\s*$", "", expr.strip())
    if stripped == expr.strip():
        raise ValueError(f"no trailing comparison to take off in {expr!r}")
    return stripped
