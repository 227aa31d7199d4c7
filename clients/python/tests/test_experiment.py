"""The experiment runner end to end against a real daemon: the quick matrix, the
HH-RLHF path on tiny stand-ins written here, the replayed-power baseline, and the
errors that must come before any training."""

import csv
import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from conftest import python_env  # noqa: E402
from mxserve import experiment  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model, save_pretrained  # noqa: E402
from mxserve.rlhf.tokenizer import bytes_to_unicode  # noqa: E402

OUTPUTS = ("results.csv", "runs.csv", "summary.json", "pareto.png", "curves.png", "report.md")


def run_experiment(daemon, *args, timeout=1200):
    return subprocess.run([sys.executable, "-m", "mxserve.experiment", "--server",
                           daemon.address, "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout, env=python_env())


def read_rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


SUBSET = ["INT8-uniform", "INT8-B", "MX-D", "rollout-MXFP4", "update-INT8"]


def test_the_quick_matrix_runs_end_to_end(daemon, tmp_path):
    # The quick experiment's machinery on a subset of its matrix (make experiment runs
    # all of it): two seeds, the untrained row, the noise floor, the phase-alone rows.
    out = tmp_path / "quick"
    done = run_experiment(daemon, "--quick", "--steps", "3", "--only", ",".join(SUBSET),
                          "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name

    rows = {r["configuration"]: r for r in read_rows(out / "results.csv")}
    assert list(rows) == ["FP16", "noise-floor", "untrained", *SUBSET]
    for name, row in rows.items():
        for metric in ("held_out_reward", "win_rate", "kl_vs_fp16"):
            estimate, low, high = (float(row[metric + s]) for s in ("", "_lo", "_hi"))
            assert low <= estimate <= high, (name, metric, low, estimate, high)
        assert int(row["wins"]) + int(row["ties"]) + int(row["losses"]) == \
            int(row["seeds"]) * int(row["prompts"]), name
    for name in ["FP16", *SUBSET]:
        assert float(rows[name]["energy_fpga_model_J"]) > 0
        assert -1 <= float(rows[name]["reward_spearman_lo"]) <= float(rows[name]["reward_spearman"])
    baseline = rows["FP16"]
    assert int(baseline["seeds"]) == 2 and int(baseline["prompts"]) == 64
    # Each seed's baseline against itself: exactly a tie, KL 0, no interval around it.
    assert float(baseline["win_rate_lo"]) == float(baseline["win_rate_hi"]) == 0.5
    assert float(baseline["kl_vs_fp16"]) == 0.0 and float(baseline["energy_saving_pct"]) == 0.0
    # The noise floor: seed 1's baseline against seed 0's, one pair; two trainings
    # differ, so their KL is not zero.
    floor = rows["noise-floor"]
    assert floor["policy"] == "FP16 seed 1 vs 0" and int(floor["seeds"]) == 1
    assert float(floor["kl_vs_fp16"]) > 0
    # INT8 everywhere costs the FPGA model less than FP16 everywhere, in every phase;
    # MXFP4 in the rollout alone saves in the rollout.
    for phase in ("rollout", "reward", "update"):
        assert float(rows["INT8-uniform"][f"energy_saving_{phase}_pct"]) > 10
    assert float(rows["rollout-MXFP4"]["energy_saving_rollout_pct"]) > 10
    # Policy D, as the origin defines it, costs no more than FP16 in any phase.
    for phase in ("rollout", "reward", "update"):
        assert float(rows["MX-D"][f"energy_saving_{phase}_pct"]) >= 0, phase

    summary = json.loads((out / "summary.json").read_text())
    assert summary["task_setup"]["reward_pair_accuracy"] > 0.6
    assert summary["seeds"] == [0, 1] and summary["eval_prompts"] == 64
    assert summary["commit"] and "cores" in summary["machine"]
    # Every run is paired with the FP16 baseline of its own seed, prompt by prompt.
    runs = summary["runs"]
    base = {r["seed"]: r for r in runs if r["configuration"] == "FP16"}
    assert base[1]["noise_vs_seed"] == 0 and len(base[1]["noise_kls"]) == 64
    for run in runs:
        reference = base[run["seed"]]["judge_scores"]
        wins = [1.0 if a > b else 0.5 if a == b else 0.0
                for a, b in zip(run["judge_scores"], reference)]
        assert run["win_rate"] == pytest.approx(sum(wins) / len(wins)), run["run_tag"]
        assert len(run["kls"]) == 64 and len(run["reward_scores"]) == 64
    # Each run's energy, read back by its run tag, is exactly what its responses
    # reported: nothing of the other runs, the profile or the evaluation mixed in.
    tags = set()
    for run in runs:
        tags.add(run["run_tag"])
        assert len(run["curves"]) == (0 if run["kind"] == "untrained" else summary["steps"])
        for phase in ("rollout", "reward", "update"):
            assert run["energy"][phase].get("fpga_model", 0.0) == pytest.approx(
                run["totals"].get(phase, {}).get("model_joules", 0.0), rel=1e-9)
    assert len(tags) == len(runs) == 2 * (len(rows) - 1)
    # The mismatch metrics of every step, in runs.csv too.
    trained = [r for r in runs if r["kind"] == "trained"]
    for run in trained:
        for step in run["curves"]:
            assert 0 < step["rollout_corr/rollout_is_eff_sample_size"] <= 1
    assert "rollout_corr/k3_kl" in read_rows(out / "runs.csv")[0]
    report = (out / "report.md").read_text()
    assert "FPGA-model estimates" in report and "| MX-D |" in report
    assert "seeds 0, 1" in report and "64 held-out prompts" in report
    assert "**Noise floor**" in report and "## Each phase alone" in report
    assert "policy D:" in report and "![Pareto](pareto.png)" in report
    assert any(status in report for status in ("**met**", "**not met**", "**unresolved**"))


def test_a_replayed_power_trace_stands_in_for_the_gpu_baseline(daemon, tmp_path):
    trace = tmp_path / "power.csv"
    trace.write_text("timestamp,watts\n" + "".join(f"{i * 0.05:.2f},{100 + i}\n"
                                                  for i in range(2000)))
    out = tmp_path / "replay"
    done = run_experiment(daemon, "--quick", "--steps", "2", "--seeds", "0", "--only", "MX-A",
                          "--out", str(out), "--power-source", f"replay:{trace}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["configuration"]: r for r in read_rows(out / "results.csv")}
    assert set(rows) == {"FP16", "FP16-cpu", "untrained", "MX-A"}
    assert rows["FP16-cpu"]["energy_label"] == "replayed"
    local = rows["FP16-cpu"]
    assert local["where"] == "local:cpu"
    assert float(local["energy_gpu_baseline_J"]) > 0
    assert local.get("energy_fpga_model_J", "") == ""  # nothing of it ran on the daemon
    assert rows["FP16"].get("energy_gpu_baseline_J", "") == ""
    report = (out / "report.md").read_text()
    # A replayed trace is never called a measurement.
    assert "REPLAYED power trace" in report and "measured on the GPU" not in report


# --- HH-RLHF on tiny stand-ins ------------------------------------------------------------


def write_tokenizer(directory):
    """A byte-level BPE over all 256 byte symbols, a few merges and <|endoftext|>."""
    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a"]
    for merge in merges:
        vocab["".join(merge.split())] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return len(vocab)


def write_checkpoint(directory):
    directory.mkdir()
    vocab = write_tokenizer(directory)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="qwen2", vocab_size=vocab, hidden_size=32, num_layers=2,
                                    num_heads=4, num_kv_heads=2, intermediate_size=48,
                                    max_positions=256, norm_eps=1e-6,
                                    eos_token_id=vocab - 1))
    save_pretrained(model, directory)


def write_hh(directory, pairs=12, bad_line=None):
    directory.mkdir()
    for split, opener in (("train", open), ("test", gzip.open)):
        lines = []
        for i in range(pairs):
            prompt = f"\n\nHuman: what is {i} plus {i}?\n\nAssistant:"
            lines.append(json.dumps({"chosen": prompt + f" it is {2 * i}.",
                                     "rejected": prompt + " the moon."}))
        if bad_line is not None and split == "train":
            lines.insert(bad_line, json.dumps({"rejected": "no chosen here"}))
        name = "train.jsonl" if split == "train" else "test.jsonl.gz"
        with opener(directory / name, "wt") as handle:
            handle.write("\n".join(lines) + "\n")


def hh_config(tmp_path, checkpoint, data, **overrides):
    config = {
        "name": "hh-tiny",
        "task": {"kind": "hh-rlhf", "checkpoint": str(checkpoint), "data": str(data),
                 "n_train": 8, "n_test": 4, "reward_steps": 3, "max_prompt_tokens": 48},
        "ppo": {"steps": 2, "batch_size": 2, "response_length": 4, "learning_rate": 1e-4},
        "seeds": [0, 1],
        "configurations": [{"name": "FP16", "policy": "fp16-baseline"},
                           {"name": "MX-A", "policy": "A-conservative"}],
    }
    config.update(overrides)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_hh_rlhf_with_a_checkpoint_directory_runs_the_matrix(daemon, tmp_path):
    write_checkpoint(tmp_path / "ckpt")
    write_hh(tmp_path / "hh")
    out = tmp_path / "out"
    done = run_experiment(daemon, "--config", str(hh_config(tmp_path, tmp_path / "ckpt",
                                                              tmp_path / "hh")),
                          "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(out / "results.csv")
    assert [r["configuration"] for r in rows] == ["FP16", "noise-floor", "untrained", "MX-A"]
    assert float(rows[0]["win_rate"]) == 0.5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"].startswith("ckpt on Anthropic HH-RLHF (8 train / 4 test pairs, seed 42)")
    assert "Human:" in summary["runs"][0]["examples"][0]["prompt"]


def test_an_rl_searched_configuration_runs_beside_the_others(daemon, tmp_path):
    """kind "rl": mxserve.torch.search on the initial policy's samples (rollout) and
    on the reward model (reward), joined into one policy the runs then train under;
    the searches' cost and result are in summary.json."""
    write_checkpoint(tmp_path / "ckpt")
    write_hh(tmp_path / "hh")
    out = tmp_path / "out"
    rl = {"kind": "rl", "phases": ["rollout", "reward"], "candidates": ["MXFP4", "FP16"],
          "relative_budget": 0.9, "episodes": 2, "seed": 4, "search_seeds": 2}
    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "hh", seeds=[0], configurations=[
        {"name": "FP16", "policy": "fp16-baseline"}, {"name": "RL", "generate": rl}])
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["configuration"]: r for r in read_rows(out / "results.csv")}
    assert rows["RL"]["policy"] == "generated rl" and float(rows["RL"]["energy_fpga_model_J"]) > 0
    summary = json.loads((out / "summary.json").read_text())
    for phase in ("rollout", "reward"):
        search = summary["search"]["RL"][phase]
        assert search["episodes"] == 3 and search["evaluations"] > 0 and search["seconds"] > 0
        assert search["search_joules_modelled"] > 0
        # Two seeds: both reported, the best return kept, the spread their own.
        seeds = search["seeds"]
        assert [s["seed"] for s in seeds] == [4, 5]
        returns = [s["best_return"] for s in seeds]
        assert search["best_return"] == max(returns) and search["seed"] in (4, 5)
        spread = search["best_return_spread"]
        assert spread["min"] == min(returns) and spread["max"] == max(returns)
        assert spread["std"] == pytest.approx(abs(returns[0] - returns[1]) / 2 ** 0.5)
    assert "spearman" in summary["search"]["RL"]["reward"]
    assert "kl" in summary["search"]["RL"]["rollout"]


def _refused_before_training(done, message):
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert "base policy" not in done.stderr and "reward model: step" not in done.stderr


def test_bad_input_is_refused_before_any_training(daemon, tmp_path):
    write_checkpoint(tmp_path / "ckpt")
    write_hh(tmp_path / "hh")
    write_hh(tmp_path / "bad-hh", bad_line=3)
    out = tmp_path / "never"

    config = hh_config(tmp_path, tmp_path / "missing-ckpt", tmp_path / "hh")
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "missing-ckpt")
    assert "not found" in done.stderr

    (tmp_path / "ckpt" / "model.safetensors").rename(tmp_path / "ckpt" / "moved.safetensors")
    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "hh")
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "model.safetensors")
    (tmp_path / "ckpt" / "moved.safetensors").rename(tmp_path / "ckpt" / "model.safetensors")

    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "bad-hh")
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "train.jsonl line 4: expected a JSON object with string "
                                   "fields 'chosen' and 'rejected'")

    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "hh", configurations=[
        {"name": "FP16", "policy": "fp16-baseline"}, {"name": "X", "policy": "no-such-policy"}])
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "configurations[1] (X).policy: the daemon has no policy "
                                   "'no-such-policy'")

    # An inline policy the daemon refuses: its words, not an AttributeError (the
    # runner read a `.details` that MxserveError does not have; issue 33).
    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "hh", configurations=[
        {"name": "FP16", "policy": "fp16-baseline"},
        {"name": "Y", "policy": {"defaults": {"rollout": "MXFP5", "reward": "FP16",
                                              "update": "FP16"}}}])
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "configurations[1] (Y).policy: the daemon refused it: json: "
                                   "policy.defaults.rollout: unknown format 'MXFP5'")
    assert "AttributeError" not in done.stderr

    config = hh_config(tmp_path, tmp_path / "ckpt", tmp_path / "hh", ppo={"stepz": 3})
    done = run_experiment(daemon, "--config", str(config), "--out", str(out))
    _refused_before_training(done, "ppo.stepz: unknown key")
    assert not out.exists()


