"""The TLS variants of the deployments: docker/compose.tls.yaml over compose.yaml and
deploy/k8s-tls over deploy/k8s render, and hand mxserved its certificates from
secrets mounted at run time (never from the image)."""

import pathlib
import shutil
import subprocess

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_compose_tls_overlay_mounts_secrets():
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose is missing: scripts/deps.sh installs Debian's (make deps)"
    done = subprocess.run([tool, "-f", "docker/compose.yaml", "-f", "docker/compose.tls.yaml",
                           "--profile", "gpu", "config"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={"MXSERVE_TLS_DIR": "/srv/mxserve-tls",
                                                      "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    stack = yaml.safe_load(done.stdout)
    daemon = stack["services"]["mxserved"]
    command = daemon["command"]
    for flag, secret in [("--tls-cert", "mxserved_tls_cert"), ("--tls-key", "mxserved_tls_key"),
                         ("--tls-client-ca", "mxserved_tls_ca"),
                         ("--auth-tokens", "mxserved_auth_tokens")]:
        assert command[command.index(flag) + 1] == f"/run/secrets/{secret}"
        assert stack["secrets"][secret]["file"].startswith("/srv/mxserve-tls/")
    assert {s["source"] if isinstance(s, dict) else s for s in daemon["secrets"]} >= {
        "mxserved_tls_cert", "mxserved_tls_key", "mxserved_tls_ca", "mxserved_auth_tokens"}
    assert "--reflection=false" in command
    assert "--tls-ca" in daemon["healthcheck"]["test"]
    assert stack["services"]["gpu-baseline"]["environment"]["MXSERVE_TLS_CA"] == \
        "/run/secrets/mxserved_tls_ca"


def test_k8s_tls_overlay_mounts_the_secret():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run([kubectl, "kustomize", str(REPO / "deploy" / "k8s-tls")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    deployment = next(o for o in yaml.safe_load_all(done.stdout) if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/mxserve/tls/tls.crt"
    assert args[args.index("--tls-client-ca") + 1] == "/etc/mxserve/tls/ca.crt"
    assert args[args.index("--auth-tokens") + 1] == "/etc/mxserve/tls/tokens"
    assert {"secret": {"secretName": "mxserved-tls", "defaultMode": 0o440}, "name": "tls"} \
        in pod["volumes"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" not in container[probe]
        assert "--tls-ca" in container[probe]["exec"]["command"]
