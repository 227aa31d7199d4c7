"""End to end: the real mxserved and Debian's real Prometheus, run with the project's
own config and recording rules (only the target and the intervals rewritten).
Traffic in all three RLHF phases, failing calls, and a replayed GPU baseline power
trace; then every target of every dashboard panel, its variables at their "All"
values, is evaluated through Prometheus' HTTP API the way Grafana would (range
panels over the run, instant panels at its end): each must parse and return data.
The dashboard's energy per phase and source, and its saving against the GPU
baseline, must agree with GetEnergyReport within 1 %.

Set MXSERVE_OBSERVE_REPORT=FILE to keep the figures read (markdown: each panel's
queries and values), as the README shows for a sample run."""

import json
import math
import os
import pathlib
import threading
import time
import urllib.request

import numpy as np
import pytest

from conftest import Daemon, local_daemon_flags
from stack import DEPLOY, Prometheus, prometheus_config

import mxserve  # noqa: E402  (stack puts clients/python on the path)
from mxserve.rlhf.power import ReplayPower

SCRAPE = 1.0                # seconds, the rewritten scrape and evaluation interval
RATE_INTERVAL = "4s"        # Grafana's $__rate_interval for it: 4 scrape intervals
LAYERS = [mxserve.LayerSpec(f"model.layers.{i}.mlp.up_proj", 96, 128, False) for i in range(4)]
PHASES = ("rollout", "reward", "update")


def finite_values(result):
    for series in result:
        points = series.get("values") or [series["value"]]
        for _, value in points:
            if math.isfinite(float(value)):
                yield float(value)


