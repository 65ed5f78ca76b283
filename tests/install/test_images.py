"""The two images of the Containerfile, built for real (``scripts/build-images.sh``: buildah,
daemonless, as root, on a Debian 12 base made locally with debootstrap) and looked into: each
runs its own command, holds its own extra's packages and none of the other parts' (the table
in ``tests/install/parts.py``), and the coordinator does not run as root.

Soak tier (``--soak``): about 1.5-3.5 min (the base, then two ``pip install`` runs from PyPI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator

import pytest

from tests.install.parts import PARTS, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.soak]

ENV = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
CHECK = "import importlib.util as u, sys; print(sorted(m for m in sys.argv[1:] if u.find_spec(m)))"


def buildah(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", *argv], capture_output=True, text=True, timeout=timeout, check=False, env=ENV
    )


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """target -> image name, both built by the script."""
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        why = "needs root" if os.geteuid() != 0 else f"needs {', '.join(missing)}"
        pytest.skip(f"image build: {why} (./scripts/setup.sh installs buildah and debootstrap)")
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-images.sh")], capture_output=True, text=True,
        timeout=1800, check=False, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    version = _version()
    return {t: f"localhost/slurm-k8s-recover-{t}:{version}" for t in ("agent", "coordinator")}


class Container:
    def __init__(self, image: str) -> None:
        made = buildah("from", image)
        assert made.returncode == 0, made.stderr
        self.name = made.stdout.strip().splitlines()[-1]
        self.image = image

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return buildah("run", self.name, "--", *argv)

    def modules(self, names: tuple[str, ...]) -> list[str]:
        """Of ``names``, the modules the image's Python finds."""
        done = self.run("python", "-c", CHECK, *names)
        assert done.returncode == 0, done.stderr
        found: list[str] = json.loads(done.stdout.strip().replace("'", '"'))
        return found

    def config(self) -> dict[str, object]:
        done = buildah("inspect", "--type", "image", self.image)
        assert done.returncode == 0, done.stderr
        config: dict[str, object] = json.loads(done.stdout)["OCIv1"]["config"]
        return config


@pytest.fixture
def container(images: dict[str, str], request: pytest.FixtureRequest) -> Iterator[Container]:
    c = Container(images[request.param])
    try:
        yield c
    finally:
        buildah("rm", c.name)


@pytest.mark.parametrize("container", ["agent"], indirect=True)
def test_the_agent_image_runs_the_agent_and_holds_no_jax_or_service_stack(
    container: Container,
) -> None:
    assert container.config()["Entrypoint"] == ["recover"]
    done = container.run("recover", "agent", "run", "--help")
    assert done.returncode == 0, done.stderr
    assert "--sources" in done.stdout
    assert container.modules(("agents", "recovery")) == ["agents", "recovery"]
    absent = tuple(m.replace("-", "_") for m in PARTS["agent"].absent)
    assert container.modules(absent) == []
    assert container.run("id", "-u").stdout.strip() == "0"  # /dev/kmsg and NVML need root


@pytest.mark.parametrize("container", ["coordinator"], indirect=True)
def test_the_coordinator_image_serves_with_slurms_commands_and_not_as_root(
    container: Container,
) -> None:
    config = container.config()
    assert config["Entrypoint"] == ["recover"]
    assert str(config.get("User", "0")) not in ("", "0", "root")
    done = container.run("recover", "coordinator", "serve", "--help")
    assert done.returncode == 0, done.stderr
    assert "--state-dir" in done.stdout
    # Slurm's commands, from Debian's slurm-client (scontrol itself needs a cluster's config).
    client = container.run("dpkg-query", "-W", "-f=${Status} ${Version}", "slurm-client")
    assert client.stdout.startswith("install ok installed 22.05"), client.stderr
    found = container.run("sh", "-c", "for c in scontrol squeue sinfo; do command -v $c; done")
    assert found.stdout.split() == ["/usr/bin/scontrol", "/usr/bin/squeue", "/usr/bin/sinfo"]
    assert container.modules(("fastapi", "uvicorn", "kubernetes")) == [
        "fastapi", "kubernetes", "uvicorn",
    ]  # fmt: skip
    absent = tuple(
        {"nvidia-ml-py": "pynvml", "grpcio": "grpc"}.get(m, m) for m in PARTS["coordinator"].absent
    )
    assert container.modules(absent) == []
