#!/usr/bin/env python3
"""mxserve quickstart: a 3-layer MLP on mxserved, forward in each RLHF phase.

Start the daemon first (`make run` in the repository), then:

    /usr/bin/python3 clients/python/examples/quickstart.py

It registers the MLP, uploads its weights, runs the same input through it in the
rollout, reward and update phases, and prints the format the model's policy chose
for each layer in each phase and the output's error against plain FP32.
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
import mxserve  # noqa: E402

# Named like a transformer's blocks, so the policy's default sensitivity applies: the
# first and last blocks count as sensitive and get the more precise format.
LAYERS = [mxserve.LayerSpec("blocks.0.fc", 256, 128, bias=True),
          mxserve.LayerSpec("blocks.1.fc", 256, 256, bias=True),
          mxserve.LayerSpec("blocks.2.fc", 64, 256, bias=True)]


def relu(x):
    return np.maximum(x, 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=mxserve.DEFAULT_ADDRESS)
    mxserve.security.add_connection_arguments(parser)
    parser.add_argument("--model", default="quickstart-mlp", help="name to register it under")
    parser.add_argument("--policy", default="", help="policy (default: the daemon's)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    weights = {l.name: (rng.standard_normal((l.out_features, l.in_features)) /
                        np.sqrt(l.in_features), rng.standard_normal(l.out_features) * 0.1)
               for l in LAYERS}
    x = rng.standard_normal((8, 128))

    # The FP32 answer, computed here.
    reference = x
    for i, layer in enumerate(LAYERS):
        w, b = weights[layer.name]
        reference = reference @ w.T + b
        reference = relu(reference) if i < len(LAYERS) - 1 else reference

    with mxserve.Client(args.server, **mxserve.security.connection_kwargs(args)) as client:
        client.wait_ready(timeout=10)
        if args.model in {m.name for m in client.list_models()}:
            client.delete_model(args.model)  # left over from an earlier run
        info = client.register_model(args.model, LAYERS, policy=args.policy)
        client.upload_weights(args.model, weights, publish=True)
        print(f"registered '{args.model}' (policy {info.policy}) on {args.server}")
        print(f"{'phase':<8} " + " ".join(f"{l.name:<12}" for l in LAYERS) +
              f" {'error vs FP32':>13} {'FPGA model':>11}")
        for phase in mxserve.PHASES:
            with client.phase(phase):
                h, formats, joules = x, [], 0.0
                for i, layer in enumerate(LAYERS):
                    result = client.forward(args.model, layer.name, h)
                    formats.append(result.info.format)
                    joules += result.info.model_joules
                    h = relu(result.output) if i < len(LAYERS) - 1 else result.output
            error = np.linalg.norm(h - reference) / np.linalg.norm(reference)
            print(f"{phase:<8} " + " ".join(f"{f:<12}" for f in formats) +
                  f" {error:>13.2e} {joules * 1e6:>8.2f} µJ")
        client.delete_model(args.model)


if __name__ == "__main__":
    try:
        main()
    except mxserve.MxserveError as error:
        sys.exit(f"quickstart: {error}")
