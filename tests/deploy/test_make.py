"""make up / make down: `docker compose` when the plugin answers, else docker-compose,
else a clear error. Fake tools on a private PATH record what make runs."""

import pathlib
import shutil
import stat
import subprocess

import pytest

from conftest import REPO

MAKE = shutil.which("make") or "/usr/bin/make"


def fake_tool(directory: pathlib.Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_make(bin_dir: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "HOME": str(bin_dir)}
    return subprocess.run([MAKE, "-s", "-C", str(REPO), *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.fixture
def bin_dir(tmp_path):
    directory = tmp_path / "bin"
    directory.mkdir()
    return directory


@pytest.mark.parametrize("target", ["up", "down"])
def test_without_docker_the_error_points_at_make_observe(bin_dir, target):
    result = run_make(bin_dir, target)
    assert result.returncode != 0
    assert "no Docker here: use `make observe` for the native stack" in result.stderr


def test_docker_compose_v1_when_there_is_no_plugin(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_tool(bin_dir, "docker", "exit 1\n")  # a docker without the compose plugin
    fake_tool(bin_dir, "docker-compose", f'echo "docker-compose $*" >> {log}\n')
    assert run_make(bin_dir, "up").returncode == 0
    assert run_make(bin_dir, "down", "COMPOSE_FLAGS=--profile gpu").returncode == 0
    assert log.read_text().splitlines() == [
        "docker-compose -p mxserve -f docker/compose.yaml up -d --build",
        "docker-compose -p mxserve -f docker/compose.yaml --profile gpu down",
    ]


def test_docker_compose_v2_plugin_first(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_tool(bin_dir, "docker", f'[ "$1 $2" = "compose version" ] && exit 0\n'
                                 f'echo "docker $*" >> {log}\n')
    fake_tool(bin_dir, "docker-compose", f'echo "docker-compose $*" >> {log}\n')
    result = run_make(bin_dir, "up", "COMPOSE_FLAGS=--profile gpu")
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [
        "docker compose -p mxserve -f docker/compose.yaml --profile gpu up -d --build"]
    assert "Grafana http://127.0.0.1:3000" in result.stdout


def test_a_failing_compose_fails_make(bin_dir):
    fake_tool(bin_dir, "docker-compose", "echo 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    result = run_make(bin_dir, "up")
    assert result.returncode != 0 and "Cannot connect" in result.stderr


def test_targets_are_phony():
    makefile = (REPO / "Makefile").read_text()
    phony = makefile.split(".PHONY:", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").split()
    assert {"up", "down"} <= set(phony)
