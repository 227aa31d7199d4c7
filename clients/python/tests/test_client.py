"""mxserve.Client against a real mxserved: every call, error mapping, phases, streams."""

import json
import struct
import threading
import time

import grpc
import numpy as np
import pytest

import mxserve

RNG = np.random.default_rng(7)

# Distinct formats per phase, so a response's format tells which phase it carried.
PHASE_POLICY = {"name": "py-phases", "description": "one format per phase",
                "defaults": {"rollout": "MXFP4", "reward": "MXFP8", "update": "FP16"}}


def make_layer(client, model, out_features=48, in_features=80, bias=True, publish=True):
    w = RNG.standard_normal((out_features, in_features)).astype(np.float32)
    b = RNG.standard_normal(out_features).astype(np.float32) if bias else None
    client.register_model(model, [mxserve.LayerSpec("fc", out_features, in_features, bias)])
    client.upload_weights(model, {"fc": (w, b) if bias else w}, publish=publish)
    return w, b


def test_health(client):
    assert client.health() == "SERVING"
    assert client.health("mxserve.v1.Compute") == "SERVING"
    with pytest.raises(mxserve.MxserveError) as error:
        client.health("no.such.Service")
    assert error.value.code == grpc.StatusCode.NOT_FOUND


def test_wait_ready_names_the_address_when_nothing_listens():
    with mxserve.Client("127.0.0.1:1") as nobody:
        with pytest.raises(mxserve.MxserveError) as error:
            nobody.wait_ready(timeout=0.3)
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1:1" in error.value.message


def test_model_lifecycle(client, model_name):
    info = client.register_model(model_name, [("a", 16, 32), ("b", 8, 16, True)],
                                 policy="B-balanced")
    assert info.policy == "B-balanced" and info.weight_version == 0
    assert [l.spec for l in info.layers] == [mxserve.LayerSpec("a", 16, 32, False),
                                             mxserve.LayerSpec("b", 8, 16, True)]
    with pytest.raises(mxserve.MxserveError) as error:
        client.register_model(model_name, [("a", 16, 32)])
    assert error.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert error.value.rpc == "RegisterModel"

    staged = client.upload_weights(model_name, {"a": np.ones((16, 32), np.float32),
                                                "b": {"weight": np.ones((8, 16)),
                                                      "bias": np.zeros(8)}})
    assert (staged.tensors_staged, staged.weight_version) == (3, 0)
    assert staged.bytes_received == (16 * 32 + 8 * 16 + 8) * 4
    assert client.describe_model(model_name).staged_tensors == 3
    assert client.publish(model_name).weight_version == 1
    assert model_name in [m.name for m in client.list_models()]
    assert client.delete_model(model_name) > 0
    with pytest.raises(mxserve.MxserveError) as error:
        client.describe_model(model_name)
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    assert model_name in error.value.message


def test_upload_refuses_a_weight_of_the_wrong_shape(client, model_name):
    # A 64x8 array for an 8x64 layer has the right element count: it was staged
    # and read in the wrong order, every answer after it wrong (a black-box test).
    client.register_model(model_name, [("fc", 8, 64, True)])
    w = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
    for bad, shape in ((w.T.copy(), "[64, 8]"), (w.reshape(-1), "[512]"),
                       (w.reshape(2, 4, 64), "[2, 4, 64]")):
        with pytest.raises(mxserve.MxserveError) as error:
            client.upload_weights(model_name, {"fc": bad}, publish=True)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert ("chunks[0].shape: tensor 'fc.weight' is [8, 64] (out_features, in_features), "
                f"got {shape}; nothing was staged") in error.value.message
    with pytest.raises(mxserve.MxserveError) as error:
        client.upload_weights(model_name, {"fc": (w, np.zeros((1, 8), np.float32))})
    assert "tensor 'fc.bias' is [8] (out_features), got [1, 8]" in error.value.message
    assert client.describe_model(model_name).staged_tensors == 0
    client.upload_weights(model_name, {"fc": (w, np.zeros(8, np.float32))}, publish=True)
    assert client.describe_model(model_name).weight_version == 1


