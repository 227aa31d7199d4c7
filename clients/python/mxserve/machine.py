"""What machine a figure was measured on: every benchmark and report names it."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (e.g. "AMD EPYC"), else what
    platform knows, else "unknown CPU"."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
