"""What the experiment trains on: a policy, a reward model and prompts.

Two sources:

- `synthetic_task`: nothing on disk. A small built-in transformer (Qwen2
  architecture) and a preference task generated at run time from a seed. Prompts
  are strings of "word" tokens ending in SEP; each word has a hidden utility, and a
  response's true quality is the mean utility of its words, plus how much of it
  stays on the prompt's words, minus a length penalty. The policy is first trained
  (supervised) on responses from a broad base distribution, so it starts as a
  "base model"; the reward model starts from that policy's body and learns the
  hidden quality from Bradley–Terry preference pairs only, as a real one does.
- `hh_rlhf_task`: a Hugging Face checkpoint directory (GPT-2 or Qwen2/Qwen2.5),
  its tokenizer, and Anthropic HH-RLHF's jsonl files (the fixed 1,000 + 200 subset
  drawn with seed 42). The reward model loads from `reward_checkpoint` (a
  sequence-classification checkpoint: the body and `score.weight`) or is trained
  from the policy checkpoint on the training pairs (Bradley–Terry).

A Task hands out fresh copies of the initial models, so every configuration of a
matrix starts from the very same weights.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from mxserve.rlhf.trainer import RewardModel, left_pad

__all__ = ["Task", "bradley_terry", "hh_rlhf_task", "synthetic_task", "BUILTIN_CONFIG"]

Progress = Callable[[str], None]


@dataclasses.dataclass
class Task:
    name: str
    description: str
    train_prompts: List[List[int]]
    test_prompts: List[List[int]]
    eos_id: int
    pad_id: int
    policy: nn.Module        # the initial policy LM (copied for each configuration)
    reward: RewardModel      # the trained reward model (frozen; copied likewise)
    decode: Callable[[Sequence[int]], str]
    setup: Dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. RM accuracy
    vocab_limit: Optional[int] = None  # ids the tokenizer has (the embedding may have more)
    # The dtype the initial models are held in (see `hold_in`); a new policy is FP32.
    frozen_dtype: torch.dtype = torch.float32

    def new_policy(self) -> nn.Module:
        """A copy of the initial policy in FP32 (it trains)."""
        return copy.deepcopy(self.policy).float()

    def new_reward(self) -> RewardModel:
        """A copy of the reward model, in `frozen_dtype` (it never trains)."""
        return copy.deepcopy(self.reward)

    def hold_in(self, dtype: torch.dtype) -> "Task":
        """Holds the initial policy and the reward model in `dtype` (BF16: half of
        FP32's memory; exact for a checkpoint stored in BF16, as Qwen2.5's is).
        Done after the reward model's training, which stays in FP32."""
        self.policy.to(dtype)
        self.reward.to(dtype)
        self.frozen_dtype = dtype
        return self


def _quiet(_: str) -> None:
    pass


# --- training helpers --------------------------------------------------------------------


def shuffled_batches(items, batch_size: int, generator: torch.Generator):
    """One seeded pass over `items` in batches of `batch_size` (a short last one dropped)."""
    order = torch.randperm(len(items), generator=generator).tolist()
    for start in range(0, len(order) - batch_size + 1, batch_size):
        yield [items[i] for i in order[start:start + batch_size]]


def bradley_terry(reward: RewardModel, pairs: Sequence[Tuple[List[int], List[int], List[int]]],
                  pad_id: int, steps: int, batch_size: int = 32, lr: float = 1e-3,
                  seed: int = 0, progress: Progress = _quiet) -> float:
    """Trains `reward` on (prompt, chosen, rejected) token lists with the
    Bradley–Terry loss −log σ(r(chosen) − r(rejected)); returns the last loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(reward.parameters(), lr=lr, weight_decay=0.0)
    reward.train()
    loss_value, step = float("nan"), 0
    batch_size = min(batch_size, len(pairs))
    while step < steps:
        for batch in shuffled_batches(pairs, batch_size, generator):
            ids, mask = left_pad([p + c for p, c, _ in batch] + [p + r for p, _, r in batch],
                                 pad_id)
            scores = reward(ids, mask)
            chosen, rejected = scores[:len(batch)], scores[len(batch):]
            loss = -F.logsigmoid(chosen - rejected).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(reward.parameters(), 1.0)
            optimizer.step()
            loss_value, step = float(loss), step + 1
            if step % 50 == 0 or step == steps:
                progress(f"reward model: step {step}/{steps}, Bradley-Terry loss {loss_value:.4f}")
            if step >= steps:
                break
    reward.eval()
    return loss_value


@torch.no_grad()
def pairwise_accuracy(reward: RewardModel, pairs, pad_id: int) -> float:
    """Share of (prompt, chosen, rejected) pairs the reward model orders right."""
    ids, mask = left_pad([p + c for p, c, _ in pairs] + [p + r for p, _, r in pairs], pad_id)
    scores = reward(ids, mask)
    return float((scores[:len(pairs)] > scores[len(pairs):]).float().mean())


def _supervised(lm: nn.Module, sequences: List[List[int]], loss_from: List[int], pad_id: int,
                steps: int, batch_size: int, lr: float, seed: int, progress: Progress) -> float:
    """Next-token cross-entropy on each sequence from position loss_from[i] on."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0)
    lm.train()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        rows = torch.randint(len(sequences), (batch_size,), generator=generator).tolist()
        ids, mask = left_pad([sequences[i] for i in rows], pad_id)
        width = ids.shape[1]
        targets = ids[:, 1:].clone()
        keep = mask[:, 1:].clone()
        for row, i in enumerate(rows):  # only the response (and EOS) is learned
            start = width - len(sequences[i]) + loss_from[i]
            keep[row, :max(start - 1, 0)] = 0
        logits = lm(ids, attention_mask=mask).logits[:, :-1]
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 reduction="none").view_as(targets)
        loss = (losses * keep).sum() / keep.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss)
        if step % 100 == 0 or step == steps:
            progress(f"base policy: step {step}/{steps}, loss {loss_value:.4f}")
    lm.eval()
    return loss_value


