"""Client.report_work (Telemetry.ReportWork) against a real mxserved: layer calls a
client computed itself book what running them on the daemon books (the fpga_model
joules, busy seconds and requests of the energy report, bit for bit: the served
calls under one run, the same calls reported under another), marked as emulated;
bad arguments fail before anything is sent, and the daemon's refusals name the field
and book nothing."""

import numpy as np
import pytest

import mxserve
RNG = np.random.default_rng(29)
LAYERS = [mxserve.LayerSpec("q", 48, 64, True), mxserve.LayerSpec("up", 80, 48, False)]


def x(rows, cols):
    return RNG.standard_normal((rows, cols)).astype(np.float32)


def model_books(client, run):
    return {phase: (e.joules, e.busy_seconds, e.requests, e.emulated_requests)
            for phase, e in client.energy_report(run=run).by_phase("fpga_model").items()}


def test_report_work_books_what_running_the_calls_books(client, model_name):
    weights = {"q": (x(48, 64), x(48, 1)[:, 0]), "up": x(80, 48)}
    client.register_model(model_name, LAYERS)
    client.upload_weights(model_name, weights, publish=True)

    run, reported_run = f"{model_name[:40]}/served", f"{model_name[:40]}/reported"
    calls, served_joules = [], 0.0
    # At most two calls per (run, phase): the ledger's sums are then the same
    # doubles whether the served calls fell within one second or not.
    with client.run(run):
        for _ in range(2):
            served_joules += client.forward(model_name, "q", x(3, 64), format="MXFP4",
                                            phase="rollout").info.model_joules
        served_joules += client.forward(model_name, "up", x(5, 48), format="MXFP8_E4M3",
                                        phase="reward").info.model_joules
        served_joules += client.backward(model_name, "q", x(4, 48), x(4, 64), format="MXFP8",
                                         phase="update").info.model_joules
        served_joules += client.backward(model_name, "up", x(6, 16), x(6, 48), format="BF16",
                                         phase="update", weight_rows=(8, 24)).info.model_joules
    calls = [
        mxserve.WorkCall("rollout", None, model_name, "q", "forward", "MXFP4", m=3, count=2),
        mxserve.WorkCall("reward", reported_run, model_name, "up", "forward", "MXFP8_E4M3", m=5),
        mxserve.WorkCall("update", reported_run, model_name, "q", "backward", "MXFP8", m=4,
                         grad_input=True, grad_weight=True),
        mxserve.WorkCall("update", reported_run, model_name, "up", "backward", "BF16", m=6, n=16,
                         grad_weight=True),
    ]
    with client.run(reported_run):  # the first call's run None: the scope's
        result = client.report_work(calls)
    assert result.calls == 5
    assert result.model_joules == served_joules  # the same doubles, summed in the same order

    served, reported = model_books(client, run), model_books(client, reported_run)
    assert set(served) == {"rollout", "reward", "update"}
    for phase, (joules, seconds, requests, emulated) in served.items():
        assert emulated == 0
        assert reported[phase] == (joules, seconds, requests, requests), phase


def test_report_work_splits_large_lists_and_checks_arguments(client, model_name):
    client.register_model(model_name, LAYERS)  # specs only: no weights needed
    call = mxserve.WorkCall("rollout", "", model_name, "q", "forward", "MXFP4", m=2,
                            count=1 << 20)
    # Five counts of 2^20 exceed one message's 2^22: two messages, all booked.
    result = client.report_work([call] * 5)
    assert result.calls == 5 << 20
    one = client.report_work([mxserve.WorkCall("rollout", "", model_name, "q",
                                                         "forward", "MXFP4", m=2)])
    assert result.model_joules == pytest.approx(one.model_joules * (5 << 20), rel=1e-9)

    bad = {
        r"calls\[1\]\.phase: unknown phase": dict(phase="warmup"),
        r"calls\[1\]\.phase: required": dict(phase=None),
        r"calls\[1\]\.run: expected 1-64": dict(run="a b"),
        r"calls\[1\]\.call: expected 'forward' or 'backward'": dict(call="sideways"),
        r"calls\[1\]\.format: required": dict(format=None),
        r"calls\[1\]\.format: unknown format": dict(format="MXFP3"),
        r"calls\[1\]\.m: expected an integer in \[1, 4294967296\], got 0": dict(m=0),
        r"calls\[1\]\.n: expected an integer": dict(n=-1),
        r"calls\[1\]\.count: expected an integer in \[1, 1048576\], got 0": dict(count=0),
        r"calls\[1\]\.grad_input: expected grad_input and grad_weight False": dict(grad_input=True),
        r"calls\[1\]\.grad_weight: a backward call runs": dict(call="backward"),
        r"calls\[1\]\.layer: expected a non-empty string": dict(layer=""),
    }
    good = mxserve.WorkCall("rollout", "", model_name, "q", "forward", "MXFP4", m=2)
    before = client.energy_report().by_phase("fpga_model")["rollout"].requests
    for message, change in bad.items():
        fields = {**good.__dict__, **change}
        with pytest.raises(ValueError, match=message):
            client.report_work([good, mxserve.WorkCall(**fields)])
    with pytest.raises(ValueError, match=r"calls: expected at least one WorkCall"):
        client.report_work([])
    # What only the daemon knows: the layer's out_features, the model's layers.
    with pytest.raises(mxserve.MxserveError, match=r"calls\[1\]\.n: expected 0 or 48 "
                                                   r"\(out_features of layer 'q'\) for a forward"):
        client.report_work([good, mxserve.WorkCall(**{**good.__dict__, "n": 5})])
    with pytest.raises(mxserve.MxserveError, match=r"calls\[0\]\.layer: model '.*' has no layer "
                                                   r"'nope'") as error:
        client.report_work([mxserve.WorkCall(**{**good.__dict__, "layer": "nope"})])
    assert error.value.code.name == "NOT_FOUND"
    after = client.energy_report().by_phase("fpga_model")["rollout"].requests
    assert after == before  # nothing of a refused list was booked
