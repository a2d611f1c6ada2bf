"""Every manifest of deploy/kubernetes/ is valid: Kubernetes kinds against the Kubernetes
schemas (kubernetes-validate, strict: unknown fields are errors), the Prometheus Operator
kinds against models generated from their CRDs; and kustomize renders the base to exactly
the listed manifests plus the generated config.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from pydantic import BaseModel, ValidationError

from tests.deploy._manifests import (
    BASE,
    KUBECTL,
    KUBERNETES_VERSION,
    NO_KUBECTL,
    Manifest,
    kustomization,
    listed,
    one,
    render,
)

# on one test worker: the CRD models take seconds to import (crd_errors), once is enough
pytestmark = pytest.mark.xdist_group("crd_models")
CRD_KINDS = ("ServiceMonitor", "PrometheusRule")
EXPECTED_KINDS = {
    "Deployment": 1, "Service": 4, "PodDisruptionBudget": 1, "HorizontalPodAutoscaler": 1,
    "ServiceMonitor": 1, "PrometheusRule": 1, "ConfigMap": 1, "StatefulSet": 3,
    "NetworkPolicy": 1,
}  # fmt: skip


def kubernetes_schema_errors(doc: Manifest) -> str | None:
    try:
        version = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}"
    assert version == KUBERNETES_VERSION.rsplit(".", 1)[0]
    return None


def crd_errors(doc: Manifest) -> str | None:
    """Validate against the CRD's model; a field the CRD does not define is an error too
    (the models ignore unknown fields, so compare what they kept with what was given)."""
    # imported here: the generated models take seconds to import, in every test worker that
    # collects this module, while only the tests that validate a CRD kind need them
    from cloudcoil.models.prometheus_operator import v1

    model: type[BaseModel] = getattr(v1, doc["kind"])
    try:
        parsed = model.model_validate(doc)
    except ValidationError as exc:
        return f"{doc['kind']}/{doc['metadata']['name']}: {exc}"
    kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if kept != doc:
        return f"{doc['kind']}/{doc['metadata']['name']}: unknown fields: {_lost(doc, kept)}"
    return None


def _lost(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        return [
            p
            for k, v in given.items()
            for p in ([f"{path}.{k}"] if k not in kept else _lost(v, kept[k], f"{path}.{k}"))
        ]
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        pairs = enumerate(zip(given, kept, strict=True))
        return [p for i, (g, k) in pairs for p in _lost(g, k, f"{path}[{i}]")]
    return [] if given == kept else [f"{path} ({given!r} became {kept!r})"]


def errors(doc: Manifest) -> str | None:
    return crd_errors(doc) if doc["kind"] in CRD_KINDS else kubernetes_schema_errors(doc)


def test_every_listed_manifest_is_valid() -> None:
    docs = listed()
    assert docs
    problems = [e for e in map(errors, docs) if e]
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(KUBECTL is None, reason=NO_KUBECTL)
def test_kustomize_renders_the_listed_manifests_plus_the_generated_config() -> None:
    rendered = render()
    kinds: dict[str, int] = {}
    for doc in rendered:
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    assert kinds == {**EXPECTED_KINDS, "ConfigMap": 2}
    problems = [e for e in map(errors, rendered) if e]
    assert not problems, "\n".join(problems)
    # the generated ConfigMap is fencegate.toml byte for byte, under a hashed name that the
    # Deployment's volume follows (a changed config rolls the pods)
    generated = [d for d in rendered if d["metadata"]["name"].startswith("fencegate-config-")]
    assert len(generated) == 1
    assert generated[0]["data"] == {"fencegate.toml": (BASE / "fencegate.toml").read_text()}
    pod = one(rendered, "Deployment", "fencegate")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == generated[0]["metadata"]["name"]
    # everything else unchanged, but for whitespace inside PromQL and annotations: Go's YAML
    # parsers (kustomize's, and Prometheus') read a folded scalar (>-) whose lines are more
    # indented with one more line break than PyYAML does, which PromQL ignores
    by_id = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    for doc in listed():
        if doc["kind"] == "PrometheusRule":
            assert squeezed(by_id[(doc["kind"], doc["metadata"]["name"])]) == squeezed(doc)
        elif doc["kind"] != "Deployment":
            assert by_id[(doc["kind"], doc["metadata"]["name"])] == doc


def squeezed(value: Any) -> Any:
    """``value`` with every run of whitespace in its strings made one space."""
    if isinstance(value, dict):
        return {k: squeezed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [squeezed(v) for v in value]
    return " ".join(value.split()) if isinstance(value, str) else value


def test_kustomization_lists_every_manifest_file_once() -> None:
    resources = kustomization()["resources"]
    assert len(resources) == len(set(resources))
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(resources) == on_disk
    kinds: dict[str, int] = {}
    for doc in listed():
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    assert kinds == EXPECTED_KINDS


# the checks themselves catch what they are for
def test_the_kubernetes_check_refuses_an_unknown_field_and_a_wrong_type() -> None:
    service = one(listed(), "Service", "fencegate")
    assert kubernetes_schema_errors(service) is None
    typo = {**service, "spec": {**service["spec"], "selectr": {"a": "b"}}}
    assert "selectr" in (kubernetes_schema_errors(typo) or "")
    wrong = {**service, "spec": {**service["spec"], "ports": [{"port": "eighty"}]}}
    assert kubernetes_schema_errors(wrong) is not None


def test_the_crd_check_refuses_an_unknown_field_and_a_bad_duration() -> None:
    monitor = one(listed(), "ServiceMonitor")
    assert crd_errors(monitor) is None
    endpoint = monitor["spec"]["endpoints"][0]
    typo = {**monitor, "spec": {**monitor["spec"], "endpoints": [{**endpoint, "paht": "/x"}]}}
    assert ".spec.endpoints[0].paht" in (crd_errors(typo) or "")
    slow = {**monitor, "spec": {**monitor["spec"], "endpoints": [{**endpoint, "interval": "15"}]}}
    assert "interval" in (crd_errors(slow) or "")
    rule = one(listed(), "PrometheusRule")
    assert crd_errors(rule) is None
    first = rule["spec"]["groups"][0]
    bad_for = {**first, "rules": [{**first["rules"][0], "for": "1 minute"}]}
    assert crd_errors({**rule, "spec": {"groups": [bad_for]}}) is not None
