"""Every enum of mxserve.v1 has its names by one rule, in Python (mxserve._wire) and
in C++ (proto/convert, printed by mxserve_format_table, the conftest's `cpp_table`):
a value's name is its proto name lower-cased without the enum's prefix, the prefix
being the enum's type name in UPPER_SNAKE_CASE and "_" (Phase: PHASE_ROLLOUT →
"rollout"; Score: SCORE_REL_ERROR → "rel_error"). test_wire.py pins the format
table, whose canonical names are the same names in upper case, the same way."""

import re

import numpy as np
import pytest

import mxserve
from mxserve import _upload, _wire, _work_calls, client as client_module
from mxserve.v1 import (common_pb2, compute_pb2, models_pb2, policies_pb2, profiles_pb2,
                        telemetry_pb2)

MODULES = (common_pb2, compute_pb2, models_pb2, policies_pb2, profiles_pb2, telemetry_pb2)
# Every enum type declared in mxserve.v1, by full name ("mxserve.v1.Phase").
ENUMS = {enum.full_name: enum for module in MODULES
         for enum in module.DESCRIPTOR.enum_types_by_name.values()}


def rule_prefix(type_name: str) -> str:
    """The rule's prefix, written here apart from mxserve._wire's: UPPER_SNAKE_CASE
    (an underscore where a lower-case letter or digit meets a capital) and "_"."""
    return "".join("_" + c if c.isupper() and i and (type_name[i - 1].islower() or
                                                      type_name[i - 1].isdigit()) else c
                   for i, c in enumerate(type_name)).upper() + "_"


def test_the_rule_on_the_examples_it_was_written_with():
    assert {name: rule_prefix(name) for name in (
        "Phase", "CostMetric", "GenerationKind", "WorkCallKind", "TensorRole",
        "ProfileSource", "DType")} == {
        "Phase": "PHASE_", "CostMetric": "COST_METRIC_", "GenerationKind": "GENERATION_KIND_",
        "WorkCallKind": "WORK_CALL_KIND_", "TensorRole": "TENSOR_ROLE_",
        "ProfileSource": "PROFILE_SOURCE_", "DType": "DTYPE_"}
    assert _wire.enum_name(common_pb2.Phase, common_pb2.PHASE_ROLLOUT) == "rollout"
    assert _wire.enum_name(profiles_pb2.Score, profiles_pb2.SCORE_REL_ERROR) == "rel_error"
    assert _wire.enum_name(profiles_pb2.Reference, profiles_pb2.REFERENCE_FP64) == "fp64"
    assert _wire.enum_name(common_pb2.Phase, 7) == "phase#7"
    assert _wire.enum_name(profiles_pb2.CostMetric, 9) == "costmetric#9"
    assert set(ENUMS) >= {"mxserve.v1.Phase", "mxserve.v1.Format", "mxserve.v1.Score",
                          "mxserve.v1.WorkCallKind", "mxserve.v1.TensorRole"}


@pytest.mark.parametrize("full_name", sorted(ENUMS))
def test_every_value_is_named_by_the_rule_and_round_trips(full_name):
    enum = ENUMS[full_name]
    prefix = rule_prefix(enum.name)
    field = f"f.{enum.name}"
    assert _wire.enum_prefix(enum) == prefix
    unspecified = prefix + "UNSPECIFIED"
    for value in enum.values:
        assert value.name.startswith(prefix), f"{value.name} lacks its enum's prefix {prefix}"
        short = value.name[len(prefix):].lower()
        assert _wire.enum_name(enum, value.number) == short
        spellings = (short, short.upper(), value.name, value.name.lower(), value.number)
        for spelling in spellings:
            assert _wire.enum_value(enum, spelling, field, unspecified=True) == value.number
        if value.name == unspecified:  # refused unless asked for: the wire's "not given"
            for spelling in spellings:
                with pytest.raises(ValueError, match=f"^{re.escape(field)}: unknown "):
                    _wire.enum_value(enum, spelling, field)
        else:
            for spelling in spellings:
                assert _wire.enum_value(enum, spelling, field) == value.number

    numbers = [value.number for value in enum.values if value.name != unspecified]
    names = [_wire.enum_name(enum, n) for n in numbers]
    assert _wire.enum_names(enum) == tuple(names)
    assert _wire.enum_names(enum, skip_unspecified=False) == tuple(
        value.name[len(prefix):].lower() for value in enum.values)
    expected = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    noun = prefix[:-1].lower().replace("_", " ")
    with pytest.raises(ValueError, match=f"^{re.escape(field)}: unknown {noun} 'nope'; "
                                         f"expected {re.escape(expected)}$"):
        _wire.enum_value(enum, "nope", field)
    top = max(value.number for value in enum.values)
    for outside in (top + 1, -1):
        assert _wire.enum_name(enum, outside) == f"{enum.name.lower()}#{outside}"
        with pytest.raises(ValueError, match=f"^{re.escape(field)}: unknown wire value "
                                             f"{outside}; expected "):
            _wire.enum_value(enum, outside, field)