def test_list_models_joins_the_daemons_pages():
    # ListModels answers in pages under --max-message-bytes; list_models follows
    # next_page_token: seven models of about 17 KB of layers each, three a page.
    from conftest import Daemon
    d = Daemon("--max-message-bytes", "64K")
    try:
        with mxserve.Client(d.address, timeout=60) as c:
            c.wait_ready(timeout=10)
            names = [f"m{i}" for i in range(7)]
            for i, name in enumerate(reversed(names)):
                c.register_model(name, [(chr(ord("a") + i) * 200 + str(n), 1, 1)
                                        for n in range(80)])
            models = c.list_models()
            assert [m.name for m in models] == names
            assert all(len(m.layers) == 80 for m in models)
    finally:
        assert d.stop() == 0


def test_forward_matches_fp32_and_follows_the_input_kind(client, model_name):
    torch = pytest.importorskip("torch")
    w, b = make_layer(client, model_name)
    x = RNG.standard_normal((5, 80)).astype(np.float32)
    result = client.forward(model_name, "fc", x, format="FP32", phase="update")
    assert result.output.dtype == np.float32 and result.output.shape == (5, 48)
    assert result.output.flags.writeable
    np.testing.assert_allclose(result.output, x.astype(np.float64) @ w.T + b, rtol=1e-5,
                               atol=1e-5)
    assert (result.info.format, result.info.weight_format) == ("FP32", "FP32")
    assert result.info.weight_version == 1 and result.info.backend == "cpu"

    as_torch = client.forward(model_name, "fc", torch.from_numpy(x), format="FP32",
                              phase="update")
    assert isinstance(as_torch.output, torch.Tensor)
    assert np.array_equal(as_torch.output.numpy(), result.output)


def test_chunked_upload_gives_the_same_weights(client, model_name):
    w = RNG.standard_normal((33, 70)).astype(np.float32)
    specs = [("whole", 33, 70), ("chunked", 33, 70)]
    client.register_model(model_name, specs)
    client.upload_weights(model_name, {"whole": w}, publish=False)
    client.upload_weights(model_name, {"chunked": w}, chunk_bytes=100, publish=True)
    x = RNG.standard_normal((4, 70))
    whole = client.forward(model_name, "whole", x, format="MXFP6_E3M2", phase="reward")
    chunked = client.forward(model_name, "chunked", x, format="MXFP6_E3M2", phase="reward")
    assert whole.output.tobytes() == chunked.output.tobytes()


def test_half_precision_weights_and_inputs_travel_as_they_are(client, model_name):
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(7)
    w = torch.randn(24, 40, generator=generator).to(torch.bfloat16)
    client.register_model(model_name, [("fc", 24, 40)])
    client.upload_weights(model_name, {"fc": w}, publish=True)
    x = torch.randn(3, 40, generator=generator).to(torch.float16)
    y = client.forward(model_name, "fc", x, format="FP32", phase="update").output
    # Both operands are exact in FP32 (so nothing was rounded on the way), and each
    # product is exact too; only the FP32 sum over K = 40 rounds, at most K half-ulps
    # of the running magnitude: a fixed 1e-6 failed where the sum nearly cancels.
    expected = x.double() @ w.double().T
    bound = 40 * 2.0 ** -24 * (x.double().abs() @ w.double().abs().T)
    assert ((y.double() - expected).abs() <= bound).all()
    assert y.abs().max() > 1  # a real product, not zeros


