"""The experiment with --compute local (mxserve.torch.emulator in the trainer's process)
against the daemon path: the same numbers. Its own file, so that ctest runs it
beside test_experiment.py."""

import json

import pytest

pytest.importorskip("torch")

from test_experiment import run_experiment  # noqa: E402  (this directory)

# What a run's quality is made of: the same seed must give these exactly, wherever
# the layers ran.
QUALITY = ("configuration", "seed", "kind", "judge_scores", "reward_scores", "kls", "curves",
           "win_rate", "held_out_reward", "noise_vs_seed", "noise_kls", "work")


def test_the_quick_experiment_computed_locally_equals_the_daemon_path(daemon, tmp_path):
    """--compute local (mxserve.torch.emulator in the trainer's process) against the daemon
    path on a subset of the quick matrix: every score, KL, curve and GEMM the same,
    and the daemon's FPGA-model energy the same (booked through ReportWork)."""
    subset = "INT8-B,MX-D,reward-MXFP8,update-INT8"
    summaries = {}
    for compute in ("daemon", "local"):
        out = tmp_path / compute
        done = run_experiment(daemon, "--quick", "--steps", "2", "--prompts", "16", "--only",
                              subset, "--compute", compute, "--out", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        summaries[compute] = json.loads((out / "summary.json").read_text())
    daemon_runs, local_runs = summaries["daemon"]["runs"], summaries["local"]["runs"]
    assert len(local_runs) == len(daemon_runs) == 12  # 2 seeds x (FP16, untrained, 4)
    for mine, theirs in zip(local_runs, daemon_runs):
        for key in QUALITY:
            mine_value, their_value = mine[key], theirs[key]
            if key == "work":  # run tags differ
                mine_value = [dict(w, run="") for w in mine_value]
                their_value = [dict(w, run="") for w in their_value]
            assert mine_value == their_value, (mine["configuration"], mine["seed"], key)
        for phase, sources in theirs["energy"].items():
            assert mine["energy"][phase].keys() == sources.keys()
            for source, joules in sources.items():
                assert mine["energy"][phase][source] == pytest.approx(joules, rel=1e-9), \
                    (mine["configuration"], phase, source)
    assert summaries["local"]["compute"] == "local" and summaries["daemon"]["compute"] == "daemon"
