"""The package against a Baton that requires an API token, TLS or mutual TLS (docs/security.md,
"Clients"): blocking and asyncio, the token given as a string, a file (read again when it
changes) or `BATON_API_TOKEN_FILE`. Certificates are made here with the `openssl` command."""

import os
import subprocess
import sys
import uuid

import pytest

import baton
import baton.aio
from conftest import BatonServer, read_line

TOKEN = "py-token-4c1d9e7a2b5f3e80"
OTHER = "py-token-other-9a7b5c3d1e0f2a46"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d, name):
    """A self-signed CA in d/NAME.{crt,key}; returns its certificate's path."""
    crt, key = os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", crt, "-subj", f"/CN={name}", "-days", "2")
    return crt


def make_leaf(d, name, ca, usage):
    """A certificate for localhost and 127.0.0.1 signed by the CA `ca`, for `usage`
    (serverAuth or clientAuth); returns the (certificate, key) paths."""
    crt, key, csr = (os.path.join(d, f"{name}.{x}") for x in ("crt", "key", "csr"))
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", csr, "-CA", os.path.join(d, f"{ca}.crt"),
            "-CAkey", os.path.join(d, f"{ca}.key"), "-set_serial", str(uuid.uuid4().int >> 64),
            "-out", crt, "-days", "2", "-extfile", ext)
    return crt, key


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture(scope="module")
def pki(workdir):
    d = os.path.join(workdir, f"pki-{uuid.uuid4().hex[:6]}")
    os.makedirs(d)
    ca = make_ca(d, "ca")
    other = make_ca(d, "other")
    server = make_leaf(d, "server", "ca", "serverAuth")
    client = make_leaf(d, "client", "ca", "clientAuth")
    return {"ca": ca, "other": other, "server": server, "client": client, "dir": d}


@pytest.fixture(scope="module")
def token_server(redis, workdir):
    """A Baton accepting the tokens TOKEN and OTHER, over plaintext TCP and the socket."""
    path = write(os.path.join(workdir, f"tokens-{uuid.uuid4().hex[:6]}"), f"{TOKEN}\n{OTHER}\n")
    b = BatonServer(redis, workdir, "--api-token-file", path)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def mtls_server(redis, workdir, pki):
    """A Baton serving mutual TLS on TCP: certificates from the test CA only."""
    cert, key = pki["server"]
    b = BatonServer(redis, workdir, "--tls-cert", cert, "--tls-key", key,
                    "--tls-client-ca", pki["ca"])
    yield b
    b.stop()


def test_calls_carry_the_api_token(token_server, transport, name, tmp_path):
    """Without a token a call raises Unauthenticated saying a token is required; with it as a
    string or a file, plain calls and a lock's Hold stream get in, over TCP and the socket."""
    addr = token_server.addr(transport)
    with baton.Baton.connect(addr) as client:
        with pytest.raises(baton.Unauthenticated, match="requires an API token"):
            client.describe_lock(name)
    with baton.Baton.connect(addr, api_token="not-the-token") as client:
        with pytest.raises(baton.Unauthenticated, match="not valid"):
            client.describe_lock(name)
    token_file = write(tmp_path / "token", f"\n  {TOKEN}\nignored\n")
    for kwargs in [{"api_token": TOKEN}, {"api_token_file": token_file}]:
        with baton.Baton.connect(addr, **kwargs) as client:
            with client.lock(name, ttl=2) as lease:
                assert client.describe_lock(name).fencing_token == lease.fencing_token
            assert not client.describe_lock(name).held


def test_a_token_file_is_read_again_when_it_changes(token_server, name, tmp_path):
    """The token file is checked before each call: a rotated token is used by the next call on
    the same client, a wrong one is refused, an emptied file keeps the last token read."""
    path = write(tmp_path / "token", f"{TOKEN}\n")
    with baton.Baton.connect(token_server.tcp, api_token_file=path) as client:
        client.describe_lock(name)
        write(path, "wrong-token-0000000000\n")
        with pytest.raises(baton.Unauthenticated):
            client.describe_lock(name)
        write(path, f"{OTHER}\n")
        client.describe_lock(name)
        write(path, "\n")
        client.describe_lock(name)


