"""Serving-side security from a stock gRPC client (grpcio, generated from proto/): TLS and mutual
TLS on the TCP listener (a client certificate from the CA, none, one from another CA, an expired
one), certificates rotated under an open Hold stream the way Kubernetes rotates a Secret (a
`..data` symlink swapped at once), the health listener left plaintext, and the API token.

Certificates are made in the test with the `openssl` command. Run by scripts/python-tests.sh.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from harness import Redis, free_port, ms, wait_until  # noqa: E402
from baton.v1 import lock_pb2 as pb  # noqa: E402
from baton.v1 import lock_pb2_grpc as rpc  # noqa: E402


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d, name):
    """A self-signed CA in d/NAME.{crt,key}; returns its certificate's path."""
    crt, key = os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", crt, "-subj", f"/CN={name}", "-days", "2")
    return crt


def make_leaf(d, name, ca, usage, days=2):
    """A certificate for localhost signed by the CA `ca` (a name given to make_ca), for `usage`
    (serverAuth or clientAuth), valid for `days` (negative: already expired); returns the
    (certificate, key) paths."""
    crt, key, csr = (os.path.join(d, f"{name}.{x}") for x in ("crt", "key", "csr"))
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", csr, "-CA", os.path.join(d, f"{ca}.crt"),
            "-CAkey", os.path.join(d, f"{ca}.key"), "-set_serial", str(uuid.uuid4().int >> 64),
            "-out", crt, "-days", str(days), "-extfile", ext)
    return crt, key


def read(path):
    with open(path, "rb") as f:
        return f.read()


def secret_volume(root):
    """A directory laid out as Kubernetes mounts a Secret: each file a symlink through `..data`,
    itself a symlink to the current timestamped directory."""
    os.makedirs(root)
    return root


def publish(root, files):
    """Writes `files` (name -> bytes) into a new timestamped directory of the Secret volume at
    `root` and swaps `..data` to it at once, as the kubelet does."""
    version = f"..{uuid.uuid4().hex[:8]}"
    os.makedirs(os.path.join(root, version))
    for name, data in files.items():
        with open(os.path.join(root, version, name), "wb") as f:
            f.write(data)
        link = os.path.join(root, name)
        if not os.path.islink(link):
            os.symlink(os.path.join("..data", name), link)
    staged = os.path.join(root, "..data_tmp")
    os.symlink(version, staged)
    os.replace(staged, os.path.join(root, "..data"))


class Certs:
    """The certificates of the tests: two CAs for servers and clients, another CA, and the
    server, client and expired client certificates."""

    def __init__(self, d):
        self.dir = d
        self.ca = make_ca(d, "ca")
        self.new_ca = make_ca(d, "new-ca")
        self.other_ca = make_ca(d, "other-ca")
        self.server = make_leaf(d, "server", "ca", "serverAuth")
        self.new_server = make_leaf(d, "new-server", "new-ca", "serverAuth")
        self.client = make_leaf(d, "client", "ca", "clientAuth")
        self.stranger = make_leaf(d, "stranger", "other-ca", "clientAuth")
        self.expired = make_leaf(d, "expired", "ca", "clientAuth", days=-1)


class BatonProcess:
    """The baton binary serving TLS with `extra` flags; readiness is asked on its plaintext
    health listener."""

    def __init__(self, redis_port, workdir, *extra):
        self.port = free_port()
        self.health_port = free_port()
        self.log = open(os.path.join(workdir, f"baton-{self.port}.log"), "wb")
        self.proc = subprocess.Popen(
            [os.environ["BATON_BIN"], "serve", "--listen", f"127.0.0.1:{self.port}",
             "--health-listen", f"127.0.0.1:{self.health_port}",
             "--redis-url", f"redis://127.0.0.1:{redis_port}",
             "--key-prefix", f"py-{uuid.uuid4().hex[:8]}:", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.health_channel = grpc.insecure_channel(f"127.0.0.1:{self.health_port}")
        health = health_pb2_grpc.HealthStub(self.health_channel)
        wait_until("Baton readiness SERVING on the plaintext health listener", lambda: health.Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=1).status
            == health_pb2.HealthCheckResponse.SERVING)

    def channel(self, roots, identity=None):
        """A new TLS channel (its own connection) trusting `roots` (PEM bytes), presenting
        `identity` ((certificate, key) paths) if given."""
        cert, key = (read(identity[0]), read(identity[1])) if identity else (None, None)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=key, certificate_chain=cert)
        return grpc.secure_channel(
            f"127.0.0.1:{self.port}", credentials,
            options=[("grpc.ssl_target_name_override", "localhost"),
                     ("grpc.use_local_subchannel_pool", 1)])

    def stop(self):
        self.health_channel.close()
        self.proc.terminate()
        self.proc.wait(timeout=15)
        self.log.close()


