"""Transport security against the real daemon: TLS, mutual TLS, SIGHUP reload,
--reflection=false, the TLS flags' errors, and the bearer token on the wire.

Certificates are made here with Debian's openssl CLI, in a temporary directory.
"""

import os
import shutil
import signal
import ssl
import subprocess
import time
from concurrent import futures

import grpc
import pytest

import mxserve
from mxserve import _health_pb2
from conftest import MXSERVED, Daemon, REPO

MXCTL = os.environ.get("MXCTL", str(REPO / "build" / "bin" / "mxctl"))
OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl CLI")


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """Two CAs; a server certificate for 127.0.0.1 from each; client certificates."""

    def __init__(self, root):
        self.root = root
        for ca in ("ca", "otherca"):
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                    "-subj", f"/CN=mxserve test {ca}", cwd=root)
        server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        client_ext = "extendedKeyUsage=clientAuth\n"
        self.issue("server", "ca", server_ext)
        self.issue("server2", "otherca", server_ext)  # what a reload switches to
        self.issue("alice", "ca", client_ext)
        self.issue("mallory", "otherca", client_ext)

    def issue(self, name, ca, extensions):
        (self.root / f"{name}.ext").write_text(extensions)
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
                cwd=self.root)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
                cwd=self.root)

    def __getitem__(self, name):
        return str(self.root / name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_daemon(pki):
    d = Daemon("--tls-cert", pki["server.pem"], "--tls-key", pki["server.key"])
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def mtls_daemon(pki):
    d = Daemon("--tls-cert", pki["server.pem"], "--tls-key", pki["server.key"],
               "--tls-client-ca", pki["ca.pem"])
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def plain_daemon():
    d = Daemon("--reflection=false")
    yield d
    assert d.stop() == 0, d.log()


def mxctl(*args):
    return subprocess.run([MXCTL, *args], capture_output=True, text=True, timeout=60)


def error_of(address, **kwargs):
    with mxserve.Client(address, timeout=5, **kwargs) as client:
        with pytest.raises(mxserve.MxserveError) as caught:
            client.wait_ready(timeout=3)
    return caught.value


# --- TLS ------------------------------------------------------------------------------

def test_python_client_over_tls(tls_daemon, pki):
    assert "tls=on" in tls_daemon.log()
    with mxserve.Client(tls_daemon.address, tls=pki["ca.pem"]) as client:
        client.wait_ready(timeout=10)
        client.register_model("tls-mlp", [("fc", 4, 8, False)])
        assert [m.name for m in client.list_models()] == ["tls-mlp"]
        client.delete_model("tls-mlp")


def test_python_client_takes_the_ca_from_the_environment(tls_daemon, pki, monkeypatch):
    monkeypatch.setenv("MXSERVE_TLS_CA", pki["ca.pem"])
    with mxserve.Client(tls_daemon.address) as client:
        assert client.health(timeout=10) == "SERVING"


def test_mxctl_over_tls(tls_daemon, pki):
    done = mxctl("health", "--server", tls_daemon.address, "--tls-ca", pki["ca.pem"])
    assert (done.returncode, done.stdout) == (0, "SERVING\n"), done.stderr
    done = mxctl("--tls-ca", pki["ca.pem"], "models", "list", "--server", tls_daemon.address)
    assert done.returncode == 0, done.stderr


def test_plaintext_client_against_tls_daemon_says_so(tls_daemon):
    error = error_of(tls_daemon.address, tls=False)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert "may speak TLS" in error.message, error.message
    done = mxctl("health", "--server", tls_daemon.address, "--timeout", "5s")
    assert done.returncode == 1
    assert f"the daemon at {tls_daemon.address} closed the connection: it may speak TLS; pass " \
           "--tls-ca FILE" in done.stderr, done.stderr


def test_tls_client_against_plaintext_daemon_says_so(plain_daemon, pki):
    error = error_of(plain_daemon.address, tls=pki["ca.pem"])
    assert "does not speak TLS" in error.message, error.message
    done = mxctl("health", "--server", plain_daemon.address, "--tls-ca", pki["ca.pem"],
                 "--timeout", "5s")
    assert done.returncode == 1
    assert f"the daemon at {plain_daemon.address} does not speak TLS: drop --tls-ca" \
        in done.stderr, done.stderr


def test_a_certificate_from_another_ca_is_refused(tls_daemon, pki):
    error = error_of(tls_daemon.address, tls=pki["otherca.pem"])
    assert "not signed by the CA given" in error.message, error.message
    done = mxctl("health", "--server", tls_daemon.address, "--tls-ca", pki["otherca.pem"])
    assert done.returncode == 1
    assert "certificate not signed by --tls-ca" in done.stderr, done.stderr


# --- mutual TLS -------------------------------------------------------------------------

def test_mutual_tls_takes_a_client_certificate_of_its_ca(mtls_daemon, pki):
    assert "tls=mutual" in mtls_daemon.log()
    with mxserve.Client(mtls_daemon.address, tls=pki["ca.pem"], client_cert=pki["alice.pem"],
                        client_key=pki["alice.key"]) as client:
        client.wait_ready(timeout=10)
    done = mxctl("health", "--server", mtls_daemon.address, "--tls-ca", pki["ca.pem"],
                 "--tls-cert", pki["alice.pem"], "--tls-key", pki["alice.key"])
    assert (done.returncode, done.stdout) == (0, "SERVING\n"), done.stderr


@pytest.mark.parametrize("who", [None, "mallory"])
def test_mutual_tls_refuses_no_or_a_foreign_client_certificate(mtls_daemon, pki, who):
    cert = {"client_cert": pki[f"{who}.pem"], "client_key": pki[f"{who}.key"]} if who else {}
    error = error_of(mtls_daemon.address, tls=pki["ca.pem"], **cert)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert "client certificate" in error.message, error.message
    flags = ["--tls-cert", pki[f"{who}.pem"], "--tls-key", pki[f"{who}.key"]] if who else []
    done = mxctl("health", "--server", mtls_daemon.address, "--tls-ca", pki["ca.pem"], *flags)
    assert done.returncode == 1
    assert "client certificate" in done.stderr, done.stderr


# --- SIGHUP -----------------------------------------------------------------------------

def served_certificate(address):
    host, port = address.rsplit(":", 1)
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((host, int(port))))


