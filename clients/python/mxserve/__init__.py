"""mxserve: the Python client of mxserved, quantized compute for RLHF training.

    import mxserve
    client = mxserve.Client("127.0.0.1:50051")

`mxserve.torch` (needs PyTorch) offloads a model's nn.Linear layers;
`mxserve.torch.profile` (needs PyTorch) captures calibration data and measures which
layers tolerate which format;
`mxserve.energy_model` prices a session's work ledger with the daemon's FPGA
energy model and gives an energy saving its range over the model's parameter
estimates;
`python3 -m mxserve.gpu_baseline` measures the same work on a GPU and streams its
power to the daemon;
`python3 -m mxserve.experiment` runs PPO-RLHF (`mxserve.rlhf.trainer`) over a policy matrix
and reports energy per phase and quality against the FP16 baseline, with models,
tokenizers and data from disk (`mxserve.rlhf.models`, `.tokenizer`, `.hhrlhf`).
"""

try:
    from mxserve.v1 import common_pb2 as _common_pb2  # noqa: F401
except ImportError as error:  # pragma: no cover - a checkout that was never built
    raise ImportError(
        "mxserve's gRPC stubs are missing: run `make build` in the repository (or "
        "`python3 clients/python/gen_stubs.py`) before importing mxserve") from error

from mxserve._wire import FORMATS, PHASES
from mxserve.client import DEFAULT_ADDRESS, Client, MxserveError, StreamSession
from mxserve import security  # noqa: F401  (Client(tls=..., token=...), the CLI flags)
from mxserve.types import (BackwardResult, ComputeResult, EnergyEntry, EnergyInterval,
                           EnergyReport, EnergyResult, ExecutionInfo, GeneratedPolicy, LayerInfo,
                           LayerSpec, ModelInfo, PhaseSummary, PolicyInfo, PowerResult,
                           PowerSample, Profile, ProfileRow, ReportWorkResult, ResolvedFormat,
                           ResolvedPolicy, UploadResult, WorkCall)

__version__ = "0.1.0"

__all__ = [
    "BackwardResult", "Client", "ComputeResult", "DEFAULT_ADDRESS", "EnergyEntry", "EnergyInterval",
    "EnergyReport", "EnergyResult", "ExecutionInfo", "FORMATS", "GeneratedPolicy", "LayerInfo",
    "LayerSpec", "ModelInfo", "MxserveError", "PHASES", "PhaseSummary", "PolicyInfo",
    "PowerResult", "PowerSample", "Profile", "ProfileRow", "ReportWorkResult", "ResolvedFormat",
    "ResolvedPolicy", "StreamSession", "UploadResult", "WorkCall",
]
