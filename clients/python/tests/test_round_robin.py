"""One Client over two real daemons: round_robin spreads calls over both.

The target names both addresses ("ipv4:A,B"), as a headless Service's DNS name
resolves to every pod (deploy/k8s). Each daemon's own /metrics says how many
Gemm calls it served.
"""

import re
import urllib.request

import numpy as np
import pytest

import mxserve
from conftest import Daemon

CALLS = 20
_GEMM_COUNT = re.compile(r'^mxserve_requests_total\{[^}]*rpc="Gemm"[^}]*\} (\S+)$', re.M)


def gemms_served(daemon: Daemon) -> int:
    with urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics", timeout=10) as page:
        text = page.read().decode()
    return int(sum(float(value) for value in _GEMM_COUNT.findall(text)))


@pytest.fixture(scope="module")
def two_daemons():
    first = Daemon("--workers", "1")
    try:
        second = Daemon("--workers", "1")
    except Exception:
        first.stop()
        raise
    yield first, second
    codes = (first.stop(), second.stop())
    assert codes == (0, 0), "\n".join(first.log_lines[-10:] + second.log_lines[-10:])


def run_gemms(client: mxserve.Client) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 32)).astype(np.float32)
    b = rng.standard_normal((32, 8)).astype(np.float32)
    for _ in range(CALLS):
        result = client.gemm(a, b, "FP32", phase="rollout")
        np.testing.assert_allclose(result.output, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_calls_spread_over_every_daemon_of_the_target(two_daemons):
    first, second = two_daemons
    before = gemms_served(first), gemms_served(second)
    with mxserve.Client(f"ipv4:{first.address},{second.address}", timeout=30) as client:
        client.wait_ready(timeout=10)
        run_gemms(client)
    served = gemms_served(first) - before[0], gemms_served(second) - before[1]
    assert sum(served) == CALLS
    assert min(served) > 0, f"one daemon served every call: {served}"


def test_options_choose_another_policy(two_daemons):
    # pick_first: every call to the first address that connects; shows that the
    # spread above is round_robin's doing and that a caller's choice wins.
    first, second = two_daemons
    before = gemms_served(first), gemms_served(second)
    with mxserve.Client(f"ipv4:{first.address},{second.address}", timeout=30,
                        options=[("grpc.lb_policy_name", "pick_first")]) as client:
        client.wait_ready(timeout=10)
        run_gemms(client)
    served = gemms_served(first) - before[0], gemms_served(second) - before[1]
    assert sorted(served) == [0, CALLS]
