"""Sensitivity profiling (issue 16): mxserve.torch.profile and the Profiles RPCs.

The centre is a model whose sensitivity is known by construction (PlantedLM): a
residual MLP language model in which one layer sees activation outliers and one
has tiny weights beside a few large ones in every 32-element block, so MXFP4
wipes out most of both layers' outputs while every other layer loses ~16%. The
profile's rel_error and Fisher scores and the end-to-end KL must all rank those
two first, and the Fisher score must order the rest as the end-to-end KL does.

The client's side of the wire is checked against a recording Profiles server in
this process; the daemon's side against the real daemon (conftest.py).
"""

import csv
import io
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from mxserve.torch.profile import capture, end_to_end, profile, spearman  # noqa: E402
from mxserve.torch import OffloadedLinear, offload  # noqa: E402
from mxserve.types import PROFILE_COLUMNS  # noqa: E402
from mxserve.v1 import common_pb2, policies_pb2, profiles_pb2, profiles_pb2_grpc  # noqa: E402

MXFP4 = "MXFP4_E2M1"
# The daemon's default candidates: every format but FP32.
DEFAULT_FORMATS = {"MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3", "MXFP4_E2M1",
                   "MXINT8", "NVFP4", "NF4", "BNB_FP4", "LO_BCQ", "INT8", "BF16", "FP16"}

# --- the planted model ---------------------------------------------------------------------

VOCAB, WIDTH, HIDDEN = 64, 64, 128
# Each block's output gain: the blocks matter to the logits by different amounts, so
# the layers' end-to-end sensitivities spread over more than a decade.
GAINS = (1.0, 0.6, 0.35, 0.8, 0.25, 0.5)
HEAD_GAIN = 0.5
DEAD = (0, 32)           # residual channels that stay exactly zero, one per 32-block
OUTLIER_BLOCK, TINY_BLOCK = 1, 3
OUTLIER_SCALE = 300.0    # outlier channels of blocks.1.fc2's input, relative to the rest
TINY_RATIO = 50.0        # the large weight of each 32-block of blocks.3.fc1, in row stds
PLANTED = {f"blocks.{OUTLIER_BLOCK}.fc2", f"blocks.{TINY_BLOCK}.fc1"}
# Measured with seeds 0-3 of the model: Spearman ρ(Fisher, end-to-end KL) over the
# 12 layers 0.986-1.0 (rel_error's ρ with KL: 0.08-0.53, as it ignores how much a
# layer's output matters downstream). The bound leaves room for numerics changes.
SPEARMAN_BOUND = 0.9


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h):
        return h + self.fc2(self.act(self.fc1(h)))


class PlantedLM(nn.Module):
    """Embedding → 6 residual MLP blocks → logits through the tied embedding (so the
    12 linear layers are the blocks' and round(f · 12) is never a tie).

    blocks.1.fc2: fc1 drives one channel per 32-block of fc2's input to ~600 while
    the rest stay below ~1, and fc2's matching weight columns are divided by 300:
    the function is unchanged (ReLU is positively homogeneous), but in MXFP4 the
    outlier sets each input block's scale and the other 31 elements flush to zero.
    blocks.3.fc1: every 32-block of every weight row holds one weight 50 row-stds
    large, on a residual channel that is always zero, so Y is unchanged but MXFP4
    flushes the block's other weights."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in GAINS)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(VOCAB, WIDTH, generator=g))
            self.embed.weight[:, DEAD] = 0
            for gain, block in zip(GAINS, self.blocks):
                block.fc1.weight.copy_(torch.randn(HIDDEN, WIDTH, generator=g) / WIDTH ** 0.5)
                block.fc1.bias.copy_(0.1 * torch.randn(HIDDEN, generator=g))
                block.fc2.weight.copy_(gain * torch.randn(WIDTH, HIDDEN, generator=g) *
                                       (2.0 / HIDDEN) ** 0.5)
                block.fc2.bias.copy_(0.1 * torch.randn(WIDTH, generator=g))
                block.fc2.weight[list(DEAD), :] = 0
                block.fc2.bias[list(DEAD)] = 0
            outlier = self.blocks[OUTLIER_BLOCK]
            channels = list(range(5, HIDDEN, 32))
            outlier.fc1.bias[channels] = 2.0  # always active
            outlier.fc1.weight[channels] *= OUTLIER_SCALE
            outlier.fc1.bias[channels] *= OUTLIER_SCALE
            outlier.fc2.weight[:, channels] /= OUTLIER_SCALE
            tiny = self.blocks[TINY_BLOCK].fc1
            tiny.weight[:, list(DEAD)] = TINY_RATIO * tiny.weight.std(dim=1, keepdim=True)

    def logits(self, h):
        return HEAD_GAIN / WIDTH ** 0.5 * h @ self.embed.weight.t()

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.logits(h)


def calibration_batches(count=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4, 32), generator=g) for _ in range(count)]


@pytest.fixture(scope="module")
def planted(daemon):
    """PlantedLM offloaded on the module's daemon, with its calibration capture."""
    with mxserve.Client(daemon.address, timeout=60) as client:
        client.wait_ready(timeout=10)
        model = PlantedLM()
        session = offload(model, client, name="planted-lm")
        batches = calibration_batches()
        yield SimpleNamespace(client=client, session=session, model=model, batches=batches,
                              capture=capture(session, batches, seed=0),
                              layers=list(session.layers))
        session.restore()


