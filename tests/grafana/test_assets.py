"""grafana/ and deploy/ without a Prometheus: structure, metric names, promtool, configs.

A metric the dashboard or an alert names must exist in ``gateway/metrics.py``
(checked here on every machine); that each query returns data from a live
gateway is ``test_prometheus.py``.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from prometheus_client import CollectorRegistry

from gateway.cli import main as fencegate
from gateway.config import load_config
from gateway.metrics import Metrics
from tests.grafana._assets import (
    ALERT_TESTS,
    ALERTS,
    AMTOOL,
    DASHBOARD,
    DEPLOY,
    GRAFANA,
    NO_AMTOOL,
    NO_PROMTOOL,
    PROMTOOL,
    ROOT,
    SCRAPE_CONFIG,
    dashboard,
    metric_names,
    panels,
    substitute,
    targets,
    variable_queries,
    without_comparison,
)

ROWS = ["Contention", "Throughput", "Safety", "Storage", "Redis nodes", "HTTP"]
# What each row must show, by the metrics its queries read.
ROW_METRICS = {
    "Contention": {"fencegate_lock_acquire_wait_seconds", "fencegate_lock_acquisitions_total",
                   "fencegate_lock_waiters", "fencegate_lock_acquire_wait_by_kind_seconds",
                   "fencegate_lock_acquisitions_by_kind_total"},
    "Throughput": {"fencegate_lock_acquisitions_total", "fencegate_lock_renewals_total",
                   "fencegate_lock_releases_total"},
    "Safety": {"fencegate_leases_lost_total", "fencegate_fencing_rejections_total"},
    "Storage": {"fencegate_storage_write_duration_seconds", "fencegate_storage_writes_total"},
    "Redis nodes": {"fencegate_redis_node_latency_seconds", "fencegate_redis_node_errors_total",
                    "fencegate_quorum_failures_total", "fencegate_redis_node_state",
                    "fencegate_lock_group_can_grant", "fencegate_lock_group_node_errors_total"},
    "HTTP": {"fencegate_http_requests_total", "fencegate_http_request_duration_seconds"},
}  # fmt: skip


def exported_names() -> set[str]:
    """Every metric family name of ``Metrics``, as PromQL sees it (counters with _total)."""
    registry = CollectorRegistry()
    Metrics.create(registry, stores=["s"], nodes=["n:1"])
    names = set()
    for family in registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


# the dashboard
def test_dashboard_is_a_current_grafana_dashboard_with_datasource_and_instance_variables() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 39
    assert board["uid"] == "fencegate-overview"
    assert board["id"] is None
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query"
    assert instance["multi"]
    assert instance["includeAll"]
    assert instance["allValue"] == ".*"
    assert instance["datasource"]["uid"] == "${datasource}"
    assert not any("__inputs" in k for k in board), "no import-time inputs: use ${datasource}"


def test_dashboard_rows_in_order_and_what_each_shows() -> None:
    board = dashboard()
    assert [p["title"] for p in board["panels"] if p["type"] == "row"] == ROWS
    shown: dict[str, set[str]] = {row: set() for row in ROWS}
    for target in targets():
        shown[target.row] |= metric_names(target.expr)
    for row, needed in ROW_METRICS.items():
        assert needed <= shown[row], (row, needed - shown[row])
    exprs = " ".join(t.expr for t in targets() if t.row == "Contention")
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(fencegate_lock_acquire_wait" in exprs
    safety = " ".join(t.expr for t in targets() if t.row == "Safety")
    assert 'reason="token_not_issued"' in safety  # forged tokens
    nodes = " ".join(t.expr for t in targets() if t.row == "Redis nodes")
    assert 'state="quarantined"' in nodes


def test_every_panel_uses_the_datasource_variable_and_the_instance_filter() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for _, panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            selectors = re.findall(r"fencegate_[a-z_]+(\{[^}]*\})?", target["expr"])
            assert selectors, target["expr"]
            unfiltered = [s for s in selectors if 'instance=~"$instance"' not in s]
            assert not unfiltered, (panel["title"], target["expr"])


def test_panels_do_not_overlap_and_fit_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_dashboard_and_alerts_name_only_metrics_that_exist() -> None:
    exported = exported_names()
    used: dict[str, set[str]] = {}
    for target in targets():
        used[target.id] = metric_names(target.expr)
    for name, definition in variable_queries().items():
        used[f"${name}"] = metric_names(definition)
    used["alerts.yml"] = metric_names(ALERTS.read_text())
    unknown = {where: names - exported for where, names in used.items() if names - exported}
    assert not unknown, f"not exported by gateway/metrics.py: {unknown}"
    assert all(used.values())


def test_no_grafana_variable_is_left_after_substitution() -> None:
    for target in targets():
        assert "$" not in substitute(target.expr), target.expr


def test_the_comparison_of_an_alert_comes_off_cleanly() -> None:
    expr = 'max by (job, node) (fencegate_redis_node_state{state="quarantined"}) == 1'
    assert without_comparison(expr) == (
        'max by (job, node) (fencegate_redis_node_state{state="quarantined"})'
    )
    with pytest.raises(ValueError, match="no trailing comparison"):
        without_comparison("up")


# promtool
def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.skipif(not PROMTOOL.exists(), reason=NO_PROMTOOL)
def test_promtool_check_rules_is_clean() -> None:
    done = _promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout
    assert "WARNING" not in (done.stdout + done.stderr).upper()


@pytest.mark.skipif(not PROMTOOL.exists(), reason=NO_PROMTOOL)
def test_promtool_check_config_is_clean() -> None:
    done = _promtool("check", "config", str(SCRAPE_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout


@pytest.mark.skipif(not PROMTOOL.exists(), reason=NO_PROMTOOL)
def test_alerts_fire_as_their_unit_tests_say() -> None:
    """``promtool test rules``: a gateway down, quorum lost with no traffic, store 5xx."""
    done = _promtool("test", "rules", str(ALERT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname:\s*(\w+)", ALERT_TESTS.read_text()))
    assert {"FencegateDown", "FencegateQuorumLost", "FencegateStorageErrors"} <= tested


@pytest.mark.skipif(not AMTOOL.exists(), reason=NO_AMTOOL)
def test_alertmanager_config_is_valid() -> None:
    done = subprocess.run(
        [str(AMTOOL), "check-config", str(DEPLOY / "alertmanager.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alerts_reach_the_compose_alertmanager_and_its_webhook() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    scrape = SCRAPE_CONFIG.read_text()
    manager = (DEPLOY / "alertmanager.yml").read_text()
    assert "alertmanager:9093" in scrape
    assert re.search(r"^  alertmanager:", compose, re.MULTILINE)
    assert "./alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro" in compose
    webhook = re.search(r"url:\s*http://([\w-]+):(\d+)/", manager)
    assert webhook is not None
    assert re.search(rf"^  {webhook.group(1)}:", compose, re.MULTILINE)
    assert f'("", {webhook.group(2)})' in (DEPLOY / "alert_log.py").read_text()
    for block in ALERTS.read_text().split("- alert:")[1:]:
        assert re.search(r"severity: (critical|warning)", block), block.split()[0]


# provisioning and deploy
def test_provisioning_matches_the_paths_compose_mounts() -> None:
    provider = (GRAFANA / "provisioning" / "dashboards" / "fencegate.yml").read_text()
    compose = (DEPLOY / "compose.yaml").read_text()
    path = re.search(r"^\s+path:\s*(\S+)\s*$", provider, re.MULTILINE)
    assert path is not None
    assert f"../grafana/dashboards:{path.group(1)}:ro" in compose
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in compose
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "type: prometheus" in datasource
    assert "url: http://prometheus:9090" in datasource
    scrape = SCRAPE_CONFIG.read_text()
    for service in ("gateway-1", "gateway-2"):
        assert f"{service}:8080" in scrape
        assert f"\n  {service}:" in compose


def test_every_file_compose_mounts_or_builds_exists() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    sources = re.findall(r"^\s+- (\.{1,2}/[^:\s]+):", compose, re.MULTILINE)
    assert len(sources) >= 4
    for source in sources:
        assert (DEPLOY / source).exists(), source
    dockerfile = re.search(r"dockerfile:\s*(\S+)", compose)
    assert dockerfile is not None
    assert (ROOT / dockerfile.group(1)).is_file()
    for service in ("redis-1", "redis-2", "redis-3", "postgres", "gateway-1", "gateway-2",
                    "prometheus", "alertmanager", "alert-log", "grafana"):  # fmt: skip
        assert re.search(rf"^  {service}:", compose, re.MULTILINE), service
    assert "noeviction" in compose


def test_deploy_gateway_config_loads(capsys: pytest.CaptureFixture[str]) -> None:
    config = DEPLOY / "fencegate.toml"
    assert fencegate(["check-config", str(config)]) == 0
    assert "locks 3 redis node(s), stores kv, files" in capsys.readouterr().out
    loaded = load_config(config, env={})
    assert str(loaded.listen) == "0.0.0.0:8080"
    assert [s.type for s in loaded.stores.values()] == ["postgres", "files"]


def test_dockerfile_copies_what_the_package_needs() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for needed in ("pyproject.toml", "README.md", "gateway", "lockservice", "storage_adapters"):
        assert needed in dockerfile
        assert f"!{needed}" in ignore
        assert (ROOT / needed).exists()


def test_dashboard_file_is_plain_json_with_a_trailing_newline() -> None:
    text = DASHBOARD.read_text()
    assert text.endswith("}\n")
    assert json.loads(text)["title"] == "fencegate"
