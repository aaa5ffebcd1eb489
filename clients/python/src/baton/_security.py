"""What the client shows Baton of itself: the API token and TLS (docs/security.md, "Clients").

The token goes as `authorization: Bearer <token>` on every call, added by a client interceptor
(which works over the Unix socket and plaintext TCP, where gRPC call credentials do not). A token
file is checked before each call and read again when it changed, so a rotated Kubernetes Secret
(swapped in place by the kubelet) is used by the next call without reconnecting.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import List, Optional, Tuple, Union

import grpc

#: The variable naming the API token file when neither `api_token` nor `api_token_file` is given
#: (the Helm chart sets it in the app containers).
TOKEN_FILE_ENV = "BATON_API_TOKEN_FILE"
#: Largest token file read, in bytes (Baton's own bound).
MAX_TOKEN_FILE_BYTES = 4096
#: Largest PEM file read (CA bundle, certificate, key), in bytes.
MAX_PEM_FILE_BYTES = 1024 * 1024

PathLike = Union[str, "os.PathLike[str]"]


def _check_token(token: str, where: str) -> str:
    token = token.strip()
    if not token:
        raise ValueError(f"{where}: no token (it is empty)")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError(f"{where}: the token holds a character that is not visible ASCII "
                         "(a token must fit an HTTP header)")
    return token


def _read_bounded(path: PathLike, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"{what}: cannot read {os.fspath(path)}: {e.strerror or e}") from None
    if len(data) > limit:
        raise ValueError(f"{what}: {os.fspath(path)} is more than the {limit} bytes accepted")
    return data


def _token_from_file(path: PathLike) -> str:
    where = f"the API token file {os.fspath(path)}"
    data = _read_bounded(path, MAX_TOKEN_FILE_BYTES, "api_token_file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    for line in text.splitlines():
        if line.strip():
            return _check_token(line, where)
    raise ValueError(f"{where} holds no token (it is empty)")


class TokenSource:
    """The `authorization` value of each call: a fixed token, or the first non-empty line of a
    file, read again whenever the file changed (its inode, size or modification time); should
    the file become unreadable or empty, the last token read stays in use."""

    def __init__(self, token: Optional[str] = None, path: Optional[PathLike] = None):
        self._lock = threading.Lock()
        self._path = path
        if token is not None:
            self._header = "Bearer " + _check_token(token, "api_token")
            self._stamp = None
        else:
            assert path is not None
            self._stamp = self._stat()
            self._header = "Bearer " + _token_from_file(path)

    def _stat(self):
        try:
            st = os.stat(self._path)
            return (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            return None

    def header(self) -> str:
        if self._path is None:
            return self._header
        stamp = self._stat()
        with self._lock:
            if stamp is not None and stamp != self._stamp:
                try:
                    self._header = "Bearer " + _token_from_file(self._path)
                    self._stamp = stamp
                except ValueError:
                    pass  # half-written or emptied: keep the token in use until it settles
            return self._header


def token_source(api_token: Optional[str], api_token_file: Optional[PathLike]
                 ) -> Optional[TokenSource]:
    """The token the caller gave, its file, or the file `BATON_API_TOKEN_FILE` names; None when
    there is none. A missing, unreadable or empty file raises `ValueError` naming it."""
    if api_token is not None and api_token_file is not None:
        raise ValueError("give api_token or api_token_file, not both")
    if api_token is not None:
        return TokenSource(token=api_token)
    if api_token_file is None:
        api_token_file = os.environ.get(TOKEN_FILE_ENV) or None
    if api_token_file is None:
        return None
    return TokenSource(path=api_token_file)


def _pem(value: Union[None, bytes, PathLike], what: str) -> Optional[bytes]:
    """PEM contents given as bytes, or read from a path."""
    if value is None or isinstance(value, bytes):
        return value
    return _read_bounded(value, MAX_PEM_FILE_BYTES, what)


def tls_credentials(https: bool, unix: bool, tls_ca, tls_cert, tls_key,
                    tls_server_name: Optional[str]
                    ) -> Tuple[Optional[grpc.ChannelCredentials], List[Tuple[str, object]]]:
    """The channel credentials and extra options when TLS is asked for (an `https://` address
    or any TLS argument), or `(None, [])` for plaintext. PEM arguments are paths or bytes."""
    asked = any(v is not None for v in (tls_ca, tls_cert, tls_key, tls_server_name))
    if not (https or asked):
        return None, []
    if unix:
        raise ValueError("TLS (tls_ca, tls_cert, tls_key, tls_server_name, https://) needs a TCP "
                         "address: Baton serves its Unix socket in the clear, confined by the "
                         "file's permissions")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together (a client certificate and its key)")
    ca = _pem(tls_ca, "tls_ca")
    if ca is not None and b"-----BEGIN CERTIFICATE-----" not in ca:
        raise ValueError("tls_ca: holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    cert, key = _pem(tls_cert, "tls_cert"), _pem(tls_key, "tls_key")
    if cert is not None and b"-----BEGIN CERTIFICATE-----" not in cert:
        raise ValueError("tls_cert: holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if key is not None and b"PRIVATE KEY-----" not in key:
        raise ValueError("tls_key: holds no PEM private key")
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                               certificate_chain=cert)
    options: List[Tuple[str, object]] = []
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return credentials, options


_Details = collections.namedtuple(
    "_Details", ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"])


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


class AuthInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a blocking channel."""

    def __init__(self, source: TokenSource):
        self._source = source

    def _details(self, d):
        metadata = list(d.metadata or ()) + [("authorization", self._source.header())]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def aio_interceptors(source: TokenSource) -> list:
    """Interceptors adding the token to every call of an asyncio channel."""
    import grpc.aio

    def details(d):
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()))
        metadata.add("authorization", source.header())
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials,
                                          d.wait_for_ready)

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, d, request):
            return await continuation(details(d), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, d, request):
            return await continuation(details(d), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, d, request_iterator):
            return await continuation(details(d), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, d, request_iterator):
            return await continuation(details(d), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
