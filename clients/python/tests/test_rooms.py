"""The package's rooms import downward only: experiment → rlhf → torch → mxserve (the
SDK), as mxserve/README.md draws them. Read from the source, so nothing is imported."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mxserve"
# A room's rank: it may import rooms of the same or a lower rank.
RANK = {"mxserve": 0, "mxserve.torch": 1, "mxserve.rlhf": 2, "mxserve.experiment": 3}
# The one exception: `python3 -m mxserve.gpu_baseline` kept at its old name.
ALIASES = {"gpu_baseline.py"}


def room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if ".".join(parts[:2]) in RANK else "mxserve"


def imported(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_room_imports_a_room_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "v1" or relative.name.endswith("_pb2.py") or \
                str(relative) in ALIASES:
            continue
        here = room(".".join(("mxserve",) + relative.parts[:-1]))
        for name in imported(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] == "mxserve" and RANK[room(name)] > RANK[here]:
                upward.append(f"{relative}: {name}")
    assert not upward, "imports pointing up a room:\n" + "\n".join(upward)


def test_the_rooms_check_sees_an_upward_import():
    tree = ast.parse("from mxserve.experiment import run\nimport torch\n")
    names = list(imported(tree))
    assert [n for n in names if RANK[room(n)] > RANK["mxserve.torch"] and
            n.startswith("mxserve")] == ["mxserve.experiment", "mxserve.experiment.run"]
    assert "torch" in names and room("mxserve.torch.offloading") == "mxserve.torch"


def test_import_torch_inside_the_torch_room_is_pytorch():
    import importlib

    for name in ("offloading", "profile", "emulator"):
        module = importlib.import_module(f"mxserve.torch.{name}")
        assert PACKAGE not in pathlib.Path(module.torch.__file__).resolve().parents
        assert hasattr(module.torch, "nn")


def test_the_emulator_imports_without_the_client():
    # bench/gpu_check.py loads the emulator where the gRPC stubs do not import.
    import subprocess
    import sys

    probe = ("import sys, types; sys.modules['mxserve.client'] = None; "
             "p = types.ModuleType('mxserve'); p.__path__ = [sys.argv[1]]; "
             "sys.modules['mxserve'] = p; from mxserve.torch import emulator; print('ok')")
    done = subprocess.run([sys.executable, "-c", probe, str(PACKAGE)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