def acquire(channel, name=None, timeout=5):
    return rpc.LockServiceStub(channel).Acquire(pb.LockServiceAcquireRequest(
        name=name or uuid.uuid4().hex, ttl=ms(5000)), timeout=timeout)


class MutualTls(unittest.TestCase):
    """Mutual TLS: only a client with a valid certificate from --tls-client-ca is served; any
    other completes its TLS handshake, then every call fails UNAUTHENTICATED saying why."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-tls-")
        cls.certs = Certs(cls.dir)
        cls.redis = Redis(cls.dir)
        cert, key = cls.certs.server
        cls.baton = BatonProcess(cls.redis.port, cls.dir, "--tls-cert", cert, "--tls-key", key,
                                 "--tls-client-ca", cls.certs.ca)
        cls.roots = read(cls.certs.ca)

    @classmethod
    def tearDownClass(cls):
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def refused(self, identity):
        channel = self.baton.channel(self.roots, identity)
        try:
            with self.assertRaises(grpc.RpcError) as caught:
                acquire(channel)
            return caught.exception
        finally:
            channel.close()

    def test_a_certificate_from_the_client_ca_gets_in(self):
        """A client certificate issued by the client CA completes the handshake and is served."""
        channel = self.baton.channel(self.roots, self.certs.client)
        try:
            self.assertTrue(acquire(channel).acquired)
        finally:
            channel.close()

    def test_no_certificate_is_refused_saying_one_is_required(self):
        """A client presenting no certificate fails UNAUTHENTICATED, saying one is required."""
        error = self.refused(None)
        self.assertEqual(error.code(), grpc.StatusCode.UNAUTHENTICATED, error)
        self.assertIn("requires a client certificate", error.details())

    def test_a_certificate_from_another_ca_is_refused(self):
        """A certificate issued by a CA other than the client CA fails UNAUTHENTICATED, saying
        so."""
        error = self.refused(self.certs.stranger)
        self.assertEqual(error.code(), grpc.StatusCode.UNAUTHENTICATED, error)
        self.assertIn("not issued by a CA this Baton trusts", error.details())

    def test_an_expired_certificate_is_refused(self):
        """An expired certificate from the client CA fails UNAUTHENTICATED, saying it expired."""
        error = self.refused(self.certs.expired)
        self.assertEqual(error.code(), grpc.StatusCode.UNAUTHENTICATED, error)
        self.assertIn("has expired", error.details())

    def test_plaintext_is_refused_and_health_stays_plaintext(self):
        """A plaintext client cannot call the TLS listener; the health listener answers one."""
        channel = grpc.insecure_channel(f"127.0.0.1:{self.baton.port}")
        try:
            with self.assertRaises(grpc.RpcError) as caught:
                acquire(channel, timeout=2)
            self.assertIn(caught.exception.code(),
                          (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))
        finally:
            channel.close()
        health = health_pb2_grpc.HealthStub(self.baton.health_channel)
        self.assertEqual(health.Check(health_pb2.HealthCheckRequest(service="liveness")).status,
                         health_pb2.HealthCheckResponse.SERVING)


class Rotation(unittest.TestCase):
    """Certificates rotated in place, as Kubernetes rotates a mounted Secret."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-rot-")
        cls.certs = Certs(cls.dir)
        cls.redis = Redis(cls.dir)
        cls.secret = secret_volume(os.path.join(cls.dir, "secret"))
        cert, key = cls.certs.server
        publish(cls.secret, {"tls.crt": read(cert), "tls.key": read(key),
                             "ca.crt": read(cls.certs.ca)})
        s = cls.secret
        cls.baton = BatonProcess(
            cls.redis.port, cls.dir, "--tls-cert", os.path.join(s, "tls.crt"),
            "--tls-key", os.path.join(s, "tls.key"), "--tls-client-ca", os.path.join(s, "ca.crt"),
            "--credentials-reload", "100ms")

    @classmethod
    def tearDownClass(cls):
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_rotation_keeps_an_open_hold_stream_and_serves_new_connections(self):
        """A Hold stream opened before the Secret's `..data` is swapped to a certificate from
        another CA goes on renewing; new connections get the new certificate."""
        both = read(self.certs.ca) + read(self.certs.new_ca)
        channel = self.baton.channel(both, self.certs.client)
        locks = rpc.LockServiceStub(channel)
        name = uuid.uuid4().hex
        stream = locks.Hold(pb.LockServiceHoldRequest(name=name, ttl=ms(600)), timeout=60)
        self.assertEqual(next(stream).WhichOneof("event"), "acquired")
        self.assertEqual(next(stream).WhichOneof("event"), "renewed")

        cert, key = self.certs.new_server
        publish(self.secret, {"tls.crt": read(cert), "tls.key": read(key),
                              "ca.crt": read(self.certs.ca)})

        def new_certificate_served():
            fresh = self.baton.channel(read(self.certs.new_ca), self.certs.client)
            try:
                return acquire(fresh, timeout=2).acquired
            finally:
                fresh.close()
        wait_until("a new connection to get the new certificate", new_certificate_served)
        old_only = self.baton.channel(read(self.certs.ca), self.certs.client)
        try:
            with self.assertRaises(grpc.RpcError):
                acquire(old_only, timeout=2)
        finally:
            old_only.close()
        # The stream opened before the swap is still renewing, over its first connection.
        for _ in range(3):
            self.assertEqual(next(stream).WhichOneof("event"), "renewed")
        stream.cancel()
        channel.close()


