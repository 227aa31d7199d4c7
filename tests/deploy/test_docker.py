"""docker/: the compose stack as docker-compose renders it, the Prometheus config it
mounts, the Dockerfile's stages and commands (run against the real binaries), the
runtime package list, and the build context. No Docker engine is needed."""

import fnmatch
import json
import pathlib
import re
import shlex
import shutil
import subprocess
from typing import Dict, List

import pytest
import yaml

from conftest import (MXCTL, MXSERVED, REPO, Daemon, args_dict, check_daemon_args, metric_sum,
                      mxctl, require_binary)

DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
NATIVE_PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
COMPOSE_PROMETHEUS = DOCKER / "prometheus.compose.yml"
PORTS = {"mxserved": {50051, 9464}, "prometheus": {9090}, "grafana": {3000}, "gpu-baseline": set()}


# --- compose ----------------------------------------------------------------------

def docker_compose(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose is missing: scripts/deps.sh installs Debian's (make deps)"
    return subprocess.run([tool, "-f", str(COMPOSE_FILE), *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


@pytest.fixture(scope="module")
def compose() -> dict:
    assert docker_compose("config", "-q").returncode == 0
    result = docker_compose("--profile", "gpu", "config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def published(port) -> tuple:
    """(host_ip, published, target) of a port entry, short ("127.0.0.1:1:2/tcp") or long form."""
    if isinstance(port, dict):
        return port.get("host_ip"), int(port["published"]), int(port["target"])
    parts = str(port).split("/")[0].split(":")
    assert len(parts) == 3, f"{port}: no host address, so every interface"
    return parts[0], int(parts[1]), int(parts[2])


def test_services_and_published_ports(compose):
    services = compose["services"]
    assert set(services) == set(PORTS)
    for name, want in PORTS.items():
        ports = [published(p) for p in services[name].get("ports", [])]
        assert all(host == "127.0.0.1" for host, _, _ in ports), (name, ports)
        assert {target for _, _, target in ports} == want, name
        assert all(host_port == target for _, host_port, target in ports), name


def test_healthchecks_and_start_order(compose):
    services = compose["services"]
    checks = {name: " ".join(services[name]["healthcheck"]["test"])
              for name in ("mxserved", "prometheus", "grafana")}
    assert checks["mxserved"].startswith("CMD mxctl health --server 127.0.0.1:50051")
    # The image's HEALTHCHECK and compose's are the same command.
    assert services["mxserved"]["healthcheck"]["test"] == ["CMD", *healthcheck_command()]
    assert "http://127.0.0.1:9090/-/ready" in checks["prometheus"]
    assert "http://127.0.0.1:3000/api/health" in checks["grafana"]
    depends = {name: services[name].get("depends_on", {}) for name in services}
    assert depends["prometheus"] == {"mxserved": {"condition": "service_healthy"}}
    assert depends["grafana"] == {"prometheus": {"condition": "service_healthy"}}
    assert depends["gpu-baseline"] == {"mxserved": {"condition": "service_healthy"}}
    assert depends["mxserved"] == {}


def test_images_are_pinned(compose):
    images = {name: service["image"] for name, service in compose["services"].items()}
    for name, image in images.items():
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag and tag not in ("", "latest"), (name, image)
    assert re.fullmatch(r"prom/prometheus:v2\.53\.\d+", images["prometheus"])
    assert re.fullmatch(r"grafana/grafana:11\.\d+\.\d+", images["grafana"])
    builds = {name: service["build"]["target"] for name, service in compose["services"].items()
              if "build" in service}
    assert builds == {"mxserved": "runtime", "gpu-baseline": "gpu-baseline"}
    assert set(builds.values()) <= set(dockerfile_stages())


def test_gpu_profile(compose):
    services = compose["services"]
    assert services["gpu-baseline"]["profiles"] == ["gpu"]
    assert all("profiles" not in services[name] for name in ("mxserved", "prometheus", "grafana"))
    (device,) = services["gpu-baseline"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == 1
    assert "gpu" in device["capabilities"]
    command = services["gpu-baseline"]["command"]
    assert command[:2] == ["--server", "mxserved:50051"]
    # Flags of python -m mxserve.gpu_baseline, read from its argparse calls.
    source = (REPO / "clients" / "python" / "mxserve" / "rlhf" / "gpu_baseline.py").read_text()
    known = set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))
    assert {arg for arg in command if arg.startswith("--")} <= known


def mounts(service: dict) -> Dict[str, dict]:
    """{container path: {"source", "type", "read_only"}} of a rendered service."""
    result = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            result[volume["target"]] = {"source": volume["source"], "type": volume["type"],
                                        "read_only": bool(volume.get("read_only"))}
        else:
            source, target, *mode = volume.split(":")
            kind = "bind" if source.startswith("/") else "volume"
            result[target] = {"source": source, "type": kind, "read_only": mode == ["ro"]}
    return result


def test_volumes_and_mounts(compose):
    services = compose["services"]
    assert set(compose["volumes"]) == {"policies", "prometheus-data", "grafana-data"}
    daemon, prometheus, grafana = (mounts(services[n]) for n in
                                   ("mxserved", "prometheus", "grafana"))
    assert daemon["/var/lib/mxserve/policies"]["source"] == "policies"
    assert prometheus["/prometheus"]["source"] == "prometheus-data"
    assert grafana["/var/lib/grafana"]["source"] == "grafana-data"
    binds = [
        (prometheus, "/etc/prometheus/prometheus.yml", COMPOSE_PROMETHEUS),
        (prometheus, "/etc/prometheus/rules", REPO / "deploy" / "prometheus" / "rules"),
        (grafana, "/etc/grafana/provisioning", REPO / "deploy" / "grafana" / "provisioning"),
        (grafana, "/etc/grafana/dashboards", REPO / "deploy" / "grafana" / "dashboards"),
    ]
    for table, target, source in binds:
        assert table[target] == {"source": str(source), "type": "bind", "read_only": True}, target
    # The compose config must match its flags: the daemon's policy dir is the volume.
    args = args_dict(dockerfile_cmd())
    assert args["--policy-dir"] == "/var/lib/mxserve/policies"


def test_grafana_settings(compose):
    """Anonymous viewers; the provisioned datasource is compose's Prometheus, and the
    dashboards provider reads where compose mounts deploy/grafana/dashboards, the
    home dashboard among them."""
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    provisioning = REPO / "deploy" / "grafana" / "provisioning"
    [datasource] = yaml.safe_load((provisioning / "datasources" / "mxserve.yml").read_text())[
        "datasources"]
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    [provider] = yaml.safe_load((provisioning / "dashboards" / "mxserve.yml").read_text())[
        "providers"]
    path = provider["options"]["path"]
    assert mounts(compose["services"]["grafana"])[path]["source"] == str(
        REPO / "deploy" / "grafana" / "dashboards")
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == path + "/mxserve-energy.json"


def test_mounted_files_exist(compose):
    """What the stack mounts from deploy/ (Prometheus rules, Grafana provisioning
    and the dashboard that is Grafana's home) is there."""
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for target, mount in mounts(services[name]).items():
            if mount["type"] == "bind":
                assert pathlib.Path(mount["source"]).exists(), f"{name} mounts {mount['source']}"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    dashboards = mounts(services["grafana"])["/etc/grafana/dashboards"]["source"]
    relative = home[len("/etc/grafana/dashboards/"):]
    assert (pathlib.Path(dashboards) / relative).is_file(), f"home dashboard {relative}"


def test_compose_prometheus_config_is_the_native_one_but_the_target():
    native = yaml.safe_load(NATIVE_PROMETHEUS.read_text())
    ours = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())

    def daemon_targets(config):
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "mxserved"]
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        for sc in job["static_configs"]:
            sc["targets"] = ["<mxserved>"]
        return targets

    assert daemon_targets(native) == ["127.0.0.1:9464"]
    assert daemon_targets(ours) == ["mxserved:9464"]
    assert ours == native


# --- Dockerfile -------------------------------------------------------------------

def dockerfile_instructions() -> List[tuple]:
    """[(stage, INSTRUCTION, argument text)], continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result, stage = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stage = rest.split()[-1]
        result.append((stage, instruction, rest.strip()))
    return result


def dockerfile_stages() -> Dict[str, str]:
    """{stage name: base image}, in order."""
    stages = {}
    for _, instruction, rest in dockerfile_instructions():
        if instruction == "FROM":
            words = rest.split()
            assert len(words) == 3 and words[1].upper() == "AS", rest
            stages[words[2]] = words[0]
    return stages


def stage_lines(stage: str, instruction: str) -> List[str]:
    return [rest for s, i, rest in dockerfile_instructions() if s == stage and i == instruction]


def exec_form(text: str) -> List[str]:
    return json.loads(text)


def dockerfile_cmd() -> List[str]:
    (cmd,) = stage_lines("runtime", "CMD")
    return exec_form(cmd)


def test_dockerfile_stages_and_base_images():
    stages = dockerfile_stages()
    assert list(stages)[-1] == "runtime", "docker build without --target must give the daemon"
    assert stages["build"] == stages["runtime"] == "debian:12-slim"
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime",
                        stages["gpu-baseline"])
    for image in stages.values():
        if image not in stages:  # not FROM an earlier stage
            assert ":" in image and not image.endswith(":latest"), image


def test_build_stage_uses_the_project_scripts():
    runs = " ".join(stage_lines("build", "RUN"))
    assert "scripts/deps.sh" in runs
    for option in ("-DCMAKE_BUILD_TYPE=Release", "-DMXSERVE_BUILD_TESTS=OFF",
                   "-DMXSERVE_BUILD_BENCH=OFF", "-DMXSERVE_BUILD_PYTHON=OFF",
                   "--target mxserved mxctl"):
        assert option in runs, option
    assert re.search(r"runtime_packages\.sh /build/bin/mxserved /build/bin/mxctl\s*>\s*"
                     r"/build/runtime-packages\.txt", runs), runs


def test_runtime_stage_installs_exactly_the_listed_packages():
    copies = stage_lines("runtime", "COPY")
    assert "--from=build /build/runtime-packages.txt /tmp/runtime-packages.txt" in copies
    runs = " ".join(stage_lines("runtime", "RUN"))
    assert "xargs apt-get install -y --no-install-recommends < /tmp/runtime-packages.txt" in runs
    installs = re.findall(r"apt-get install[^&]*", runs)
    assert len(installs) == 1, installs
    (user,) = stage_lines("runtime", "USER")
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "a numeric non-root user"
    assert sorted(" ".join(stage_lines("runtime", "EXPOSE")).split()) == ["50051", "9464"]
    assert exec_form(stage_lines("runtime", "ENTRYPOINT")[0]) == ["mxserved"]


def test_dockerfile_cmd_flags(mxserved_flags):
    cmd = dockerfile_cmd()
    check_daemon_args(cmd, mxserved_flags)
    args = args_dict(cmd)
    assert args == {"--listen": "0.0.0.0:50051", "--metrics-listen": "0.0.0.0:9464",
                    "--backend": "cpu", "--default-policy": "D-phase-adaptive",
                    "--policy-dir": "/var/lib/mxserve/policies"}


def healthcheck_command() -> List[str]:
    (check,) = stage_lines("runtime", "HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    return exec_form(command)


def test_image_command_and_healthcheck_run_against_the_real_binaries(tmp_path):
    """The image's CMD, moved from 0.0.0.0 to 127.0.0.1 free ports and a temporary
    policy dir, starts the daemon; its HEALTHCHECK command, pointed at that port,
    says SERVING (exit 0); compose's healthcheck is the same command."""
    cmd = dockerfile_cmd()
    args = args_dict(cmd)
    args.update({"--listen": "127.0.0.1:0", "--metrics-listen": "127.0.0.1:0",
                 "--policy-dir": str(tmp_path / "policies")})
    with Daemon(*[word for pair in args.items() for word in pair]) as daemon:
        check = healthcheck_command()
        assert check[0] == "mxctl"
        check = [word.replace("127.0.0.1:50051", daemon.address) for word in check[1:]]
        result = mxctl(*check)
        assert (result.returncode, result.stdout.strip()) == (0, "SERVING"), result.stderr
        assert metric_sum(daemon.metrics_address, "mxserve_build_info", backend="cpu") == 1
        assert daemon.stop(timeout=20) == 0, daemon.log()
    # ...and exits non-zero when nothing serves, so Docker marks the container unhealthy.
    assert mxctl(*check, timeout=30).returncode != 0


def test_gpu_baseline_stage():
    stages = dockerfile_stages()
    assert "stubs" in stages and list(stages).index("stubs") < list(stages).index("gpu-baseline")
    assert any("gen_stubs.py" in run for run in stage_lines("stubs", "RUN"))
    pips = " ".join(stage_lines("gpu-baseline", "RUN"))
    for package in ("grpcio", "protobuf"):
        assert re.search(rf"\b{package}==[\d.]+", pips), f"{package} pinned"
    assert exec_form(stage_lines("gpu-baseline", "ENTRYPOINT")[0]) == \
        ["python", "-m", "mxserve.gpu_baseline"]
    assert any("--from=stubs" in copy for copy in stage_lines("gpu-baseline", "COPY"))


# --- scripts/runtime_packages.sh ---------------------------------------------------

RUNTIME_PACKAGES = REPO / "scripts" / "runtime_packages.sh"


def test_runtime_packages_of_the_built_binaries():
    binaries = [require_binary(MXSERVED), require_binary(MXCTL)]
    result = subprocess.run(["bash", str(RUNTIME_PACKAGES), *binaries], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    packages = result.stdout.split()
    assert packages == sorted(set(packages), key=lambda p: p.encode())
    # The C library and gRPC itself, each once, whatever their versions.
    assert "libc6" in packages
    assert any(re.fullmatch(r"libgrpc\+\+\d[\d.]*", p) for p in packages), packages
    assert not any(p.endswith("-dev") for p in packages), packages
    # Every name is an installed package: apt-get install in the image takes them.
    status = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *packages],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert all(line.endswith("install ok installed") for line in status.stdout.splitlines())
    # mxctl needs a subset of what the daemon needs.
    alone = subprocess.run(["bash", str(RUNTIME_PACKAGES), binaries[1]], capture_output=True,
                           text=True, timeout=120)
    assert set(alone.stdout.split()) < set(packages)


def test_runtime_packages_refuses_a_library_no_package_holds(tmp_path):
    # mxctl with its zlib taken from a private directory: that file has no package.
    libz = subprocess.run(["bash", "-c", f"ldd {shlex.quote(require_binary(MXCTL))} | "
                           "awk '$1 ~ /^libz\\.so/ {print $3}'"], capture_output=True, text=True)
    source = libz.stdout.strip()
    assert source, "mxctl no longer loads zlib; pick another library for this test"
    shutil.copy(source, tmp_path / source.rsplit("/", 1)[1])
    result = subprocess.run(["bash", str(RUNTIME_PACKAGES), require_binary(MXCTL)],
                            capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)})
    assert result.returncode != 0
    assert str(tmp_path) in result.stderr and "no Debian package" in result.stderr


def test_runtime_packages_usage():
    result = subprocess.run(["bash", str(RUNTIME_PACKAGES)], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr


# --- .dockerignore ------------------------------------------------------------------

def dockerignore_patterns() -> List[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: List[str]) -> bool:
    for pattern in patterns:
        plain = pattern.replace("**/", "")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatch(part, plain) for part in parts):
            return True
    return False


def test_dockerignore_keeps_build_trees_out_and_sources_in():
    patterns = dockerignore_patterns()
    for path in ("build", "build/bin/mxserved", "build-asan/x.o", "build-tsan/y", "build-minimal.1/z",
                 ".git/HEAD", "clients/python/mxserve/v1/compute_pb2.py"):
        assert ignored(path, patterns), path
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             timeout=60).stdout.split()
    assert tracked
    needed = ("CMakeLists.txt", "cmake/", "mx/", "proto/", "fpga/", "server/", "clients/",
              "scripts/")
    lost = [p for p in tracked if p.startswith(needed) and ignored(p, patterns)]
    assert not lost, f"the image build needs these: {lost[:10]}"
