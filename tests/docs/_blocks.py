"""Fenced code blocks of the Markdown docs, and how their placeholders map to a test setup.

A block is run unless the line just above its opening fence is
``<!-- docs-test: not run (<reason>) -->`` (invisible when rendered). The
examples use the addresses and values a reader would see; ``Substitutions``
replaces them with those of the test's gateways and Redis nodes, and with the
token and lease id the earlier commands of the same block printed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "deploy/README.md")
SKIP = re.compile(r"<!--\s*docs-test:\s*not run\s*\((?P<reason>[^)]+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)\s*$")

# What the docs show, and what it stands for.
SAMPLE_TOKEN = "1795313666024001"
SAMPLE_LEASE_ID = "2f52…"
DOC_REDIS_PORTS = (7101, 7102, 7103)


@dataclass(frozen=True, slots=True)
class Block:
    file: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None  # the reason it is not run

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.lang}"

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0]


def blocks(file: str) -> list[Block]:
    """Every fenced block of ``file`` (relative to the repository), in order."""
    lines = (ROOT / file).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(above)
        found.append(
            Block(file, start + 1, match["lang"], "\n".join(body) + "\n",
                  skip["reason"] if skip else None)
        )  # fmt: skip
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for file in DOCS for b in blocks(file)]


@dataclass
class Substitutions:
    """The docs' addresses and sample values -> those of this test run."""

    gateways: list[str]  # base URLs: the first stands for :8080 and :8081, the second :8082
    redis: list[str]  # node URLs for redis://127.0.0.1:7101..7103 (none: not substituted)
    token: str | None = None
    lease_id: str | None = None
    seen: list[str] = field(default_factory=list)  # every substitution made, for messages

    def apply(self, text: str) -> str:
        first = self.gateways[0].removeprefix("http://")
        second = self.gateways[-1].removeprefix("http://")
        pairs = [
            ("localhost:8080", first),
            ("127.0.0.1:8080", first),
            ("127.0.0.1:8081", first),
            ("127.0.0.1:8082", second),
        ]
        if self.redis:
            ports = DOC_REDIS_PORTS
            pairs += [(f"redis://127.0.0.1:{p}", u) for p, u in zip(ports, self.redis, strict=True)]
        if self.token is not None:
            pairs += [(SAMPLE_TOKEN, self.token), ("<token>", self.token)]
        if self.lease_id is not None:
            pairs += [(SAMPLE_LEASE_ID, self.lease_id), ("<lease_id>", self.lease_id)]
        for old, new in pairs:
            if old in text:
                self.seen.append(f"{old} -> {new}")
                text = text.replace(old, new)
        return text

    def learn(self, output: str) -> dict[str, Any] | None:
        """Remember the token and lease id a command printed; return its JSON, if any."""
        try:
            data = json.loads(output)
        except ValueError:
            data = None
        if isinstance(data, dict):
            if isinstance(data.get("token"), int):
                self.token = str(data["token"])
            if isinstance(data.get("lease_id"), str):
                self.lease_id = data["lease_id"]
            return data
        if token := re.search(r"\btoken\s+(\d+)", output):
            self.token = token[1]
        if lease := re.search(r"\blease_id\s+([0-9a-f]{32})", output):
            self.lease_id = lease[1]
        return None


def shell_commands(text: str) -> list[tuple[str, str | None]]:
    """(command, the JSON line the docs show as its output, if any) per command line."""
    commands: list[tuple[str, str | None]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("# {"):
            assert commands, f"an output line before any command: {line}"
            commands[-1] = (commands[-1][0], line[2:])
        elif not line.startswith("#"):
            commands.append((line, None))
    return commands
