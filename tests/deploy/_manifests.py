"""deploy/kubernetes/ as tests see it: the files kustomization.yaml lists, and its render.

``KUBERNETES_VERSION`` is the one Kubernetes release whose schemas (bundled in the PyPI
package kubernetes-validate, which ships 1.25 to 1.37) every manifest is checked against.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import yaml

ROOT: Final = Path(__file__).resolve().parents[2]
DEPLOY: Final = ROOT / "deploy"
BASE: Final = DEPLOY / "kubernetes"
KUBERNETES_VERSION: Final = "1.31.0"
KUBECTL: Final = shutil.which("kubectl")
NO_KUBECTL: Final = (
    "kubectl is not installed (Debian package 'kubernetes-client'; ./dev test installs it): "
    "the kustomize render cannot be checked"
)

Manifest = dict[str, Any]


def kubectl_minor() -> int | None:
    """The minor version of the installed kubectl (1.20 -> 20), None without one."""
    if KUBECTL is None:
        return None
    out = subprocess.run(
        [KUBECTL, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    minor = re.match(r"\d+", json.loads(out.stdout)["clientVersion"]["minor"])
    assert minor is not None, out.stdout
    return int(minor.group())


def kustomization() -> Manifest:
    data: Manifest = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return data


def documents(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def listed() -> list[Manifest]:
    """Every manifest in the files under ``resources:``, in order."""
    return [doc for name in kustomization()["resources"] for doc in documents(BASE / name)]


def render(kustomization_dir: Path = BASE) -> list[Manifest]:
    """``kubectl kustomize DIR`` (default: this base): what ``kubectl apply -k`` would send."""
    assert KUBECTL is not None, NO_KUBECTL
    out = subprocess.run(
        [KUBECTL, "kustomize", str(kustomization_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the manifests"
    return found[0]


def sync_module() -> ModuleType:
    """deploy/kubernetes/sync.py, which writes the files copied from grafana/."""
    spec = importlib.util.spec_from_file_location("fencegate_deploy_sync", BASE / "sync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pod_specs(docs: list[Manifest]) -> dict[str, Manifest]:
    """The pod template spec of each workload, by ``Kind/name``."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
    }