@pytest.fixture(scope="module")
def planted_kl(planted):
    return end_to_end(planted.session, planted.batches, [MXFP4, "MXFP8"], progress=False)


@pytest.fixture(scope="module")
def planted_profile(planted):
    """The profile with the daemon's default formats (needs the Profiles service)."""
    return profile(planted.client, planted.session, planted.capture)


# --- capture -------------------------------------------------------------------------------

def test_capture_takes_inputs_and_fisher_gradients_at_full_precision(client, model_name):
    model = PlantedLM()
    model.train()
    model.blocks[2].training = False
    model.embed.weight.requires_grad_(False)
    batches = calibration_batches(2)
    with offload(model, client, name=model_name) as session:
        flags = [(m, m.training) for m in model.modules()]
        data = capture(session, batches, seed=7)
        assert data.layers == list(session.layers)
        assert data.tokens == 12 * 2 * 4 * 32
        # Nothing ran on the daemon, and the model is as it was.
        assert all(info is None for info in session.last_infos().values())
        assert all(isinstance(b.fc1, OffloadedLinear) for b in model.blocks)
        assert [(m, m.training) for m in model.modules()] == flags
        assert not any(m._forward_hooks for m in model.modules())
        assert all(p.grad is None for p in model.parameters())
        assert not model.embed.weight.requires_grad and model.blocks[0].fc1.weight.requires_grad

        # The inputs of blocks.0.fc1 are the embeddings; the output gradient of the
        # last layer is that of the logits pulled back through the tied head:
        # HEAD_GAIN/√W · (softmax − onehot(label)) · E, labels drawn from the
        # model's own softmax with the seeded generator, batch after batch.
        generator = torch.Generator().manual_seed(7)
        expected_x, expected_g = [], []
        with session.local(), torch.no_grad():
            for tokens in batches:
                expected_x.append(model.embed(tokens).reshape(-1, WIDTH))
                probs = torch.softmax(model(tokens).reshape(-1, VOCAB), dim=-1)
                labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                dlogits = probs - nn.functional.one_hot(labels, VOCAB)
                expected_g.append(HEAD_GAIN / WIDTH ** 0.5 * dlogits @ model.embed.weight)
        assert torch.equal(data.inputs["blocks.0.fc1"], torch.cat(expected_x))
        assert torch.allclose(data.output_grads["blocks.5.fc2"], torch.cat(expected_g),
                              rtol=1e-4, atol=1e-6)
        assert data.output_grads["blocks.0.fc1"].shape == (256, HIDDEN)

        # Seeded: the same seed gives the same gradients, another seed others.
        again = capture(session, batches, seed=7)
        other = capture(session, batches, seed=8)
        assert torch.equal(again.output_grads["blocks.2.fc1"], data.output_grads["blocks.2.fc1"])
        assert not torch.equal(other.output_grads["blocks.2.fc1"],
                               data.output_grads["blocks.2.fc1"])
        # Iterating gives what Client.profile streams: layer-major triples.
        assert [layer for layer, _, _ in data] == data.layers
        # A part of the offloaded model goes by the daemon's layer names.
        part = capture(model.blocks[1], [torch.randn(8, WIDTH)])
        assert part.layers == ["blocks.1.fc1", "blocks.1.fc2"]


def test_capture_of_a_plain_model_with_other_losses():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(inplace=True), nn.Linear(64, 16))
    batches = [torch.randn(8, 32), torch.randn(2, 3, 32)]

    # Not logits: the Gaussian analogue, whose gradient at the output is −ε.
    data = capture(model, batches, seed=3)
    generator = torch.Generator().manual_seed(3)
    noise = torch.cat([torch.randn(8, 16, generator=generator),
                       torch.randn(6, 16, generator=generator)])
    assert torch.allclose(data.output_grads["2"], -noise)
    assert data.inputs["0"].shape == (14, 32) and data.output_grads["0"].shape == (14, 64)
    # The in-place ReLU after layer 0 does not leak into its output gradient: the
    # gradient is zero exactly where the ReLU cut it.
    with torch.no_grad():
        pre = model[0](torch.cat([b.reshape(-1, 32) for b in batches]))
    assert torch.all(data.output_grads["0"][pre <= 0] == 0)

    # A callable loss, a subset of layers, no gradients.
    summed = capture(model, batches, loss=lambda out, batch: out.sum(), layers=["2"])
    assert summed.layers == ["2"] and torch.equal(summed.output_grads["2"], torch.ones(14, 16))
    plain = capture(model, batches, gradients=False)
    assert plain.output_grads is None and list(plain)[0][2] is None
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="no linear layer 'nope'"):
        capture(model, batches, layers=["nope"])
    with pytest.raises(ValueError, match="loss"):
        capture(model, batches, loss="mse")


# --- end to end ----------------------------------------------------------------------------

def test_end_to_end_kl_ranks_the_planted_layers_first(planted, planted_kl):
    kl = planted_kl.values(MXFP4)
    assert list(kl) == planted.layers and planted_kl.tokens == 4 * 4 * 32
    assert set(planted_kl.ranking(MXFP4)[:2]) == PLANTED, kl
    assert min(kl[layer] for layer in PLANTED) > 5 * max(
        v for layer, v in kl.items() if layer not in PLANTED)
    assert all(0 < v for v in kl.values())
    mxfp8 = planted_kl.values("MXFP8")
    assert all(mxfp8[layer] < kl[layer] for layer in kl)
    # Nothing is left pinned, and the model's policy never changed.
    session = planted.session
    assert session.format is None and all(l.format is None for l in session.layers.values())
    assert planted.client.describe_model("planted-lm").policy == "D-phase-adaptive"
    lines = planted_kl.to_csv().splitlines()
    assert lines[0] == "layer,format,kl" and len(lines) == 1 + 2 * len(planted.layers)


