"""What machine a figure was measured on: every benchmark and report names it."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Dict


def _first_cpu() -> Dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (e.g. "AMD EPYC"), else what
    platform knows, else "unknown CPU"."""
    return _first_cpu().get("model name") or platform.processor() or "unknown CPU"


def describe_machine(device: str = "cpu") -> str:
    """The CPU as a report names it: model, family/model numbers (AMD's name alone
    says little: "AMD EPYC" is Zen 3, 4 or 5), cores, the widest vector ISA; and the
    GPU when `device` is a CUDA device."""
    fields = _first_cpu()
    flags = set(fields.get("flags", "").split())
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else \
        "AVX2" if "avx2" in flags else "no AVX2"
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    parts = []
    if "cpu family" in fields:
        parts.append(f"family {fields['cpu family']} model {fields.get('model', '?')}")
    parts.append(f"{os.cpu_count()} cores, {isa}")
    text = f"{name} ({', '.join(parts)})"
    if device.startswith("cuda"):
        try:
            import torch
            text += f"; GPU {torch.cuda.get_device_name(torch.device(device))}"
        except Exception:  # noqa: BLE001 - the name is decoration, never a failure
            pass
    return text


def source_commit() -> str:
    """The git commit of the checkout this package runs from, with "-dirty" when it
    has uncommitted changes; "unknown" outside a checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")
