"""Fixtures: a real mxserved on 127.0.0.1 (free ports), and clients to it.

The daemon binary comes from $MXSERVED (CMake sets it) or build/bin/mxserved.
"""

import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package, when run straight from the checkout

import mxserve  # noqa: E402
from daemon_process import DaemonProcess  # noqa: E402  (this directory)

REPO = HERE.parent.parent.parent


def check_golden_generator(script: str) -> None:
    """tests/golden/<script> --check: the checked-in golden file is what its
    generator writes."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "golden" / script), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def python_env(**extra):
    """Environment for a child `python3 -m mxserve...`: this checkout's package first."""
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}

MXSERVED = os.environ.get("MXSERVED", str(REPO / "build" / "bin" / "mxserved"))
# The C++ side's names (proto/convert) as JSON: formats, aliases, every enum's names.
FORMAT_TABLE = os.environ.get("MXSERVE_FORMAT_TABLE",
                              str(REPO / "build" / "bin" / "mxserve_format_table"))


@pytest.fixture(scope="module")
def cpp_table():
    """What mxserve_format_table prints, for test_wire.py and test_enums.py."""
    done = subprocess.run([FORMAT_TABLE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Daemon(DaemonProcess):
    """mxserved on free 127.0.0.1 ports with `flags`."""

    def __init__(self, *flags: str, start_timeout: float = 30.0):
        super().__init__(MXSERVED, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                         *flags, start_timeout=start_timeout)


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
