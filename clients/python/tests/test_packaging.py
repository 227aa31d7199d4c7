"""`pip install --no-build-isolation clients/python` works offline, with Debian's
grpcio, protobuf and numpy satisfying the dependencies: after `make build` (stubs
present) and from a fresh checkout (setup.py generates them)."""

import shutil
import subprocess
import sys

import pytest

from conftest import HERE, REPO


@pytest.mark.parametrize("stubs", ["built", "fresh"])
def test_pip_installs_offline_and_the_package_imports(tmp_path, stubs):
    # A copy of the parts of the checkout the build reads, so nothing is written
    # into the real one.
    checkout = tmp_path / "checkout"
    ignore = ["tests", "__pycache__", "build", "*.egg-info"]
    if stubs == "fresh":
        ignore += ["v1", "_health_pb2.py"]
    shutil.copytree(HERE.parent, checkout / "clients" / "python",
                    ignore=shutil.ignore_patterns(*ignore))
    shutil.copytree(REPO / "proto", checkout / "proto")

    prefix = tmp_path / "prefix"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                           "--no-index", "--no-warn-script-location", "--prefix", str(prefix),
                           str(checkout / "clients" / "python")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    site = next(prefix.rglob("dist-packages"), None) or next(prefix.rglob("site-packages"))
    probe = ("import mxserve, mxserve.torch, mxserve.gpu_baseline; "
             "print(mxserve.__file__); print(mxserve.__version__); "
             "print(mxserve.v1.compute_pb2.GemmRequest.DESCRIPTOR.full_name); "
             "import os, mxserve.experiment as e; print(os.path.isfile(e.shipped_config('seeds')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    path, version, message, config = done.stdout.split()
    assert path.startswith(str(site))
    assert (version, message, config) == ("0.1.0", "mxserve.v1.GemmRequest", "True")