def substitute(expr, range_seconds):
    for name, value in (("$__rate_interval", RATE_INTERVAL), ("$__range", f"{range_seconds}s"),
                        ("$instance", ".*"), ("$phase", ".*"), ("$format", ".*")):
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def power_trace(path):
    """6 s at 10 Hz: rollout at 150-250 W, reward at 120 W, update at 300 W."""
    rows = ["timestamp,watts,phase"]
    for i in range(61):
        t = i / 10
        phase = PHASES[min(int(t // 2), 2)]
        watts = {"rollout": 150 + 100 * (i % 2), "reward": 120, "update": 300}[phase]
        rows.append(f"{t:.1f},{watts},{phase}")
    path.write_text("\n".join(rows) + "\n")


def drive(client, stop):
    """Compute in every phase until `stop`: policy-chosen formats, explicit ones, a
    backward pass, a Gemm, layer calls computed client-side and reported
    (ReportWork), and calls that fail (unknown model, wrong shape)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 128), dtype=np.float32)
    dy = rng.standard_normal((8, 96), dtype=np.float32)
    a = rng.standard_normal((16, 64), dtype=np.float32)
    b = rng.standard_normal((64, 32), dtype=np.float32)
    calls = 0
    while not stop.is_set() or calls < 3:
        for layer in LAYERS:
            client.forward("e2e", layer.name, x, phase="rollout")
            client.forward("e2e", layer.name, x, phase="reward", format="MXFP8_E4M3")
            client.backward("e2e", layer.name, dy, x, phase="update", format="BF16")
        client.gemm(a, b, "MXINT8", phase="rollout")
        client.report_work([mxserve.WorkCall("rollout", None, "e2e", LAYERS[0].name, "forward",
                                             "MXFP4", m=8, count=2)])
        for bad in (lambda: client.forward("nope", LAYERS[0].name, x, phase="rollout"),
                    lambda: client.forward("e2e", LAYERS[0].name, x[:, :100], phase="reward")):
            with pytest.raises(mxserve.MxserveError):
                bad()
        calls += 1


def test_every_dashboard_query_returns_data_and_energy_agrees(tmp_path):
    t_begin = time.time()
    # --metrics-model-energy: the dashboard's per-model panel needs its series.
    daemon = Daemon(*local_daemon_flags("--backend", "cpu", "--workers", "2",
                                        "--metrics-model-energy", "true"))
    prometheus = None
    try:
        prometheus = Prometheus(prometheus_config(daemon.metrics_address, f"{SCRAPE:g}s"),
                                tmp_path / "prometheus")
        # The model's energy series are scraped at zero before any work.
        prometheus.wait_for(lambda: len(prometheus.query(
            'mxserve_energy_joules_total{source="fpga_model"} == 0')) == 3, 30,
            "the first scrape of mxserved")
        client = mxserve.Client(daemon.address)
        client.wait_ready()
        client.register_model("e2e", LAYERS)
        rng = np.random.default_rng(3)
        client.upload_weights("e2e", {l.name: rng.standard_normal((96, 128), dtype=np.float32)
                                      for l in LAYERS}, publish=True)

        trace = tmp_path / "gpu_power.csv"
        power_trace(trace)
        replay = ReplayPower(str(trace))

        def samples():
            # One sample opens the series at 0 J; Prometheus scrapes that zero before
            # the trace adds joules, so increase() over the range counts them all.
            yield mxserve.PowerSample("gpu_baseline", "replay0", "rollout", time.time(), 150.0)
            prometheus.wait_for(lambda: len(prometheus.query(
                'mxserve_energy_joules_total{source="gpu_baseline"} == 0')) == 3, 30,
                "the GPU baseline's zero")
            while (sample := replay.read()) is not None:
                t, watts, phase = sample
                yield mxserve.PowerSample("gpu_baseline", "replay0", phase, t, watts)

        stop = threading.Event()
        power_result = {}

        def stream_power():
            try:
                power_result["ok"] = client.report_power(samples(), timeout=120)
            finally:
                stop.set()

        power = threading.Thread(target=stream_power)
        power.start()
        drive(client, stop)
        power.join(timeout=120)
        assert power_result["ok"].samples_accepted == 62

        # Wait until Prometheus holds the daemon's final counters.
        def final_scrape():
            with urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics") as page:
                text = page.read().decode()
            want = {}
            for line in text.splitlines():
                if line.startswith("mxserve_energy_joules_total{"):
                    want[line.split("{")[1].split("}")[0]] = float(line.rsplit(" ", 1)[1])
            got = prometheus.query("mxserve_energy_joules_total")
            have = {",".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items())
                             if k in ("phase", "source")): float(s["value"][1]) for s in got}
            return len(want) == 6 and have == want
        prometheus.wait_for(final_scrape, 30, "the final counters in Prometheus")
        [last] = prometheus.query("max(timestamp(mxserve_energy_joules_total))")
        t_end = float(last["value"][1])
        range_seconds = math.ceil(t_end - t_begin) + 1
        report = client.energy_report()

        # Every panel's every target, as Grafana would send it.
        dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "mxserve-energy.json").read_text())
        figures = []
        results = {}  # (panel title, refId) -> what Prometheus returned
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], range_seconds)
                if target["instant"]:
                    result = prometheus.query(expr, time=t_end)
                else:
                    result = prometheus.api("query_range", query=expr, start=f"{t_begin:.3f}",
                                            end=f"{t_end:.3f}", step=f"{SCRAPE:g}")["result"]
                values = list(finite_values(result))
                assert values, f"{panel['title']!r} {target['refId']}: no data for\n{expr}"
                figures.append((panel, target, result))
                results[(panel["title"], target["refId"])] = result

        # The variables' queries find this daemon and the formats it served.
        instances = prometheus.api("label/instance/values", **{"match[]": "mxserve_build_info"})
        assert daemon.metrics_address in instances
        formats = prometheus.api("label/format/values", **{"match[]": "mxserve_requests_total"})
        assert {"MXFP8_E4M3", "BF16", "MXINT8"} <= set(formats)

        # Energy per phase and source: the dashboard's figures are the daemon's.
        dashboard_joules = {(s["metric"]["source"], s["metric"]["phase"]): float(s["value"][1])
                            for s in results[("Energy per phase and source", "A")]}
        for source in ("fpga_model", "gpu_baseline"):
            for phase in PHASES:
                want = report.joules(source, phase)
                got = dashboard_joules[(source, phase)]
                assert want > 0, (source, phase)
                assert got == pytest.approx(want, rel=0.01), (source, phase, got, want)
        assert set(dashboard_joules) == {(e.source, e.phase) for e in report.entries}

        savings = {s["metric"]["phase"]: float(s["value"][1])
                   for s in results[("Energy saving vs the GPU baseline", "A")]}
        assert set(savings) == set(PHASES)
        for phase in PHASES:
            want = 1 - report.joules("fpga_model", phase) / report.joules("gpu_baseline", phase)
            assert 1 - savings[phase] == pytest.approx(1 - want, rel=0.01), phase

        # The recording rules have data too.
        rules = prometheus.api("rules")["groups"]
        names = [r["name"] for g in rules for r in g["rules"] if r["type"] == "recording"]
        assert len(names) >= 10
        empty = [n for n in names if not list(finite_values(prometheus.query(n)))]
        assert empty == []
        assert prometheus.query('rpc_code:mxserve_rpc_errors:rate5m{code="NOT_FOUND"}')

        if os.environ.get("MXSERVE_OBSERVE_REPORT"):
            write_report(pathlib.Path(os.environ["MXSERVE_OBSERVE_REPORT"]), figures, report,
                         t_end - t_begin)
    finally:
        if prometheus is not None:
            assert prometheus.stop() == 0, prometheus.log()
        assert daemon.stop() == 0, daemon.log()


UNIT_TEXT = {"joule": " J", "watt": " W", "percentunit": "", "reqps": " req/s", "s": " s",
             "short": "", "bytes": " B", "flops": " FLOP/s", "Bps": " B/s"}


def write_report(path, figures, report, seconds):
    """Markdown for the README: per panel its queries and what Prometheus returned at
    the end of the run (range panels: the last value of each series)."""
    def figure(value, unit):
        if unit == "percentunit":
            return f"{100 * value:.2f} %"
        suffix = unit[len("suffix:"):] if unit.startswith("suffix:") else UNIT_TEXT[unit]
        return f"{value:.4g}{suffix}"

    lines = []
    for panel, target, result in figures:
        unit = panel["fieldConfig"]["defaults"]["unit"]
        if target["refId"] == "A":
            lines += [f"**{panel['title']}** ({panel['type']}, unit `{unit}`)", ""]
        lines += ["```promql", target["expr"], "```", ""]
        rows = []
        for s in result:
            value = float((s.get("values") or [s.get("value")])[-1][1])
            name = " ".join(v for k, v in sorted(s["metric"].items())) or "all"
            rows.append(f"{name}: {figure(value, unit)}")
        lines += ["Read: " + "; ".join(sorted(rows)), ""]
    lines += [f"GetEnergyReport at the end of the same {seconds:.0f} s run:", "",
              "| source | phase | joules | busy s | requests |", "|---|---|---|---|---|"]
    for e in sorted(report.entries, key=lambda e: (e.source, PHASES.index(e.phase))):
        lines.append(f"| {e.source} | {e.phase} | {e.joules:.4g} | {e.busy_seconds:.4g} | "
                     f"{e.requests} |")
    path.write_text("\n".join(lines) + "\n")