def test_gemm(client):
    a = RNG.standard_normal((7, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 9)).astype(np.float32)
    exact = client.gemm(a, b, "FP32", phase="rollout")
    np.testing.assert_allclose(exact.output, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    mixed = client.gemm(a, b, "mxfp4", "MXFP8", phase="rollout")
    assert (mixed.info.format, mixed.info.weight_format) == ("MXFP4_E2M1", "MXFP8_E4M3")
    assert mixed.info.weight_version == 0
    # Quantization changed the result, but not by more than MXFP4 can explain.
    assert not np.array_equal(mixed.output, exact.output)
    assert np.abs(mixed.output - exact.output).max() < 0.5 * np.abs(exact.output).max()
    away = client.gemm(a, b, "MXFP4", phase="rollout", rounding="away")
    assert away.output.shape == (7, 9)


def test_gemm_scale_rules_reach_the_daemon(client):
    # A block maximum the floor rule saturates in MXFP4 (emax 2, max normal 6):
    # floor gives scale 2^(2-2) and 7.9 clamps to 6; ceil (2^(3-2)), rceil
    # (ceil(log2(7.9 / 6)) = 1) and no_saturation take scale 2: 3.95 -> 4.
    a = np.zeros((1, 32), np.float32)
    a[0, 0], a[0, 1] = 7.9, 1.0
    b = np.eye(32, 2, dtype=np.float32)
    floor = client.gemm(a, b, "MXFP4", phase="rollout").output
    assert floor[0].tolist() == [6.0, 1.0]  # 7.9 saturated to max normal
    ceil = client.gemm(a, b, "MXFP4", phase="rollout", scale_rule="ceil").output
    assert ceil[0].tolist() == [8.0, 1.0]  # scale 2: 3.95 -> 4
    rceil = client.gemm(a, b, "MXFP4", phase="rollout", scale_rule="RCEIL").output
    assert rceil[0].tolist() == [8.0, 1.0]  # 7.9 / 6 -> 2^1
    nosat = client.gemm(a, b, "MXFP4", phase="rollout", scale_rule="nosat").output
    assert nosat[0].tolist() == [8.0, 1.0]
    with client.session() as session:
        assert session.gemm(a, b, "MXFP4", phase="rollout",
                            scale_rule="ceil").result().output[0].tolist() == [8.0, 1.0]
    with pytest.raises(ValueError, match="scale_rule: unknown scale rule 'round'; expected "
                                         "floor, no_saturation, ceil, rceil"):
        client.gemm(a, b, "MXFP4", phase="rollout", scale_rule="round")


def test_backward_in_fp32_is_the_plain_gradient(client, model_name):
    w, _ = make_layer(client, model_name)
    x = RNG.standard_normal((6, 80)).astype(np.float32)
    dy = RNG.standard_normal((6, 48)).astype(np.float32)
    grads = client.backward(model_name, "fc", dy, x, format="FP32", phase="update")
    np.testing.assert_allclose(grads.grad_input, dy.astype(np.float64) @ w, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(grads.grad_weight, dy.T.astype(np.float64) @ x, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(grads.grad_bias, dy.sum(0), rtol=1e-5, atol=1e-5)
    without_input = client.backward(model_name, "fc", dy, format="FP32", phase="update")
    assert without_input.grad_weight is None
    assert np.array_equal(without_input.grad_input, grads.grad_input)


def test_errors_carry_code_and_the_daemons_message(client, model_name):
    make_layer(client, model_name)
    cases = [
        (lambda: client.forward(model_name, "fc", np.zeros((2, 50)), phase="rollout"),
         grpc.StatusCode.INVALID_ARGUMENT, "input.tensor.shape: expected [M, 80]"),
        (lambda: client.forward(model_name, "nope", np.zeros((2, 80)), phase="rollout"),
         grpc.StatusCode.NOT_FOUND, "no layer 'nope'"),
        (lambda: client.forward("no-such-model", "fc", np.zeros((2, 80)), phase="rollout"),
         grpc.StatusCode.NOT_FOUND, "no-such-model"),
        (lambda: client.forward(model_name, "fc", np.zeros((2, 80))),
         grpc.StatusCode.INVALID_ARGUMENT, "phase"),
        (lambda: client.forward(model_name, "fc", np.zeros((2, 80)), phase="rollout",
                                min_weight_version=5),
         grpc.StatusCode.FAILED_PRECONDITION, "5"),
    ]
    for call, code, fragment in cases:
        with pytest.raises(mxserve.MxserveError) as error:
            call()
        assert error.value.code == code, error.value
        assert fragment in error.value.message, error.value
    # Client-side mistakes are plain Python errors, raised before anything is sent.
    with pytest.raises(ValueError, match="format: unknown format 'MXFP5'"):
        client.forward(model_name, "fc", np.zeros((2, 80)), format="MXFP5", phase="rollout")
    with pytest.raises(ValueError, match="phase: unknown phase 'training'"):
        client.phase("training")
    # The daemon kept serving and kept the layer.
    assert client.forward(model_name, "fc", np.zeros((2, 80)), phase="rollout").output.shape \
        == (2, 48)


def test_policies(client, model_name):
    make_layer(client, model_name)
    put = client.put_policy(PHASE_POLICY)
    assert put.name == "py-phases" and not put.builtin
    assert put.document["defaults"]["reward"] == "MXFP8_E4M3"
    assert client.get_policy("py-phases").json == put.json
    names = {p.name: p.builtin for p in client.list_policies()}
    assert names["py-phases"] is False and names["D-phase-adaptive"] is True

    assert client.set_active_policy(model_name, "py-phases") == "D-phase-adaptive"
    table = client.resolve_policy(model_name).table()
    assert table == {("rollout", "fc"): "MXFP4_E2M1", ("reward", "fc"): "MXFP8_E4M3",
                     ("update", "fc"): "FP16"}
    assert client.resolve_policy(model_name, "fp16-baseline").policy == "fp16-baseline"
    # Each entry says the phase's scale rule and rounding (floor and nearest even
    # where the policy names none), so a client computing locally can follow them.
    client.put_policy({"name": "py-numerics", "defaults": {"rollout": "MXFP4", "reward": "INT8",
                                                            "update": "MXFP8_E4M3"},
                       "scale_rules": {"update": "rceil", "reward": "no_saturation"},
                       "roundings": {"update": "stochastic", "rollout": "away"}})
    choices = client.resolve_policy(model_name, "py-numerics").choices()
    assert {(p, c.format, c.scale_rule, c.rounding) for (p, _), c in choices.items()} == {
        ("rollout", "MXFP4_E2M1", "floor", "away"), ("reward", "INT8", "no_saturation", "even"),
        ("update", "MXFP8_E4M3", "rceil", "stochastic")}
    assert {(c.scale_rule, c.rounding) for c in
            client.resolve_policy(model_name).choices().values()} == {("floor", "even")}
    client.delete_policy("py-numerics")
    with pytest.raises(mxserve.MxserveError) as error:
        client.delete_policy("py-phases")
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    client.set_active_policy(model_name, "D-phase-adaptive")
    client.delete_policy("py-phases")
    with pytest.raises(mxserve.MxserveError) as error:
        client.get_policy("py-phases")
    assert error.value.code == grpc.StatusCode.NOT_FOUND


def write_safetensors(path, tensors):
    """The safetensors layout: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_load_safetensors(client, daemon, model_name):
    w = RNG.standard_normal((16, 40)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    path = daemon.model_dir / f"{model_name}.safetensors"
    write_safetensors(path, {"net.fc.weight": w, "net.fc.bias": b})
    client.register_model(model_name, [("fc", 16, 40, True)])
    loaded = client.load_safetensors(model_name, path, prefix="net.", publish=True)
    assert (loaded.tensors_staged, loaded.weight_version) == (2, 1)
    x = RNG.standard_normal((2, 40)).astype(np.float32)
    y = client.forward(model_name, "fc", x, format="FP32", phase="update").output
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(mxserve.MxserveError) as error:
        client.load_safetensors(model_name, daemon.model_dir / "missing.safetensors")
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    assert "missing.safetensors" in error.value.message
    # Outside --model-dir: refused from the path alone, whether or not the file exists.
    for outside in ("/etc/passwd", "/no/such/file", str(daemon.model_dir / ".." / "x")):
        with pytest.raises(mxserve.MxserveError) as error:
            client.load_safetensors(model_name, outside)
        assert error.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "--model-dir" in error.value.message


def test_power_and_energy(client):
    t0 = time.time()
    samples = [mxserve.PowerSample("py_test", "dev0", "reward", t0 + i * 0.1, 50.0 + 10 * i)
               for i in range(5)]
    result = client.report_power(samples)
    # Trapezoids of 0.1 s: (50+60, 60+70, 70+80, 80+90) / 2 × 0.1 = 28 J, computed on
    # the very timestamps sent (at Unix-time magnitude a double holds ~0.2 µs).
    joules = sum((b.timestamp - a.timestamp) * (a.watts + b.watts) / 2
                 for a, b in zip(samples, samples[1:]))
    assert joules == pytest.approx(28.0, rel=1e-5)
    assert result.samples_accepted == 5
    assert result.joules_added == pytest.approx(joules, rel=1e-12)
    report = client.energy_report()
    assert report.by_phase("py_test")["reward"].joules == pytest.approx(joules, rel=1e-12)
    assert report.joules(source="py_test") == pytest.approx(joules, rel=1e-12)
    assert report.busy_seconds(source="py_test", phase="reward") == pytest.approx(0.4, rel=1e-5)
    assert report.until_seconds >= t0

    with pytest.raises(mxserve.MxserveError) as error:
        client.report_power([("py_test", "dev1", "rollout", t0, 10.0),
                             ("py_test", "dev1", "rollout", t0 + 1, -1.0)])
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "samples[1].watts" in error.value.message
    # What came before the bad sample stayed, and nothing more.
    assert client.energy_report().joules(source="py_test") == pytest.approx(joules, rel=1e-12)


def test_phase_scopes_nest_and_decorate(client):
    assert client.current_phase is None
    with client.phase("rollout"):
        assert client.current_phase == "rollout"
        with client.phase("PHASE_UPDATE"):
            assert client.current_phase == "update"
        assert client.current_phase == "rollout"
    assert client.current_phase is None

    @client.phase("reward")
    def score():
        return client.current_phase

    assert score() == "reward" and client.current_phase is None
    try:
        with client.phase("update"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert client.current_phase is None


def test_phase_is_per_thread_and_reaches_the_daemon(client, model_name):
    make_layer(client, model_name)
    client.put_policy(PHASE_POLICY)
    client.set_active_policy(model_name, "py-phases")
    expected = {"rollout": "MXFP4_E2M1", "reward": "MXFP8_E4M3", "update": "FP16"}
    barrier = threading.Barrier(4)
    seen, errors = {}, []
    scope = client.phase("reward")  # one scope object, entered by two threads at once

    def work(phase):
        try:
            with (scope if phase == "reward" else client.phase(phase)):
                barrier.wait()  # every thread is inside its scope now
                for _ in range(5):
                    info = client.forward(model_name, "fc", np.ones((1, 80)),).info
                    seen.setdefault(phase, set()).add(info.format)
                    assert client.current_phase == phase
                barrier.wait()
            assert client.current_phase is None
        except Exception as error:  # surfaced below
            errors.append(error)

    with client.phase("update"):  # a new thread does not inherit this scope
        threads = [threading.Thread(target=work, args=(p,))
                   for p in ("rollout", "reward", "reward", "update")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client.current_phase == "update"
    assert not errors, errors
    assert seen == {phase: {fmt} for phase, fmt in expected.items()}
    client.set_active_policy(model_name, "D-phase-adaptive")


def test_stream_session_pipelines_and_isolates_errors(client, model_name):
    w, _ = make_layer(client, model_name)
    xs = [RNG.standard_normal((3, 80)).astype(np.float32) for _ in range(40)]
    unary = [client.forward(model_name, "fc", x, phase="rollout").output for x in xs]
    with client.session(max_in_flight=8) as session:
        with client.phase("rollout"):
            futures = [session.forward(model_name, "fc", x) for x in xs]
            bad = session.forward(model_name, "fc", np.zeros((3, 7)))
            gemm = session.gemm(xs[0], w.T, "MXFP8")
        grads = session.backward(model_name, "fc", np.ones((3, 48)), xs[0], phase="update",
                                 format="FP32")
        after_error = session.forward(model_name, "fc", xs[1], phase="rollout")
    assert all(f.result().output.tobytes() == u.tobytes() for f, u in zip(futures, unary))
    assert isinstance(bad.exception(), mxserve.MxserveError)
    assert bad.exception().code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input.tensor.shape" in bad.exception().message
    assert gemm.result().info.format == "MXFP8_E4M3"
    np.testing.assert_allclose(grads.result().grad_input, np.ones((3, 48)) @ w, rtol=1e-5)
    assert after_error.result().output.tobytes() == unary[1].tobytes()
    with pytest.raises(RuntimeError, match="closed"):
        session.forward(model_name, "fc", xs[0], phase="rollout")


def test_stream_cancel_fails_what_is_outstanding(client, model_name):
    make_layer(client, model_name, out_features=512, in_features=2048)
    session = client.session()
    futures = [session.forward(model_name, "fc", np.ones((256, 2048)), phase="rollout",
                               format="FP32") for _ in range(16)]
    session.cancel()
    outcomes = [f.exception(timeout=30) for f in futures]
    assert all(o is None or o.code == grpc.StatusCode.CANCELLED for o in outcomes)
    # 16 requests of 2 MiB and 0.5 GFLOP each are still on their way when cancel
    # comes (how many finished first depends on the machine: the fast kernels
    # take a few ms each); at least the last must have been cut off.
    assert outcomes[-1] is not None
    assert client.health() == "SERVING"


def test_a_sent_request_cannot_be_cancelled_and_still_answers(client, model_name):
    make_layer(client, model_name)
    with client.session() as session:
        future = session.forward(model_name, "fc", np.ones((2, 80)), phase="rollout")
        assert not future.cancel()
    assert future.result().output.shape == (2, 48)


def test_streams_outlive_the_unary_timeout(daemon):
    with mxserve.Client(daemon.address, timeout=0.3) as short:
        def slow_samples():
            t0 = time.time()
            for i in range(5):
                yield ("py_slow", "dev0", "update", t0 + 0.2 * i, 10.0)
                time.sleep(0.2)
        assert short.report_power(slow_samples()).samples_accepted == 5
        with short.session() as session:
            time.sleep(0.5)
            assert session.gemm(np.ones((1, 8)), np.ones((8, 1)), "FP32",
                                phase="update").result().output[0, 0] == 8.0


def test_errors_producing_a_stream_surface_as_themselves(client, model_name):
    client.register_model(model_name, [("fc", 2, 2), ("fc2", 2, 2)])
    with pytest.raises(TypeError, match="fc2.weight: expected a numeric array"):
        client.upload_weights(model_name, {"fc": np.ones((2, 2)),
                                           "fc2": np.array([["a", "b"], ["c", "d"]])})
    assert client.describe_model(model_name).staged_tensors == 0  # nothing half-staged
    with pytest.raises(ValueError, match="unknown phase 'warmup'"):
        client.report_power([("py_bad", "dev0", "warmup", time.time(), 1.0)])


def test_phase_refuses_to_decorate_coroutines(client):
    with pytest.raises(TypeError, match="cannot decorate a coroutine function"):
        @client.phase("rollout")
        async def generate():
            pass


def test_misuse_is_named_before_grpc_sees_it():
    # These reached grpc and came back in its words: "Failed to create secure
    # client channel" for "", a TypeError from inside grpc for timeout="5",
    # DEADLINE_EXCEEDED for -1, "Cannot invoke RPC on closed channel!" (a
    # black-box test).
    for address in ("", None):
        with pytest.raises(ValueError, match="address: expected HOST:PORT or a gRPC target"):
            mxserve.Client(address)
    for timeout in (-1, 0, "5", float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"timeout: expected seconds > 0 \(or None"):
            mxserve.Client("127.0.0.1:1", timeout=timeout)
    client = mxserve.Client("127.0.0.1:1", timeout=0.5)
    with pytest.raises(ValueError, match="timeout: expected seconds > 0"):
        client.list_models(timeout="5")
    client.close()
    with pytest.raises(ValueError, match="ListModels: this mxserve.Client is closed"):
        client.list_models()
    with pytest.raises(ValueError, match="UploadWeights: this mxserve.Client is closed"):
        client.upload_weights("m", {"fc": np.ones((2, 2), np.float32)})


def test_misshapen_arguments_are_named_before_anything_is_sent():
    # A black-box test got "not enough values to unpack" for register_model("m",
    # "fc"), "'list' object has no attribute 'items'" for upload_weights(m, [W]),
    # 1-byte chunks for chunk_bytes=0 and protobuf's TypeError for since="x".
    client = mxserve.Client("127.0.0.1:1", timeout=0.5)
    w = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"layers: expected a list of a LayerSpec, \(name, "
                                         r"out_features, in_features\[, bias\]\) or a dict"):
        client.register_model("m", "fc")
    with pytest.raises(ValueError, match="layers: expected a list of"):
        client.register_model("m", {"name": "fc", "out_features": 2, "in_features": 2})
    with pytest.raises(ValueError, match=r"layers\[1\]: expected a LayerSpec.*got \('fc', 2\)"):
        client.register_model("m", [("a", 2, 2), ("fc", 2)])
    with pytest.raises(ValueError, match=r"layers\[0\]: expected .* got \{'name': 'fc'\}"):
        client.register_model("m", [{"name": "fc"}])
    with pytest.raises(ValueError, match=r"layers\[0\]: expected .* got \('fc', 'x', 2\)"):
        client.register_model("m", [("fc", "x", 2)])
    with pytest.raises(ValueError, match=r"weights: expected a mapping \{layer: W, .*got list"):
        client.upload_weights("m", [w])
    for chunk in (0, -5, 1.5, True, "64"):
        with pytest.raises(ValueError, match=r"chunk_bytes: expected a whole number of bytes > 0"):
            client.upload_weights("m", {"fc": w}, chunk_bytes=chunk)
    for since in ("x", -1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"since: expected a Unix time in seconds >= 0"):
            client.energy_report(since=since)
    # What worked before still does: a layer as a generator, since=None ("since
    # the start"); both get as far as the (absent) daemon.
    with pytest.raises(mxserve.MxserveError, match="RegisterModel: UNAVAILABLE"):
        client.register_model("m", [(f for f in ("fc", 2, 2))])
    with pytest.raises(mxserve.MxserveError, match="GetEnergyReport: UNAVAILABLE"):
        client.energy_report(since=None)
    client.close()


def test_sessions_share_the_checks_and_numpy_timeouts_are_seconds():
    client = mxserve.Client("127.0.0.1:1", timeout=np.float32(0.5))
    assert client.timeout == 0.5
    with pytest.raises(ValueError, match="timeout: expected seconds > 0"):
        client.session(timeout="5")
    client.close()
    with pytest.raises(ValueError, match="Stream: this mxserve.Client is closed"):
        client.session()
    assert mxserve.Client("127.0.0.1:1", timeout=np.int64(3)).timeout == 3.0
