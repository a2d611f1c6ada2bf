"""``[locks] groups`` and ``previous_groups``: parsing, overrides, and one-line errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.config import ConfigError, load_config, parse_config
from lockservice.placement import derived_id

A = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
B = ["redis://10.0.1.1:6379", "redis://10.0.1.2:6379", "redis://10.0.1.3:6379"]
C = ["redis://10.0.2.1:6379"]


def test_groups_are_lists_of_urls_or_tables_with_an_id() -> None:
    locks = parse_config({"locks": {"groups": [A, {"id": "orders", "redis": B}]}}).locks
    assert [g.id for g in locks.groups] == [derived_id(A), "orders"]
    assert locks.groups[1].urls == tuple(B)
    assert locks.redis == ()
    assert locks.previous_groups == ()


def test_previous_groups_name_the_groups_before_a_change() -> None:
    locks = parse_config({"locks": {"groups": [A, B], "previous_groups": [A]}}).locks
    assert [g.id for g in locks.previous_groups] == [derived_id(A)]
    # back from groups to a single redis list: the list is the one group after it
    locks = parse_config({"locks": {"redis": A, "previous_groups": [A, B]}}).locks
    assert len(locks.previous_groups) == 2


def test_groups_from_the_environment_and_the_command_line() -> None:
    env = {"FENCEGATE_LOCKS_GROUPS": ",".join(A) + ";" + ",".join(C)}
    locks = load_config(None, env=env).locks
    assert [g.urls for g in locks.groups] == [tuple(A), tuple(C)]
    env["FENCEGATE_LOCKS_PREVIOUS_GROUPS"] = ",".join(A)
    assert load_config(None, env=env).locks.previous_groups[0].urls == tuple(A)
    locks = load_config(None, overrides={"locks.groups": [B]}).locks
    assert locks.groups[0].urls == tuple(B)
    with pytest.raises(ConfigError, match="is empty"):  # not the in-process backend
        load_config(None, env={"FENCEGATE_LOCKS_GROUPS": ";"})
    # no change of groups under way: previous_groups may be an empty list
    assert parse_config({"locks": {"groups": [A], "previous_groups": []}}).locks.groups


@pytest.mark.parametrize(
    ("locks", "names"),
    [
        ({"redis": A, "groups": [B]}, ["'locks.groups'", "not both"]),
        ({"groups": [A[:2]]}, ["'locks.groups[0]'", "2 nodes"]),
        ({"groups": [A, [A[0]]]}, ["'locks.groups'", "two groups"]),
        ({"groups": [A, A[:1] + B[:2]]}, ["'locks.groups'", "two groups"]),
        ({"groups": [[A[0], A[0], A[1]]]}, ["same node twice"]),
        ({"groups": [{"id": "a b", "redis": A}]}, ["'locks.groups[0]'", "group id"]),
        ({"groups": [{"id": "x", "redis": A}, {"id": "x", "redis": B}]}, ["same id"]),
        ({"groups": [{"id": "x", "nodes": A}]}, ["'locks.groups[0].nodes'", "unknown"]),
        ({"groups": "redis://a"}, ["'locks.groups'", "list of groups"]),
        ({"groups": []}, ["'locks.groups'", "is empty"]),
        ({"groups": [["redis://a:1/x"]]}, ["'locks.groups[0]'", "database"]),
        ({"previous_groups": [A]}, ["'locks.previous_groups'", "needs locks.groups"]),
        ({"groups": [A, B], "previous_groups": [B, A]}, ["equals the groups"]),
        ({"groups": [A, B], "previous_groups": [[A[0], B[0], C[0]]]}, ["two groups"]),
    ],
)
def test_group_errors_are_one_line_naming_the_key(locks: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"locks": locks})
    message = str(info.value)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)


def test_a_group_urls_password_is_never_printed() -> None:
    bad = ["redis://:hunter2@a:1", "redis://b:1"]
    for locks in ({"groups": [bad]}, {"groups": [{"id": "x", "redis": bad}]}):
        with pytest.raises(ConfigError) as info:
            parse_config({"locks": locks})
        assert "hunter2" not in str(info.value)


def test_check_config_names_the_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "groups.toml"
    path.write_text(
        f'[locks]\ngroups = [{A!r}, {{id = "orders", redis = {B!r}}}]\n'
        f"previous_groups = [{A!r}]\n".replace("'", '"')
    )
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"2 redlock group(s) {derived_id(A)} (3 node(s)), orders (3 node(s))" in out
    assert f"changing from {derived_id(A)}" in out


def test_the_readme_groups_example_parses() -> None:
    from tests.docs._blocks import blocks

    (block,) = [b for b in blocks("README.md") if b.text.startswith("groups = [")]
    locks = parse_config(tomllib.loads("[locks]\n" + block.text)).locks
    assert [len(g.urls) for g in locks.groups] == [3, 3]
    assert locks.groups[1].id == "b"
