"""Anthropic's HH-RLHF preference data (github.com/anthropics/hh-rlhf), read from its
.jsonl(.gz) files into (prompt, chosen, rejected) triples.

Each line holds two full transcripts, "chosen" and "rejected", that share the
conversation and differ in the assistant's last answer:

    {"chosen":   "\\n\\nHuman: Hi\\n\\nAssistant: Hello! How can I help?",
     "rejected": "\\n\\nHuman: Hi\\n\\nAssistant: Go away."}

The prompt is the transcripts' longest common prefix cut back to end right after its
last "\\n\\nAssistant:", so both responses hold the assistant's whole final answer
(here " Hello! How can I help?" and " Go away.").

The recipe of the experiment's measurement run: `load_hh_rlhf(directory)` draws
1,000 train and 200 test pairs, each split on its own with
`random.Random(42).sample(range(len(pairs)), n)`, in that sampled order.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

ASSISTANT = "\n\nAssistant:"


@dataclass(frozen=True)
class PreferencePair:
    """A conversation and two answers to it; chosen is the one people preferred."""
    prompt: str
    chosen: str
    rejected: str


def split_pair(chosen: str, rejected: str) -> PreferencePair:
    """The shared prompt and the two responses of two full transcripts. Without an
    "\\n\\nAssistant:" in the common prefix, the prompt is the whole common prefix."""
    common = os.path.commonprefix([chosen, rejected])
    cut = common.rfind(ASSISTANT)
    prompt = common[:cut + len(ASSISTANT)] if cut >= 0 else common
    return PreferencePair(prompt, chosen[len(prompt):], rejected[len(prompt):])


def read_hh_rlhf(path: os.PathLike | str) -> List[PreferencePair]:
    """Every pair of a .jsonl or .jsonl.gz file, in file order; blank lines are
    skipped. A line that is not a JSON object with string fields "chosen" and
    "rejected" raises ValueError naming the file and the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    pairs = []
    with opener(path, "rb") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                text = line.decode("utf-8")
                if not text.strip():
                    continue
                record = json.loads(text)
            except ValueError:  # bad UTF-8 or bad JSON
                record = None
            if not (isinstance(record, dict) and isinstance(record.get("chosen"), str)
                    and isinstance(record.get("rejected"), str)):
                raise ValueError(f"{path} line {number}: expected a JSON object with string "
                                 "fields 'chosen' and 'rejected'")
            pairs.append(split_pair(record["chosen"], record["rejected"]))
    return pairs


def _split_file(directory: Path, split: str) -> Path:
    """train.jsonl, else train.jsonl.gz (as the hh-rlhf repository ships it)."""
    candidates = [directory / f"{split}.jsonl", directory / f"{split}.jsonl.gz"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{directory}: neither {candidates[0].name} nor "
                            f"{candidates[1].name} found (HH-RLHF's {split} split)")


def load_hh_rlhf(directory: os.PathLike | str, n_train: int = 1000, n_test: int = 200,
                 seed: int = 42) -> Tuple[List[PreferencePair], List[PreferencePair]]:
    """A fixed subset of HH-RLHF: n_train pairs of train.jsonl[.gz] and n_test of
    test.jsonl[.gz] in `directory`, each split drawn on its own with
    random.Random(seed).sample(range(len(pairs)), min(n, len(pairs))), in that
    sampled order. The measurement run uses the defaults, 1,000 + 200 with seed 42.

    Both files are read and checked before anything is drawn; a missing file raises
    FileNotFoundError, a split without pairs ValueError.
    """
    directory = Path(directory)
    files = [_split_file(directory, split) for split in ("train", "test")]
    splits = [read_hh_rlhf(file) for file in files]
    for file, pairs in zip(files, splits):
        if not pairs:
            raise ValueError(f"{file}: no preference pairs")

    def draw(pairs: List[PreferencePair], n: int) -> List[PreferencePair]:
        indices = random.Random(seed).sample(range(len(pairs)), min(n, len(pairs)))
        return [pairs[i] for i in indices]

    return draw(splits[0], n_train), draw(splits[1], n_test)
