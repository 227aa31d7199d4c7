"""Debian's real Prometheus as a child process on 127.0.0.1, for the deploy tests
(mxserved: conftest.Daemon). Prometheus runs the project's own
deploy/prometheus/prometheus.yml and rules with only the scrape target (a free
port) and the intervals rewritten."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional

import yaml

from conftest import REPO
from daemon_process import stop_process  # on the path through conftest

sys.path.insert(0, str(REPO / "clients" / "python"))
DEPLOY = REPO / "deploy"
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_config(target: str, interval: str = "1s") -> Dict[str, Any]:
    """deploy/prometheus/prometheus.yml with `target` scraped and rules loaded from
    the checkout, every `interval`."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=interval, scrape_timeout=interval,
                            evaluation_interval=interval)
    config["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in config["rule_files"]]
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "mxserved"]
    job["static_configs"] = [{"targets": [target]}]
    return config


class PrometheusApi:
    """The HTTP API of a Prometheus on 127.0.0.1:`port`."""

    def __init__(self, port: int):
        self.port = port

    def api(self, path: str, **params) -> Any:
        """GET /api/v1/<path>; the `data` of a success, else AssertionError with the error."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, time: Optional[float] = None) -> list:
        params = {"query": expr}
        if time is not None:
            params["time"] = f"{time:.3f}"
        return self.api("query", **params)["result"]

    def wait_for(self, predicate, timeout: float, what: str, poll: float = 0.25):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(poll)


class Prometheus(PrometheusApi):
    """Debian's prometheus with `config`, its data in `workdir`, its API on a free port."""

    def __init__(self, config: Dict[str, Any], workdir: pathlib.Path, start_timeout: float = 60):
        super().__init__(free_port())
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("prometheus did not start:\n" + self.log())
                time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        code = stop_process(self.process)
        self._log.close()
        return code
