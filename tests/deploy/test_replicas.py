"""Several daemons behind one target, as a headless Service's DNS name resolves to
every pod (deploy/k8s). The client libraries spread calls with round_robin (their
own tests show it); mxctl keeps pick_first, because one command's calls build on
one daemon's state: bench registers a model, uploads it, then calls it."""

from conftest import Daemon, local_daemon_flags, metric_sum, mxctl


def test_mxctl_bench_over_two_daemons_stays_on_one():
    with Daemon(*local_daemon_flags("--workers", "1")) as first, \
            Daemon(*local_daemon_flags("--workers", "1")) as second:
        target = f"ipv4:{first.address},{second.address}"
        result = mxctl("bench", "--server", target, "--m", "2", "--k", "64", "--n", "16",
                       "--concurrency", "2", "--duration", "1s", "--warmup", "0s", "--json")
        assert result.returncode == 0, result.stderr
        served = [metric_sum(d.metrics_address, "mxserve_requests_total", rpc="LayerForward")
                  for d in (first, second)]
        assert sorted(served)[0] == 0 and sorted(served)[1] > 0, served
        assert (first.stop(timeout=20), second.stop(timeout=20)) == (0, 0)
