"""deploy/k8s: the manifests fit together (labels, ports, probes, the ServiceMonitor),
the daemon's args are flags it has, the ConfigMap's policies load in the real daemon,
and kustomize renders the set (the one check skipped when kubectl is absent)."""

import json
import re
import shutil
import subprocess
from typing import Dict, List

import pytest
import yaml

from conftest import REPO, Daemon, args_dict, check_daemon_args, mxctl

K8S = REPO / "deploy" / "k8s"
NAMESPACE = "mxserve"
EXPECTED = {  # kind: apiVersion
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Deployment": "apps/v1",
    "Service": "v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
}
POLICY_DIR = "/var/lib/mxserve/policies"


def manifests() -> List[dict]:
    documents = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return documents


@pytest.fixture(scope="module")
def objects() -> Dict[str, dict]:
    docs = manifests()
    kinds = [doc["kind"] for doc in docs]
    assert sorted(kinds) == sorted(EXPECTED), kinds
    return {doc["kind"]: doc for doc in docs}


@pytest.fixture(scope="module")
def pod(objects):
    return objects["Deployment"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def daemon_container(pod):
    (container,) = [c for c in pod["containers"] if c["name"] == "mxserved"]
    return container


def test_kinds_and_api_versions(objects):
    assert {kind: doc["apiVersion"] for kind, doc in objects.items()} == EXPECTED
    for doc in objects.values():
        assert "namespace" not in doc["metadata"], "kustomization.yaml sets the namespace"
    assert objects["Namespace"]["metadata"]["name"] == NAMESPACE


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)


def test_service_is_headless_and_selects_the_pods(objects):
    service, deployment = objects["Service"], objects["Deployment"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= template_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert service["metadata"]["name"] == "mxserved"  # dns:///mxserved.mxserve.svc...


def test_ports_probes_and_service_monitor_line_up(objects, daemon_container):
    ports = {p["name"]: p["containerPort"] for p in daemon_container["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}
    args = args_dict(daemon_container["args"])
    assert args["--listen"] == f"0.0.0.0:{ports['grpc']}"
    assert args["--metrics-listen"] == f"0.0.0.0:{ports['metrics']}"

    service_ports = {p["name"]: p for p in objects["Service"]["spec"]["ports"]}
    assert set(service_ports) == {"grpc", "metrics"}
    for name, port in service_ports.items():
        target = port["targetPort"]
        assert target == name or target == ports[name]
        # Headless: clients dial the pods directly, so the ports must be the pods'.
        assert port["port"] == ports[name]

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert daemon_container[probe]["grpc"]["port"] == ports["grpc"], probe

    monitor = objects["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        objects["Service"]["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["port"] in service_ports
    assert endpoint["interval"] == "5s"
    assert endpoint.get("path", "/metrics") == "/metrics"


def test_daemon_args_are_flags_mxserved_has(daemon_container, mxserved_flags):
    assert daemon_container["command"] == ["/usr/local/bin/mxserved"]
    check_daemon_args(daemon_container["args"], mxserved_flags)
    args = args_dict(daemon_container["args"])
    assert args["--backend"] == "fpga"
    assert args["--policy-dir"] == POLICY_DIR


def test_policy_dir_is_writable_and_seeded_from_the_config_map(objects, pod, daemon_container):
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in daemon_container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[POLICY_DIR]], "the daemon must be able to write policies"
    (init,) = pod["initContainers"]
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert init_mounts[POLICY_DIR] == mounts[POLICY_DIR]
    (source,) = [path for path, name in init_mounts.items()
                 if volumes[name].get("configMap", {}).get("name") ==
                 objects["ConfigMap"]["metadata"]["name"]]
    script = " ".join(init["command"])
    assert f"{source}/*.json" in script and POLICY_DIR in script


def test_pods_run_unprivileged(pod):
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"] + pod["initContainers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
    # The kubelet waits this long after SIGTERM: longer than the daemon's grace.
    grace = int(args_dict(pod["containers"][0]["args"]).get("--grace-seconds", "10"))
    assert pod["terminationGracePeriodSeconds"] > grace


def test_one_fpga_per_pod_on_f2_nodes(pod, daemon_container):
    limits = daemon_container["resources"]["limits"]
    requests = daemon_container["resources"].get("requests", {})
    devices = [name for name in limits if "/" in name]
    assert len(devices) == 1, limits
    (device,) = devices
    # The AMD/Xilinx FPGA device plugin's names: amd.com/<VBNV>-<ts> (xilinx.com/fpga-... before 1.1).
    assert re.fullmatch(r"(amd\.com/|xilinx\.com/fpga-)[A-Za-z0-9_.-]+-\d+", device), device
    assert limits[device] == 1
    assert requests.get(device, 1) == 1
    assert [name for name in requests if "/" in name] in ([], [device])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    (expression,) = [e for term in terms for e in term["matchExpressions"]
                     if e["key"] == "node.kubernetes.io/instance-type"]
    assert expression["operator"] == "In"
    assert expression["values"] and all(v.startswith("f2.") for v in expression["values"])


def test_config_map_policies_load_in_the_daemon(objects, tmp_path):
    data = objects["ConfigMap"]["data"]
    assert data, "the ConfigMap holds no policy"
    for key, text in data.items():
        document = json.loads(text)
        # The daemon writes a policy put later as NAME.json: the same file.
        assert key == document["name"] + ".json"
        (tmp_path / key).write_text(text)
    with Daemon("--listen", "127.0.0.1:0", "--metrics-listen", "off",
                "--policy-dir", str(tmp_path)) as daemon:
        listed = mxctl("--server", daemon.address, "policy", "list")
        assert listed.returncode == 0, listed.stderr
        kinds = dict(line.split()[:2] for line in listed.stdout.splitlines()[1:])
        for key, text in data.items():
            document = json.loads(text)
            assert kinds.get(document["name"]) == "user", listed.stdout
            got = mxctl("--server", daemon.address, "policy", "get", document["name"])
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout) == document  # canonical format names, so equal
        assert daemon.stop(timeout=20) == 0, daemon.log()


def test_kustomize_renders_the_set():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (scripts/deps.sh installs Debian's "
                    "kubernetes-client); the structural checks above still ran")
    result = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    rendered = {doc["kind"]: doc for doc in yaml.safe_load_all(result.stdout) if doc}
    assert sorted(rendered) == sorted(EXPECTED)
    for kind, doc in rendered.items():
        if kind != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, kind
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    for container in pod["containers"] + pod["initContainers"]:
        assert container["image"] == f"{image['name']}:{image['newTag']}", container["name"]
    # Apart from the namespace and the image tag, kustomize changed nothing.
    for doc in manifests():
        out = json.loads(json.dumps(rendered[doc["kind"]]))
        out["metadata"].pop("namespace", None)
        for container in (out["spec"]["template"]["spec"]["containers"] +
                          out["spec"]["template"]["spec"]["initContainers"]
                          if doc["kind"] == "Deployment" else []):
            container["image"] = image["name"]
        assert out == doc, doc["kind"]
