"""Who may do what, end to end: the Python client's and mxctl's credentials against a real
daemon with --auth-tokens over TLS, and mutual-TLS certificates as principals (cert:NAME).

The daemon's own tests (tests/daemon/auth_test.cc) check every RPC x role with raw gRPC;
these check that the clients carry what the daemon checks, and that the two halves of
issue 21 (transport, access) work together. Certificates come from test_tls's Pki.
"""

import grpc
import pytest
import torch

import mxserve
from conftest import Daemon
from test_tls import OPENSSL, Pki, mxctl

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl CLI")

TOKENS = {"alice": "a11ce-7f3c9e1b2d4a", "bob": "b0b-5e8d2c7a9f1b", "root": "r00t-3c1e9a7b5d2f"}
LAYERS = [("fc", 4, 8, False)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pki = Pki(tmp_path_factory.mktemp("pki"))
    pki.issue("carol", "ca", "extendedKeyUsage=clientAuth\n")  # a CN with no cert: line
    return pki


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text("# TOKEN PRINCIPAL ROLE\n"
                    f"{TOKENS['alice']} alice train\n"
                    f"{TOKENS['bob']} bob compute\n"
                    f"{TOKENS['root']} root admin\n"
                    "cert:alice alice train\n")
    return path


@pytest.fixture(scope="module")
def secure_daemon(pki, tokens_file):
    """The README's secure configuration: TLS, tokens, quotas, no reflection."""
    d = Daemon("--tls-cert", pki["server.pem"], "--tls-key", pki["server.key"],
               "--auth-tokens", str(tokens_file), "--quota-models", "2", "--reflection=false")
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def mtls_daemon(pki, tokens_file):
    d = Daemon("--tls-cert", pki["server.pem"], "--tls-key", pki["server.key"],
               "--tls-client-ca", pki["ca.pem"], "--auth-tokens", str(tokens_file))
    yield d
    assert d.stop() == 0, d.log()


def client(daemon, pki, who=None, **kwargs):
    return mxserve.Client(daemon.address, timeout=20, tls=pki["ca.pem"],
                          token=TOKENS[who] if who else "", **kwargs)


def code_and_message(call):
    with pytest.raises(mxserve.MxserveError) as caught:
        call()
    return caught.value.code, caught.value.message


def test_roles_and_ownership_through_the_python_client(secure_daemon, pki):
    weights = {"fc": torch.arange(32, dtype=torch.float32).reshape(4, 8) / 32}
    with client(secure_daemon, pki, "alice") as alice, client(secure_daemon, pki, "bob") as bob, \
            client(secure_daemon, pki, "root") as root, client(secure_daemon, pki) as nobody:
        assert nobody.health(timeout=10) == "SERVING"  # health needs no credentials
        code, message = code_and_message(nobody.list_models)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in message

        alice.register_model("alice-mlp", LAYERS, policy="fp16")
        alice.upload_weights("alice-mlp", weights, publish=True)
        info = bob.describe_model("alice-mlp")  # compute may read...
        assert (info.owner, info.weight_version) == ("alice", 1)
        y = bob.forward("alice-mlp", "fc", torch.ones(2, 8), phase="rollout")  # ...and compute
        assert tuple(y.output.shape) == (2, 4)

        code, message = code_and_message(lambda: bob.register_model("bob-mlp", LAYERS))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "RegisterModel needs role train" in message and "'bob' has role compute" in message
        code, message = code_and_message(lambda: bob.delete_model("alice-mlp"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'bob'" in message
        # The model is untouched: the next forward still sees version 1.
        assert alice.describe_model("alice-mlp").weight_version == 1

        # The quota: two models per principal; the third is refused and not registered.
        alice.register_model("alice-2", LAYERS)
        code, message = code_and_message(lambda: alice.register_model("alice-3", LAYERS))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--quota-models" in message
        assert sorted(m.name for m in root.list_models()) == ["alice-2", "alice-mlp"]
        root.delete_model("alice-2")  # an admin may delete anyone's
        alice.delete_model("alice-mlp")
        assert root.list_models() == []


def test_mxctl_carries_the_token_file(secure_daemon, pki, tmp_path):
    for who in ("alice", "bob"):
        (tmp_path / who).write_text(TOKENS[who] + "\n")
    common = ["--server", secure_daemon.address, "--tls-ca", pki["ca.pem"]]
    done = mxctl("models", "register", "--name", "mx-mlp", "--layer", "fc:4x8", *common,
                 "--token-file", str(tmp_path / "alice"))
    assert done.returncode == 0, done.stderr
    done = mxctl("models", "list", *common, "--token-file", str(tmp_path / "bob"))
    assert done.returncode == 0, done.stderr
    assert "mx-mlp" in done.stdout and "alice" in done.stdout  # the owner column
    done = mxctl("models", "delete", "mx-mlp", *common,
                 "--token-file", str(tmp_path / "bob"))
    assert done.returncode != 0
    assert "PERMISSION_DENIED" in done.stderr and "'bob' has role compute" in done.stderr
    done = mxctl("models", "list", *common)  # no token at all
    assert done.returncode != 0 and "UNAUTHENTICATED" in done.stderr
    done = mxctl("models", "delete", "mx-mlp", *common,
                 "--token-file", str(tmp_path / "alice"))
    assert done.returncode == 0, done.stderr


def test_a_client_certificate_is_its_principal(mtls_daemon, pki):
    cert = {"client_cert": pki["alice.pem"], "client_key": pki["alice.key"]}
    with client(mtls_daemon, pki, **cert) as alice:  # no token: the certificate speaks
        alice.register_model("by-cert", LAYERS)
        assert alice.describe_model("by-cert").owner == "alice"
        alice.delete_model("by-cert")
    # A certificate from the right CA whose name has no cert: line is no principal.
    carol = {"client_cert": pki["carol.pem"], "client_key": pki["carol.key"]}
    with client(mtls_daemon, pki, **carol) as carol_client:
        code, message = code_and_message(carol_client.list_models)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "carol" in message
        # ...but a bearer token still works over its connection, and decides.
    with client(mtls_daemon, pki, "bob", **carol) as bob:
        assert bob.list_models() == []