def test_bad_token_arguments_are_refused_at_once(tmp_path):
    """A missing or empty token file, both a token and a file, and a token no header can carry
    raise ValueError before any call."""
    with pytest.raises(ValueError, match="cannot read"):
        baton.Baton.connect("127.0.0.1:1", api_token_file=tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no token"):
        baton.Baton.connect("127.0.0.1:1", api_token_file=write(tmp_path / "empty", "\n \n"))
    with pytest.raises(ValueError, match="not both"):
        baton.Baton.connect("127.0.0.1:1", api_token="a", api_token_file=tmp_path / "x")
    with pytest.raises(ValueError, match="visible ASCII"):
        baton.aio.Baton("127.0.0.1:1", api_token="two words")


def test_the_token_file_of_the_environment_is_used(token_server, name, tmp_path):
    """A process whose environment has BATON_API_TOKEN_FILE (as the Helm chart sets it) gets in
    with no argument, blocking and asyncio."""
    path = write(tmp_path / "token", f"{TOKEN}\n")
    for mode in [[], ["aio"]]:
        env = {**os.environ, "BATON_API_TOKEN_FILE": str(path)}
        proc = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "holder.py"),
             token_server.unix, "hold", f"{name}-{len(mode)}", *mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        try:
            line = read_line(proc)
            assert line.startswith("HELD "), (line, proc.stderr.read() if proc.poll() else "")
        finally:
            proc.kill()
            proc.wait()


async def test_asyncio_calls_carry_the_api_token(token_server, transport, name, tmp_path):
    """The asyncio client: refused without a token, in with it (plain calls and a Hold
    stream)."""
    addr = token_server.addr(transport)
    async with baton.aio.Baton.connect(addr) as client:
        with pytest.raises(baton.Unauthenticated, match="requires an API token"):
            await client.describe_lock(name)
    token_file = write(tmp_path / "token", f"{OTHER}\n")
    async with baton.aio.Baton.connect(addr, api_token_file=token_file) as client:
        async with client.lock(name, ttl=2) as lease:
            assert (await client.describe_lock(name)).fencing_token == lease.fencing_token
        assert not (await client.describe_lock(name)).held


def test_mutual_tls(mtls_server, pki, name):
    """With the CA and a client certificate the calls and a Hold stream get in, by address,
    `https://` address or server name; without a certificate Unauthenticated says why; a CA
    that did not issue Baton's certificate cannot connect; TLS to the socket is refused."""
    cert, key = pki["client"]
    identity = {"tls_ca": pki["ca"], "tls_cert": cert, "tls_key": key}
    for addr, extra in [(mtls_server.tcp, {}), (f"https://{mtls_server.tcp}", {}),
                        (mtls_server.tcp, {"tls_server_name": "localhost"})]:
        with baton.Baton.connect(addr, **identity, **extra) as client:
            with client.lock(name, ttl=2) as lease:
                assert client.describe_lock(name).fencing_token == lease.fencing_token
    with open(pki["ca"], "rb") as f:
        ca_bytes = f.read()
    with baton.Baton.connect(mtls_server.tcp, tls_ca=ca_bytes) as client:
        with pytest.raises(baton.Unauthenticated, match="presented none"):
            client.describe_lock(name)
    with baton.Baton.connect(mtls_server.tcp, tls_ca=pki["other"], tls_cert=cert,
                             tls_key=key, timeout=3) as client:
        with pytest.raises(baton.Unavailable):
            client.describe_lock(name)
    with pytest.raises(ValueError, match="needs a TCP address"):
        baton.Baton.connect(mtls_server.unix, tls_ca=pki["ca"])
    with pytest.raises(ValueError, match="go together"):
        baton.Baton.connect(mtls_server.tcp, tls_ca=pki["ca"], tls_cert=cert)


async def test_asyncio_mutual_tls(mtls_server, pki, name):
    """The asyncio client over mutual TLS: in with the certificate, Unauthenticated without."""
    cert, key = pki["client"]
    async with baton.aio.Baton.connect(mtls_server.tcp, tls_ca=pki["ca"], tls_cert=cert,
                                       tls_key=key) as client:
        async with client.lock(name, ttl=2) as lease:
            assert (await client.describe_lock(name)).fencing_token == lease.fencing_token
    async with baton.aio.Baton.connect(mtls_server.tcp, tls_ca=pki["ca"]) as client:
        with pytest.raises(baton.Unauthenticated, match="presented none"):
            await client.describe_lock(name)
