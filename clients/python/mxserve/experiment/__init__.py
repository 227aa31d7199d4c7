"""The experiment: seeded PPO-RLHF once per configuration of a policy matrix and per
training seed, with quality and energy per phase and their uncertainty, in one command.

    python3 -m mxserve.experiment --server 127.0.0.1:50051 --quick --out results/
    python3 -m mxserve.experiment --server 127.0.0.1:50051 --config matrix.toml --out results/

Each configuration names a daemon policy (a built-in preset, a policy given inline,
or one generated from a sensitivity profile of the policy model) and runs the same
seeded PPO (`mxserve.rlhf.trainer`) with every linear layer on mxserved in its phase. Its
requests carry a run tag of their own, so the energy read back belongs to that run
alone. The default matrix holds the origin's two policy families, a generated
budget policy, and each phase alone (one phase in MXFP4, MXFP8 or INT8 on every
layer, the others FP16). The runner goes seed by seed (`--seeds`: 3 by default, 2
for `--quick`), each seed's FP16 baseline first; it adds the untrained policy (did
PPO learn anything?) and the noise floor (FP16 of one seed against FP16 of the
previous one). Then, on the held-out prompts, per seed and prompt:

- held-out reward: the score of its response by the reward model in FP16 (the
  judge, the same for every configuration; it scores each response alone);
- win rate against the FP16 baseline of the same seed: the judge prefers this
  configuration's response to the baseline's (ties count half);
- KL(π_q ‖ π_FP16): exact over the vocabulary at the sampling temperature, summed
  over the response's tokens, against the same seed's trained FP16 baseline;
- reward Spearman ρ: the reward model's scores of the same responses in the
  configuration's reward formats against the judge's.

Every figure gets a 95 % hierarchical bootstrap interval (`mxserve.stats`); the
success criteria are met, not met or unresolved by their whole interval
(`mxserve.experiment.report`).

Outputs in --out: results.csv (one row per configuration), runs.csv (one per run),
summary.json (everything, training curves included), pareto.png, curves.png and
report.md. Energy is the FPGA model's estimate in emulation (with its range over the
model's parameters), the board's measurement on F2, and for the `--device cuda`
baseline the GPU's energy counter (NVML), labelled "replayed" when it came from a
power trace file instead. state/ keeps each finished run as it finishes, so that
`--resume` continues a killed run (`mxserve.experiment.state`).

`--compute local` (the default with `--device cuda`) computes the offloaded layers
in this process on the device, with the daemon's numerics; a preflight
(`mxserve.experiment.preflight`) prints the memory and time the run needs before any training
and refuses one that cannot fit. `--config seeds` is the shipped seeds' run
(configs/seeds.toml).

The rooms of this package (README.md): config.py (the schema), run.py (running and
evaluating), report.py (aggregation and the files), state.py, preflight.py, cli.py
(the command line) and __main__.py.
"""

from mxserve.experiment.cli import main
from mxserve.experiment.config import (DEFAULT_MATRIX, QUICK, ConfigError, Configuration,
                                       Experiment, load_config, shipped_config)
from mxserve.experiment.report import pareto_front, summarize, write_outputs
from mxserve.experiment.run import run_experiment

__all__ = ["DEFAULT_MATRIX", "QUICK", "ConfigError", "Configuration", "Experiment", "load_config",
           "main", "pareto_front", "run_experiment", "shipped_config", "summarize",
           "write_outputs"]
