"""The Containerfile, checked statically (quick; tests/install/test_images.py builds it):
a pinned base, the ``agent`` and ``coordinator`` targets installing their own extra only, the
coordinator not running as root, entrypoints that are real commands, and k8s/deploy naming
each target's image for the workload it runs."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
import typer
import yaml

from recover import app
from tests.install.parts import ROOT

RECIPE = ROOT / "Containerfile"
DEPLOY = ROOT / "k8s" / "deploy"
TARGETS = {"agent": "agent.yaml", "coordinator": "coordinator.yaml"}


@dataclass
class Stage:
    name: str
    base: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    """``(instruction, arguments)`` in order, continuation lines joined."""

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.lines if i == instruction]


def instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def parse(text: str) -> tuple[dict[str, str], dict[str, Stage]]:
    """``(ARGs before the first FROM with their defaults, stages by name)``."""
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for word, rest in instructions(text):
        if word == "FROM":
            m = re.fullmatch(r"(\S+) AS (\w+)", rest, flags=re.I)
            assert m is not None, f"every stage is named: FROM {rest}"
            current = stages[m.group(2)] = Stage(m.group(2), m.group(1))
        elif current is None:
            assert word == "ARG", f"{word} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            current.lines.append((word, rest))
    return args, stages


def lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built on, base first."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def resolve(base: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def command_exists(argv: list[str]) -> bool:
    """Whether ``recover ARGV...`` names a command (options after it are not checked)."""
    cmd: Any = typer.main.get_command(app)
    for word in argv:
        if word.startswith("-"):
            break
        sub = getattr(cmd, "commands", {})  # a group (typer's own, not always click's class)
        if word not in sub:
            return False
        cmd = sub[word]
    return not hasattr(cmd, "commands")


@pytest.fixture(scope="module")
def recipe() -> tuple[dict[str, str], dict[str, Stage]]:
    return parse(RECIPE.read_text())


def test_base_image_is_pinned(recipe: tuple[dict[str, str], dict[str, Stage]]) -> None:
    args, stages = recipe
    for stage in stages.values():
        base = resolve(stage.base, args)
        if base in stages:
            continue
        name, _, tag = base.rpartition(":")
        pinned = "@sha256:" in base or re.fullmatch(r"\d+\.\d+\.\d+(-[\w.-]+)?", tag) is not None
        assert pinned, f"stage {stage.name}: base {base} is not pinned to a full version"
        assert "/" in name, f"stage {stage.name}: name the registry ({base})"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target_installs_its_own_extra_only(
    recipe: tuple[dict[str, str], dict[str, Stage]], target: str
) -> None:
    _, stages = recipe
    runs = " ".join(a for s in lineage(stages, target) for a in s.args("RUN"))
    installed = set(re.findall(r"pip install [^&]*\.whl\)\[([\w,-]+)\]", runs))
    assert installed == {target}
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert target in extras


def test_coordinator_runs_unprivileged_and_the_agent_says_why_it_does_not(
    recipe: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    _, stages = recipe
    (user,) = stages["coordinator"].args("USER")[-1:]
    assert user not in ("0", "root")
    assert int(user) >= 1000
    assert any(f"--uid {user}" in a for a in stages["coordinator"].args("RUN"))
    assert stages["agent"].args("USER")[-1:] == ["0"]
    text = RECIPE.read_text()
    assert "/dev/kmsg" in text.split("FROM runtime AS agent", 1)[1].split("FROM ", 1)[0]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_entrypoint_and_default_command_exist(
    recipe: tuple[dict[str, str], dict[str, Stage]], target: str
) -> None:
    _, stages = recipe
    stage = stages[target]
    (entry,) = stage.args("ENTRYPOINT")
    (cmd,) = stage.args("CMD")
    assert json.loads(entry) == ["recover"]
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert "recover" in tomllib.load(f)["project"]["scripts"]
    default = json.loads(cmd)
    assert default[0] == target
    assert command_exists(default)


def test_copied_sources_are_every_package(
    recipe: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    _, stages = recipe
    copied = set()
    for a in stages["wheel"].args("COPY"):
        copied.update(shlex.split(a)[:-1])
    for path in copied:
        assert (ROOT / path).exists(), path
    with (ROOT / "pyproject.toml").open("rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in include} <= copied


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_deploy_runs_each_target_with_a_real_command(target: str) -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / TARGETS[target]).read_text()) if d]
    (workload,) = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"slurm-k8s-recover-{target}"
    command = container["command"]
    assert command[:2] == ["recover", target]
    assert command_exists(command[1:])
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert container["image"] in {i["name"] for i in kustomization["images"]}


def test_the_checks_catch_a_floating_base_and_a_missing_command() -> None:
    args, stages = parse("ARG BASE=docker.io/library/python:3.11-slim\nFROM ${BASE} AS a\n")
    tag = resolve(stages["a"].base, args).rpartition(":")[2]
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[\w.-]+)?", tag) is None
    assert not command_exists(["agent", "fly"])
    assert command_exists(["agent", "run", "--help"])
