"""mxserve.rlhf: the PPO-RLHF harness the experiment trains with. See README.md here.

Import the module you need (`mxserve.rlhf.models`, `.tokenizer`, `.trainer`, ...):
this file imports nothing, so the torch-free modules (tokenizer, hhrlhf,
safetensors_io, power, machine) load without PyTorch. The trainer's names are also
reachable here, as before the move: `mxserve.rlhf.PPOTrainer`.
"""

_TRAINER_NAMES = {"PPOConfig", "PPOTrainer", "PolicyWithValue", "Rollout", "RewardModel",
                  "adaptive_cliprange", "generate", "left_pad", "response_logprobs",
                  "sequence_scores"}


def __getattr__(name):
    if name in _TRAINER_NAMES:
        from mxserve.rlhf import trainer
        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
