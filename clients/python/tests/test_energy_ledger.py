"""The offload path's work ledger against a real daemon: the GEMMs it records,
priced by mxserve.energy_model, are what mxserved booked — per response
(ExecutionInfo.model_joules) and in its energy report for the run (source
fpga_model) — in every phase, split calls included. The daemon reads the same
parameter file as the Python port (--energy-model), which also shows that the
C++ parser still loads the file with its "ranges"."""

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mxserve  # noqa: E402
from conftest import Daemon  # noqa: E402
from mxserve import energy_model as em  # noqa: E402
from mxserve.rlhf import trainer as rlhf  # noqa: E402
from mxserve.energy_model import WorkKey  # noqa: E402
from mxserve.rlhf.models import ModelConfig, build_model  # noqa: E402
from mxserve.torch import offload  # noqa: E402

SMALL = 1 << 20  # a client limit under which the vocabulary projection is split
VOCAB, HIDDEN, TOKENS = 8192, 96, 48
PHASES = ("rollout", "reward", "update")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon("--model-dir", str(tmp_path_factory.mktemp("models")),
               "--energy-model", str(em.DEFAULT_PATH))
    yield d
    assert d.stop() == 0, "mxserved did not exit cleanly:\n" + "\n".join(d.log_lines[-20:])


@pytest.fixture(scope="module")
def params():
    return em.load_energy_model()


@pytest.fixture
def small_client(daemon):
    with mxserve.Client(daemon.address, timeout=60, max_message_bytes=SMALL) as c:
        c.wait_ready(timeout=10)
        yield c


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b))


@pytest.mark.parametrize("fmt,m,n,k,joules", [
    # The hand-computed cases of test_energy_model.py, now as the daemon books them.
    ("MXFP4_E2M1", 8, 4864, 896, 0.0018193473712),
    ("FP16", 8, 896, 896, 32.11264e-6 + 54.1212672e-6 + 1129.333333333e-6),
    ("INT8", 64, 256, 100, 2.4576e-6 + 3.2907264e-6 + 85.333333333e-6),
])
def test_the_daemon_books_what_estimate_gemm_computes(client, model_name, params, fmt, m, n, k,
                                                       joules):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(k, n))
    session = offload(model, client, name=model_name, format=fmt)
    try:
        with client.phase("rollout"):
            model(torch.randn(m, k))
        info = session.layers["0"].last_info
        assert (info.format, info.weight_format) == (fmt, fmt)
        assert info.model_joules == pytest.approx(joules, rel=1e-12)
        assert info.model_joules == em.estimate_gemm(params, fmt, fmt, m, n, k).joules
        assert info.model_seconds == em.estimate_gemm(params, fmt, fmt, m, n, k).seconds
        assert session.work() == [{**WorkKey("rollout", "", fmt, fmt, m, n, k, "forward")._asdict(),
                                   "count": 1}]
    finally:
        session.restore()


def projection_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(64, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, VOCAB))


@pytest.mark.parametrize("grad_weight", ["remote", "local"])
def test_the_ledger_prices_to_what_the_daemon_booked_in_every_phase(small_client, model_name,
                                                                    params, grad_weight):
    client = small_client
    run = f"ledger-{grad_weight}"
    model = projection_model()
    session = offload(model, client, name=model_name, format="MXFP8_E4M3",
                      grad_weight=grad_weight)
    session.layers["0"].format = "INT8"  # two formats in one run
    try:
        torch.manual_seed(12)
        x, target = torch.randn(TOKENS, 64), torch.randint(0, VOCAB, (TOKENS,))
        for phase in PHASES:
            with client.run(run), client.phase(phase):
                nn.functional.cross_entropy(model(x), target).backward()
        # An untagged call, kept apart from the run's.
        with client.phase("rollout"), torch.no_grad():
            model(x)

        work = em.work_counts(session.work(run))
        assert {row["run"] for row in session.work()} == {run, ""}
        ours = em.phase_joules(work, params)
        responses = {phase: t.model_joules for phase, t in session.totals.items()}
        untagged = em.phase_joules(session.work(""), params)["rollout"]
        booked = client.energy_report(run=run).by_phase("fpga_model")
        assert set(ours) == set(booked) == set(PHASES)
        for phase in PHASES:
            assert rel(ours[phase], booked[phase].joules) < 1e-9
            expected = responses[phase] - (untagged if phase == "rollout" else 0.0)
            assert rel(ours[phase], expected) < 1e-9

        # The shapes: per phase the same calls. The projection's forward (48 rows of
        # 8192 FP32 logits) does not fit 1 MiB less the envelope, 30 rows do.
        update = {key._replace(phase="", run=""): count for key, count in work.items()
                  if key.phase == "update"}
        mx8 = ("MXFP8_E4M3", "MXFP8_E4M3")

        def entry(fmts, m, n, k, kind):
            return WorkKey("", "", *fmts, m, n, k, kind)

        assert update[entry(mx8, 30, VOCAB, HIDDEN, "forward")] == 1
        assert update[entry(mx8, 18, VOCAB, HIDDEN, "forward")] == 1
        assert update[entry(("INT8", "INT8"), TOKENS, HIDDEN, 64, "forward")] == 1
        # grad_input of the projection, split along M too.
        assert update[entry(mx8, 30, HIDDEN, VOCAB, "grad_input")] == 1
        assert update[entry(mx8, 18, HIDDEN, VOCAB, "grad_input")] == 1
        first_grad_input = entry(("INT8", "INT8"), TOKENS, 64, HIDDEN, "grad_input")
        # grad_weight of the projection: rows of W [n_slice, 96] over the 48 tokens.
        slices = {key.m: count for key, count in update.items()
                  if key.kind == "grad_weight" and key.n == HIDDEN}
        if grad_weight == "remote":
            # The first layer's input needs no gradient, but its call (for
            # grad_weight) carries no weight_rows, so the daemon computes and books
            # grad_input anyway: so does the ledger.
            assert update[first_grad_input] == 1
            # weight_rows slices of the 8192 rows, each with all 48 rows of X.
            assert len(slices) > 1 and sum(m * c for m, c in slices.items()) == VOCAB
            assert all(key.k == TOKENS for key in update if key.kind == "grad_weight")
            assert update[entry(("INT8", "INT8"), HIDDEN, 64, TOKENS, "grad_weight")] == 1
            assert len(update) == 9
        else:
            # Locally the first layer needs nothing from the daemon: no call at all.
            assert first_grad_input not in update
            assert slices == {} and len(update) == 5
        assert {key.phase for key in work} == set(PHASES)
        assert all(key._replace(phase="update") in work for key in work)

        session.reset_work(run)
        assert session.work(run) == [] and session.work("") != []
        session.reset_work()
        assert session.work() == []
    finally:
        session.restore()


