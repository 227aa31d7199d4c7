"""The Grafana dashboard, linted in the spirit of grafana/dashboard-linter: it is
what deploy/grafana/dashboard.py writes; every panel has a title, a description, a
unit and the templated datasource; every rate and increase runs over
$__rate_interval or $__range; panel ids are unique and the grid is valid; every
variable used is defined; every metric is one the daemon exports. The linter is
shown to catch each kind of mistake on a broken copy."""

import importlib.util
import json
import re

import pytest

from conftest import REPO
from stack import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mxserve-energy.json"
# Grafana's unit ids this dashboard may use; custom units are "suffix:<text>".
UNITS = {"joule", "watt", "percentunit", "reqps", "s", "short", "bytes", "flops", "Bps"}
RANGE = re.compile(r"\[([^\]]*)\]")
VARIABLE = re.compile(r"\$\{?(\w+)")
METRIC = re.compile(r"\b(mxserve_[a-z_]+)")


def exported_metrics():
    """Metric names in server/README.md's table, with histograms' series suffixes."""
    names = set(re.findall(r"^\| `(mxserve_[a-z_]+)` \|", (REPO / "server" / "README.md").read_text(),
                           re.M))
    return names | {n + s for n in names for s in ("_bucket", "_sum", "_count")}


def lint(d):
    problems = []
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables.get("datasource")
    if not ds or ds["type"] != "datasource" or ds["query"] != "prometheus":
        problems.append("no Prometheus datasource variable")
    for name in ("instance", "phase", "format"):
        v = variables.get(name)
        if not v or not (v.get("includeAll") and v.get("multi") and v.get("allValue") == ".*"):
            problems.append(f"variable {name}: missing, or not multi with All = .*")
    ids = [p.get("id") for p in d["panels"]]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids not unique: {ids}")
    cells = {}
    metrics = exported_metrics()
    for p in d["panels"]:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        g = p.get("gridPos", {})
        if not (g.get("h", 0) > 0 and 1 <= g.get("w", 0) <= 24 and g.get("x", -1) >= 0
                and g["x"] + g["w"] <= 24 and g.get("y", -1) >= 0):
            problems.append(f"{where}: invalid gridPos {g}")
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        problems.append(f"{where}: overlaps panel {cells[(x, y)]}")
                        break
                    cells[(x, y)] = p.get("id")
                else:
                    continue
                break
        if p["type"] == "row":
            continue
        if not p.get("title"):
            problems.append(f"{where}: no title")
        if not p.get("description"):
            problems.append(f"{where}: no description")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if unit not in UNITS and not unit.startswith("suffix:"):
            problems.append(f"{where}: unit {unit!r} is not a known Grafana unit")
        if p.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            problems.append(f"{where}: datasource is not the templated one")
        if p.get("repeat") and p["repeat"] not in variables:
            problems.append(f"{where}: repeats over undefined ${p['repeat']}")
        targets = p.get("targets", [])
        if not targets:
            problems.append(f"{where}: no targets")
        if len({t.get("refId") for t in targets}) != len(targets):
            problems.append(f"{where}: refIds not unique")
        for t in targets:
            expr = t.get("expr", "")
            if t.get("datasource") != p.get("datasource"):
                problems.append(f"{where} {t.get('refId')}: target datasource differs")
            for window in RANGE.findall(expr):
                if window not in ("$__rate_interval", "$__range"):
                    problems.append(f"{where}: range [{window}] is not $__rate_interval or $__range")
            for name in VARIABLE.findall(expr):
                if not name.startswith("__") and name not in variables:
                    problems.append(f"{where}: ${name} is not a variable")
            for m in METRIC.findall(expr):
                if m not in metrics:
                    problems.append(f"{where}: {m} is not a metric the daemon exports")
            selectors = re.findall(r"(mxserve_[a-z_]+)(\{[^}]*\})?", expr)
            for m, labels in selectors:
                if 'instance=~"$instance"' not in labels:
                    problems.append(f"{where}: {m} not filtered by $instance")
    return problems


def test_the_json_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "grafana" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.render(), \
        "deploy/grafana/dashboards/mxserve-energy.json is stale: run python3 deploy/grafana/dashboard.py"


def test_the_dashboard_passes_the_lint():
    d = json.loads(DASHBOARD.read_text())
    assert lint(d) == []
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    # The datasource variable defaults to the provisioned uid.
    provisioned = (DEPLOY / "grafana" / "provisioning" / "datasources" / "mxserve.yml").read_text()
    ds = next(v for v in d["templating"]["list"] if v["name"] == "datasource")
    assert f"uid: {ds['current']['value']}" in provisioned


def mutate(change):
    d = json.loads(DASHBOARD.read_text())
    change(d)
    return lint(d)


def panel(d, title):
    return next(p for p in d["panels"] if p.get("title") == title)


@pytest.mark.parametrize("change, problem", [
    (lambda d: panel(d, "Queue depth")["fieldConfig"]["defaults"].pop("unit"), "unit ''"),
    (lambda d: panel(d, "Queue depth")["fieldConfig"]["defaults"].update(unit="furlongs"),
     "unit 'furlongs'"),
    (lambda d: panel(d, "Weight memory").update(description=""), "no description"),
    (lambda d: panel(d, "Weight memory").update(title=""), "no title"),
    (lambda d: panel(d, "Batch size").update(datasource={"type": "prometheus", "uid": "abc"}),
     "not the templated one"),
    (lambda d: panel(d, "FLOP/s by phase × format")["targets"][0].update(
        expr='sum(rate(mxserve_flops_total{instance=~"$instance"}[5m]))'), "range [5m]"),
    (lambda d: panel(d, "FLOP/s by phase × format")["targets"][0].update(
        expr="sum(rate(mxserve_flops_total[$__rate_interval]))"), "not filtered by $instance"),
    (lambda d: panel(d, "FLOP/s by phase × format")["targets"][0].update(
        expr='sum(mxserve_flopz_total{instance=~"$instance", x=~"$nope"})'),
     "$nope is not a variable"),
    (lambda d: panel(d, "FLOP/s by phase × format")["targets"][0].update(
        expr='sum(mxserve_flopz_total{instance=~"$instance"})'), "mxserve_flopz_total is not"),
    (lambda d: panel(d, "Queue time").update(id=panel(d, "Batch size")["id"]), "not unique"),
    (lambda d: panel(d, "Queue time")["gridPos"].update(x=20), "invalid gridPos"),
    (lambda d: panel(d, "Queue time")["gridPos"].update(x=4), "overlaps"),
    (lambda d: d["templating"]["list"].pop(), "variable format"),
])
def test_the_lint_catches(change, problem):
    problems = mutate(change)
    assert any(problem in p for p in problems), problems
