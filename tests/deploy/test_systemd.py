"""deploy/systemd/mxserved.service: systemd accepts it, it is hardened, and its
ExecStart runs the real daemon (state directory, the MXSERVED_ARGS hook, SIGTERM)."""

import json
import pathlib
import re
import shlex
import shutil
import subprocess
from typing import Dict, List

import pytest

from conftest import (MXSERVED, REPO, Daemon, args_dict, check_daemon_args, mxctl,
                      require_binary)

UNIT = REPO / "deploy" / "systemd" / "mxserved.service"
DEFAULTS = REPO / "deploy" / "systemd" / "mxserved.default"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def parse_unit(text: str) -> Dict[str, Dict[str, List[str]]]:
    """{section: {key: [values in order]}}; continuation lines joined, comments dropped."""
    sections: Dict[str, Dict[str, List[str]]] = {}
    current = None
    logical = []
    pending = ""
    for raw in text.splitlines():
        if not pending and raw.lstrip().startswith(("#", ";")):
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        logical.append(pending + raw)
        pending = ""
    for line in logical:
        line = line.strip()
        if not line:
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text())


def one(unit, key, section="Service"):
    values = unit[section].get(key)
    assert values, f"[{section}] {key}= is missing"
    return values[-1]


def exec_start(unit) -> List[str]:
    return shlex.split(one(unit, "ExecStart"))


def verifiable_copy(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    """The unit with ExecStart's binary replaced by the built one: verify checks it exists."""
    installed = exec_start(parse_unit(text))[0]
    path = tmp_path / "mxserved.service"
    path.write_text(text.replace(installed, require_binary(MXSERVED)))
    return path


def verify(path: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    result = verify(verifiable_copy(tmp_path, UNIT.read_text()))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    about_unit = [line for line in output.splitlines() if "mxserved" in line]
    assert not about_unit, "systemd-analyze verify warns about the unit:\n" + output


def test_systemd_analyze_verify_would_report_a_bad_setting(tmp_path):
    # verify exits 0 on unknown or unparsable settings and only prints them: the
    # test above looks at the output, and this one shows that output appears.
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=stricter")
    result = verify(verifiable_copy(tmp_path, broken))
    reported = [line for line in (result.stdout + result.stderr).splitlines()
                if "mxserved.service" in line and "stricter" in line]
    assert reported, result.stdout + result.stderr


def test_security_exposure_is_low(tmp_path):
    path = verifiable_copy(tmp_path, UNIT.read_text())
    # --threshold is in tenths: 20 means an overall exposure of at most 2.0 ("OK").
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=20",
                             str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Overall exposure level for mxserved\.service: [01]\.\d", result.stdout), \
        result.stdout


def test_hardening_settings(unit):
    expected = {
        "DynamicUser": "yes", "ProtectSystem": "strict", "NoNewPrivileges": "yes",
        "PrivateTmp": "yes", "ProtectHome": "yes", "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native", "CapabilityBoundingSet": "",
        "AmbientCapabilities": "", "StateDirectory": "mxserve",
    }
    got = {key: one(unit, key) for key in expected}
    assert got == expected
    assert set(one(unit, "RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert unit["Service"]["SystemCallFilter"][0] == "@system-service"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_execstart_flags(unit, mxserved_flags):
    argv = exec_start(unit)
    assert argv[0] == "/usr/local/bin/mxserved"
    assert argv[-1] == "$MXSERVED_ARGS", "the hook must come last so that its flags win"
    check_daemon_args(argv[1:-1], mxserved_flags)
    flags = args_dict(argv[1:-1])
    assert flags["--listen"].startswith("127.0.0.1:")
    assert flags["--metrics-listen"].startswith("127.0.0.1:")
    # %S is /var/lib for system units: policies persist in StateDirectory=.
    assert flags["--policy-dir"].startswith("%S/" + one(unit, "StateDirectory") + "/")
    assert any(value.startswith("-") for value in unit["Service"]["EnvironmentFile"]), \
        "the EnvironmentFile must be optional (a leading '-')"
    # systemd must wait longer than the daemon's grace before it kills it.
    grace = int(flags.get("--grace-seconds", "10"))
    assert int(one(unit, "TimeoutStopSec").rstrip("s")) > grace
    assert one(unit, "KillSignal") == "SIGTERM"


def test_example_defaults_file_sets_only_the_hook():
    lines = [line for line in DEFAULTS.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert [line.split("=", 1)[0] for line in lines] == ["MXSERVED_ARGS"]


def test_execstart_runs_the_daemon(unit, tmp_path):
    """ExecStart as systemd would run it, with %S a temporary state root and
    MXSERVED_ARGS moving both listeners to free ports: the later flags win."""
    state = tmp_path / "state"
    hook = "--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0"
    argv = []
    for word in exec_start(unit)[1:]:
        if word == "$MXSERVED_ARGS":
            argv += hook.split()  # an unbraced $VAR splits into words, as systemd does
        else:
            argv.append(word.replace("%S", str(state)))
    with Daemon(*argv) as daemon:
        assert daemon.address.startswith("127.0.0.1:") and not daemon.address.endswith(":50051")
        assert daemon.metrics_address.startswith("127.0.0.1:")
        document = {"name": "unit-check", "defaults": {"rollout": "MXFP4_E2M1",
                                                      "reward": "MXFP8_E4M3",
                                                      "update": "FP16"}}
        policy_file = tmp_path / "unit-check.json"
        policy_file.write_text(json.dumps(document))
        put = mxctl("--server", daemon.address, "policy", "put", "--file", str(policy_file))
        assert put.returncode == 0, put.stderr
        assert (state / "mxserve" / "policies" / "unit-check.json").is_file()
        assert daemon.stop(timeout=20) == 0, daemon.log()
    assert "event=stopping signal=SIGTERM" in daemon.log()
    assert "event=stopped" in daemon.log()