def test_end_to_end_mse_and_progress(client, model_name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    model.train()
    with offload(model, client, name=model_name, format="MXFP6") as session:
        session.layers["2"].format = "BF16"
        seen = []
        result = end_to_end(session, [torch.randn(16, 32)], ["MXFP4", "FP16"], layers=["0", "2"],
                            metric="mse", progress=lambda done, total, row: seen.append(
                                (done, total, row.layer, row.format)))
        assert seen == [(1, 4, "0", MXFP4), (2, 4, "0", "FP16"), (3, 4, "2", MXFP4),
                        (4, 4, "2", "FP16")]
        values = {(r.layer, r.format): r.value for r in result.rows}
        assert all(values[(layer, "FP16")] < values[(layer, MXFP4)] for layer in ("0", "2"))
        # The session's format, the pin and the training mode are back.
        assert session.format == "MXFP6" and session.layers["2"].format == "BF16"
        assert model.training and model[0].training
        with pytest.raises(ValueError, match="no layer 'nope'"):
            end_to_end(session, [torch.randn(4, 32)], [MXFP4], layers=["nope"])
        with pytest.raises(ValueError, match="metric"):
            end_to_end(session, [torch.randn(4, 32)], [MXFP4], metric="l1")
    with pytest.raises(TypeError, match="offloaded"):
        end_to_end(model, [torch.randn(4, 32)], [MXFP4])


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties take average ranks: x ranks 1, 2.5, 2.5, 4.
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman({"a": 1, "b": 2, "c": 3, "x": 0}, {"c": 1, "b": 2, "a": 3}) == \
        pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


# --- the result types, without a daemon ----------------------------------------------------

def canned_profile() -> profiles_pb2.Profile:
    def score(fmt, rel, fisher=None, joules=1e-9):
        s = profiles_pb2.FormatScore(format=fmt, rel_error=rel,
                                     sqnr_db=-20 * math.log10(rel) if rel else math.inf,
                                     seconds_per_token=joules / 10, joules_per_token=joules,
                                     train_seconds_per_token=joules * 0.3,
                                     train_joules_per_token=3 * joules, weight_bits=1024)
        if fisher is not None:
            s.fisher, s.has_fisher = fisher, True
        return s

    mxfp4, fp16 = common_pb2.FORMAT_MXFP4_E2M1, common_pb2.FORMAT_FP16
    return profiles_pb2.Profile(
        model="m", weight_version=3, source=profiles_pb2.PROFILE_SOURCE_GRADIENTS,
        batch_tokens=128, formats=[mxfp4, fp16], tokens=96,
        layers=[profiles_pb2.LayerProfile(layer=name, out_features=64, in_features=32, tokens=32,
                                          scores=[score(mxfp4, rel, fisher), score(fp16, 0.0, 0.0)])
                for name, rel, fisher in (("a", 0.1, 5.0), ("b", 0.3, 1.0), ("c", 0.2, 9.0))])


def test_profile_table(tmp_path):
    prof = mxserve.Profile.from_proto(canned_profile())
    assert (prof.model, prof.weight_version, prof.source, prof.reference) == \
        ("m", 3, "gradients", "fp32")
    assert prof.layers == ("a", "b", "c") and prof.formats == (MXFP4, "FP16")
    assert len(prof.rows) == 6 and prof.has_fisher
    assert prof.ranking("mxfp4") == ["c", "a", "b"]              # auto: fisher
    assert prof.ranking(MXFP4, score="rel_error") == ["b", "c", "a"]
    assert prof.scores(MXFP4, "mse")["b"] == pytest.approx(0.09)
    assert prof.row("b", "MXFP4").rel_error == 0.3
    assert prof.matrix("rel_error").shape == (3, 2)
    with pytest.raises(ValueError, match="not profiled"):
        prof.ranking("MXFP8")
    with pytest.raises(ValueError, match="score"):
        prof.ranking(MXFP4, score="kl")

    text = prof.to_csv(tmp_path / "sensitivity_matrix.csv")
    assert (tmp_path / "sensitivity_matrix.csv").read_text() == text
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == PROFILE_COLUMNS and len(rows) == 1 + 3 * 2
    assert rows[1][:3] == ["a", MXFP4, "64"] and float(rows[1][5]) == 0.1
    assert rows[2][6] == "inf"  # FP16 exact here: SQNR is infinite

    weights_only = profiles_pb2.Profile()
    weights_only.CopyFrom(canned_profile())
    for layer in weights_only.layers:
        for s in layer.scores:
            s.has_fisher = False
    prof = mxserve.Profile.from_proto(weights_only)
    assert not prof.has_fisher and prof.ranking(MXFP4) == ["b", "c", "a"]  # auto: rel_error
    assert next(csv.DictReader(io.StringIO(prof.to_csv())))["fisher"] == ""
    with pytest.raises(ValueError, match="no Fisher"):
        prof.ranking(MXFP4, score="fisher")


def test_heatmap_is_a_png(tmp_path):
    import matplotlib  # noqa: F401  (python3-matplotlib: scripts/deps.sh installs it)
    prof = mxserve.Profile.from_proto(canned_profile())
    path = prof.heatmap(str(tmp_path / "sensitivity.png"))
    data = (tmp_path / "sensitivity.png").read_bytes()
    assert path.endswith("sensitivity.png") and len(data) > 1000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


# --- the client's side of the wire, against a recording server -----------------------------

class RecordingProfiles(profiles_pb2_grpc.ProfilesServicer):
    """Keeps every request; answers canned responses, or `abort` when set."""

    def __init__(self):
        self.requests = []
        self.abort = None
        self.stream_ended = threading.Event()
        self.stream_cancelled = None
        self.watch_cancel = False  # wait in ProfileModel to see a cancellation land

    def ProfileModel(self, request_iterator, context):
        messages = []
        try:
            for message in request_iterator:
                messages.append(message)
        finally:
            self.requests.append(messages)
            # A cancelled call's context goes inactive a moment after its
            # iterator ends; a half-closed one stays active until we return.
            deadline = time.monotonic() + (5 if self.watch_cancel else 0)
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.stream_cancelled = not context.is_active()
            self.stream_ended.set()
        if self.abort:
            context.abort(*self.abort)
        return canned_profile()

    def _unary(self, request, context, response):
        self.requests.append(request)
        if self.abort:
            context.abort(*self.abort)
        return response

    def GetProfile(self, request, context):
        return self._unary(request, context, canned_profile())

    def ListProfiles(self, request, context):
        listed = profiles_pb2.Profile(model="m", weight_version=3)
        return self._unary(request, context, profiles_pb2.ListProfilesResponse(profiles=[listed]))

    def ExportProfile(self, request, context):
        return self._unary(request, context, profiles_pb2.ExportProfileResponse(csv="layer\n"))

    def DeleteProfile(self, request, context):
        return self._unary(request, context, profiles_pb2.DeleteProfileResponse(deleted=2))

    def GeneratePolicy(self, request, context):
        response = profiles_pb2.GeneratePolicyResponse(
            policy=policies_pb2.PolicyInfo(name=request.name, json="{}"),
            phases=[profiles_pb2.PhaseSummary(phase=common_pb2.PHASE_ROLLOUT, layers=3,
                                              low_layers=1, joules_per_token=1.0,
                                              fp16_joules_per_token=4.0)],
            entries=[policies_pb2.ResolvedFormat(phase=common_pb2.PHASE_ROLLOUT, layer=layer,
                                                 format=fmt, rule=i)
                     for i, (layer, fmt) in enumerate([("a", common_pb2.FORMAT_MXFP4_E2M1),
                                                       ("b", common_pb2.FORMAT_FP16)])])
        return self._unary(request, context, response)


@pytest.fixture
def recorder():
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    servicer = RecordingProfiles()
    profiles_pb2_grpc.add_ProfilesServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with mxserve.Client(f"127.0.0.1:{port}", timeout=10) as client:
        yield client, servicer
    server.stop(grace=None)


def test_profile_streams_the_config_then_each_layers_rows_in_bounded_messages(recorder):
    client, servicer = recorder
    x_a, g_a = np.random.rand(1000, 64).astype(np.float32), np.random.rand(1000, 32)
    x_b = torch.randn(2, 50, 96, dtype=torch.bfloat16)   # flattened to [100, 96], sent as BF16
    prof = client.profile("m", [("a", x_a, g_a), ("b", x_b, None)], formats=["mxfp4", "FP16"],
                          layers=["a", "b"], reference="FP64", batch_tokens=64,
                          max_message_bytes=40_000)
    assert prof.layers == ("a", "b", "c")  # the canned answer, parsed
    config, *batches = servicer.requests[0]
    assert config.WhichOneof("kind") == "config"
    assert (config.config.model, list(config.config.layers), config.config.reference,
            config.config.batch_tokens) == ("m", ["a", "b"], profiles_pb2.REFERENCE_FP64, 64)
    assert list(config.config.formats) == [common_pb2.FORMAT_MXFP4_E2M1, common_pb2.FORMAT_FP16]
    assert all(m.WhichOneof("kind") == "batch" for m in batches)
    assert all(m.ByteSize() <= 41_000 for m in batches)
    layers = [m.batch.layer for m in batches]
    assert layers == sorted(layers) and layers.count("a") == math.ceil(1000 / (40_000 // 384))

    def rows(tensors):
        return np.concatenate([np.frombuffer(t.data, np.float32).reshape(tuple(t.shape))
                               for t in tensors])

    a = [m.batch for m in batches if m.batch.layer == "a"]
    assert np.array_equal(rows([b.inputs for b in a]), x_a)
    assert np.array_equal(rows([b.output_grads for b in a]), g_a.astype(np.float32))
    b = [m.batch for m in batches if m.batch.layer == "b"]
    assert [tuple(m.inputs.shape) for m in b] == [(100, 96)]
    assert b[0].inputs.dtype == common_pb2.DTYPE_BF16 and not b[0].HasField("output_grads")

    # No batches: a weight-only profile is the config alone; None formats: the default.
    client.profile("m", formats=None)
    assert len(servicer.requests[1]) == 1 and not servicer.requests[1][0].config.formats


def test_profile_arguments_refused_before_sending(recorder):
    client, servicer = recorder
    with pytest.raises(ValueError, match="unknown format 'MXFP5'"):
        client.profile("m", formats=["MXFP4", "MXFP5"])
    with pytest.raises(ValueError, match="not a format"):
        client.profile("m", formats=["policy"])
    with pytest.raises(ValueError, match="reference"):
        client.profile("m", reference="fp16")
    assert servicer.requests == []


def test_a_failure_while_producing_batches_cancels_the_stream(recorder):
    client, servicer = recorder
    servicer.watch_cancel = True

    def batches():
        yield "a", np.ones((4, 32)), None
        raise RuntimeError("calibration source broke")

    with pytest.raises(RuntimeError, match="calibration source broke"):
        client.profile("m", batches())
    assert servicer.stream_ended.wait(10)
    assert servicer.stream_cancelled  # the daemon sees a cancelled stream, not a short one
    with pytest.raises(TypeError, match="batches\\[0\\].inputs"):
        client.profile("m", [("a", np.array([["x"]]), None)])


def test_daemon_errors_raise_mxserve_error(recorder):
    client, servicer = recorder
    servicer.abort = (grpc.StatusCode.INVALID_ARGUMENT, "batches[0].output_grads: NaN")
    with pytest.raises(mxserve.MxserveError) as error:
        client.profile("m", [("a", np.ones((4, 32)), np.full((4, 8), np.nan))])
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and "NaN" in error.value.message
    assert error.value.rpc == "ProfileModel"
    servicer.abort = (grpc.StatusCode.NOT_FOUND, "no profile")
    with pytest.raises(mxserve.MxserveError) as error:
        client.get_profile("m")
    assert error.value.code == grpc.StatusCode.NOT_FOUND


def test_profile_queries_map_to_their_requests(recorder):
    client, servicer = recorder
    assert client.get_profile("m", weight_version=3).weight_version == 3
    listed = client.list_profiles("m")
    assert [(p.model, p.rows) for p in listed] == [("m", ())]
    assert client.export_profile("m", 2) == "layer\n"
    assert client.delete_profile("m") == 2
    get, listing, export, delete = servicer.requests
    assert (get.model, get.weight_version) == ("m", 3)
    assert listing.model == "m" and (export.model, export.weight_version) == ("m", 2)
    assert (delete.model, delete.weight_version) == ("m", 0)


def test_generate_policy_maps_its_arguments(recorder):
    client, servicer = recorder
    generated = client.generate_policy(
        "m", "D-measured", fraction={"rollout": 0.8, "reward": 0.5, "update": 0.2},
        low="mxfp4", high="FP16", score="fisher", groups=["blocks.*.fc?"],
        description="from the profile", dry_run=True)
    request = servicer.requests[-1]
    assert (request.model, request.name, request.kind, request.score, request.low,
            request.high, list(request.groups), request.dry_run, request.description) == (
        "m", "D-measured", profiles_pb2.GENERATION_KIND_FRACTION, profiles_pb2.SCORE_FISHER,
        common_pb2.FORMAT_MXFP4_E2M1, common_pb2.FORMAT_FP16, ["blocks.*.fc?"], True,
        "from the profile")
    assert [(v.phase, v.value) for v in request.fractions] == [
        (common_pb2.PHASE_ROLLOUT, 0.8), (common_pb2.PHASE_REWARD, 0.5),
        (common_pb2.PHASE_UPDATE, 0.2)]
    assert generated.name == "D-measured"
    assert generated.table() == {("rollout", "a"): MXFP4, ("rollout", "b"): "FP16"}
    assert generated.formats("rollout") == {"a": MXFP4, "b": "FP16"}
    assert generated.summary("rollout").energy_saving == pytest.approx(0.75)

    client.generate_policy("m", "B", fraction=0.5, phases=["rollout", "reward"])
    request = servicer.requests[-1]
    assert [(v.phase, v.value) for v in request.fractions] == [(common_pb2.PHASE_UNSPECIFIED, 0.5)]
    assert list(request.phases) == [common_pb2.PHASE_ROLLOUT, common_pb2.PHASE_REWARD]

    client.generate_policy("m", "budgeted", "budget", relative_budget={"*": 0.5},
                           candidates=["MXFP4", "MXFP8", "FP16"], metric="time")
    request = servicer.requests[-1]
    assert request.kind == profiles_pb2.GENERATION_KIND_BUDGET
    assert request.metric == profiles_pb2.COST_METRIC_TIME and not request.budgets
    assert [(v.phase, v.value) for v in request.relative_budgets] == [
        (common_pb2.PHASE_UNSPECIFIED, 0.5)]
    assert list(request.candidates) == [common_pb2.FORMAT_MXFP4_E2M1,
                                        common_pb2.FORMAT_MXFP8_E4M3, common_pb2.FORMAT_FP16]

    client.generate_policy("m", "bounded", "tolerance", tolerance={"update": 1e-3})
    request = servicer.requests[-1]
    assert request.kind == profiles_pb2.GENERATION_KIND_TOLERANCE
    assert [(v.phase, v.value) for v in request.budgets] == [(common_pb2.PHASE_UPDATE, 1e-3)]

    sent = len(servicer.requests)
    for kwargs in ({"kind": "fraction", "budget": 1.0}, {"kind": "budget", "fraction": 0.5},
                   {"kind": "tolerance", "relative_budget": 0.5}, {"kind": "knapsack"},
                   {"score": "kl"}, {"metric": "watts"}, {"fraction": {"prefill": 0.5}},
                   {"candidates": ["MXFP5"]}):
        with pytest.raises(ValueError):
            client.generate_policy("m", "bad", **kwargs)
    assert len(servicer.requests) == sent


# --- against the daemon's Profiles service -------------------------------------------------

def test_profile_ranks_the_planted_layers_and_fisher_tracks_end_to_end_kl(
        planted, planted_profile, planted_kl):
    prof = planted_profile
    assert prof.source == "gradients" and prof.has_fisher
    assert set(prof.ranking(MXFP4, "rel_error")[:2]) == PLANTED
    assert set(prof.ranking(MXFP4, "fisher")[:2]) == PLANTED
    assert set(planted_kl.ranking(MXFP4)[:2]) == PLANTED
    rho = spearman(prof.scores(MXFP4, "fisher"), planted_kl.values(MXFP4))
    rho_rel = spearman(prof.scores(MXFP4, "rel_error"), planted_kl.values(MXFP4))
    print(f"\nSpearman rho over {len(planted.layers)} layers, MXFP4: fisher vs end-to-end KL "
          f"{rho:.3f}, rel_error vs end-to-end KL {rho_rel:.3f}")
    assert rho > SPEARMAN_BOUND


def test_profile_scores_are_those_of_layer_forward(planted, planted_profile):
    """The profile's numbers are what LayerForward gives on the same inputs: the
    datapath is bit-identical whatever computes it (the numerics contract)."""
    client, data = planted.client, planted.capture
    for layer in ("blocks.0.fc1", "blocks.1.fc2", "blocks.3.fc1"):
        x, g = data.inputs[layer].numpy(), data.output_grads[layer].numpy().astype(np.float64)
        y = client.forward("planted-lm", layer, x, format="FP32", phase="rollout").output
        for fmt in (MXFP4, "MXFP8_E4M3"):
            y_f = client.forward("planted-lm", layer, x, format=fmt, phase="rollout").output
            delta = y_f.astype(np.float64) - y
            row = planted_profile.row(layer, fmt)
            assert row.rel_error == pytest.approx(np.linalg.norm(delta) / np.linalg.norm(y),
                                                  rel=1e-3)
            assert row.fisher == pytest.approx(float((g ** 2 * delta ** 2).sum()), rel=1e-3)
            assert row.tokens == x.shape[0]


def test_profile_covers_every_layer_and_default_format_with_costs(planted, planted_profile):
    prof = planted_profile
    assert prof.model == "planted-lm" and prof.weight_version == 1
    assert set(prof.formats) == DEFAULT_FORMATS
    assert prof.layers == tuple(planted.layers)
    assert len(prof.rows) == len(planted.layers) * len(DEFAULT_FORMATS)
    assert prof.tokens == planted.capture.tokens and prof.batch_tokens == 128
    for row in prof.rows:
        assert row.tokens == 512 and row.rel_error > 0
        assert row.sqnr_db == pytest.approx(-20 * math.log10(row.rel_error), rel=1e-6)
        assert 0 < row.seconds_per_token < row.train_seconds_per_token
        assert 0 < row.joules_per_token < row.train_joules_per_token
    for layer in prof.layers:
        elements = prof.row(layer, MXFP4).out_features * prof.row(layer, MXFP4).in_features
        assert prof.row(layer, MXFP4).weight_bits == elements * (4 + 8 / 32)  # E8M0 per 32
        assert prof.row(layer, "MXFP8").weight_bits == elements * (8 + 8 / 32)
        assert prof.row(layer, "FP16").weight_bits == elements * 16
        assert prof.row(layer, "FP16").rel_error < prof.row(layer, "MXFP8").rel_error < \
            prof.row(layer, MXFP4).rel_error


def test_profiles_are_kept_and_exported(planted, planted_profile, tmp_path):
    client = planted.client
    kept = client.get_profile("planted-lm")
    assert kept.rows == planted_profile.rows
    assert client.get_profile("planted-lm", weight_version=1).rows == planted_profile.rows
    listed = [p for p in client.list_profiles() if p.model == "planted-lm"]
    assert [(p.weight_version, p.source, p.rows) for p in listed] == [(1, "gradients", ())]
    assert [p.model for p in client.list_profiles("planted-lm")] == ["planted-lm"]

    exported = list(csv.DictReader(io.StringIO(client.export_profile("planted-lm"))))
    ours = list(csv.DictReader(io.StringIO(planted_profile.to_csv(tmp_path / "profile.csv"))))
    assert tuple(exported[0]) == PROFILE_COLUMNS
    assert len(exported) == len(ours) == len(planted.layers) * len(DEFAULT_FORMATS)
    for theirs, mine in zip(exported, ours):
        assert (theirs["layer"], theirs["format"], theirs["tokens"]) == \
            (mine["layer"], mine["format"], mine["tokens"])
        for column in ("rel_error", "fisher", "joules_per_token", "weight_bits"):
            assert float(theirs[column]) == pytest.approx(float(mine[column]), rel=1e-5)


def test_heatmap_of_a_measured_profile(planted_profile, tmp_path):
    import matplotlib  # noqa: F401  (python3-matplotlib: scripts/deps.sh installs it)
    png = tmp_path / "sensitivity.png"
    planted_profile.heatmap(str(png), score="fisher")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def register_small(client, name, seed=0):
    rng = np.random.default_rng(seed)
    layers = [mxserve.LayerSpec("fc1", 64, 32, bias=True), mxserve.LayerSpec("fc2", 16, 64)]
    client.register_model(name, layers)
    client.upload_weights(name, {"fc1": (rng.standard_normal((64, 32)), rng.standard_normal(64)),
                                 "fc2": rng.standard_normal((16, 64))}, publish=True)


def test_weight_only_profiles_and_their_lifetime(client, model_name):
    register_small(client, model_name)
    with pytest.raises(mxserve.MxserveError) as error:
        client.get_profile(model_name)
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    prof = client.profile(model_name, formats=["MXFP4", "MXFP8", "FP16"])
    assert prof.source == "weights" and prof.tokens == 0 and not prof.has_fisher
    assert prof.layers == ("fc1", "fc2") and prof.formats == (MXFP4, "MXFP8_E4M3", "FP16")
    assert all(r.tokens == 0 and r.fisher is None for r in prof.rows)
    for layer in prof.layers:
        assert prof.row(layer, "FP16").rel_error < prof.row(layer, "MXFP8").rel_error < \
            prof.row(layer, MXFP4).rel_error < 0.3
    assert prof.ranking(MXFP4) == sorted(prof.layers, key=lambda l: -prof.row(l, MXFP4).rel_error)
    only = client.profile(model_name, layers=["fc2"], formats=[MXFP4])
    assert only.layers == ("fc2",) and client.get_profile(model_name).layers == ("fc2",)

    client.upload_weights(model_name, {"fc2": np.ones((16, 64))}, publish=True)
    client.profile(model_name, formats=[MXFP4])  # version 2
    assert sorted(p.weight_version for p in client.list_profiles(model_name)) == [1, 2]
    assert client.get_profile(model_name).weight_version == 2
    assert client.delete_profile(model_name, weight_version=1) == 1
    assert [p.weight_version for p in client.list_profiles(model_name)] == [2]
    assert client.delete_profile(model_name) == 1
    with pytest.raises(mxserve.MxserveError) as error:
        client.get_profile(model_name)
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    client.profile(model_name)
    client.delete_model(model_name)  # a deleted model's profiles go with it
    assert model_name not in {p.model for p in client.list_profiles()}


def test_bad_calibration_is_refused_and_keeps_nothing(client, model_name):
    register_small(client, model_name)
    x, g = np.ones((8, 32), np.float32), np.ones((8, 64), np.float32)

    def refused(code, words, batches=None, **kwargs):
        with pytest.raises(mxserve.MxserveError) as error:
            client.profile(model_name, batches, **kwargs)
        assert error.value.code in ((code,) if isinstance(code, grpc.StatusCode) else code), \
            error.value
        for word in words:
            assert word in error.value.message, error.value

    either = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    refused(either, ["nope"], [("nope", x, None)])
    refused(either, ["nope"], layers=["nope"])
    with pytest.raises(mxserve.MxserveError) as error:
        client.profile("no-such-model")
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    refused(grpc.StatusCode.INVALID_ARGUMENT, ["inputs"], [("fc1", np.ones((8, 33)), None)])
    refused(grpc.StatusCode.INVALID_ARGUMENT, ["output_grads"], [("fc1", x, np.ones((8, 65)))])
    refused(grpc.StatusCode.INVALID_ARGUMENT, ["output_grads"], [("fc1", x, np.ones((7, 64)))])
    nan = g.copy()
    nan[3, 5] = np.nan
    refused(grpc.StatusCode.INVALID_ARGUMENT, ["output_grads"], [("fc1", x, nan)])
    with pytest.raises(mxserve.MxserveError) as error:  # nothing was kept of any of them
        client.get_profile(model_name)
    assert error.value.code == grpc.StatusCode.NOT_FOUND

    # No format list is the default; an empty or misspelt one never leaves the client.
    assert set(client.profile(model_name, [("fc1", x, g)], layers=["fc1"]).formats) \
        == DEFAULT_FORMATS
    with pytest.raises(ValueError, match="formats: an empty list"):
        client.profile(model_name, formats=[])
    with pytest.raises(ValueError, match="MXFP5"):
        client.profile(model_name, formats=["MXFP5"])


def low_layers(generated, phase, low=MXFP4):
    return {layer for layer, fmt in generated.formats(phase).items() if fmt == low}


def half_up(value):
    return math.floor(value + 0.5)


# ORIGIN.md's fraction policies: low-precision shares of the layers per phase.
FRACTION_POLICIES = {"A": {"rollout": 0.2, "reward": 0.2}, "B": {"rollout": 0.5, "reward": 0.5},
                     "C": {"rollout": 0.8, "reward": 0.8},
                     "D": {"rollout": 0.8, "reward": 0.5, "update": 0.2}}


def test_fraction_policies_a_b_c_d(planted, planted_profile):
    client, layers = planted.client, planted.layers
    tolerant = planted_profile.ranking(MXFP4)[::-1]  # least sensitive first (auto: fisher)
    for letter, fractions in FRACTION_POLICIES.items():
        name = f"planted-{letter}"
        generated = client.generate_policy("planted-lm", name, fraction=fractions, low="MXFP4",
                                           high="FP16")
        assert generated.name == name and client.get_policy(name).name == name
        resolved = client.resolve_policy("planted-lm", name).table()
        for phase in mxserve.PHASES:
            formats = generated.formats(phase)
            assert list(formats) == layers
            count = half_up(fractions.get(phase, 0.0) * len(layers))
            assert low_layers(generated, phase) == set(tolerant[:count]), (letter, phase)
            assert set(formats.values()) <= {MXFP4, "FP16"}
            if phase not in fractions:
                assert set(formats.values()) == {"FP16"}  # not generated: all `high`
            assert {l for l in layers if resolved[(phase, l)] == MXFP4} == \
                low_layers(generated, phase)
            if fractions.get(phase, 0) <= 0.8:
                assert not PLANTED & low_layers(generated, phase)
        for summary in generated.phases:
            assert summary.layers == len(layers)
            if summary.phase in fractions:
                assert summary.low_layers == half_up(fractions[summary.phase] * len(layers))
        client.delete_policy(name)


def phase_cost(prof, phase, formats, metric="energy"):
    """Σ over layers of the profile's cost of each layer's format, per token of `phase`."""
    column = {"energy": "joules_per_token", "time": "seconds_per_token",
              "bits": "weight_bits"}[metric]
    if phase == "update" and metric != "bits":
        column = "train_" + column
    return sum(getattr(prof.row(layer, fmt), column) for layer, fmt in formats.items())


def test_budget_policies_stay_within_their_budget(planted, planted_profile):
    client, prof = planted.client, planted_profile
    generated = client.generate_policy("planted-lm", "planted-half-energy", "budget",
                                       relative_budget=0.5, dry_run=True)
    with pytest.raises(mxserve.MxserveError):
        client.get_policy("planted-half-energy")  # a dry run puts nothing
    for summary in generated.phases:
        formats = generated.formats(summary.phase)
        fp16 = phase_cost(prof, summary.phase, {layer: "FP16" for layer in formats})
        cost = phase_cost(prof, summary.phase, formats)
        assert summary.fp16_joules_per_token == pytest.approx(fp16, rel=1e-9)
        assert summary.budget == pytest.approx(0.5 * fp16, rel=1e-9)
        assert summary.joules_per_token == pytest.approx(cost, rel=1e-9)
        assert cost <= summary.budget * (1 + 1e-12)
        scores = prof.scores  # least score within the budget: no worse than all-MXFP4
        assert summary.score == pytest.approx(
            sum(scores(fmt)[layer] for layer, fmt in formats.items()), rel=1e-9)
        cheapest = {layer: MXFP4 for layer in formats}
        if phase_cost(prof, summary.phase, cheapest) <= summary.budget:
            assert summary.score <= sum(scores(MXFP4).values()) * (1 + 1e-9)

    # An absolute bound on the weights' bits, per phase, with paired layers.
    elements = sum(prof.row(l, "FP16").weight_bits / 16 for l in prof.layers)
    generated = client.generate_policy(
        "planted-lm", "planted-6-bits", "budget", budget={"rollout": 6 * elements},
        metric="bits", candidates=["MXFP4", "MXFP8", "FP16"], groups=["blocks.*.fc?"])
    rollout = generated.formats("rollout")
    assert phase_cost(prof, "rollout", rollout, "bits") <= 6 * elements
    assert all(rollout[f"blocks.{i}.fc1"] == rollout[f"blocks.{i}.fc2"] for i in range(6))
    assert set(rollout.values()) <= {MXFP4, "MXFP8_E4M3", "FP16"}
    assert set(generated.formats("update").values()) == {"FP16"}  # not generated
    client.delete_policy("planted-6-bits")


def test_infeasible_bounds_name_the_least_feasible_one(planted, planted_profile):
    prof, layers = planted_profile, planted.layers
    cheapest = sum(min(prof.row(l, f).joules_per_token for f in prof.formats) for l in layers)
    with pytest.raises(mxserve.MxserveError) as error:
        planted.client.generate_policy("planted-lm", "planted-impossible", "budget",
                                       budget={"rollout": cheapest / 2})
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
                                            error.value.message)]
    assert any(n == pytest.approx(cheapest, rel=1e-3) for n in numbers), error.value.message

    least = sum(min(prof.row(l, f).fisher for f in prof.formats) for l in layers)
    with pytest.raises(mxserve.MxserveError) as error:
        planted.client.generate_policy("planted-lm", "planted-impossible", "tolerance",
                                       tolerance=least / 2)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(mxserve.MxserveError) as error:
        planted.client.generate_policy("planted-lm", "planted-impossible", fraction=1.5)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_tolerance_policy_is_the_cheapest_within_its_bound(planted, planted_profile):
    prof, layers = planted_profile, planted.layers
    best = {l: min(prof.formats, key=lambda f: prof.row(l, f).fisher) for l in layers}
    bound = 2 * sum(prof.row(l, f).fisher for l, f in best.items())
    generated = planted.client.generate_policy("planted-lm", "planted-tolerant", "tolerance",
                                               tolerance={"reward": bound}, dry_run=True)
    reward = generated.formats("reward")
    assert sum(prof.row(l, f).fisher for l, f in reward.items()) <= bound * (1 + 1e-9)
    assert phase_cost(prof, "reward", reward) <= phase_cost(prof, "reward", best) * (1 + 1e-9)
    assert generated.summary("reward").budget == pytest.approx(bound)


def test_generated_policy_serves_requests(planted, planted_profile):
    client, session = planted.client, planted.session
    generated = client.generate_policy("planted-lm", "planted-served", fraction={
        "rollout": 0.8, "reward": 0.5, "update": 0.2}, low="MXFP4", high="MXFP8")
    previous = client.set_active_policy("planted-lm", "planted-served")
    try:
        assert client.resolve_policy("planted-lm").table() == generated.table()
        for phase in mxserve.PHASES:
            with client.phase(phase), torch.no_grad():
                planted.model(planted.batches[0])
            served = {layer: info.format for layer, info in session.last_infos().items()}
            assert served == generated.formats(phase), phase
    finally:
        client.set_active_policy("planted-lm", previous)
        client.delete_policy("planted-served")
