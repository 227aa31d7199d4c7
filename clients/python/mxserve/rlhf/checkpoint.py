"""Writes a randomly initialized checkpoint directory of an architecture
`mxserve.rlhf.models` supports (GPT-2, Qwen2), for tests and benchmarks: no download.

    python3 -m mxserve.rlhf.checkpoint --arch qwen2 --preset qwen2.5-0.5b --out models/q05 --seed 0
    python3 -m mxserve.rlhf.checkpoint --arch qwen2 --preset tiny --layers 2 --out /tmp/tiny

The directory holds what the experiment's HH-RLHF task loads
(`mxserve.rlhf.tasks.hh_rlhf_task`): config.json (Hugging Face's keys, read back by
`mxserve.rlhf.models.load_pretrained`), model.safetensors (`mxserve.rlhf.safetensors_io`), and
a small byte-level BPE tokenizer (vocab.json, merges.txt, tokenizer_config.json):
every byte, a few English merges and <|endoftext|> as end of text, 262 tokens, which
encodes any text. The model's vocabulary keeps the preset's size (151,936 rows for
Qwen2.5-0.5B), so shapes, memory and time are the real model's; ids past the
tokenizer's are never sampled (the trainer's `vocab_limit`). A real checkpoint
directory brings its own tokenizer.json; this one only stands in for it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from mxserve.rlhf.models import ModelConfig, build_model, save_pretrained
from mxserve.rlhf.tokenizer import ENDOFTEXT, bytes_to_unicode

__all__ = ["PRESETS", "preset_config", "write_checkpoint", "write_tokenizer", "main"]

# Published shapes (the models' own config.json) and small ones for tests.
PRESETS: Dict[str, Dict[str, Dict]] = {
    "qwen2": {
        # Qwen/Qwen2.5-0.5B's config.json: 494,032,768 parameters, tied embeddings.
        "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                             num_kv_heads=2, intermediate_size=4864, max_positions=32768,
                             norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
        "tiny": dict(vocab_size=288, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=64, max_positions=1024, norm_eps=1e-6,
                     rope_theta=10000.0, tie_word_embeddings=True),
    },
    "gpt2": {
        # openai-community/gpt2 (GPT-2 small, 124M).
        "gpt2": dict(vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                     num_kv_heads=12, intermediate_size=3072, max_positions=1024,
                     norm_eps=1e-5, tie_word_embeddings=True),
        "tiny": dict(vocab_size=288, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4,
                     intermediate_size=128, max_positions=1024, norm_eps=1e-5,
                     tie_word_embeddings=True),
    },
}

# The written tokenizer's merges: enough to make a few common words one token.
_MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ s"]
TOKENIZER_SIZE = 256 + len(_MERGES) + 1  # bytes, merges, end of text
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def write_tokenizer(directory: Path | str) -> int:
    """A byte-level BPE tokenizer in `directory` (vocab.json, merges.txt,
    tokenizer_config.json naming <|endoftext|> as end of text and padding);
    returns its size, the end-of-text id being the last."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    for merge in _MERGES:
        vocab["".join(merge.split())] = len(vocab)
    vocab[ENDOFTEXT] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(_MERGES) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT,
         "added_tokens_decoder": {str(vocab[ENDOFTEXT]): {"content": ENDOFTEXT,
                                                          "special": True}}}, indent=2))
    return len(vocab)


def preset_config(arch: str, preset: str, **overrides) -> ModelConfig:
    """A preset's ModelConfig with fields replaced (None leaves the preset's)."""
    if arch not in PRESETS:
        raise ValueError(f"--arch: expected one of {', '.join(PRESETS)}, got {arch!r}")
    if preset not in PRESETS[arch]:
        raise ValueError(f"--preset: {arch} has {', '.join(PRESETS[arch])}, not {preset!r}")
    fields = dict(PRESETS[arch][preset], **{k: v for k, v in overrides.items() if v is not None})
    if arch == "gpt2":
        fields["num_kv_heads"] = fields["num_heads"]
    return ModelConfig(arch=arch, **fields)


def write_checkpoint(directory: Path | str, config: ModelConfig, seed: int = 0,
                     dtype: torch.dtype = torch.bfloat16) -> Path:
    """config.json, model.safetensors (weights N(0, 0.02) as Hugging Face initializes
    them, from torch.manual_seed(seed), stored in `dtype`) and the tokenizer files."""
    directory = Path(directory)
    if config.vocab_size < TOKENIZER_SIZE:
        raise ValueError(f"vocab_size {config.vocab_size}: the written tokenizer has "
                         f"{TOKENIZER_SIZE} tokens, the model needs at least as many rows")
    size = write_tokenizer(directory)
    config.eos_token_id = size - 1
    torch.manual_seed(seed)
    model = build_model(config).to(dtype)
    save_pretrained(model, directory)
    return directory


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m mxserve.rlhf.checkpoint",
        description="Write a randomly initialized checkpoint directory (config.json, "
                    "model.safetensors, a small byte-level BPE tokenizer) that "
                    "mxserve.rlhf.models and the experiment's hh-rlhf task load. For tests and "
                    "benchmarks: the shapes are the preset's, the weights random, and the "
                    f"tokenizer a {TOKENIZER_SIZE}-token stand-in (a real checkpoint "
                    "directory brings its own tokenizer.json).")
    parser.add_argument("--arch", choices=sorted(PRESETS), default="qwen2",
                        help="architecture (default %(default)s)")
    parser.add_argument("--preset", default="tiny",
                        help="qwen2: qwen2.5-0.5b (the published Qwen2.5-0.5B shapes) or tiny; "
                             "gpt2: gpt2 (124M) or tiny (default %(default)s)")
    parser.add_argument("--out", required=True, help="the directory to write (created)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the weights")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="stored dtype (default %(default)s, as Qwen2.5 ships)")
    for flag, field, what in (("--layers", "num_layers", "blocks"),
                              ("--hidden", "hidden_size", "hidden size"),
                              ("--intermediate", "intermediate_size", "MLP width"),
                              ("--heads", "num_heads", "attention heads"),
                              ("--kv-heads", "num_kv_heads", "key/value heads (qwen2)"),
                              ("--vocab", "vocab_size",
                               f"embedding rows (at least {TOKENIZER_SIZE})"),
                              ("--max-positions", "max_positions", "positions")):
        parser.add_argument(flag, dest=field, type=_positive, help=f"{what}: overrides the preset")
    args = parser.parse_args(argv)
    fields = {f: getattr(args, f) for f in ("num_layers", "hidden_size", "intermediate_size",
                                            "num_heads", "num_kv_heads", "vocab_size",
                                            "max_positions")}
    try:
        config = preset_config(args.arch, args.preset, **fields)
        write_checkpoint(args.out, config, args.seed, DTYPES[args.dtype])
    except ValueError as error:
        print(f"mxserve.rlhf.checkpoint: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {args.arch} {config.num_layers} layers, hidden "
          f"{config.hidden_size}, vocab {config.vocab_size}, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
