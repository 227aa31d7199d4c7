"""Run tags: `client.run(...)` scopes (nesting, threads, explicit `run=`), and the
daemon's energy report read per run (`energy_report(run=...)`), against a real
mxserved. Every tag here is unique to its test: the module's daemon is shared."""

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

import mxserve

RNG = np.random.default_rng(11)


def make_layer(client, model, out_features=32, in_features=64):
    w = RNG.standard_normal((out_features, in_features)).astype(np.float32)
    client.register_model(model, [mxserve.LayerSpec("fc", out_features, in_features, False)])
    client.upload_weights(model, {"fc": w}, publish=True)
    return w


def model_entry(report, phase):
    """The fpga_model entry of `phase`, or None."""
    return report.by_phase("fpga_model").get(phase)


def test_run_scopes_nest_decorate_and_validate_early(client):
    assert client.current_run is None
    with client.run("outer"):
        assert client.current_run == "outer"
        with client.run("exp/inner:1"):
            assert client.current_run == "exp/inner:1"
            with client.run(""):  # untagged inside a tagged scope
                assert client.current_run is None
            assert client.current_run == "exp/inner:1"
        assert client.current_run == "outer"
    assert client.current_run is None

    @client.run("decorated")
    def work():
        return client.current_run

    assert work() == "decorated" and client.current_run is None
    with pytest.raises(KeyError):
        with client.run("raising"):
            raise KeyError("boom")
    assert client.current_run is None

    # Tags are checked when the scope is made, before anything is sent.
    for bad in ("a b", "x" * 65, "rün", "semi;colon", 7):
        with pytest.raises(ValueError, match=r"run: expected 1-64 characters of "
                                             r"\[A-Za-z0-9_.:/-\], got"):
            client.run(bad)
    assert client.run("x" * 64) is not None
    with pytest.raises(TypeError, match=r"client\.run\(\.\.\.\) cannot decorate a coroutine"):
        @client.run("async")
        async def coroutine():
            await asyncio.sleep(0)


def test_compute_calls_carry_the_scope_and_an_explicit_run_wins(client, model_name):
    w = make_layer(client, model_name)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    joules = {"t1/a": 0.0, "t1/b": 0.0}
    with client.run("t1/a"):
        joules["t1/a"] += client.forward(model_name, "fc", x, phase="rollout").info.model_joules
        joules["t1/a"] += client.gemm(x, w.T, "MXFP8", phase="rollout").info.model_joules
        # Explicit run= wins over the scope; run="" is untagged.
        joules["t1/b"] += client.forward(model_name, "fc", x, phase="rollout",
                                         run="t1/b").info.model_joules
        client.forward(model_name, "fc", x, phase="rollout", run="")
        with client.phase("update"):
            joules["t1/a"] += client.backward(model_name, "fc", np.ones((3, 32), np.float32),
                                              x).info.model_joules
        with pytest.raises(ValueError, match="run: expected 1-64"):
            client.forward(model_name, "fc", x, phase="rollout", run="not ok")

    a = client.energy_report(run="t1/a")
    assert a.run == "t1/a"
    assert model_entry(a, "rollout").requests == 2
    assert model_entry(a, "update").requests == 1
    assert a.joules() == pytest.approx(joules["t1/a"], rel=1e-12)
    b = client.energy_report(run="t1/b")
    assert [(e.source, e.phase, e.requests) for e in b.entries] == [("fpga_model", "rollout", 1)]
    assert b.joules() == pytest.approx(joules["t1/b"], rel=1e-12)
    # A run nobody used: no entries; every run together holds them all.
    assert client.energy_report(run="t1/never").entries == ()
    everything = client.energy_report()
    assert everything.run == ""
    assert model_entry(everything, "rollout").requests >= 4
    with pytest.raises(ValueError, match="run: expected 1-64"):
        client.energy_report(run="a b")


