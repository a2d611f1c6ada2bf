"""What the manifests of deploy/kubernetes/ mean: copies equal their sources in grafana/,
probes hit routes the gateway has, the config passes the gateway's own validation and
names the Redis StatefulSets, shutdown fits in the grace period, pods run locked down.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.app import create_app
from gateway.cli import main as fencegate
from gateway.config import load_config, parse_config
from tests.deploy._manifests import (
    BASE,
    ROOT,
    Manifest,
    documents,
    listed,
    one,
    pod_specs,
    sync_module,
)

CONFIG = BASE / "fencegate.toml"
ALERTS = ROOT / "grafana" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "fencegate.json"


def gateway_container() -> Manifest:
    pod = one(listed(), "Deployment", "fencegate")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert isinstance(container, dict)
    return container


# copies of grafana/
def test_prometheus_rule_is_the_alert_rule_file() -> None:
    rule = one(listed(), "PrometheusRule", "fencegate")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    assert rule["spec"]["groups"][0]["rules"], "no rules"


def test_dashboard_configmap_is_the_dashboard_file_byte_for_byte() -> None:
    configmap = one(listed(), "ConfigMap", "fencegate-dashboard")
    assert configmap["data"] == {"fencegate.json": DASHBOARD.read_text()}
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_generated_files_are_up_to_date() -> None:
    sync = sync_module()
    stale = [str(p.relative_to(ROOT)) for p in sync.stale()]
    assert not stale, f"run python deploy/kubernetes/sync.py: {stale} differ from grafana/"


def test_sync_follows_a_changed_source() -> None:
    sync = sync_module()
    text = ALERTS.read_text().replace("for: 1m", "for: 7m", 1)
    rules = yaml.safe_load(sync.prometheus_rule(text))["spec"]["groups"][0]["rules"]
    assert rules[0]["for"] == "7m"
    board = '{\n  "title": "x",\n  "a": "b  c"\n}\n'
    assert yaml.safe_load(sync.dashboard_configmap(board))["data"]["fencegate.json"] == board
    unterminated = yaml.safe_load(sync.dashboard_configmap(board[:-1]))["data"]
    assert unterminated["fencegate.json"] == board[:-1]
    with pytest.raises(ValueError, match="trailing blanks"):
        sync.dashboard_configmap('{\n  "a": 1, \n}\n')


# the gateway's config
def test_config_passes_check_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert fencegate(["check-config", str(CONFIG)]) == 0
    assert "listen 0.0.0.0:8080, locks 3 redis node(s)" in capsys.readouterr().out


def test_config_names_each_redis_statefulset_by_its_stable_dns_name() -> None:
    config = load_config(CONFIG, env={})
    docs = listed()
    statefulsets = [d for d in docs if d["kind"] == "StatefulSet"]
    expected = set()
    for sts in statefulsets:
        service = one(docs, "Service", sts["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None", "a StatefulSet needs a headless Service"
        assert (
            service["spec"]["selector"].items()
            <= sts["spec"]["template"]["metadata"]["labels"].items()
        )
        (port,) = service["spec"]["ports"]
        expected.add(f"{sts['metadata']['name']}-0.{service['metadata']['name']}:{port['port']}")
    assert {urlsplit(u).netloc for u in config.locks.redis} == expected
    assert len(config.locks.redis) == 3


def test_listen_port_is_the_container_port_the_service_and_probes_use() -> None:
    config = load_config(CONFIG, env={})
    assert config.metrics_listen is None, "/metrics must stay on the port the monitor scrapes"
    container = gateway_container()
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", config.listen.port)
    service = one(listed(), "Service", "fencegate")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"
    monitor = one(listed(), "ServiceMonitor", "fencegate")
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


def test_probe_and_scrape_paths_are_routes_of_the_gateway() -> None:
    app = create_app(parse_config({}))
    routed = {r.resource.canonical for r in app.router.routes() if r.method == "GET" if r.resource}
    container = gateway_container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    monitor = one(listed(), "ServiceMonitor", "fencegate")
    paths = {
        container["readinessProbe"]["httpGet"]["path"],
        container["livenessProbe"]["httpGet"]["path"],
        monitor["spec"]["endpoints"][0]["path"],
    }
    assert paths <= routed, paths - routed


def test_grace_period_covers_the_prestop_drain_and_the_gateway_shutdown_timeout() -> None:
    config = load_config(CONFIG, env={})
    pod = one(listed(), "Deployment", "fencegate")["spec"]["template"]["spec"]
    command = gateway_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain = int(command[1])
    assert drain >= 3, "load balancers need a few seconds to stop sending"
    assert pod["terminationGracePeriodSeconds"] > drain + config.shutdown_timeout


def test_the_config_is_mounted_where_the_container_reads_it() -> None:
    container = gateway_container()
    assert container["args"] == ["serve", "--config", "/etc/fencegate/fencegate.toml"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/fencegate"
    assert mount["readOnly"] is True


# the gateway's scaling objects
def test_service_pdb_and_autoscaler_all_point_at_the_gateway_pods() -> None:
    docs = listed()
    deployment = one(docs, "Deployment", "fencegate")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one(docs, "Service", "fencegate")["spec"]["selector"].items() <= labels.items()
    pdb = one(docs, "PodDisruptionBudget", "fencegate")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one(docs, "HorizontalPodAutoscaler", "fencegate")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "fencegate",
    }
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["maxUnavailable"]
    assert gateway_container()["resources"]["requests"]["cpu"], "Utilization needs a request"


# locked-down pods
@pytest.mark.parametrize("workload", sorted(pod_specs(listed())))
def test_every_container_runs_non_root_read_only_without_capabilities(workload: str) -> None:
    pod = pod_specs(listed())[workload]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        resources = container["resources"]
        assert resources["requests"]["cpu"]
        assert resources["requests"]["memory"]
        assert resources["limits"]["memory"]


# the Redis nodes
def test_three_redis_nodes_are_independent_single_pod_statefulsets() -> None:
    texts = {n: (BASE / f"redis-{n}.yaml").read_text() for n in (1, 2, 3)}
    # the same file but for the node's number
    assert texts[2] == texts[1].replace("redis-1", "redis-2").replace("node 1 of", "node 2 of")
    assert texts[3] == texts[1].replace("redis-1", "redis-3").replace("node 1 of", "node 3 of")
    for n in (1, 2, 3):
        docs = documents(BASE / f"redis-{n}.yaml")
        sts = one(docs, "StatefulSet", f"redis-{n}")
        assert sts["spec"]["replicas"] == 1
        assert sts["spec"]["serviceName"] == f"redis-{n}"
        assert one(docs, "Service", f"redis-{n}")["spec"]["clusterIP"] == "None"
        pod = sts["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        assert args[0] == "redis-server"
        options = dict(zip(args[1::2], args[2::2], strict=True))
        assert options["--maxmemory-policy"] == "noeviction"
        assert options["--appendonly"] == "yes"
        assert options["--appendfsync"] == "everysec"
        assert options["--dir"] == container["volumeMounts"][0]["mountPath"]
        assert not any(a in args for a in ("--replicaof", "--slaveof", "--cluster-enabled"))
        claim = sts["spec"]["volumeClaimTemplates"][0]
        assert claim["metadata"]["name"] == container["volumeMounts"][0]["name"]
        anti = pod["affinity"]["podAntiAffinity"]
        assert (
            anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
                "topologyKey"
            ]
            == "kubernetes.io/hostname"
        )


def test_redis_memory_limit_leaves_room_above_maxmemory() -> None:
    sts = one(documents(BASE / "redis-1.yaml"), "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    maxmemory = args[args.index("--maxmemory") + 1]
    mb = int(re.fullmatch(r"(\d+)mb", maxmemory).group(1))  # type: ignore[union-attr]
    limit = container["resources"]["limits"]["memory"]
    mi = int(re.fullmatch(r"(\d+)Mi", limit).group(1))  # type: ignore[union-attr]
    assert mi * 1024 * 1024 >= 1.25 * mb * 1024 * 1024, "room for an AOF rewrite's fork"


def test_scrape_job_is_the_one_the_alert_rules_and_dashboard_expect() -> None:
    """The Prometheus Operator names the job of a ServiceMonitor's targets after the
    Service (no jobLabel), so the Service must be named like the job of
    grafana/prometheus/prometheus.yml, which rules such as ``up{job="fencegate"}`` use."""
    scrape = yaml.safe_load((ROOT / "grafana" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in scrape["scrape_configs"]}
    monitor = one(listed(), "ServiceMonitor", "fencegate")
    assert "jobLabel" not in monitor["spec"]
    assert one(listed(), "Service", "fencegate")["metadata"]["name"] in jobs


def test_only_gateway_pods_may_reach_the_redis_nodes() -> None:
    docs = listed()
    policy = one(docs, "NetworkPolicy", "redis-lock-nodes")
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        assert selected <= sts["spec"]["template"]["metadata"]["labels"].items()
    gateway_labels = one(docs, "Deployment", "fencegate")["spec"]["template"]["metadata"]
    assert not selected <= gateway_labels["labels"].items(), "it must not select the gateways"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= gateway_labels["labels"].items()
    assert rule["ports"] == [{"port": "redis", "protocol": "TCP"}]
