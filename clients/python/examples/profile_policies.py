#!/usr/bin/env python3
"""Measure which layers of a model tolerate MX formats, and generate policies from it.

Start the daemon first (`make run` in the repository), then:

    /usr/bin/python3 clients/python/examples/profile_policies.py --out profile-out

It offloads a small language model (defined below; one of its layers sees
activation outliers, the kind of layer MXFP4 hurts), captures a few calibration
batches at full precision, has the daemon profile every layer in every candidate
format, and writes the profile as CSV and as a heatmap. From the profile it
generates the research's fraction policies A, B, C and D (the share of layers in
MXFP4 per phase, the most tolerant first, the rest FP16) and a policy held to half
of the FP16 energy, and prints what each gives every phase.
"""

import argparse
import pathlib
import sys

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
import mxserve  # noqa: E402
from mxserve.torch import profile as mxprofile  # noqa: E402
from mxserve.torch import offload  # noqa: E402

VOCAB, WIDTH, HIDDEN, BLOCKS = 96, 64, 128, 4

# ORIGIN.md's first formulation, in MX formats: the share of layers in the low format.
FRACTIONS = {"A": {"rollout": 0.2, "reward": 0.2}, "B": {"rollout": 0.5, "reward": 0.5},
             "C": {"rollout": 0.8, "reward": 0.8},
             "D": {"rollout": 0.8, "reward": 0.5, "update": 0.2}}


class TinyLM(nn.Module):
    """Embedding → residual MLP blocks → logits through the tied embedding. In block
    1 a few hidden channels are 300× larger and the next layer's weights for them
    300× smaller: the same function, but an MXFP4 block's shared scale follows the
    outlier and its other elements round to zero."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"fc1": nn.Linear(WIDTH, HIDDEN), "fc2": nn.Linear(HIDDEN, WIDTH)})
            for _ in range(BLOCKS))
        with torch.no_grad():
            for block in self.blocks:
                block["fc2"].weight.mul_(0.5)
            outliers = list(range(3, HIDDEN, 32))
            block = self.blocks[1]
            block["fc1"].bias[outliers] = 2.0
            block["fc1"].weight[outliers] *= 300
            block["fc1"].bias[outliers] *= 300
            block["fc2"].weight[:, outliers] /= 300

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block["fc2"](torch.relu(block["fc1"](h)))
        return h @ self.embed.weight.t() / WIDTH ** 0.5


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=mxserve.DEFAULT_ADDRESS)
    mxserve.security.add_connection_arguments(parser)
    parser.add_argument("--model", default="profile-example", help="name to register it under")
    parser.add_argument("--out", default="profile-out", type=pathlib.Path,
                        help="directory for sensitivity_matrix.csv and sensitivity.png")
    parser.add_argument("--batches", type=int, default=4,
                        help="calibration batches of 4×32 tokens")
    parser.add_argument("--keep", action="store_true",
                        help="keep the model, its profile and the policies on the daemon")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    model = TinyLM()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (4, 32), generator=generator) for _ in range(args.batches)]
    policies = [f"{args.model}-{letter}" for letter in FRACTIONS] + [f"{args.model}-half-energy"]

    with mxserve.Client(args.server, **mxserve.security.connection_kwargs(args)) as client:
        client.wait_ready(timeout=10)
        session = offload(model, client, name=args.model, replace=True)
        # The core: capture at full precision, profile on the daemon, generate.
        captured = mxprofile.capture(session, batches)
        prof = mxprofile.profile(client, session, captured)
        prof.to_csv(args.out / "sensitivity_matrix.csv")
        generated = {policy: client.generate_policy(args.model, policy, fraction=fractions,
                                                    low="MXFP4", high="FP16")
                     for policy, fractions in zip(policies, FRACTIONS.values())}
        generated[policies[-1]] = client.generate_policy(args.model, policies[-1], "budget",
                                                         relative_budget=0.5)

        print(f"profiled {len(prof.layers)} layers × {len(prof.formats)} formats on "
              f"{captured.tokens // len(prof.layers)} tokens in {prof.compute_seconds:.2f} s")
        print(f"wrote {args.out / 'sensitivity_matrix.csv'}")
        try:
            prof.heatmap(str(args.out / "sensitivity.png"), score="fisher")
            print(f"wrote {args.out / 'sensitivity.png'}")
        except ImportError as error:
            print(f"no heatmap: {error}")
        print("most sensitive to MXFP4 (Fisher): " + ", ".join(prof.ranking("MXFP4")[:3]))
        print()
        print(f"{'policy':<28} {'phase':<8} {'formats':<40} {'energy vs FP16':>14}")
        for policy, result in generated.items():
            for summary in result.phases:
                counts = {}
                for fmt in result.formats(summary.phase).values():
                    counts[fmt] = counts.get(fmt, 0) + 1
                formats = " ".join(f"{fmt}×{n}" for fmt, n in sorted(counts.items()))
                print(f"{policy:<28} {summary.phase:<8} {formats:<40} "
                      f"{-summary.energy_saving:>+14.1%}")
        print()
        d = generated[policies[3]]
        print(f"{policies[3]}, per layer:")
        print(f"{'layer':<14} " + " ".join(f"{phase:<11}" for phase in mxserve.PHASES))
        for layer in prof.layers:
            print(f"{layer:<14} " + " ".join(f"{d.formats(phase)[layer]:<11}"
                                             for phase in mxserve.PHASES))

        if not args.keep:
            session.restore()  # deletes the model, and with it its profile
            for policy in policies:
                client.delete_policy(policy)


if __name__ == "__main__":
    try:
        main()
    except mxserve.MxserveError as error:
        sys.exit(f"profile_policies: {error}")
