"""A fuzz smoke for the experiment's file parsers: seeded random mutations of valid
inputs (bytes flipped, inserted, deleted, truncated) must either parse or raise the
documented ValueError naming the file; any other exception is a bug. The same
mutations every run, so a failure reproduces; a few hundred cases per parser."""

import gzip
import json
import random

import pytest

torch = pytest.importorskip("torch")

from mxserve import experiment  # noqa: E402
from mxserve.rlhf.hhrlhf import read_hh_rlhf  # noqa: E402
from mxserve.rlhf.safetensors_io import read_safetensors, write_safetensors  # noqa: E402
from mxserve.rlhf.tokenizer import BPETokenizer, bytes_to_unicode  # noqa: E402

CASES = 300


def mutations(data: bytes, seed: int, count: int = CASES):
    """`count` mutants of `data`: 1-4 edits each of flip, insert, delete, truncate."""
    rng = random.Random(seed)
    for _ in range(count):
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            edit = rng.randrange(4)
            at = rng.randrange(len(out) + 1)
            if edit == 0 and out:
                out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
            elif edit == 1:
                out[at:at] = bytes([rng.randrange(256)])
            elif edit == 2 and out:
                del out[min(at, len(out) - 1)]
            else:
                del out[at:]
        yield bytes(out)


def test_safetensors_reader(tmp_path):
    path = tmp_path / "seed.safetensors"
    write_safetensors(path, {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                             "b": torch.ones(3, dtype=torch.bfloat16)}, {"format": "pt"})
    seed = path.read_bytes()
    parsed = 0
    for mutant in mutations(seed, 1):
        path.write_bytes(mutant)
        try:
            read_safetensors(path)
            parsed += 1
        except ValueError as error:
            assert str(path) in str(error) or path.name in str(error), error
    assert parsed < CASES  # the mutations do reach the checks


def test_hh_rlhf_reader(tmp_path):
    lines = [json.dumps({"chosen": f"\n\nHuman: q{i}\n\nAssistant: yes {i}",
                         "rejected": f"\n\nHuman: q{i}\n\nAssistant: no"}) for i in range(4)]
    seed = ("\n".join(lines) + "\n").encode()
    for index, mutant in enumerate(mutations(seed, 2)):
        path = tmp_path / (f"{index}.jsonl.gz" if index % 5 == 0 else f"{index}.jsonl")
        path.write_bytes(gzip.compress(mutant) if index % 5 == 0 else mutant)
        try:
            read_hh_rlhf(path)
        except ValueError as error:
            assert path.name in str(error), error


def test_tokenizer_files(tmp_path):
    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    vocab.update({"Ġt": 256, "he": 257, "<|endoftext|>": 258})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    merges_seed = b"#version: 0.2\n\xc4\xa0 t\nh e\n"
    for mutant in mutations(merges_seed, 3):
        (tmp_path / "merges.txt").write_bytes(mutant)
        try:
            tokenizer = BPETokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
        except ValueError as error:
            assert "merges.txt" in str(error), error
            continue
        assert tokenizer.decode(tokenizer.encode("the tea")) == "the tea"


def test_experiment_config(tmp_path):
    seed = json.dumps({"name": "x", "task": {"kind": "synthetic", "seed": 1},
                       "ppo": {"steps": 2, "batch_size": 4}, "seeds": [0, 1],
                       "configurations": [{"name": "F", "policy": "fp16-baseline"},
                                          {"name": "G", "generate": {"kind": "fraction",
                                                                     "fraction": 0.5}}]}).encode()
    path = tmp_path / "config.json"
    for mutant in mutations(seed, 4):
        path.write_bytes(mutant)
        try:
            experiment.load_config(str(path))
        except experiment.ConfigError:
            pass


def test_energy_model_file(tmp_path):
    # The shipped parameter file with its ranges: a mutant either loads (and then
    # prices a GEMM to a finite, positive number) or is refused naming the file.
    from mxserve import energy_model

    seed = energy_model.DEFAULT_PATH.read_bytes()
    path = tmp_path / "energy_model.json"
    parsed = 0
    for mutant in mutations(seed, 5):
        path.write_bytes(mutant)
        try:
            params = energy_model.load_energy_model(path)
        except energy_model.EnergyModelError as error:
            assert path.name in str(error), error
            continue
        parsed += 1
        joules = energy_model.estimate_gemm(params, "MXFP4_E2M1", "FP16", 8, 896, 896).joules
        assert joules > 0 and joules == joules and joules != float("inf")
    assert 0 < parsed < CASES  # most edits in a 4 KiB file hit a string; some hit a check
