#!/usr/bin/env python3
"""Writes dashboards/mxserve-energy.json, mxserve's Grafana dashboard.

The dashboard is code so that its queries are reviewable in one place and every
panel gets a title, a description, a unit and a templated datasource by
construction. `python3 deploy/grafana/dashboard.py` rewrites the JSON;
tests/deploy/test_dashboard.py fails when the committed JSON and this file differ,
lints the JSON and evaluates every query against a real Prometheus.

Queries filter by the dashboard's variables (instance, phase, format; "All" is the
regex .*) and take rates over $__rate_interval, totals over $__range.
"""
import json
import pathlib
import sys

DATASOURCE_UID = "mxserve-prometheus"  # deploy/grafana/provisioning/datasources/mxserve.yml
DS = {"type": "prometheus", "uid": "${datasource}"}
OUT = pathlib.Path(__file__).resolve().parent / "dashboards" / "mxserve-energy.json"

I = 'instance=~"$instance"'
P = 'phase=~"$phase"'
F = 'format=~"$format"'
# The baseline's samples (gpu_baseline_sampled, beside its counter's joules) are
# the same GPU measured another way, not a source to compare with it.
NOT_GPU = 'source!~"gpu_baseline|gpu_baseline_sampled"'
GPU = 'source="gpu_baseline"'
NOT_OK = 'code!="OK"'


def sel(*matchers: str) -> str:
    return "{" + ", ".join(matchers) + "}"


def rate(metric: str, *matchers: str) -> str:
    return f"rate({metric}{sel(*matchers)}[$__rate_interval])"


# Energy of non-baseline sources over the GPU baseline's, per phase, over the range.
SAVING = (
    "1 - (\n"
    f'  sum by (source, phase) (increase(mxserve_energy_joules_total{sel(I, P, NOT_GPU)}[$__range]))\n'
    "    / on (phase) group_left ()\n"
    f'  (sum by (phase) (increase(mxserve_energy_joules_total{sel(I, P, GPU)}[$__range])) > 0)\n'
    ")")


def per_format(denominator: str, scale: str = "") -> str:
    """Request energy by (source, phase, format) over a per-(phase, format) rate."""
    return (f"sum by (source, phase, format) ({rate('mxserve_request_energy_joules_total', I, P, F)})\n"
            "  / on (phase, format) group_left ()\n"
            f"(sum by (phase, format) ({rate(denominator, I, P, F)}){scale} > 0)")


def quantiles(histogram: str, matchers, legend: str):
    targets = [(f"histogram_quantile({q}, sum by (le) ({rate(histogram + '_bucket', *matchers)}))",
                f"p{round(q * 100)}{legend}") for q in (0.5, 0.9, 0.99)]
    targets.append((f"sum({rate(histogram + '_sum', *matchers)})\n"
                    f"  / (sum({rate(histogram + '_count', *matchers)}) > 0)", f"mean{legend}"))
    return targets


class Layout:
    def __init__(self):
        self.panels, self.y, self.x, self.row_h, self.next_id = [], 0, 0, 0, 1

    def row(self, title: str):
        self._newline()
        self.panels.append({"type": "row", "id": self._id(), "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, kind, title, description, unit, targets, w=8, h=8, instant=False, **extra):
        if self.x + w > 24:
            self._newline()
        panel = {
            "type": kind, "id": self._id(), "title": title, "description": description,
            "datasource": DS, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr,
                         "legendFormat": legend, "instant": instant, "range": not instant}
                        for i, (expr, legend) in enumerate(targets)],
        }
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {
                "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                "stacking": {"mode": extra.pop("stacking", "none"), "group": "A"}}
            panel["options"] = {"legend": {"displayMode": "table", "placement": "bottom",
                                           "calcs": ["lastNotNull", "max"]},
                                "tooltip": {"mode": "multi", "sort": "desc"}}
        elif kind == "bargauge":
            panel["options"] = {"orientation": "horizontal", "displayMode": "gradient",
                                "showUnfilled": True, "valueMode": "color",
                                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                                  "values": False}}
        panel.update(extra)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _newline(self):
        self.y += self.row_h
        self.x = self.row_h = 0

    def _id(self):
        self.next_id += 1
        return self.next_id - 1


