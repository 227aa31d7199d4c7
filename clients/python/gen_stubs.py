#!/usr/bin/env python3
"""Generates the mxserve package's gRPC stubs from the repository's .proto files.

Writes mxserve/v1/*_pb2.py and *_pb2_grpc.py (the API, mxserve.v1) and
mxserve/_health_pb2.py (grpc.health.v1 messages) next to this script, using
Debian's `protoc` and `grpc_python_plugin`. `make build` runs it through CMake;
setup.py runs it when the stubs are missing, so `pip install clients/python`
works from a fresh checkout too. Standard library only.
"""

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
API_PROTOS = ["common", "compute", "models", "policies", "profiles", "telemetry"]


def generate(proto_dir: pathlib.Path, package_dir: pathlib.Path, protoc: str,
             plugin: str) -> None:
    for tool in (protoc, plugin):
        if shutil.which(tool) is None:
            sys.exit(f"gen_stubs: '{tool}' not found; install protobuf-compiler and "
                     "protobuf-compiler-grpc (make deps)")
    with tempfile.TemporaryDirectory() as scratch:
        out = pathlib.Path(scratch)
        api = [f"mxserve/v1/{name}.proto" for name in API_PROTOS]
        subprocess.run([protoc, f"--proto_path={proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}", f"--plugin=protoc-gen-grpc_python={shutil.which(plugin)}",
                        *api], check=True)
        # health.proto imports nothing, so its module may live under another name;
        # its own path (grpc/health/v1) would shadow the grpc library.
        subprocess.run([protoc, f"--proto_path={proto_dir}", f"--python_out={out}",
                        "grpc/health/v1/health.proto"], check=True)

        target = package_dir / "v1"
        staged = package_dir / ".v1.new"
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(out / "mxserve" / "v1", staged)
        (staged / "__init__.py").write_text(
            '"""mxserve.v1 messages and stubs, generated from proto/ by gen_stubs.py."""\n')
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
        shutil.copyfile(out / "grpc" / "health" / "v1" / "health_pb2.py",
                        package_dir / "_health_pb2.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", type=pathlib.Path, default=REPO / "proto",
                        help="root of mxserve/v1/*.proto and grpc/health/v1/health.proto "
                        "(default: the repository's proto/)")
    parser.add_argument("--package-dir", type=pathlib.Path, default=HERE / "mxserve",
                        help="the mxserve package directory to write into")
    parser.add_argument("--protoc", default="protoc")
    parser.add_argument("--grpc-python-plugin", default="grpc_python_plugin")
    args = parser.parse_args()
    generate(args.proto_dir, args.package_dir, args.protoc, args.grpc_python_plugin)


if __name__ == "__main__":
    main()
