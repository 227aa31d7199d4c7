"""Builds the mxserve package. A checkout where `make build` has not run lacks the
generated gRPC stubs: they are generated here first, before setuptools looks for
packages. Metadata lives in pyproject.toml."""

import pathlib
import subprocess
import sys

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent

if not (HERE / "mxserve" / "v1" / "compute_pb2.py").exists():
    subprocess.run([sys.executable, str(HERE / "gen_stubs.py")], check=True)

setup()
