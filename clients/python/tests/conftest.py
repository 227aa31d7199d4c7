"""Fixtures: a real mxserved on 127.0.0.1 (free ports), and clients to it.

The daemon binary comes from $MXSERVED (CMake sets it) or build/bin/mxserved.
"""

import itertools
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package, when run straight from the checkout

import mxserve  # noqa: E402

REPO = HERE.parent.parent.parent


def python_env(**extra):
    """Environment for a child `python3 -m mxserve...`: this checkout's package first."""
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}

MXSERVED = os.environ.get("MXSERVED", str(REPO / "build" / "bin" / "mxserved"))
_LISTENING = re.compile(r"event=listening grpc=(\S+) metrics=(\S+)")


class Daemon:
    """mxserved as a child process, stopped with SIGTERM (it exits 0 on that)."""

    def __init__(self, *flags: str, start_timeout: float = 30.0):
        self.log_lines = []
        self.process = subprocess.Popen(
            [MXSERVED, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        listening = threading.Event()
        self.address = self.metrics_address = None

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
                raise RuntimeError("mxserved did not start:\n" + "\n".join(self.log_lines))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # LoadSafetensors reads only inside --model-dir: tests write their files there.
    model_dir = tmp_path_factory.mktemp("models")
    d = Daemon("--model-dir", str(model_dir))
    d.model_dir = model_dir
    yield d
    assert d.stop() == 0, "mxserved did not exit cleanly:\n" + "\n".join(d.log_lines[-20:])


@pytest.fixture
def client(daemon):
    with mxserve.Client(daemon.address, timeout=60) as c:
        c.wait_ready(timeout=10)
        yield c


_names = itertools.count(1)


@pytest.fixture
def model_name(request):
    """A model name unique within the module's daemon."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:100] + f"-{next(_names)}"
