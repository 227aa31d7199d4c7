"""The seeds' run at toy scale: the checkpoint tool, the preflight estimator, the
shipped seeds config end to end through a real daemon, and a resumed run that ends
where an uninterrupted one does."""

import dataclasses
import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from conftest import python_env  # noqa: E402
from mxserve import experiment  # noqa: E402
from mxserve.experiment import preflight  # noqa: E402
from mxserve.experiment.state import ResumeError  # noqa: E402
from mxserve.rlhf import checkpoint, tasks  # noqa: E402
from mxserve.rlhf.models import build_model  # noqa: E402
from mxserve.rlhf.safetensors_io import read_safetensors  # noqa: E402


def write_hh(directory, pairs=12):
    directory.mkdir()
    for split, opener in (("train.jsonl", open), ("test.jsonl.gz", gzip.open)):
        with opener(directory / split, "wt") as handle:
            for i in range(pairs):
                prompt = f"\n\nHuman: what is {i} plus {i}?\n\nAssistant:"
                handle.write(json.dumps({"chosen": prompt + f" it is {2 * i}.",
                                         "rejected": prompt + " the moon."}) + "\n")


# --- the checkpoint tool ---------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_a_written_checkpoint_loads_through_the_task_loader_unchanged(tmp_path, arch):
    out = tmp_path / "ckpt"
    assert checkpoint.main(["--arch", arch, "--preset", "tiny", "--layers", "3", "--out",
                            str(out), "--seed", "7"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["torch_dtype"] == "bfloat16"
    assert config["n_layer" if arch == "gpt2" else "num_hidden_layers"] == 3
    write_hh(tmp_path / "hh")
    task = tasks.hh_rlhf_task(str(out), str(tmp_path / "hh"), n_train=4, n_test=2,
                              reward_steps=1)
    stored = read_safetensors(out / "model.safetensors")
    loaded = task.policy.state_dict()
    transposed = task.policy.hf_transposed
    assert set(stored) == set(loaded) - {"lm_head.weight"}  # tied: the file omits it
    for name, tensor in stored.items():
        mine = loaded[name].t() if name.endswith(transposed) else loaded[name]
        assert torch.equal(tensor.float(), mine), name
    # The stand-in tokenizer encodes any text and ends it with its own end of text.
    assert task.eos_id == checkpoint.TOKENIZER_SIZE - 1 == config["eos_token_id"]
    assert task.vocab_limit == checkpoint.TOKENIZER_SIZE
    assert "Human:" in task.decode(task.train_prompts[0])
    # Same seed, same weights; another seed, others.
    again = tmp_path / "again"
    checkpoint.main(["--arch", arch, "--layers", "3", "--out", str(again), "--seed", "7",
                     "--dtype", "fp32"])
    other = read_safetensors(again / "model.safetensors")
    assert all(torch.equal(other[n].bfloat16(), t) for n, t in stored.items())


def test_the_qwen_preset_carries_the_published_config():
    config = checkpoint.preset_config("qwen2", "qwen2.5-0.5b")
    hf = config.to_hf()
    assert (hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"],
            hf["num_key_value_heads"], hf["intermediate_size"], hf["vocab_size"]) == \
        (896, 24, 14, 2, 4864, 151936)
    assert hf["tie_word_embeddings"] and hf["rope_theta"] == 1e6 and hf["rms_norm_eps"] == 1e-6
    assert hf["max_position_embeddings"] == 32768
    assert preflight.parameter_count(config) == 494_032_768  # Qwen2.5-0.5B's 0.49B
    assert preflight.parameter_count(checkpoint.preset_config("gpt2", "gpt2")) == 124_439_808
    with pytest.raises(ValueError, match="--preset: qwen2 has qwen2.5-0.5b, tiny"):
        checkpoint.preset_config("qwen2", "gpt2")


# --- the preflight ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_parameter_counts_match_the_built_models(arch):
    for tied in (True, False):
        config = checkpoint.preset_config(arch, "tiny")
        config.tie_word_embeddings = tied
        model = build_model(config)
        assert preflight.parameter_count(config) == sum(p.numel() for p in model.parameters())
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert preflight.linear_parameters(config) == sum(
            m.weight.numel() + (m.bias.numel() if m.bias is not None else 0) for m in linears)


def test_the_estimate_of_the_seeds_run_on_known_shapes():
    config = checkpoint.preset_config("qwen2", "qwen2.5-0.5b")
    p, v = 494_032_768, 151_936
    shape = preflight.Shape(batch_size=8, prompt_tokens=256, response_tokens=256,
                            eval_batch_size=8, frozen_bytes=2, steps=100, runs=60,
                            untrained_runs=3)
    est = preflight.estimate(config, shape)
    update = est.transients["update"]
    # The vocabulary projection: 8 × 512 × 151,936 FP32 logits and their gradient.
    assert update["logits and their gradient (FP32)"] == 2 * 8 * 512 * v * 4 == 4_978_638_848
    assert update["log-softmax of the response (FP32)"] == 4 * 8 * 256 * v * 4
    assert update["activations"] == 24 * 8 * 512 * (10 * 896 + 4 * 4864 + 2 * 14 * 512) * 4
    assert est.client["Adam states (2 × FP32)"] == p * 8
    assert est.client["reference (frozen)"] == p * 2  # BF16
    assert est.client["task: initial policy and reward model"] == 2 * p * 2
    assert est.peak_transient[0] == "update"
    assert est.host_bytes == sum(est.client.values()) + sum(update.values())
    # The daemon holds five models' linear weights, 6 bytes each.
    linear = p - v * 896 - (2 * 896 * 24 + 896) + v * 896
    assert preflight.linear_parameters(config) == linear
    assert est.daemon_bytes == 6 * (3 * linear + 2 * (linear - v * 896 + 896))
    # Time: rollout, reward, reference and learner forwards, 4 epochs of training.
    assert est.flops_per_step == 2 * linear * 8 * 512 * 4 + 6 * linear * 8 * 512 * 4
    # Local compute uploads nothing; on a GPU the trainer's models live there.
    local = preflight.estimate(config, shape, compute="local", device="cuda")
    assert local.daemon_bytes == 0 and local.gpu_bytes > local.host_bytes
    assert local.host_bytes == est.client["task: initial policy and reward model"]
    text = est.render()
    assert "494,032,768 parameters" in text and "peak transient (update)" in text


def test_what_does_not_fit_is_refused_naming_the_setting(tmp_path):
    config = checkpoint.preset_config("qwen2", "qwen2.5-0.5b")
    shape = preflight.Shape(batch_size=8, prompt_tokens=256, response_tokens=256)
    est = preflight.estimate(config, shape)
    problems = est.check(preflight.Available(host=16 << 30, daemon=8 << 30))
    assert len(problems) == 2
    assert problems[0].startswith("host memory: the estimate is") and "16.00 GiB is available" \
        in problems[0]
    for setting in ("ppo.response_length", "ppo.batch_size", 'task.frozen_dtype = "bf16"',
                    "--compute local"):
        assert setting in problems[0], setting
    assert "mxserved --weight-memory-bytes" in problems[1]
    assert est.check(preflight.Available(host=1 << 50, daemon=1 << 50)) == []
    gpu = preflight.estimate(config, dataclasses.replace(shape, frozen_bytes=2), "local", "cuda")
    (problem,) = gpu.check(preflight.Available(host=1 << 50, gpu=24 << 30))
    assert problem.startswith("GPU memory") and "frozen_dtype" not in problem
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    assert preflight.available_memory(meminfo=str(meminfo)).host == 2 << 20
    assert preflight.parse_bytes("8G") == 8 << 30 and preflight.parse_bytes("512M") == 512 << 20


def test_the_command_line_refuses_before_training(tmp_path, capsys):
    ckpt, hh = tmp_path / "ckpt", tmp_path / "hh"
    checkpoint.main(["--out", str(ckpt)])
    write_hh(hh)
    args = ["--config", "seeds", "--checkpoint", str(ckpt), "--data", str(hh),
            "--server", "127.0.0.1:1"]
    # The shipped config's paths are relative; a missing one is named with its sources.
    assert experiment.main(["--config", "seeds", "--preflight-only", "--data", str(hh)]) == 2
    assert "task.checkpoint: models/Qwen2.5-0.5B-Instruct not found (from the config); set " \
           "it in the config's [task], with --checkpoint or with $MXSERVE_CHECKPOINT" in \
           capsys.readouterr().err
    assert experiment.main([*args, "--preflight-only"]) == 0
    assert "preflight: 27,936 parameters" in capsys.readouterr().out
    assert experiment.main([*args, "--preflight-only", "--daemon-weight-memory", "1K"]) == 2
    assert "mxserved weight memory" in capsys.readouterr().err
    assert experiment.main([*args, "--device", "cuda", "--compute", "daemon", "--out", "x"]) == 2
    assert "--device cuda with --compute daemon" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert experiment.main([*args, "--out", str(tmp_path / "full")]) == 2
    assert "is not empty (it holds files): --resume continues the run there, --overwrite " \
           "starts over" in capsys.readouterr().err
    assert experiment.main([*args, "--out", str(tmp_path / "full"), "--resume"]) == 2
    assert "holds no resumable run" in capsys.readouterr().err


# --- the seeds' config end to end ------------------------------------------------------


def test_the_seeds_config_runs_end_to_end_at_toy_scale(daemon, tmp_path):
    ckpt, hh, out = tmp_path / "ckpt", tmp_path / "hh", tmp_path / "out"
    checkpoint.main(["--out", str(ckpt)])
    write_hh(hh)
    done = subprocess.run(
        [sys.executable, "-m", "mxserve.experiment", "--server", daemon.address, "--config",
         "seeds", "--checkpoint", str(ckpt), "--steps", "2", "--seeds", "0,1", "--prompts",
         "4", "--response-length", "4", "--batch-size", "2", "--prompt-length", "32",
         "--only", "MX-A", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env=python_env(MXSERVE_HH_RLHF=str(hh)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preflight: 27,936 parameters, batch 2, 32 + 4 tokens" in done.stderr
    rows = {r.split(",")[0] for r in (out / "results.csv").read_text().splitlines()[1:]}
    assert rows == {"FP16", "noise-floor", "untrained", "MX-A"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "seeds" and summary["compute"] == "daemon"
    assert summary["frozen_dtype"] == "bfloat16" and summary["eval_prompts"] == 4
    assert summary["ppo"]["batch_size"] == 2 and summary["ppo"]["response_length"] == 4
    assert summary["task"].startswith("ckpt on Anthropic HH-RLHF (12 train / 12 test pairs")
    assert len(summary["runs"]) == 6 and not (out / "state" / "baseline.safetensors").exists()
    assert "compute `daemon`" in (out / "report.md").read_text()


# --- resuming --------------------------------------------------------------------------

QUALITY = ("configuration", "seed", "kind", "judge_scores", "reward_scores", "kls", "curves",
           "win_rate", "held_out_reward", "noise_vs_seed", "noise_kls")


class Interrupted(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_same_results(client, tmp_path):
    exp = experiment.load_config({
        "name": "resume", "seeds": [0, 1], "eval": {"prompts": 6},
        "task": {"kind": "synthetic", "n_train": 32, "n_test": 6},
        "ppo": {"steps": 2, "batch_size": 4, "response_length": 4},
        "configurations": [{"name": "FP16", "policy": "fp16-baseline"},
                           experiment.DEFAULT_MATRIX[1]]})  # INT8-uniform, put inline
    task = tasks.synthetic_task(seed=0, n_train=32, n_test=6, sft_steps=10, reward_steps=5)
    whole = experiment.run_experiment(client, exp, str(tmp_path / "whole"), task=task)

    out = str(tmp_path / "resumed")

    def stop_after_four(index, result):
        if index == 4:  # seed 1's baseline done: the judges must get it back
            raise Interrupted

    with pytest.raises(Interrupted):
        experiment.run_experiment(client, exp, out, task=task, on_job_done=stop_after_four)
    assert len(list((tmp_path / "resumed" / "state" / "runs").iterdir())) == 4
    with pytest.raises(ResumeError, match="is not empty"):
        experiment.run_experiment(client, exp, out, task=task)
    other = dataclasses.replace(exp, steps=3)
    with pytest.raises(ResumeError, match=r"another experiment \(differs in: steps\)"):
        experiment.run_experiment(client, other, out, task=task, resume=True)
    ran = []
    resumed = experiment.run_experiment(client, exp, out, task=task, resume=True,
                                        on_job_done=lambda index, _: ran.append(index))
    assert ran == [5, 6] and resumed["resumed"]
    assert len({r["run_tag"].split("/")[0] for r in resumed["runs"]}) == 1  # one run's tag
    for mine, theirs in zip(resumed["runs"], whole["runs"], strict=True):
        for key in QUALITY:
            assert mine[key] == theirs[key], (mine["configuration"], mine["seed"], key)
        assert [dict(w, run="") for w in mine["work"]] == [dict(w, run="") for w in theirs["work"]]
    assert [r["win_rate"] for r in resumed["configurations"]] == \
        [r["win_rate"] for r in whole["configurations"]]


def test_a_repeated_seed_is_refused():
    # --seeds 0,0 ran the same run twice under one run tag: its energy booked
    # twice, and a noise floor of "seed 0 vs 0" (a black-box test).
    from mxserve.experiment.config import ConfigError, check_seeds
    assert check_seeds("--seeds", [0, 1, 2]) == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"--seeds: each seed may appear once; \[0, 2\] repeated "
                                          r"in \[0, 2, 1, 0, 2\]"):
        check_seeds("--seeds", [0, 2, 1, 0, 2])


def test_device_and_power_source_are_checked_before_the_preflight(tmp_path, capsys):
    # --device tpu passed the preflight and died in torch with --out written;
    # --power-source foo the same in open_power_source; with --preflight-only
    # both exited 0 (a black-box test).
    replay = tmp_path / "trace.csv"
    replay.write_text("t,watts\n")
    for flags, message in (
            (["--device", "tpu"], "--device: expected cpu, cuda or cuda:N, got 'tpu'"),
            (["--device", "cuda:x"], "--device: expected cpu, cuda or cuda:N, got 'cuda:x'"),
            (["--device", "cuda:"], "--device: expected cpu, cuda or cuda:N, got 'cuda:'"),
            (["--power-source", "foo"],
             "--power-source: expected 'nvml', 'nvml:INDEX' or 'replay:FILE', got 'foo'"),
            (["--power-source", "nvml:a"], "--power-source: expected nvml:INDEX"),
            (["--power-source", f"replay:{tmp_path}/none.csv"],
             f"--power-source: the replay file '{tmp_path}/none.csv' is not a file")):
        for mode in (["--preflight-only"], ["--out", str(tmp_path / "out")]):
            assert experiment.main(["--quick", *mode, *flags]) == 2, flags
            assert message in capsys.readouterr().err
            assert not (tmp_path / "out").exists()
    assert experiment.main(["--quick", "--preflight-only", "--power-source",
                            f"replay:{replay}"]) == 0
