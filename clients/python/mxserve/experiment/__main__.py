"""`python3 -m mxserve.experiment`: the experiment's command line (cli.py)."""

import sys

from mxserve.experiment.cli import main

sys.exit(main())
