"""`python3 -m mxserve.gpu_baseline`: the GPU baseline's command line at its old name.

The module is `mxserve.rlhf.gpu_baseline`; this file only runs its main.
"""

import sys

from mxserve.rlhf.gpu_baseline import main

if __name__ == "__main__":
    sys.exit(main())
