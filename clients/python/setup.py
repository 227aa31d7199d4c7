"""Builds the mxserve package; generates the gRPC stubs first when they are missing
(a checkout where `make build` has not run). Metadata lives in pyproject.toml."""

import pathlib
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


class BuildWithStubs(build_py):
    def run(self):
        if not (HERE / "mxserve" / "v1" / "compute_pb2.py").exists():
            subprocess.run([sys.executable, str(HERE / "gen_stubs.py")], check=True)
            self.distribution.packages = sorted(set(self.distribution.packages or []) |
                                                {"mxserve", "mxserve.v1"})
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