class ApiToken(unittest.TestCase):
    """The API token, from a stock client's call metadata."""

    TOKEN = "py-token-" + uuid.uuid4().hex

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-token-")
        cls.redis = Redis(cls.dir)
        token = os.path.join(cls.dir, "token")
        with open(token, "w") as f:
            f.write(cls.TOKEN + "\n")
        cls.port = free_port()
        cls.log = open(os.path.join(cls.dir, "baton.log"), "wb")
        cls.proc = subprocess.Popen(
            [os.environ["BATON_BIN"], "serve", "--listen", f"127.0.0.1:{cls.port}",
             "--redis-url", f"redis://127.0.0.1:{cls.redis.port}", "--api-token-file", token],
            stdout=cls.log, stderr=subprocess.STDOUT)
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.port}")
        health = health_pb2_grpc.HealthStub(cls.channel)
        wait_until("Baton readiness SERVING (health needs no token)", lambda: health.Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=1).status
            == health_pb2.HealthCheckResponse.SERVING)
        cls.locks = rpc.LockServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.proc.terminate()
        cls.proc.wait(timeout=15)
        cls.log.close()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def call(self, metadata):
        return self.locks.Acquire(pb.LockServiceAcquireRequest(
            name=uuid.uuid4().hex, ttl=ms(1000)), metadata=metadata, timeout=5)

    def test_missing_wrong_and_right_tokens(self):
        """No token and a wrong one fail UNAUTHENTICATED saying what to send; the right one is
        served."""
        for metadata, says in [((), "requires an API token"),
                               ((("authorization", "Bearer wrong"),), "not valid"),
                               ((("authorization", self.TOKEN),), "Bearer <token>")]:
            with self.assertRaises(grpc.RpcError) as caught:
                self.call(metadata)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn(says, caught.exception.details())
        self.assertTrue(self.call((("authorization", f"Bearer {self.TOKEN}"),)).acquired)


if __name__ == "__main__":
    unittest.main()