TINY = dict(arch="qwen2", vocab_size=24, hidden_size=32, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=48, max_positions=64, norm_eps=1e-6,
            tie_word_embeddings=True, eos_token_id=1)


def tiny_lm(seed):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**TINY)).eval()


def test_a_ppo_step_ledger_matches_the_runs_energy_report(client, params):
    run = "test-emodel/ppo"
    config = rlhf.PPOConfig(batch_size=4, response_length=4, learning_rate=1e-3)
    trainer = rlhf.PPOTrainer(client, tiny_lm(0), rlhf.RewardModel(tiny_lm(2)), config,
                              eos_id=1, pad_id=0, seed=0, run=run, name_prefix="test-emodel")
    try:
        trainer.step([[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 2], [14, 2]])
        work = em.work_counts(trainer.work(run))
        assert work and trainer.work("another-run") == []
        # Merged over the three sessions: the reward phase is the reference's and
        # the reward model's calls together.
        merged = {}
        for session in trainer.sessions.values():
            for key, count in em.work_counts(session.work(run)).items():
                merged[key] = merged.get(key, 0) + count
        assert merged == work
        assert {key.phase for key in em.work_counts(trainer.sessions["reward"].work())} == \
            {"reward"}
        ours = em.phase_joules(work, params)
        booked = client.energy_report(run=run).by_phase("fpga_model")
        totals = trainer.totals()
        assert set(ours) == set(booked) == {"rollout", "reward", "update"}
        for phase, entry in booked.items():
            assert rel(ours[phase], entry.joules) < 1e-9
            assert rel(ours[phase], totals[phase].model_joules) < 1e-9
        # The same shapes in FP16 cost more at the nominal parameters and the
        # saving's range brackets its nominal.
        report = em.saving_range(work, em.recast(work, "FP16"), params, samples=64)
        for r in report.phases.values():
            assert r.min <= r.nominal <= r.max and math.isfinite(r.nominal)
    finally:
        trainer.close()


def test_each_models_energy_is_what_its_calls_booked(client, model_name):
    """Issue 37: GetEnergyReport by_model, served calls and reported work alike."""
    sessions = {}
    try:
        for role, seed in (("a", 1), ("b", 2)):
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))
            sessions[role] = offload(model, client, name=f"{model_name}-{role}", policy="D")
            with client.phase("rollout"), torch.no_grad():
                model(torch.randn(4, 64))
            with client.phase("update"):
                model(torch.randn(3, 64)).square().sum().backward()
        # Work a client computed itself and reported counts for its model too.
        client.report_work([mxserve.WorkCall(phase="reward", run="", model=f"{model_name}-b",
                                             layer="0", call="forward", format="MXFP4_E2M1",
                                             m=8, count=2)])
        report = client.energy_report(by_model=True)
        for role, session in sessions.items():
            rows = [e for e in report.entries if e.model == f"{model_name}-{role}"]
            by_phase = {e.phase: e for e in rows if e.source == "fpga_model"}
            for phase, totals in session.totals.items():
                assert by_phase[phase].joules == pytest.approx(totals.model_joules, rel=1e-12)
                assert by_phase[phase].requests == totals.requests
        reported = [e for e in report.entries if e.model == f"{model_name}-b" and
                    e.phase == "reward"]
        assert len(reported) == 1 and reported[0].emulated_requests == 2
        for kwargs, text in ((dict(since=1.0), "since_seconds: by_model reports totals"),
                             (dict(run="exp/1"), "run: by_model reports every run together")):
            with pytest.raises(mxserve.MxserveError, match=text):
                client.energy_report(by_model=True, **kwargs)
    finally:
        for session in sessions.values():
            session.restore()
