"""The examples run to completion against a real daemon, with short settings."""

import pathlib
import re
import subprocess
import sys

import pytest

from conftest import python_env

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(name, daemon, *args):
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "--server", daemon.address,
                           *args], capture_output=True, text=True, timeout=300, env=python_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quickstart(daemon):
    out = run_example("quickstart.py", daemon)
    rows = {m[0]: m for m in re.findall(
        r"^(rollout|reward|update)\s+(\S+)\s+(\S+)\s+(\S+)\s+([0-9.e+-]+)\s+([0-9.]+) µJ$",
        out, re.M)}
    assert set(rows) == {"rollout", "reward", "update"}, out
    # Policy D: first/last blocks one step more precise than the middle one.
    assert rows["rollout"][1:4] == ("MXFP8_E4M3", "MXFP4_E2M1", "MXFP8_E4M3")
    assert rows["update"][1:4] == ("FP32", "FP16", "FP32")
    errors = {phase: float(row[4]) for phase, row in rows.items()}
    assert errors["update"] < 1e-3 < errors["reward"] < errors["rollout"] < 0.5
    assert all(float(row[5]) > 0 for row in rows.values())
    # It cleaned up after itself, and runs again.
    assert "quickstart-mlp" in run_example("quickstart.py", daemon)


def test_train_offloaded(daemon, client):
    pytest.importorskip("torch")
    out = run_example("train_offloaded.py", daemon, "--steps", "3", "--batch", "4",
                      "--new-tokens", "3", "--ppo-epochs", "1")
    steps = re.findall(r"^step\s+(\d+): mean reward ([+-][0-9.]+), loss \S+, weights v(\d+)",
                       out, re.M)
    assert [(int(s), int(v)) for s, _, v in steps] == [(1, 2), (2, 3), (3, 4)], out
    table = {m[0]: m[1:] for m in re.findall(
        r"^(rollout|reward|update)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)}
    assert set(table) == {"rollout", "reward", "update"}, out
    assert all(float(joules) > 0 for _, joules in table.values())
    names = {m.name for m in client.list_models()}
    assert not {"example-policy", "example-reward"} & names  # restored and deleted
