#!/usr/bin/env python3
"""A PPO-style RLHF loop whose linear layers all run on mxserved.

A small decoder-only transformer (defined below) is the policy; a second, frozen
one with a scalar head is the reward model. Each step:

  rollout  the policy samples continuations of random prompts (token by token),
  reward   the reward model scores prompt + continuation,
  update   a clipped policy-gradient (PPO) loss with group-normalised advantages,
           loss.backward() through Compute.LayerBackward, then optimizer.step()
           and session.sync_weights() to publish the new weights.

Every nn.Linear of both models is offloaded with mxserve.torch.offload, so the
formats come from the daemon's policy per (phase, layer). At the end it prints
the mean reward per step and, per phase, the wall time spent here and the energy
the daemon accounted (the FPGA model's estimate, and measured sources if any).

    make run                                             # in one terminal
    /usr/bin/python3 clients/python/examples/train_offloaded.py --steps 10
"""

import argparse
import math
import pathlib
import sys
import time
from collections import defaultdict

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
import mxserve  # noqa: E402
from mxserve.torch import offload  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.o_proj = nn.Linear(width, width)
        self.up_proj = nn.Linear(width, 4 * width)
        self.down_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        batch, length, width = x.shape
        h = self.norm1(x)

        def split(t):
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)
        attention = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + self.o_proj(attention.transpose(1, 2).reshape(batch, length, width))
        return x + self.down_proj(nn.functional.gelu(self.up_proj(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token and position embeddings, `depth` blocks, and a linear head."""

    def __init__(self, vocab, width, depth, heads, context, outputs):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, outputs)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def sample(policy, prompts, new_tokens):
    """Autoregressive sampling; returns the sequences and each new token's log-prob."""
    tokens, logprobs = prompts, []
    for _ in range(new_tokens):
        logits = policy(tokens)[:, -1].float()
        distribution = torch.distributions.Categorical(logits=logits)
        token = distribution.sample()
        logprobs.append(distribution.log_prob(token))
        tokens = torch.cat([tokens, token[:, None]], dim=1)
    return tokens, torch.stack(logprobs, dim=1)


def token_logprobs(policy, tokens, new_tokens):
    logits = policy(tokens[:, :-1])[:, -new_tokens:].float()
    return torch.distributions.Categorical(logits=logits).log_prob(tokens[:, -new_tokens:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=mxserve.DEFAULT_ADDRESS)
    mxserve.security.add_connection_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--prompt-tokens", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--policy", default="", help="mxserve policy (default: the daemon's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    vocab, context = 64, args.prompt_tokens + args.new_tokens
    policy = TinyTransformer(vocab, width=64, depth=4, heads=4, context=context, outputs=vocab)
    reward_model = TinyTransformer(vocab, width=64, depth=2, heads=4, context=context,
                                   outputs=1).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)

    client = mxserve.Client(args.server, **mxserve.security.connection_kwargs(args))
    client.wait_ready(timeout=10)
    energy_before = client.energy_report()
    seconds = defaultdict(float)
    rewards = []
    with offload(policy, client, name="example-policy", policy=args.policy,
                 replace=True) as session, \
            offload(reward_model, client, name="example-reward", policy=args.policy,
                    replace=True):
        print(f"offloaded {len(session.layers)} policy layers and the reward model to "
              f"{args.server}")
        for step in range(args.steps):
            started = time.perf_counter()
            with client.phase("rollout"), torch.no_grad():
                prompts = torch.randint(vocab, (args.batch, args.prompt_tokens))
                tokens, old_logprobs = sample(policy, prompts, args.new_tokens)
            seconds["rollout"] += time.perf_counter() - started

            started = time.perf_counter()
            with client.phase("reward"), torch.no_grad():
                reward = reward_model(tokens)[:, -1, 0]
            seconds["reward"] += time.perf_counter() - started
            rewards.append(reward.mean().item())

            started = time.perf_counter()
            advantage = ((reward - reward.mean()) / (reward.std() + 1e-6))[:, None]
            for _ in range(args.ppo_epochs):
                with client.phase("update"):
                    ratio = (token_logprobs(policy, tokens, args.new_tokens) - old_logprobs).exp()
                    clipped = ratio.clamp(0.8, 1.2)
                    loss = -torch.min(ratio * advantage, clipped * advantage).mean()
                    optimizer.zero_grad()
                    loss.backward()
                optimizer.step()
                session.sync_weights()
            seconds["update"] += time.perf_counter() - started
            formats = {layer.last_info.format for layer in session.layers.values()}
            print(f"step {step + 1:>3}: mean reward {rewards[-1]:+.4f}, loss {loss.item():+.4f}, "
                  f"weights v{session.weight_version}, update formats {sorted(formats)}")

    energy = client.energy_report()
    print(f"\nmean reward: first step {rewards[0]:+.4f}, last step {rewards[-1]:+.4f}")
    print(f"{'phase':<8} {'seconds':>8} " +
          " ".join(f"{source + ' J':>16}" for source in sorted({e.source for e in energy.entries})))
    for phase in mxserve.PHASES:
        row = [f"{phase:<8} {seconds[phase]:>8.2f}"]
        for source in sorted({e.source for e in energy.entries}):
            joules = energy.joules(source, phase) - energy_before.joules(source, phase)
            row.append(f"{joules:>16.6f}")
        print(" ".join(row))
    client.close()


if __name__ == "__main__":
    try:
        main()
    except mxserve.MxserveError as error:
        sys.exit(f"train_offloaded: {error}")
