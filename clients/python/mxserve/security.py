"""How a Client reaches a daemon run with TLS, mutual TLS or tokens.

    mxserve.Client("lab:50051", tls="ca.pem", token="s3cret")
    mxserve.Client("lab:50051", tls="ca.pem", client_cert="me.pem", client_key="me.key")

The same from the environment, for programs that do not pass them:
MXSERVE_TLS_CA (a CA file: TLS with it), MXSERVE_TLS_CERT and MXSERVE_TLS_KEY (a
client certificate for mutual TLS), MXSERVE_TOKEN (the token itself). Command
lines (the GPU baseline runner, the examples) add --tls-ca, --tls-cert,
--tls-key and --token-file with add_connection_arguments.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Optional, Union

import grpc

TlsLike = Union[None, bool, str, os.PathLike, grpc.ChannelCredentials]


def _read(path: Union[str, os.PathLike], what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise ValueError(f"{what}: cannot read {os.fspath(path)!r}: {error.strerror}") from None
    if not data:
        raise ValueError(f"{what}: {os.fspath(path)!r} is empty")
    return data


def channel_credentials(tls: TlsLike = None, client_cert: Optional[str] = None,
                        client_key: Optional[str] = None) -> Optional[grpc.ChannelCredentials]:
    """The channel's credentials, None for plaintext.

    tls: None (MXSERVE_TLS_CA if set, else plaintext), False (plaintext), True (TLS
    with the system's CAs), a CA file's path, or grpc.ChannelCredentials as they are.
    client_cert/client_key (default MXSERVE_TLS_CERT/MXSERVE_TLS_KEY): PEM files of
    a client certificate and its key, both or neither, for mutual TLS.
    """
    if tls is None:
        tls = os.environ.get("MXSERVE_TLS_CA") or None
    if client_cert is None and client_key is None and tls is not False:
        client_cert = os.environ.get("MXSERVE_TLS_CERT") or None
        client_key = os.environ.get("MXSERVE_TLS_KEY") or None
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key: give both (a certificate and its key) "
                         "or neither")
    if tls is None or tls is False:
        if client_cert is not None:
            raise ValueError("client_cert: a client certificate needs TLS (tls=CA file)")
        return None
    if isinstance(tls, grpc.ChannelCredentials):
        if client_cert is not None:
            raise ValueError("client_cert: pass it inside tls= when tls is ChannelCredentials")
        return tls
    roots = None if tls is True else _read(tls, "tls (CA file)")
    chain = _read(client_cert, "client_cert") if client_cert is not None else None
    key = _read(client_key, "client_key") if client_key is not None else None
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key,
                                        certificate_chain=chain)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call. An interceptor, not call
    credentials: gRPC sends those over TLS only, and a token must reach a plaintext
    loopback daemon too."""

    def __init__(self, token: str):
        self._entry = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        return _CallDetails(details, [*(details.metadata or ()), self._entry])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


def token_from(token: Optional[str]) -> Optional[str]:
    """`token`, else MXSERVE_TOKEN, else None; surrounding whitespace dropped."""
    if token is None:
        token = os.environ.get("MXSERVE_TOKEN")
    token = token.strip() if token else None
    if token and any(c in token for c in "\r\n"):
        raise ValueError("token: one line expected")
    return token or None


def make_channel(address: str, options, credentials: Optional[grpc.ChannelCredentials],
                 token: Optional[str] = None) -> grpc.Channel:
    """A channel to `address`: TLS with `credentials` (channel_credentials), plaintext
    with None, and the token (token_from) on every call."""
    channel = (grpc.secure_channel(address, credentials, options=options) if credentials
               else grpc.insecure_channel(address, options=options))
    token = token_from(token)
    return grpc.intercept_channel(channel, _BearerToken(token)) if token else channel


def explain_unavailable(address: str, secure: bool, message: str) -> str:
    """An UNAVAILABLE message that shows a TLS/plaintext mismatch, said plainly
    (the raw message kept in brackets); other messages come back as they are."""
    closed = any(s in message for s in ("Socket closed", "Connection reset", "Broken pipe"))
    if not secure and (closed or "andshake" in message):
        hint = (f"the daemon at {address} closed the connection: it may speak TLS; pass "
                f"tls='ca.pem' (MXSERVE_TLS_CA, --tls-ca)")
    elif secure and "wrong version number" in message:
        hint = f"the daemon at {address} does not speak TLS: connect without tls"
    elif secure and "certificate verify failed" in message:
        hint = (f"the daemon at {address} speaks TLS with a certificate not signed by the "
                f"CA given (tls=, MXSERVE_TLS_CA, --tls-ca), or not issued for that address")
    elif secure and closed:
        hint = (f"the daemon at {address} closed the TLS connection: it may want a client "
                f"certificate signed by its --tls-client-ca (client_cert=, client_key=)")
    else:
        return message
    return f"{hint} [{message}]"


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls-ca, --tls-cert, --tls-key and --token-file, as mxctl has them; their
    defaults come from the MXSERVE_* variables (see connection_kwargs)."""
    group = parser.add_argument_group("connection (default: MXSERVE_TLS_CA, MXSERVE_TLS_CERT, "
                                      "MXSERVE_TLS_KEY, MXSERVE_TOKEN)")
    group.add_argument("--tls-ca", metavar="FILE", help="speak TLS; the daemon's certificate "
                       "must be signed by this PEM CA")
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    group.add_argument("--tls-key", metavar="FILE", help="its private key")
    group.add_argument("--token-file", metavar="FILE", help="file holding the bearer token "
                       "alone (sent as `authorization: Bearer` metadata)")


def connection_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """Client(...) keyword arguments from add_connection_arguments' flags; a flag
    not given leaves the environment's default."""
    kwargs: Dict[str, Any] = {}
    if args.tls_ca:
        kwargs["tls"] = args.tls_ca
    if args.tls_cert or args.tls_key:
        kwargs["client_cert"], kwargs["client_key"] = args.tls_cert, args.tls_key
    if args.token_file:
        kwargs["token"] = _read(args.token_file, "--token-file").decode().rstrip("\r\n")
    return kwargs
