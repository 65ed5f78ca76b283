"""Which Slurm install runs a cluster (slurm.install), and scripts/build-slurm.sh's cache,
lock and refusals: none of these cases builds anything."""

from __future__ import annotations

import lzma
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from recovery.errors import SlurmNotInstalledError, UsageError
from slurm import install
from slurm.conf import render_epilog

SCRIPT = Path(__file__).parents[2] / "scripts" / "build-slurm.sh"


def build_script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**full, **env}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def fake_build(cache: Path) -> Path:
    prefix = cache / install.BUILD_VERSION
    for prog in ("bin/scontrol", "bin/sbatch", "bin/sinfo", "bin/squeue", "sbin/slurmctld",
                 "sbin/slurmd"):  # fmt: skip
        (prefix / prog).parent.mkdir(parents=True, exist_ok=True)
        (prefix / prog).write_text("#!/bin/sh\n")
        (prefix / prog).chmod(0o755)
    (prefix / "STAMP").write_text(install.BUILD_VERSION + "\n")
    return prefix


def test_a_built_cache_builds_nothing(tmp_path: Path) -> None:
    prefix = fake_build(tmp_path)
    done = build_script({"SLURM_CACHE": str(tmp_path), "SLURM_SOURCE": "/nonexistent.tar.xz"})
    assert done.returncode == 0, done.stderr
    assert f"cached: {prefix}" in done.stdout
    assert "nothing to build" in done.stdout
    printed = build_script({"SLURM_CACHE": str(tmp_path)}, "--print")
    assert printed.stdout.strip() == str(prefix)


def test_no_source_is_one_line_and_exit_3(tmp_path: Path) -> None:
    done = build_script({"SLURM_CACHE": str(tmp_path), "SLURM_SOURCE": str(tmp_path / "no.tar.xz")})
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1
    assert "SLURM_SOURCE" in done.stderr
    # Nothing is downloaded from a port where nothing listens either: same answer.
    url = build_script(
        {"SLURM_CACHE": str(tmp_path), "SLURM_SOURCE": "http://127.0.0.1:9/s.tar.bz2"}
    )
    assert url.returncode == 3
    assert url.stderr.count("\n") == 1, url.stderr
    assert not (tmp_path / install.BUILD_VERSION).exists()


def test_a_wrong_checksum_leaves_no_half_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "configure").write_text("#!/bin/sh\nexit 0\n")
    tarball = tmp_path / "slurm-25.11.7.tar.xz"
    with lzma.open(tarball, "wb") as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        tar.add(src, arcname="slurm-25.11.7")
    cache = tmp_path / "cache"
    done = build_script({"SLURM_CACHE": str(cache), "SLURM_SOURCE": str(tarball)})
    assert done.returncode == 1
    assert "is not Slurm 25.11.7's release" in done.stderr
    assert "SLURM_SHA256" in done.stderr
    assert sorted(p.name for p in cache.iterdir()) == [".lock"]  # no build folder, no prefix


def test_an_unknown_option_names_the_valid_ones() -> None:
    done = build_script({}, "--bogus")
    assert done.returncode == 2
    assert "valid: --print" in done.stderr


# --- choosing an install --------------------------------------------------------------------


def test_auto_is_the_build_when_there_is_one(tmp_path: Path) -> None:
    env = {"SLURM_CACHE": str(tmp_path)}
    assert install.choose("auto", env) == install.SYSTEM
    with pytest.raises(SlurmNotInstalledError, match=r"build-slurm\.sh"):
        install.choose("25.11", env)
    prefix = fake_build(tmp_path)
    assert install.choose(None, env) == install.SlurmInstall("25.11", prefix)
    assert install.choose("22.05", env) == install.SYSTEM
    assert install.choose(None, {**env, "RECOVER_SLURM": "22.05"}) == install.SYSTEM
    with pytest.raises(UsageError, match=r"Known: 22\.05, 25\.11, auto"):
        install.choose("24.05", env)


def test_the_conf_names_its_install_and_commands_follow_it(tmp_path: Path) -> None:
    prefix = fake_build(tmp_path)
    built = install.SlurmInstall("25.11", prefix)
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"# Generated\n{built.conf_line()}\nClusterName=x\n")
    assert install.of_conf(conf) == built
    env = install.command_env(built, {"PATH": "/usr/bin:/bin"})
    assert env["PATH"] == f"{prefix}/bin:{prefix}/sbin:/usr/bin:/bin"
    assert install.command_env(install.SYSTEM, {"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}
    assert built.program("scontrol") == str(prefix / "bin" / "scontrol")
    with pytest.raises(SlurmNotInstalledError, match="slurmrestd is not in"):
        built.program("slurmrestd")
    # A real cluster's conf names nothing: whatever is on PATH runs.
    conf.write_text("ClusterName=x\n")
    assert install.of_conf(conf) is None
    # A conf whose build is gone says so rather than running other programs.
    conf.write_text(f"{install.CONF_MARK} 25.11 {tmp_path / 'gone'}\n")
    with pytest.raises(UsageError, match="which is gone"):
        install.of_conf(conf)


def test_the_epilog_wrapper_puts_the_install_first_on_path(tmp_path: Path) -> None:
    built = install.SlurmInstall("25.11", tmp_path)
    text = render_epilog(built, ["/usr/bin/python3", "-I", "/a b/epilog.py"])
    assert f"PATH={tmp_path}/bin:{tmp_path}/sbin:/usr/local/bin:/usr/bin:/bin\n" in text
    assert text.endswith("exec /usr/bin/python3 -I '/a b/epilog.py'\n")


def test_cluster_env_puts_a_builds_programs_first_on_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recover import main

    prefix = fake_build(tmp_path / "cache")
    state = tmp_path / "state"
    state.mkdir()
    (state / "cluster.json").write_text("{}")
    (state / "slurm.conf").write_text(install.SlurmInstall("25.11", prefix).conf_line() + "\n")
    assert main(["cluster", "env", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"export SLURM_CONF={state}/slurm.conf",
        f'export PATH={prefix}/bin:{prefix}/sbin:"$PATH"',
    ]
