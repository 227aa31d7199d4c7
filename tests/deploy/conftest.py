"""Shared pieces of the deployment tests (deploy/, docker/, the Makefile's up/down).

Run from anywhere with Debian's interpreter: /usr/bin/python3 -m pytest -q tests/deploy
MXSERVE_BIN_DIR holds mxserved and mxctl (default build/bin; a relative path is
taken from the repository root). Every daemon a test starts listens on
127.0.0.1 only and is stopped with SIGTERM.
"""

import os
import pathlib
import re
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Dict, List, Optional

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = REPO / os.environ.get("MXSERVE_BIN_DIR", "build/bin")
MXSERVED = BIN_DIR / "mxserved"
MXCTL = BIN_DIR / "mxctl"

_LISTENING = re.compile(r"event=listening grpc=(\S+) metrics=(\S+)")


def require_binary(path: pathlib.Path) -> str:
    """The binary's path; a test that needs it fails (not skips) when it was not built."""
    assert path.is_file() and os.access(path, os.X_OK), (
        f"{path} is missing: build it (make build) or point MXSERVE_BIN_DIR at it")
    return str(path)


class Daemon:
    """mxserved as a child process on 127.0.0.1, stopped with SIGTERM."""

    def __init__(self, *flags: str, start_timeout: float = 30.0):
        self.log_lines: List[str] = []
        self.address: Optional[str] = None
        self.metrics_address: Optional[str] = None
        self.process = subprocess.Popen([require_binary(MXSERVED), *flags],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        listening = threading.Event()

        def read_log():
            for line in self.process.stderr:
                self.log_lines.append(line.rstrip("\n"))
                match = _LISTENING.search(line)
                if match:
                    self.address, self.metrics_address = match.groups()
                    listening.set()

        self._reader = threading.Thread(target=read_log, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout
        while not listening.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("mxserved did not start:\n" + self.log())

    def log(self) -> str:
        return "\n".join(self.log_lines)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit status (SIGKILL after `timeout` s, and -9)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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