def test_config_errors_name_the_field():
    with pytest.raises(experiment.ConfigError, match="one must be the FP16 baseline"):
        experiment.load_config({"configurations": [{"name": "A", "policy": "A-conservative"}]})
    with pytest.raises(experiment.ConfigError, match=r"configurations\[1\] \(B\): give exactly one"):
        experiment.load_config({"configurations": [{"name": "F", "policy": "fp16-baseline"},
                                                   {"name": "B"}]})
    with pytest.raises(experiment.ConfigError, match="generate.kind: expected fraction"):
        experiment.load_config({"configurations": [
            {"name": "F", "policy": "fp16-baseline"},
            {"name": "G", "generate": {"kind": "random"}}]})
    for rl, message in (({"episodes": 0}, r"generate.episodes: expected an integer >= 1"),
                        ({"relative_budget": 0}, r"generate.relative_budget: expected a "
                                                 r"positive number"),
                        ({"candidates": ["NF5"]}, r"generate.candidates\[0\]: expected a format"),
                        ({"fraction": 0.5}, r"generate.fraction: unknown key"),
                        ({"budget_bits": 6, "relative_budget": 0.5},
                         r"generate.budget_bits: give a bits budget or a joules budget"),
                        ({"phases": ["warmup"]}, r"generate.phases\[0\]: expected a phase")):
        with pytest.raises(experiment.ConfigError, match=message):
            experiment.load_config({"configurations": [
                {"name": "F", "policy": "fp16-baseline"},
                {"name": "R", "generate": {"kind": "rl", **rl}}]})
    with pytest.raises(experiment.ConfigError, match="task.checkpoint: required"):
        experiment.load_config({"task": {"kind": "hh-rlhf", "data": "x"}})
    # Types are checked too, with the field's path, whatever the file's syntax allows.
    for config, message in (
            ({"ppo": {"batch_size": "8"}}, r"ppo.batch_size: expected an integer, got '8'"),
            ({"ppo": {"adaptive_clip": 1}}, r"ppo.adaptive_clip: expected true or false"),
            ({"eval": {"prompts": 0}}, r"eval.prompts: expected an integer >= 1, got 0"),
            ({"task": {"kind": "synthetic", "seed": "x"}}, r"task.seed: expected an integer"),
            ({"task": [1]}, r"task: expected a table/object, got list"),
            ({"configurations": "abc"}, r"configurations: expected a list of tables")):
        with pytest.raises(experiment.ConfigError, match=message):
            experiment.load_config(config)
    for generate, message in (({"fraction": {"rollut": 0.2}}, r"generate.fraction.rollut: "
                                                                r"expected a phase"),
                              ({"low": "MXFP3"}, r"generate.low: expected a format"),
                              ({"fraction": -0.5}, r"generate.fraction: expected a finite "
                                                   r"number >= 0")):
        with pytest.raises(experiment.ConfigError, match=message):
            experiment.load_config({"configurations": [{"name": "F", "policy": "fp16-baseline"},
                                                       {"name": "G", "generate": generate}]})
    # Seeds: three unless the config says otherwise (two for --quick); the held-out
    # set is the origin's 200 prompts (fewer when the task has fewer).
    loaded = experiment.load_config({})
    assert loaded.seeds == [0, 1, 2] and loaded.eval_prompts == 200
    assert experiment.load_config(dict(experiment.QUICK)).seeds == [0, 1]
    # The rows the runner adds itself are not names a configuration may take.
    with pytest.raises(experiment.ConfigError, match=r"configurations\[1\].name: 'untrained' is "
                                                     r"reserved"):
        experiment.load_config({"configurations": [{"name": "F", "policy": "fp16-baseline"},
                                                   {"name": "untrained", "policy": "A"}]})
    # Each phase alone, in three formats, is part of the default matrix.
    names = [c["name"] for c in experiment.DEFAULT_MATRIX]
    for phase in ("rollout", "reward", "update"):
        for fmt in ("MXFP4", "MXFP8", "INT8"):
            entry = experiment.DEFAULT_MATRIX[names.index(f"{phase}-{fmt}")]
            assert entry["policy"]["defaults"] == {p: fmt if p == phase else "FP16"
                                                   for p in ("rollout", "reward", "update")}
    # The baseline runs first whatever the order in the file.
    loaded = experiment.load_config({"configurations": [
        {"name": "A", "policy": "A-conservative"}, {"name": "F", "policy": "fp16-baseline"}]})
    assert [c.name for c in loaded.configurations] == ["F", "A"]


def test_the_pareto_front():
    # (saving, drop): B beats A on both; C trades more saving for more drop.
    points = [(10.0, 5.0), (20.0, 2.0), (40.0, 8.0), (30.0, 9.0)]
    assert experiment.pareto_front(points) == [1, 2]