def test_the_cpp_names_are_the_python_names(cpp_table):
    assert "enums" in cpp_table, (
        "mxserve_format_table prints no \"enums\" key: the C++ side's names of every "
        "mxserve.v1 enum, {full name: {number as a string: name}}, are missing")
    python = {full_name: {str(value.number): _wire.enum_name(enum, value.number)
                          for value in enum.values}
              for full_name, enum in ENUMS.items()}
    assert set(cpp_table["enums"]) == set(python)
    for full_name, names in python.items():
        assert cpp_table["enums"][full_name] == names, full_name


# --- the package's tables are the rule's ---------------------------------------------

def test_phase_and_format_tables():
    assert _wire.PHASES == ("rollout", "reward", "update") == _wire.enum_names(common_pb2.Phase)
    assert _wire._PHASE_TO_WIRE == _wire.enum_numbers(common_pb2.Phase)
    assert mxserve.PHASES == _wire.PHASES and mxserve.FORMATS == _wire.FORMATS
    for value in common_pb2.Phase.DESCRIPTOR.values:
        assert _wire.phase_name(value.number) == _wire.enum_name(common_pb2.Phase, value.number)
    assert _wire.FORMATS == tuple(name.upper() for name in _wire.enum_names(common_pb2.Format))
    for number in range(1, len(_wire.FORMATS) + 1):
        assert _wire.format_name(number) == _wire.enum_name(common_pb2.Format, number).upper()


def test_profile_names_come_from_the_enums():
    assert mxserve.types.PROFILE_SCORES == _wire.enum_names(profiles_pb2.Score)
    for source in list(profiles_pb2.ProfileSource.values()) + [9]:
        for reference in list(profiles_pb2.Reference.values()) + [9]:
            profile = mxserve.Profile.from_proto(
                profiles_pb2.Profile(model="m", source=source, reference=reference))
            assert profile.source == _wire.enum_name(profiles_pb2.ProfileSource, source)
            assert profile.reference == _wire.enum_name(profiles_pb2.Reference, reference)
    assert profile.source == "profilesource#9" and profile.reference == "reference#9"


@pytest.fixture
def recording_client(monkeypatch):
    """A Client that never connects: its unary and client-streaming calls record the
    request and answer with an empty response."""
    client = mxserve.Client("127.0.0.1:1", tls=False, token="")
    sent = []

    def call(rpc, method, request, timeout):
        sent.append(request)
        return profiles_pb2.GeneratePolicyResponse()

    def stream_call(rpc, method, requests, timeout, cancel_on_error=False):
        sent.extend(requests)
        return profiles_pb2.Profile()

    monkeypatch.setattr(client, "_call", call)
    monkeypatch.setattr(client, "_stream_call", stream_call)
    client.sent = sent
    yield client
    client.close()