# --- the synthetic task ------------------------------------------------------------------

PAD, EOS, SEP = 0, 1, 2
FIRST_WORD = 3

# The built-in model: Qwen2's architecture (RMSNorm, rotary positions, grouped-query
# attention, SiLU-gated MLP) at a size that trains in seconds on two cores. Four
# blocks, so "the first and last blocks" are not every block.
BUILTIN_CONFIG = dict(arch="qwen2", vocab_size=32, hidden_size=64, num_layers=4, num_heads=4,
                      num_kv_heads=2, intermediate_size=128, max_positions=64, norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=EOS)


class _SyntheticPreferences:
    """The hidden rule the reward model has to discover from preferences."""

    def __init__(self, vocab_size: int, seed: int):
        self.words = list(range(FIRST_WORD, vocab_size))
        rng = random.Random(seed)
        self.utility = {w: rng.gauss(0.0, 1.0) for w in self.words}
        self.target_length = 5

    def prompt(self, rng: random.Random) -> List[int]:
        return [rng.choice(self.words) for _ in range(rng.randint(3, 6))] + [SEP]

    def response(self, rng: random.Random, prompt: List[int]) -> List[int]:
        """The base distribution: 1-8 words, half of them from the prompt, then EOS."""
        topic = prompt[:-1]
        words = [rng.choice(topic) if rng.random() < 0.5 else rng.choice(self.words)
                 for _ in range(rng.randint(1, 8))]
        return words + [EOS]

    def quality(self, prompt: List[int], response: List[int]) -> float:
        words = [t for t in response if t >= FIRST_WORD]
        if not words:
            return -2.0
        topic = set(prompt)
        on_topic = sum(1 for w in words if w in topic) / len(words)
        return (sum(self.utility[w] for w in words) / len(words) + on_topic
                - 0.15 * abs(len(words) - self.target_length))

    def pairs(self, rng: random.Random, count: int, noisy: bool):
        """(prompt, chosen, rejected): with `noisy`, chosen with Bradley–Terry
        probability σ(3·Δquality), as human labels are; else by quality."""
        out = []
        while len(out) < count:
            prompt = self.prompt(rng)
            a, b = self.response(rng, prompt), self.response(rng, prompt)
            qa, qb = self.quality(prompt, a), self.quality(prompt, b)
            if qa == qb:
                continue
            a_wins = (rng.random() < 1.0 / (1.0 + math.exp(-3.0 * (qa - qb)))) if noisy else qa > qb
            out.append((prompt, a, b) if a_wins else (prompt, b, a))
        return out