def variables():
    def all_of(name, label, description, query=None, values=None):
        v = {"name": name, "label": label, "description": description, "includeAll": True,
             "multi": True, "allValue": ".*", "hide": 0,
             "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}
        if values is not None:
            v.update(type="custom", query=",".join(values),
                     options=[{"selected": False, "text": x, "value": x} for x in values])
        else:
            v.update(type="query", datasource=DS, definition=query, refresh=2, sort=1, regex="",
                     query={"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
        return v

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "description": "The Prometheus that scrapes mxserved", "hide": 0, "regex": "",
         "current": {"selected": True, "text": "Prometheus (mxserve)", "value": DATASOURCE_UID}},
        all_of("instance", "Instance", "mxserved instances (host:metrics port)",
               query="label_values(mxserve_build_info, instance)"),
        all_of("phase", "Phase", "RLHF phases", values=["rollout", "reward", "update"]),
        all_of("format", "Format", "Weight formats that served requests",
               query="label_values(mxserve_requests_total, format)"),
    ]


def build() -> dict:
    d = Layout()
    d.row("Energy per RLHF phase")
    d.panel("bargauge", "Energy per phase and source",
            "Joules per RLHF phase over the dashboard's time range, one bar per (phase, source): "
            "fpga = the F2 board's measured power over device-busy time, fpga_model = the FPGA "
            "model's estimate (emulation), gpu_baseline = a GPU's measured energy (NVML's "
            "counter per phase through ReportEnergy, else its power samples), "
            "gpu_baseline_sampled = that GPU's power samples where the counter gave the energy. Needs the range to cover the work (increase over $__range).",
            "joule", [(f"sum by (phase, source) (increase(mxserve_energy_joules_total{sel(I, P)}[$__range]))",
                       "{{phase}} · {{source}}")], instant=True)
    d.panel("bargauge", "Energy saving vs the GPU baseline",
            "1 − E(source) / E(gpu_baseline) per phase over the time range: 75 % means a quarter "
            "of the GPU's joules for that phase. Phases without baseline power are not shown. "
            "Meaningful when both ran the same work in the range (see the experiment runner).",
            "percentunit", [(SAVING, "{{phase}} · {{source}}")], instant=True,
            fieldConfig={"defaults": {"unit": "percentunit", "min": -1, "max": 1}, "overrides": []})
    d.panel("timeseries", "Power per source and device",
            "Last reported watts per (source, device) (GPU baseline, F2 board), and each "
            "source's average power from its energy counter (the only view of fpga_model).",
            "watt", [(f"max by (source, device) (mxserve_power_watts{sel(I)})", "{{source}} {{device}}"),
                     (f"sum by (source) ({rate('mxserve_energy_joules_total', I, P)})",
                      "{{source}} from energy")])
    d.panel("timeseries", "Energy in $phase, stacked by source",
            "Joules per rate interval in one phase, the sources stacked: where a phase spends "
            "its energy over time. One panel per selected phase, side by side.",
            "joule", [(f"sum by (source) (increase(mxserve_energy_joules_total{sel(I, P)}[$__rate_interval]))",
                       "{{source}}")], w=24, stacking="normal", repeat="phase",
            repeatDirection="h", maxPerRow=3)
    d.panel("timeseries", "Joules per request by phase × format",
            "Device energy of served compute requests divided by their count, per weight "
            "format: what one LayerForward/LayerBackward/Gemm costs in each format.",
            "suffix: J", [(per_format("mxserve_requests_total"), "{{source}} {{phase}} {{format}}")],
            w=12)
    d.panel("timeseries", "Joules per GFLOP by phase × format",
            "Device energy of served compute requests per 10^9 floating-point operations "
            "(2·M·N·K): the format's energy efficiency, independent of request size.",
            "suffix: J/GFLOP",
            [(per_format("mxserve_flops_total", " / 1e9"), "{{source}} {{phase}} {{format}}")], w=12)
    d.panel("bargauge", "Energy per model",
            "fpga_model joules of each model's layer calls over the time range (served, or "
            "computed by the client and reported), the ten largest: which model — policy, "
            "reference, reward — a phase's energy goes to. Empty unless mxserved runs with "
            "--metrics-model-energy true (it puts model names in /metrics). The first 32 models "
            "named have a series of their own, later ones share model=\"other\"; "
            "GetEnergyReport with by_model has them all.",
            "joule", [(f"topk(10, sum by (model) (increase(mxserve_model_energy_joules_total"
                       f"{sel(I, P)}[$__range])))", "{{model}}")], w=24, instant=True)

    d.row("Serving")
    d.panel("timeseries", "Requests/s by phase × format",
            "Compute requests served successfully per second (Gemm, LayerForward, LayerBackward, "
            "Stream items), by phase and the weight's format.", "reqps",
            [(f"sum by (phase, format) ({rate('mxserve_requests_total', I, P, F)})",
              "{{phase}} {{format}}")], w=12)
    d.panel("timeseries", "Request latency",
            "Arrival to response inside the daemon, from mxserve_request_duration_seconds: "
            "p50/p90/p99 interpolated in the histogram's buckets, and the mean (sum/count).",
            "s", quantiles("mxserve_request_duration_seconds", (I, P, F), ""), w=12)
    d.panel("timeseries", "Queue time",
            "Time compute requests waited for a worker (mxserve_queue_duration_seconds).", "s",
            quantiles("mxserve_queue_duration_seconds", (I, P), " queued"))
    d.panel("timeseries", "Batch size",
            "Mean requests per backend GEMM (LayerForward batching, --max-batch, "
            "--batch-window-us); 1 means nothing fused. No quantiles: interpolating in the "
            "histogram's power-of-two buckets would show fractions of a request.", "short",
            [(f"sum({rate('mxserve_batch_size_sum', I)})\n"
              f"  / (sum({rate('mxserve_batch_size_count', I)}) > 0)", "mean batch")])
    d.panel("timeseries", "Queue depth",
            "Compute requests waiting in the scheduler's queue now (--queue-size is the limit).",
            "short", [(f"sum by (instance) (mxserve_queue_depth{sel(I)})", "{{instance}}")])
    d.panel("timeseries", "FLOP/s by phase × format",
            "Floating-point operations per second of the served GEMMs (2·M·N·K each).", "flops",
            [(f"sum by (phase, format) ({rate('mxserve_flops_total', I, P, F)})",
              "{{phase}} {{format}}")])
    d.panel("timeseries", "Reported (emulated) calls/s by phase × format",
            "Layer calls per second that clients computed in their own process and reported "
            "(Telemetry.ReportWork, compute=\"local\"), by phase, format and call (forward, "
            "backward). Their FPGA-model energy, FLOPs and bytes are in the panels above as "
            "served calls'; they are not in Requests/s or the latency panels.", "reqps",
            [(f"sum by (phase, format, call) ({rate('mxserve_emulated_calls_total', I, P, F)})",
              "{{phase}} {{format}} {{call}}")])
    d.panel("timeseries", "Device busy share by phase",
            "Seconds busy per second of wall time, per source and phase (modelled for "
            "fpga_model, measured for the board and the GPU baseline).", "percentunit",
            [(f"sum by (source, phase) ({rate('mxserve_busy_seconds_total', I, P)})",
              "{{source}} {{phase}}")])
    d.panel("timeseries", "Weight memory",
            "Bytes held for weights (FP32 masters, staged uploads, quantized copies) against "
            "--weight-memory-bytes, per instance.", "bytes",
            [(f"sum by (instance) (mxserve_weight_bytes{sel(I)})", "{{instance}}")])
    d.panel("timeseries", "RPC errors by code",
            "Finished RPCs per second whose status was not OK, by rpc and gRPC code "
            "(INVALID_ARGUMENT/NOT_FOUND: clients' input; INTERNAL/UNKNOWN: the daemon's fault).",
            "reqps", [(f"sum by (rpc, code) ({rate('mxserve_rpc_completed_total', I, NOT_OK)})",
                       "{{rpc}} {{code}}")], w=24)
    return {
        "uid": "mxserve-energy",
        "title": "mxserve: energy per RLHF phase",
        "description": "Joules, power and saving per RLHF phase and source (FPGA, FPGA model, "
                       "GPU baseline), and how mxserved serves: throughput, latency, queueing, "
                       "memory, errors.",
        "tags": ["mxserve", "energy", "rlhf"],
        "editable": False,
        "graphTooltip": 1,
        "refresh": "5s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-15m", "to": "now"},
        "timepicker": {"refresh_intervals": ["2s", "5s", "10s", "30s", "1m", "5m"]},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": variables()},
        "panels": d.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(pathlib.Path.cwd()) if OUT.is_relative_to(pathlib.Path.cwd()) else OUT}",
          file=sys.stderr)
