"""deploy/prometheus: the config and the rules it loads pass promtool check, and the rules' unit tests
(known series in, every recording rule's and alert's figures out) pass."""

import subprocess

import yaml

from stack import DEPLOY, PROMTOOL


def promtool(*args, cwd=DEPLOY / "prometheus"):
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_config_is_valid_and_loads_the_rules():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    # check config checks every rule file it loads, too.
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr
    assert "Checking rules/mxserve.rules.yml" in result.stdout + result.stderr


def test_every_rule_has_a_unit_test_and_the_tests_pass():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules" / "mxserve.rules.yml").read_text())
    names = {r.get("record") or r.get("alert") for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "tests" / "mxserve.rules.test.yml").read_text())
    tested = {t["expr"] for case in tests["tests"] for t in case.get("promql_expr_test", [])}
    tested |= {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    assert names - tested == set(), "rules without a promtool test"
    result = promtool("test", "rules", "tests/mxserve.rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_wrong_expectation_fails(tmp_path):
    # The unit tests can fail: the same file with one expected figure changed.
    text = (DEPLOY / "prometheus" / "tests" / "mxserve.rules.test.yml").read_text()
    assert "value: 0.75}" in text
    broken = tmp_path / "broken.test.yml"
    broken.write_text(text.replace("value: 0.75}", "value: 0.7}").replace(
        "../rules/mxserve.rules.yml", str(DEPLOY / "prometheus" / "rules" / "mxserve.rules.yml")))
    result = promtool("test", "rules", str(broken), cwd=tmp_path)
    assert result.returncode != 0
    assert "energy_saving_vs_gpu_baseline" in result.stdout + result.stderr
