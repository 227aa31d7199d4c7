"""mxserve.torch: the PyTorch bridge. See README.md in this folder.

    from mxserve.torch import offload                 # offloading.py: nn.Linear → mxserved
    from mxserve.torch import profile as mxprofile    # profile.py: sensitivity profiling
    from mxserve.torch import emulator                # the daemon's numerics, in-process
    from mxserve.torch import search                  # search.py: an RL policy generator

The offloading names resolve on first use, so that `mxserve.torch.emulator` imports
without the gRPC client (bench/gpu_check.py loads the emulator where the stubs do
not import). Inside this package `import torch` is PyTorch (imports are absolute).
"""

__all__ = ["COMPUTE_MODES", "OffloadSession", "OffloadedLinear", "PhaseTotals", "RemoteAdamW",
           "offload", "offloadable"]


def __getattr__(name):
    if name in __all__:
        from mxserve.torch import offloading
        value = globals()[name] = getattr(offloading, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