def test_each_thread_has_its_own_run(client, model_name):
    make_layer(client, model_name)
    x = np.ones((2, 64), np.float32)
    barrier = threading.Barrier(3)
    errors = []
    scope = client.run("t2/shared")  # one scope object, entered by two threads at once

    def work(run, count):
        try:
            with (scope if run == "t2/shared" else client.run(run)):
                barrier.wait()  # every thread is inside its scope now
                for _ in range(count):
                    client.forward(model_name, "fc", x, phase="reward")
                    assert client.current_run == run
                barrier.wait()
            assert client.current_run is None
        except Exception as error:  # surfaced below
            errors.append(error)

    with client.run("t2/main"):  # a new thread does not inherit this scope
        threads = [threading.Thread(target=work, args=args)
                   for args in (("t2/one", 2), ("t2/shared", 3), ("t2/shared", 4))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client.current_run == "t2/main"
    assert not errors, errors
    assert model_entry(client.energy_report(run="t2/one"), "reward").requests == 2
    assert model_entry(client.energy_report(run="t2/shared"), "reward").requests == 7
    assert client.energy_report(run="t2/main").entries == ()


def test_stream_session_takes_the_run_at_submit_time(client, model_name):
    w = make_layer(client, model_name)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    with client.session(max_in_flight=4) as session, client.phase("rollout"):
        with client.run("t3/a"):
            forwards = [session.forward(model_name, "fc", x) for _ in range(3)]
            gemm = session.gemm(x, w.T, "MXFP4")
            explicit = session.forward(model_name, "fc", x, run="t3/b")
        after = session.backward(model_name, "fc", np.ones((2, 32), np.float32), phase="update",
                                 run="t3/b")
    a_joules = sum(f.result().info.model_joules for f in forwards) + \
        gemm.result().info.model_joules
    a = client.energy_report(run="t3/a")
    assert model_entry(a, "rollout").requests == 4
    assert a.joules() == pytest.approx(a_joules, rel=1e-12)
    b = client.energy_report(run="t3/b")
    assert model_entry(b, "rollout").requests == 1
    assert model_entry(b, "update").requests == 1
    assert b.joules() == pytest.approx(
        explicit.result().info.model_joules + after.result().info.model_joules, rel=1e-12)


def test_power_samples_carry_the_scope_run_unless_they_say_otherwise(client):
    t0 = time.time() - 5
    with client.run("t4/gpu"):
        # 100 W flat: 0.5 s in run t4/gpu, then 0.25 s untagged (the sample says
        # ""), then 0.25 s in t4/other (a 6-tuple). gRPC reads the samples on its
        # own thread; the scope is the caller's.
        samples = (s for s in [
            mxserve.PowerSample("py_run", "dev0", "rollout", t0, 100.0),
            mxserve.PowerSample("py_run", "dev0", "rollout", t0 + 0.5, 100.0),
            mxserve.PowerSample("py_run", "dev0", "reward", t0 + 0.75, 100.0, run=""),
            ("py_run", "dev0", "update", t0 + 1.0, 100.0, "t4/other"),
        ])
        result = client.report_power(samples)
    assert result.samples_accepted == 4
    assert result.joules_added == pytest.approx(100.0, rel=1e-9)
    gpu = client.energy_report(run="t4/gpu").by_phase("py_run")
    assert set(gpu) == {"rollout"}
    assert gpu["rollout"].joules == pytest.approx(50.0, rel=1e-9)
    other = client.energy_report(run="t4/other").by_phase("py_run")
    assert set(other) == {"update"} and other["update"].joules == pytest.approx(25.0, rel=1e-9)
    everything = client.energy_report().by_phase("py_run")
    assert everything["reward"].joules == pytest.approx(25.0, rel=1e-9)
    assert sum(e.joules for e in everything.values()) == pytest.approx(100.0, rel=1e-9)

    # A bad tag on a sample fails before it is sent, naming the sample.
    with pytest.raises(ValueError, match=r"samples\[1\]\.run: expected 1-64 characters"):
        client.report_power([("py_run", "dev1", "rollout", t0, 1.0),
                             ("py_run", "dev1", "rollout", t0 + 1, 1.0, "a b")])


def test_the_daemon_refuses_a_bad_tag_the_client_did_not_check(client):
    # Straight through the stub, past the client's own check: the daemon's rule.
    from mxserve.v1 import telemetry_pb2
    with pytest.raises(grpc.RpcError) as error:
        client._telemetry.GetEnergyReport(telemetry_pb2.GetEnergyReportRequest(run="a b"),
                                          timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == \
        "run: expected 1-64 characters of [A-Za-z0-9_.:/-], got 'a b'"
