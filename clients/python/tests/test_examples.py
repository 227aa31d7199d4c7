"""The examples run to completion against a real daemon, with short settings."""

import csv
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
    # Policy D on the built-in ranking (blocks.1, blocks.0, blocks.2 most tolerant
    # first): 80 % = 2 layers low in rollout and reward, 20 % = 1 in the update.
    assert rows["rollout"][1:4] == ("MXFP4_E2M1", "MXFP4_E2M1", "MXFP8_E4M3")
    assert rows["reward"][1:4] == ("MXFP8_E4M3", "MXFP8_E4M3", "FP16")
    assert rows["update"][1:4] == ("FP16", "MXFP8_E4M3", "FP16")
    errors = {phase: float(row[4]) for phase, row in rows.items()}
    assert 0 < errors["update"] < errors["reward"] < errors["rollout"] < 0.5
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


def test_profile_policies(daemon, client, tmp_path):
    pytest.importorskip("torch")
    out = run_example("profile_policies.py", daemon, "--out", str(tmp_path), "--batches", "2")
    with open(tmp_path / "sensitivity_matrix.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0][:3] == ["layer", "format", "out_features"]
    assert len(rows) == 1 + 8 * 13, out  # 8 layers × the daemon's 13 default formats
    lines = re.findall(r"^profile-example-(\S+)\s+(rollout|reward|update)\s+(.+?)\s+"
                       r"([+-][0-9.]+)%$", out, re.M)
    table = {(policy, phase): (formats.split(), float(energy))
             for policy, phase, formats, energy in lines}
    low = {key: sum(int(f.split("×")[1]) for f in formats if f.startswith("MXFP4"))
           for key, (formats, _) in table.items()}
    # round(fraction × 8 layers) in MXFP4 per generated phase.
    expected = {("A", "rollout"): 2, ("A", "reward"): 2, ("B", "rollout"): 4,
                ("B", "reward"): 4, ("C", "rollout"): 6, ("C", "reward"): 6,
                ("D", "rollout"): 6, ("D", "reward"): 4, ("D", "update"): 2}
    assert {key: low[key] for key in expected} == expected, out
    for policy in "ABC":  # update is not generated: all FP16, when listed at all
        assert table.get((policy, "update"), (["FP16×8"], 0.0)) == (["FP16×8"], 0.0)
    for phase in ("rollout", "reward", "update"):
        assert table[("half-energy", phase)][1] <= -49.95, out  # at most half FP16's energy
    assert re.search(r"^most sensitive to MXFP4 \(Fisher\): blocks\.1\.fc2,", out, re.M), out
    assert (tmp_path / "sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out
    # It cleaned up after itself.
    assert "profile-example" not in {m.name for m in client.list_models()}
    assert not {p.name for p in client.list_policies()} & {
        f"profile-example-{p}" for p in ("A", "B", "C", "D", "half-energy")}
