"""Shared pieces of the deployment tests (deploy/, docker/, the Makefile's up/down).

Run from anywhere with Debian's interpreter: /usr/bin/python3 -m pytest -q tests/deploy
MXSERVE_BIN_DIR holds mxserved and mxctl (default build/bin; a relative path is
taken from the repository root). Every daemon a test starts listens on
127.0.0.1 only and is stopped with SIGTERM.
"""

import os
import pathlib
import re
import subprocess
import sys
import urllib.request
from typing import Dict, List

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))
from daemon_process import DaemonProcess  # noqa: E402  (the Python client's tests share it)

BIN_DIR = REPO / os.environ.get("MXSERVE_BIN_DIR", "build/bin")
MXSERVED = BIN_DIR / "mxserved"
MXCTL = BIN_DIR / "mxctl"

_LISTENING = re.compile(r"event=listening grpc=(\S+) metrics=(\S+)")


def require_binary(path: pathlib.Path) -> str:
    """The binary's path; a test that needs it fails (not skips) when it was not built."""
    assert path.is_file() and os.access(path, os.X_OK), (
        f"{path} is missing: build it (make build) or point MXSERVE_BIN_DIR at it")
    return str(path)


class Daemon(DaemonProcess):
    """mxserved as a child process with exactly `flags`, stopped with SIGTERM."""

    def __init__(self, *flags: str, start_timeout: float = 30.0):
        super().__init__(require_binary(MXSERVED), *flags, start_timeout=start_timeout)


def local_daemon_flags(*flags: str) -> List[str]:
    """Free ports on 127.0.0.1 for gRPC and metrics, then `flags`."""
    return ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", *flags]


def mxctl(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary(MXCTL), *args], capture_output=True, text=True,
                          timeout=timeout)


def metric_sum(metrics_address: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples on a daemon's /metrics whose labels include `labels`."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as page:
        text = page.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if all(have.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total


@pytest.fixture(scope="session")
def mxserved_flags() -> Dict[str, bool]:
    """Every flag `mxserved --help` lists, mapped to whether it takes a value."""
    result = subprocess.run([require_binary(MXSERVED), "--help"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    flags = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^\s+(--[a-z][a-z0-9-]*)(\s+\S+)?\s*$", line)
        if match:
            flags[match.group(1)] = match.group(2) is not None
    assert {"--listen", "--metrics-listen", "--backend", "--policy-dir"} <= flags.keys(), (
        "mxserved --help no longer lists its flags the way this parser expects:\n"
        + result.stdout)
    return flags


def args_dict(args: List[str]) -> Dict[str, str]:
    """A flag list of --name value pairs as {--name: value}."""
    return dict(zip(args[::2], args[1::2]))


def check_daemon_args(args: List[str], flags: Dict[str, bool]) -> None:
    """Every --flag in `args` is one mxserved knows, and one that takes a value has one."""
    index = 0
    while index < len(args):
        arg = args[index]
        assert arg.startswith("--"), f"{arg!r} is not a flag (args: {args})"
        name, has_inline_value = arg.split("=", 1)[0], "=" in arg
        assert name in flags, f"mxserved --help does not list {name} (args: {args})"
        if flags[name] and not has_inline_value:
            assert index + 1 < len(args) and not args[index + 1].startswith("--"), (
                f"{name} needs a value (args: {args})")
            index += 1
        index += 1