def accepted_names(enum, build, read, field):
    """The names of `enum` that `build(name)` takes, each checked to reach the wire
    as its number (`read` pulls it from what was built); a name outside the enum is
    refused with a message naming `field`."""
    accepted = set()
    for name, number in _wire.enum_numbers(enum, skip_unspecified=False).items():
        try:
            built = build(name)
        except ValueError:
            continue
        assert read(built) == number, name
        assert read(build(name.upper())) == number, name
        accepted.add(name)
    with pytest.raises(ValueError, match=f"^{re.escape(field)}: "):
        build("nope")
    return accepted


def test_the_clients_arguments_take_the_enums_names(recording_client):
    client = recording_client
    one = np.ones((1, 32), np.float32)

    def gemm(rounding):
        return client._gemm_request(one, one.T, "MXFP4", None, "rollout", rounding, None)

    assert accepted_names(common_pb2.Rounding, gemm, lambda r: r.rounding, "rounding") == \
        set(_wire.enum_names(common_pb2.Rounding))
    assert {word: gemm(word).rounding for word in client_module._ROUNDING_ALIASES} == {
        "even": common_pb2.ROUNDING_NEAREST_EVEN, "away": common_pb2.ROUNDING_NEAREST_AWAY}

    def generate(**kwargs):
        client.generate_policy("m", "p", **kwargs)
        return client.sent[-1]

    assert accepted_names(profiles_pb2.Score, lambda s: generate(score=s),
                          lambda r: r.score, "score") == set(_wire.enum_names(profiles_pb2.Score))
    assert accepted_names(profiles_pb2.CostMetric, lambda m: generate(metric=m),
                          lambda r: r.metric, "metric") == \
        set(_wire.enum_names(profiles_pb2.CostMetric))
    assert accepted_names(profiles_pb2.GenerationKind, lambda k: generate(kind=k),
                          lambda r: r.kind, "kind") == \
        set(_wire.enum_names(profiles_pb2.GenerationKind)) == set(client_module._KIND_VALUES)

    def profile(reference):
        client.profile("m", reference=reference)
        return client.sent[-1]

    assert accepted_names(profiles_pb2.Reference, profile, lambda r: r.config.reference,
                          "reference") == set(_wire.enum_names(profiles_pb2.Reference))


def test_work_calls_and_weight_chunks_take_the_enums_names():
    def work(call):
        grads = call.lower() in ("backward", "work_call_kind_backward")
        return _work_calls._work_call_to_wire(
            mxserve.WorkCall("rollout", "", "m", "fc", call, "MXFP4", m=2, grad_input=grads),
            "", "calls[0]")

    assert accepted_names(telemetry_pb2.WorkCallKind, work, lambda c: c.call,
                          "calls[0].call") == set(_wire.enum_names(telemetry_pb2.WorkCallKind))

    # The upload's field names are TensorRole's: "fc.weight", "fc.bias".
    for role, name in enumerate(_wire.enum_names(models_pb2.TensorRole)):
        tensors = [np.ones((2, 2)), np.ones(2)]
        tensors[role] = np.array([["x", "y"]])
        with pytest.raises(TypeError, match=f"^fc.{name}: expected a numeric array"):
            _upload._upload_stream("m", {"fc": tuple(tensors)}, False, 1 << 20)


def test_the_experiments_recipes_take_the_enums_names():
    pytest.importorskip("torch")  # the experiment room needs PyTorch
    from mxserve.experiment import config

    assert config._GENERATION_KINDS == _wire.enum_names(profiles_pb2.GenerationKind)
    assert config._COST_METRICS == _wire.enum_names(profiles_pb2.CostMetric)
    for kind in config._GENERATION_KINDS:
        for metric in config._COST_METRICS:
            for score in mxserve.types.PROFILE_SCORES:
                config._check_generate("g", {"kind": kind, "metric": metric, "score": score})
    with pytest.raises(config.ConfigError,
                       match="g.kind: expected fraction, budget, tolerance or rl"):
        config._check_generate("g", {"kind": "knapsack"})
    with pytest.raises(config.ConfigError, match="g.metric: expected energy, time or bits"):
        config._check_generate("g", {"metric": "watts"})
