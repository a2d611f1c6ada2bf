"""The overlay deploy/README.md shows renders on top of the base, stays valid, and does what
the README says: namespace, image and a replaced fencegate.toml (with API keys) that the
Deployment then mounts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.deploy._manifests import (
    BASE,
    KUBECTL,
    NO_KUBECTL,
    Manifest,
    kubectl_minor,
    one,
    render,
)
from tests.deploy.test_schemas import errors
from tests.docs._blocks import blocks

# on one test worker: the CRD models take seconds to import (crd_errors), once is enough
pytestmark = pytest.mark.xdist_group("crd_models")

OVERLAY_CONFIG = """\
listen = "0.0.0.0:8080"

[locks]
redis = [
    "redis://redis-1-0.redis-1:6379",
    "redis://redis-2-0.redis-2:6379",
    "redis://redis-3-0.redis-3:6379",
]

[[auth.keys]]
name = "billing"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
locks = ["billing/"]
"""


def readme_overlay() -> str:
    (block,) = [b for b in blocks("deploy/README.md") if b.lang == "yaml"]
    return block.text


@pytest.mark.skipif(KUBECTL is None, reason=NO_KUBECTL)
def test_readme_overlay_renders_valid_with_its_image_namespace_and_config(
    tmp_path: Path,
) -> None:
    minor = kubectl_minor()
    if minor is not None and minor < 21:
        # kubectl 1.20 (Debian 12's kubernetes-client) embeds kustomize v2.0.3, which takes a
        # base directory under bases: only; resources: takes one from kustomize v2.1 on
        pytest.skip(f"kubectl 1.{minor}: the overlay's resources: needs kubectl 1.21 or later")
    overlay = tmp_path / "overlays" / "prod"
    overlay.mkdir(parents=True)
    text = readme_overlay()
    assert "../../deploy/kubernetes" in text
    # the README's overlay sits two folders below the repository; this one elsewhere
    text = text.replace("../../deploy/kubernetes", os.path.relpath(BASE, overlay))
    (overlay / "kustomization.yaml").write_text(text)
    (overlay / "fencegate.toml").write_text(OVERLAY_CONFIG)
    # an API key, so no allow_remote: the config the README asks for is a valid one
    config = load_config(overlay / "fencegate.toml", env={})
    assert config.auth_keys
    assert not config.allow_remote

    docs = render(overlay)
    problems = [e for e in map(errors, docs) if e]
    assert not problems, "\n".join(problems)
    assert {d["metadata"].get("namespace") for d in docs} == {"locks"}
    deployment = one(docs, "Deployment", "fencegate")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/fencegate:0.1.0"
    (generated,) = [d for d in docs if d["metadata"]["name"].startswith("fencegate-config")]
    assert generated["data"] == {"fencegate.toml": OVERLAY_CONFIG}
    assert re.fullmatch(r"fencegate-config-[a-z0-9]+", generated["metadata"]["name"])
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == generated["metadata"]["name"]

    # everything else of the base is still there
    assert others(docs) == others(render())


def others(manifests: list[Manifest]) -> set[tuple[str, str]]:
    """Kind and name of each manifest but the generated gateway config."""
    names = [(d["kind"], d["metadata"]["name"]) for d in manifests]
    return {(kind, name) for kind, name in names if not name.startswith("fencegate-config-")}
