"""deploy/Dockerfile, read statically (no Docker engine here, and no hadolint): two stages,
the package installed from wheels, a numeric non-root user, a health check that works,
the command and config the image runs. Its HEALTHCHECK command is also run for real against
a gateway on loopback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.deploy._manifests import DEPLOY, ROOT, listed, one
from tests.grafana._procs import GatewayProcess

DOCKERFILE = DEPLOY / "Dockerfile"
IGNORE = DEPLOY / "Dockerfile.dockerignore"
IMAGE_CONFIG = DEPLOY / "image.toml"


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments and blank lines dropped."""
    out: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), " ".join(args.split())))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages(text: str) -> list[list[Instruction]]:
    """The instructions of each stage, FROM first; ARGs before the first FROM dropped."""
    result: list[list[Instruction]] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            result.append([ins])
        elif result:
            result[-1].append(ins)
    return result


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list)
    assert all(isinstance(v, str) for v in value)
    return value


def final() -> list[Instruction]:
    return stages(DOCKERFILE.read_text())[-1]


def last(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert found, f"no {keyword} in the final stage"
    return found[-1]


def test_builder_stage_builds_wheels_and_the_final_stage_installs_only_from_them() -> None:
    text = DOCKERFILE.read_text()
    assert text.startswith("# syntax=docker/dockerfile:1\n"), "RUN --mount needs BuildKit's syntax"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base.group(1))
    builder, runtime = stages(text)
    assert builder[0].args == "${PYTHON_IMAGE} AS builder"
    assert runtime[0].args == "${PYTHON_IMAGE}"
    assert any(i.keyword == "RUN" and "pip wheel" in i.args and "--wheel-dir /wheels ." in i.args
               for i in builder)  # fmt: skip
    (install,) = [i for i in runtime if i.keyword == "RUN" and "pip install" in i.args]
    assert install.args.startswith("--mount=type=bind,from=builder,source=/wheels,target=/wheels ")
    assert "pip install --no-cache-dir --no-index --find-links /wheels fencegate" in install.args
    # no source tree in the runtime image: it copies only its default config
    copies = [i.args for i in runtime if i.keyword == "COPY"]
    assert copies == ["deploy/image.toml /etc/fencegate/fencegate.toml"]


def test_runs_as_a_numeric_non_root_user_created_with_that_uid() -> None:
    stage = final()
    user = last(stage, "USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), "numeric: Kubernetes' runAsNonRoot cannot check a user name"
    assert int(uid) > 0
    assert int(gid) > 0
    # nothing after USER runs as root again, and nothing after it needs root
    assert [i.keyword for i in stage].index("USER") > max(
        n for n, i in enumerate(stage) if i.keyword == "RUN"
    )
    install = next(i.args for i in stage if i.keyword == "RUN" and "useradd" in i.args)
    assert f"--uid {uid}" in install
    assert f"--gid {gid}" in install
    # the Kubernetes Deployment runs the same uid
    pod = one(listed(), "Deployment", "fencegate")["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(uid),
        int(gid),
    )


def test_command_serves_the_config_the_image_ships() -> None:
    stage = final()
    command = exec_form(last(stage, "ENTRYPOINT").args) + exec_form(last(stage, "CMD").args)
    assert command[:3] == ["fencegate", "serve", "--config"]
    copied = last(stage, "COPY").args.split()
    assert copied == ["deploy/image.toml", command[3]]
    config = load_config(IMAGE_CONFIG, env={})
    assert str(config.listen) == "0.0.0.0:8080", "reachable from outside the container"
    assert config.allow_remote is True
    assert last(stage, "EXPOSE").args == str(config.listen.port)
    files = config.stores["files"]
    assert files.root is not None
    assert files.root.startswith("/var/lib/fencegate/")
    assert "mkdir -p /var/lib/fencegate/files" in next(
        i.args for i in stage if i.keyword == "RUN" and "useradd" in i.args
    )


def test_healthcheck_asks_healthz_of_the_listen_port_with_python() -> None:
    check = last(final(), "HEALTHCHECK").args
    options, _, cmd = check.partition(" CMD ")
    assert re.fullmatch(r"(--[a-z-]+=\d+s? ?)+", options), options
    assert "--timeout=" in options
    argv = exec_form(cmd)
    assert argv[:2] == ["python", "-c"]
    port = load_config(IMAGE_CONFIG, env={}).listen.port
    assert f"'http://127.0.0.1:{port}/healthz'" in argv[2]


def test_healthcheck_command_passes_on_a_live_gateway_and_fails_on_a_dead_one(
    tmp_path: Path,
) -> None:
    argv = exec_form(last(final(), "HEALTHCHECK").args.partition(" CMD ")[2])
    gateway = GatewayProcess(tmp_path, f'[stores.files]\ntype = "files"\nroot = "{tmp_path}/d"\n')
    here = [sys.executable, argv[1], argv[2].replace(":8080/", f":{gateway.port}/")]
    gateway.start()
    try:
        assert subprocess.run(here, capture_output=True, timeout=30).returncode == 0
    finally:
        gateway.stop()
    assert subprocess.run(here, capture_output=True, timeout=30).returncode != 0


@pytest.mark.parametrize("stage", [0, 1])
def test_every_copy_source_is_in_the_build_context(stage: int) -> None:
    """Dockerfile.dockerignore excludes everything, then lets back in what COPY reads."""
    allowed = {
        line[1:].rstrip("/") for line in IGNORE.read_text().splitlines() if line.startswith("!")
    }
    assert "*" in IGNORE.read_text().splitlines()
    for ins in stages(DOCKERFILE.read_text())[stage]:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            *sources, _dest = ins.args.split()
            for source in sources:
                assert source in allowed, f"{source} is excluded by the .dockerignore"
                assert (ROOT / source).exists(), source
