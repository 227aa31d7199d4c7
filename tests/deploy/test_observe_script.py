"""`make observe` (scripts/observe.sh): mxserved and Prometheus natively with the
project's config and rules. Started on free ports, it reports ready, Prometheus
scrapes the daemon and has loaded every rule, traffic shows up, and SIGTERM stops
both (their ports are free again)."""

import os
import signal
import socket
import subprocess
import threading

import yaml

from conftest import BIN_DIR, REPO
from stack import DEPLOY, PrometheusApi, free_port


def test_observe_runs_the_stack_and_stops_it(tmp_path):
    ports = {"OBSERVE_GRPC_PORT": free_port(), "OBSERVE_METRICS_PORT": free_port(),
             "OBSERVE_PROMETHEUS_PORT": free_port()}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           "OBSERVE_DIR": str(tmp_path), "BUILD_DIR": str(BIN_DIR.parent)}
    script = subprocess.Popen(["bash", str(REPO / "scripts" / "observe.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    ready = threading.Event()

    def read():
        for line in script.stdout:
            output.append(line)
            if line.startswith("observe: ready"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "".join(output)
        text = "".join(output)
        prom = ports["OBSERVE_PROMETHEUS_PORT"]
        assert f"gRPC 127.0.0.1:{ports['OBSERVE_GRPC_PORT']}" in text
        assert f"http://127.0.0.1:{prom}" in text

        api = PrometheusApi(prom)
        metrics = f"127.0.0.1:{ports['OBSERVE_METRICS_PORT']}"
        api.wait_for(lambda: api.query(f'up{{job="mxserved", instance="{metrics}"}} == 1'), 30,
                     "the mxserved target up")
        rules = yaml.safe_load((DEPLOY / "prometheus" / "rules" / "mxserve.rules.yml").read_text())
        want = {r.get("record") or r.get("alert") for g in rules["groups"] for r in g["rules"]}
        loaded = {r["name"] for g in api.api("rules")["groups"] for r in g["rules"]}
        assert loaded == want

        bench = subprocess.run(
            [str(BIN_DIR / "mxctl"), "bench", "--server", f"127.0.0.1:{ports['OBSERVE_GRPC_PORT']}",
             "--phase", "reward", "--format", "mxfp8", "--m", "4", "--k", "128", "--n", "64",
             "--duration", "2s"], capture_output=True, text=True, timeout=60)
        assert bench.returncode == 0, bench.stdout + bench.stderr
        api.wait_for(lambda: api.query(
            'mxserve_requests_total{phase="reward", format="MXFP8_E4M3"} > 0'), 30,
            "the bench's requests in Prometheus")
    finally:
        script.send_signal(signal.SIGTERM)
        code = script.wait(timeout=60)
        reader.join(timeout=5)
    assert code == 0, "".join(output)
    assert "observe: stopped" in "".join(output)
    for port in ports.values():  # nothing is left listening
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, port
