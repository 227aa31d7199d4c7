"""What an experiment keeps under --out/state/ so that a killed run restarts at the
next unfinished (configuration × seed) with the finished ones kept.

    state/state.json          the run's fingerprint (its configuration, compute and
                              device), run tag prefix, policies (name and document of
                              every configuration's, so put and generated ones are put
                              back as they were) and the profile's summary
    state/runs/NNNN.json      job NNNN's RunResult, as summary.json holds it
    state/baseline.safetensors  the latest trained FP16 baseline policy the judges
                              hold (later runs of its seed are compared with it), and
    state/baseline.json       whose it is: {"seed": s, "repetition": r}

Every file is written to a temporary name, flushed and renamed: a kill leaves the
old file or the new one, never half of one. A job's result is written only once it
is complete (evaluated and judged), so a job that was running when the run died
simply runs again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from mxserve.rlhf.safetensors_io import read_safetensors, write_safetensors

__all__ = ["ResumeError", "RunState", "atomic_write"]

VERSION = 1


class ResumeError(ValueError):
    """--out holds something that this run must not silently overwrite or resume."""


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """write(temporary) then rename over `path` (after an fsync): all or nothing."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=1, allow_nan=True,
                                                          default=float)))


def fingerprint(description: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str)
                          .encode()).hexdigest()[:16]


class RunState:
    """The state directory of one experiment's --out."""

    def __init__(self, out: str, description: Dict[str, Any]):
        self.out = Path(out)
        self.directory = self.out / "state"
        self.description = description
        self.fingerprint = fingerprint(description)
        self.meta: Dict[str, Any] = {}

    @property
    def _meta_file(self) -> Path:
        return self.directory / "state.json"

    @staticmethod
    def check_out(out: str, resume: bool, overwrite: bool) -> None:
        """Refuses a non-empty --out unless told what to do with it."""
        path = Path(out)
        has_state = (path / "state" / "state.json").is_file()
        if resume and not has_state:
            if path.is_dir() and any(path.iterdir()):
                raise ResumeError(f"--resume: {out} holds no resumable run (no "
                                  "state/state.json); --overwrite starts over there")
            return  # nothing to resume: a fresh start
        if not resume and not overwrite and path.is_dir() and any(path.iterdir()):
            what = "an unfinished or finished run" if has_state else "files"
            raise ResumeError(f"--out {out} is not empty (it holds {what}): --resume "
                              "continues the run there, --overwrite starts over")

    def open(self, resume: bool, overwrite: bool) -> Optional[Dict[str, Any]]:
        """The saved state when resuming a run of the same experiment, else None
        (after clearing an old state with `overwrite`)."""
        self.check_out(str(self.out), resume, overwrite)
        if overwrite and self.directory.exists():
            shutil.rmtree(self.directory)
        if not (resume and self._meta_file.is_file()):
            return None
        saved = json.loads(self._meta_file.read_text())
        if saved.get("version") != VERSION or saved.get("fingerprint") != self.fingerprint:
            old = saved.get("description", {})
            changed = sorted(k for k in set(old) | set(self.description)
                             if json.dumps(old.get(k), sort_keys=True, default=str) !=
                             json.dumps(self.description.get(k), sort_keys=True, default=str))
            raise ResumeError(f"--resume: {self.out} holds a run of another experiment "
                              f"(differs in: {', '.join(changed) or 'its version'}); use "
                              "another --out, or --overwrite to start over")
        self.meta = saved
        return saved

    def start(self, tag: str, policies: Dict[str, Dict[str, Any]],
              profile_info: Dict[str, Any]) -> None:
        (self.directory / "runs").mkdir(parents=True, exist_ok=True)
        self.meta = {"version": VERSION, "fingerprint": self.fingerprint,
                     "description": self.description, "tag": tag, "policies": policies,
                     "profile_info": profile_info}
        _write_json(self._meta_file, self.meta)

    def _run_file(self, index: int) -> Path:
        return self.directory / "runs" / f"{index:04d}.json"

    def finished(self, index: int) -> Optional[Dict[str, Any]]:
        """Job `index`'s saved result, or None."""
        file = self._run_file(index)
        return json.loads(file.read_text()) if file.is_file() else None

    def save_run(self, index: int, result: Dict[str, Any]) -> None:
        _write_json(self._run_file(index), result)

    def save_baseline(self, module: torch.nn.Module, key: Tuple[int, int]) -> None:
        """The judges' baseline policy: replaces the previous seed's (no later job
        needs it)."""
        atomic_write(self.directory / "baseline.safetensors",
                     lambda p: write_safetensors(p, module.state_dict()))
        _write_json(self.directory / "baseline.json", {"seed": key[0], "repetition": key[1]})

    def load_baseline(self, module: torch.nn.Module, key: Tuple[int, int]) -> torch.nn.Module:
        """`module` with the saved baseline's weights, which must be `key`'s."""
        saved = json.loads((self.directory / "baseline.json").read_text())
        if (saved["seed"], saved["repetition"]) != tuple(key):
            raise ResumeError(f"{self.directory}: the saved baseline is seed {saved['seed']}'s, "
                              f"the run needs seed {key[0]}'s; --overwrite starts over")
        with torch.no_grad():
            module.load_state_dict(read_safetensors(self.directory / "baseline.safetensors"))
        return module

    def finish(self) -> None:
        """The run is complete: its results stay, the baseline weights go."""
        for name in ("baseline.safetensors", "baseline.json"):
            (self.directory / name).unlink(missing_ok=True)
