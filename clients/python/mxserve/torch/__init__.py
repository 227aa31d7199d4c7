"""mxserve.torch: the PyTorch bridge. See README.md in this folder.

    from mxserve.torch import offload                 # offload.py: nn.Linear → mxserved
    from mxserve.torch import profile as mxprofile    # profile.py: sensitivity profiling
    from mxserve.torch import emulator                # the daemon's numerics, in-process

Inside this package `import torch` is PyTorch (imports are absolute).
"""

from mxserve.torch.offloading import (COMPUTE_MODES, OffloadedLinear, OffloadSession,  # noqa: F401
                                     PhaseTotals, offload, offloadable)

__all__ = ["COMPUTE_MODES", "OffloadSession", "OffloadedLinear", "PhaseTotals", "offload",
           "offloadable"]