def der(path):
    with open(path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def wait_for_log(daemon, event, count):
    deadline = time.monotonic() + 10
    while sum(f"event={event}" in line for line in daemon.log_lines) < count:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.05)


def test_sighup_reloads_certificates_and_keeps_open_connections(pki, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(pki["server.pem"], cert)
    shutil.copy(pki["server.key"], key)
    with Daemon("--tls-cert", str(cert), "--tls-key", str(key)) as d, \
            mxserve.Client(d.address, tls=pki["ca.pem"]) as old:
        old.wait_ready(timeout=10)
        assert served_certificate(d.address) == der(pki["server.pem"])
        # A new certificate, from the other CA: who trusts which is plain to see.
        shutil.copy(pki["server2.pem"], cert)
        shutil.copy(pki["server2.key"], key)
        d.process.send_signal(signal.SIGHUP)
        wait_for_log(d, "tls_reloaded", 1)
        assert served_certificate(d.address) == der(pki["server2.pem"])
        with mxserve.Client(d.address, tls=pki["otherca.pem"]) as new:
            assert new.health(timeout=10) == "SERVING"
        assert "not signed by the CA given" in error_of(d.address, tls=pki["ca.pem"]).message
        assert old.health(timeout=10) == "SERVING"  # its connection was kept
        # A bad set (the key of another certificate) is refused; the last good stays.
        shutil.copy(pki["alice.key"], key)
        d.process.send_signal(signal.SIGHUP)
        wait_for_log(d, "tls_reload_failed", 1)
        assert "--tls-key:" in d.log_lines[-1] and "is not the key of the certificate" \
            in d.log_lines[-1], d.log()
        assert served_certificate(d.address) == der(pki["server2.pem"])
        assert old.health(timeout=10) == "SERVING"


# --- reflection -------------------------------------------------------------------------

# ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
LIST_SERVICES = b"\x3a\x00"


def reflection_call(address):
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return list(call(iter([LIST_SERVICES]), timeout=10))


def test_reflection_is_on_by_default_and_can_be_turned_off(daemon, plain_daemon):
    assert b"mxserve.v1.Models" in reflection_call(daemon.address)[0]
    with pytest.raises(grpc.RpcError) as caught:
        reflection_call(plain_daemon.address)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- flags ------------------------------------------------------------------------------

def in_pki(pki, text):
    """PKI/name → the path of that file of `pki`."""
    return text.replace("PKI/", f"{pki.root}/")


@pytest.mark.parametrize("flags, code, message", [
    (["--tls-cert", "PKI/server.pem"], 2, "--tls-cert: needs --tls-key"),
    (["--tls-key", "PKI/server.key"], 2, "--tls-key: needs --tls-cert"),
    (["--tls-client-ca", "PKI/ca.pem"], 2, "--tls-client-ca: needs --tls-cert and --tls-key"),
    (["--tls-cert", "PKI/server.pem", "--tls-key", "PKI/nope.key"], 2, "--tls-key: cannot read"),
    (["--tls-cert", "PKI/server.pem", "--tls-key", "PKI/server.key", "--tls-client-ca", "PKI/nope"], 2,
     "--tls-client-ca: cannot read"),
    (["--tls-cert", "PKI/server.pem", "--tls-key", "PKI/alice.key"], 1,
     "--tls-key: 'PKI/alice.key' is not the key of the certificate in 'PKI/server.pem'"),
    (["--tls-cert", "PKI/server.key", "--tls-key", "PKI/server.key"], 1,
     "--tls-cert: 'PKI/server.key' holds no PEM certificate"),
    (["--reflection", "maybe"], 2, "--reflection: expected true or false, got 'maybe'"),
])
def test_bad_tls_flags_name_the_flag(pki, flags, code, message):
    done = subprocess.run([MXSERVED, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                           *(in_pki(pki, flag) for flag in flags)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == code, done.stderr
    assert in_pki(pki, message) in done.stderr


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert", "PKI/alice.pem"], "--tls-cert and --tls-key: give both"),
    (["--tls-cert", "PKI/alice.pem", "--tls-key", "PKI/alice.key"], "--tls-cert: a client "
     "certificate needs TLS, so --tls-ca too"),
    (["--tls-ca", "PKI/nope"], "--tls-ca: cannot read"),
    (["--token-file", "PKI/nope"], "--token-file: cannot read a token"),
])
def test_bad_mxctl_tls_flags_name_the_flag(pki, flags, message):
    done = mxctl("health", *(in_pki(pki, flag) for flag in flags))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


# --- the token on the wire --------------------------------------------------------------

@pytest.fixture
def recording_server():
    """An in-process gRPC server answering Health.Check, keeping each call's metadata."""
    seen = []

    def check(request, context):
        seen.append(dict(context.invocation_metadata()))
        return _health_pb2.HealthCheckResponse(status=_health_pb2.HealthCheckResponse.SERVING)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=_health_pb2.HealthCheckRequest.FromString,
            response_serializer=_health_pb2.HealthCheckResponse.SerializeToString)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", seen
    server.stop(None)


def test_the_token_travels_as_bearer_metadata(recording_server, tmp_path, monkeypatch):
    address, seen = recording_server
    with mxserve.Client(address, token="s3cret") as client:
        assert client.health() == "SERVING"
    monkeypatch.setenv("MXSERVE_TOKEN", "from-env")
    with mxserve.Client(address) as client:
        client.health()
    with mxserve.Client(address, token="") as client:  # "" : none, whatever the environment
        pass
    monkeypatch.delenv("MXSERVE_TOKEN")
    with mxserve.Client(address) as client:
        client.health()
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    done = mxctl("health", "--server", address, "--token-file", str(token_file))
    assert done.returncode == 0, done.stderr
    assert [m.get("authorization") for m in seen] == ["Bearer s3cret", "Bearer from-env", None,
                                                      "Bearer from-file"]