def synthetic_task(seed: int = 0, n_train: int = 256, n_test: int = 32,
                   sft_steps: int = 150, reward_steps: int = 100,
                   progress: Progress = _quiet) -> Task:
    """Builds the built-in model and task (deterministic in `seed`)."""
    from mxserve.rlhf.models import ModelConfig, build_model

    task = _SyntheticPreferences(BUILTIN_CONFIG["vocab_size"], seed)
    rng = random.Random(seed + 1)
    torch.manual_seed(seed)
    lm = build_model(ModelConfig(**BUILTIN_CONFIG))

    prompts = [task.prompt(rng) for _ in range(2048)]
    responses = [task.response(rng, p) for p in prompts]
    sft_loss = _supervised(lm, [p + r for p, r in zip(prompts, responses)],
                           [len(p) for p in prompts], PAD, sft_steps, 64, 3e-3, seed, progress)

    torch.manual_seed(seed + 2)
    reward = RewardModel(copy.deepcopy(lm))
    train_pairs = task.pairs(rng, 4096, noisy=True)
    bt_loss = bradley_terry(reward, train_pairs, PAD, reward_steps, batch_size=64, lr=1e-3,
                            seed=seed, progress=progress)
    accuracy = pairwise_accuracy(reward, task.pairs(rng, 512, noisy=False), PAD)
    progress(f"reward model: held-out pairwise accuracy {accuracy:.3f}")

    names = {PAD: "<pad>", EOS: "<eos>", SEP: "|"}
    return Task(
        name="synthetic",
        description=(f"built-in Qwen2-architecture model ({sum(p.numel() for p in lm.parameters()):,} "
                     f"parameters, {BUILTIN_CONFIG['num_layers']} blocks) on a synthetic "
                     f"preference task (seed {seed})"),
        train_prompts=[task.prompt(rng) for _ in range(n_train)],
        test_prompts=[task.prompt(rng) for _ in range(n_test)],
        eos_id=EOS, pad_id=PAD, policy=lm, reward=reward,
        decode=lambda ids: " ".join(names.get(int(t), f"w{int(t)}") for t in ids),
        setup={"base_policy_loss": sft_loss, "reward_bt_loss": bt_loss,
               "reward_pair_accuracy": accuracy})


# --- HH-RLHF with a Hugging Face checkpoint ----------------------------------------------


def hh_rlhf_task(checkpoint: str, data: str, *, reward_checkpoint: Optional[str] = None,
                 n_train: int = 1000, n_test: int = 200, seed: int = 42,
                 max_prompt_tokens: int = 448, reward_steps: int = 200,
                 dtype: torch.dtype = torch.float32, progress: Progress = _quiet) -> Task:
    """The original measurement run's inputs: checkpoint (GPT-2 or Qwen2/2.5),
    HH-RLHF's fixed subset, prompts cut to their last `max_prompt_tokens` tokens."""
    from mxserve.rlhf.hhrlhf import load_hh_rlhf
    from mxserve.rlhf.models import load_pretrained
    from mxserve.rlhf.tokenizer import BPETokenizer

    tokenizer = BPETokenizer.from_pretrained(checkpoint)
    train, test = load_hh_rlhf(data, n_train=n_train, n_test=n_test, seed=seed)
    lm = load_pretrained(checkpoint, dtype=dtype)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"{checkpoint}: the tokenizer names no end-of-text token")

    def prompt_ids(text: str) -> List[int]:
        return tokenizer.encode(text)[-max_prompt_tokens:]

    if reward_checkpoint:
        reward = _load_reward_checkpoint(reward_checkpoint, dtype)
        setup = {}
    else:
        torch.manual_seed(seed)
        reward = RewardModel(copy.deepcopy(lm))
        pairs = [(prompt_ids(p.prompt), tokenizer.encode(p.chosen) + [eos],
                  tokenizer.encode(p.rejected) + [eos]) for p in train]
        loss = bradley_terry(reward, pairs, tokenizer.pad_token_id, reward_steps, batch_size=8,
                             lr=1e-5, seed=seed, progress=progress)
        test_pairs = [(prompt_ids(p.prompt), tokenizer.encode(p.chosen) + [eos],
                       tokenizer.encode(p.rejected) + [eos]) for p in test]
        setup = {"reward_bt_loss": loss,
                 "reward_pair_accuracy": pairwise_accuracy(reward, test_pairs,
                                                           tokenizer.pad_token_id)}
    return Task(
        name="hh-rlhf",
        description=(f"{os.path.basename(os.path.normpath(checkpoint))} on Anthropic HH-RLHF "
                     f"({len(train)} train / {len(test)} test pairs, seed {seed})"),
        train_prompts=[prompt_ids(p.prompt) for p in train],
        test_prompts=[prompt_ids(p.prompt) for p in test],
        eos_id=eos, pad_id=tokenizer.pad_token_id, policy=lm, reward=reward,
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True), setup=setup,
        vocab_limit=tokenizer.vocab_size)


def _load_reward_checkpoint(path: str, dtype: torch.dtype) -> RewardModel:
    """A Hugging Face sequence-classification checkpoint: the body's tensors and
    `score.weight` [1, hidden] (a multi-label head's first row is not guessed at)."""
    from mxserve.rlhf.models import load_pretrained_with_extra

    lm, extra = load_pretrained_with_extra(path, extra=("score.weight",), dtype=dtype)
    score = extra["score.weight"]
    if score.dim() != 2 or score.shape[0] != 1 or score.shape[1] != lm.config.hidden_size:
        raise ValueError(f"{path}: score.weight has shape {list(score.shape)}; expected "
                         f"[1, {lm.config.hidden_size}] (one reward per sequence)")
    reward = RewardModel(lm)
    with torch.no_grad():
        reward.score.weight.copy_(score.to(reward.score.weight.dtype))
    return reward
