"""Baton's image, built without Docker: buildah (as root, vfs storage, chroot isolation) makes a
scratch image holding a binary the suite built (stripped of debug information as the Dockerfile
strips it) and exactly the shared libraries it needs, then checks its user, its files and, for
the release binary, its size, and runs the binary inside the image's root filesystem
(`buildah mount` + `chroot` as that user) until it answers health.

The binary: BATON_RELEASE_BIN, the release binary the Dockerfile ships (scripts/python-tests.sh
builds it and passes it, as root); or BATON_IMAGE_BIN, another build of it (scripts/test.sh
passes the debug binary its tests ran, which links the same libraries: a release build would take
about a third of CI's CPU), and then the size budget, which is the release binary's, is skipped.

Needs root and Debian's buildah (scripts/install-deps.sh --with-buildah). Skipped with the
reason printed when not root outside CI; under CI (CI set) it always runs.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from harness import Redis, free_port, wait_until  # noqa: E402

# The image's budget, uncompressed.
MAX_IMAGE_BYTES = 25 * 1000 * 1000
# The image's user: distroless's "nonroot", as in the Dockerfile and the chart.
USER = "65532:65532"

_ROOT = os.geteuid() == 0
_IN_CI = bool(os.environ.get("CI"))


def shared_libraries(binary):
    """The files the dynamic loader maps for `binary` (the loader itself included), as
    (path inside the image, file on this machine)."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            path = parts[parts.index("=>") + 1]
        elif parts and parts[0].startswith("/"):
            path = parts[0]
        else:
            continue  # linux-vdso: provided by the kernel
        if path.startswith("/"):
            libs.append((path, os.path.realpath(path)))
    return libs


@unittest.skipUnless(_ROOT or _IN_CI, "the image test needs root (buildah with chroot isolation); "
                     "run the suite as root, as CI does")
class ImageFromTheBuiltBinary(unittest.TestCase):
    """The image the suite builds from the binary, checked and run."""

    @classmethod
    def setUpClass(cls):
        cls.release = "BATON_RELEASE_BIN" in os.environ
        source = os.environ.get("BATON_RELEASE_BIN") or os.environ.get("BATON_IMAGE_BIN")
        if not source:
            raise unittest.SkipTest("no binary given (BATON_RELEASE_BIN or BATON_IMAGE_BIN): "
                                    "scripts/test.sh and scripts/python-tests.sh give one")
        if not _ROOT:
            raise AssertionError("CI runs the image test as root; this run is not root")
        if shutil.which("buildah") is None:
            raise AssertionError("buildah is missing: scripts/install-deps.sh --with-buildah")
        cls.dir = tempfile.mkdtemp(prefix="baton-image-")
        # Storage of its own, so the test neither sees nor leaves other images.
        cls.buildah = ["buildah", "--root", os.path.join(cls.dir, "root"),
                       "--runroot", os.path.join(cls.dir, "runroot"), "--storage-driver", "vfs"]
        cls.binary = os.path.join(cls.dir, "baton")
        subprocess.run(["strip", "--strip-debug", "-o", cls.binary, source], check=True)
        cls.libs = shared_libraries(cls.binary)
        cls.container = cls.run_buildah("from", "--isolation", "chroot", "scratch").strip()
        cls.run_buildah("copy", "--chmod", "0755", cls.container, cls.binary, "/baton")
        for inside, real in cls.libs:
            cls.run_buildah("copy", "--chmod", "0755", cls.container, real, inside)
        cls.run_buildah("config", "--user", USER, "--entrypoint", '["/baton"]',
                        "--cmd", "serve --listen 0.0.0.0:50051", cls.container)
        cls.run_buildah("commit", "--quiet", cls.container, "baton:test")
        # A container of the committed image: its root filesystem is what the image holds.
        cls.from_image = cls.run_buildah("from", "--isolation", "chroot", "baton:test").strip()
        cls.rootfs = cls.run_buildah("mount", cls.from_image).strip()

    @classmethod
    def tearDownClass(cls):
        if not hasattr(cls, "dir"):
            return
        for name in ["from_image", "container"]:
            if hasattr(cls, name):
                container = getattr(cls, name)
                subprocess.run(cls.buildah + ["umount", container], capture_output=True)
                subprocess.run(cls.buildah + ["rm", container], capture_output=True)
        subprocess.run(cls.buildah + ["rmi", "--all", "--force"], capture_output=True)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def run_buildah(cls, *args):
        done = subprocess.run(cls.buildah + list(args), capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {done.stderr}")
        return done.stdout

    def files(self):
        """Every regular file of the image's root filesystem and its size."""
        found = {}
        for folder, _, names in os.walk(self.rootfs):
            for n in names:
                path = os.path.join(folder, n)
                found["/" + os.path.relpath(path, self.rootfs)] = os.lstat(path).st_size
        return found

    def test_image_holds_the_binary_and_its_libraries_only(self):
        """The image holds /baton and the libraries the loader maps, nothing else (no shell)."""
        files = self.files()
        self.assertEqual(set(files), {"/baton", *(inside for inside, _ in self.libs)})
        total = sum(files.values())
        print(f"\nimage: {total / 1e6:.1f} MB uncompressed ({files['/baton'] / 1e6:.1f} MB "
              f"{'release' if self.release else 'non-release'} binary, {len(self.libs)} shared "
              f"libraries)", file=sys.stderr)

    def test_release_image_is_within_budget(self):
        """With the release binary, the image takes under 25 MB uncompressed."""
        if not self.release:
            self.skipTest("the budget is the release binary's: BATON_IMAGE_BIN is another build")
        self.assertLess(sum(self.files().values()), MAX_IMAGE_BYTES)

    def test_image_runs_as_a_non_root_user(self):
        """The image's configuration names user 65532:65532 and /baton as its entrypoint."""
        config = json.loads(self.run_buildah("inspect", "--type", "image", "baton:test"))
        self.assertEqual(config["OCIv1"]["config"]["User"], USER)
        self.assertEqual(config["OCIv1"]["config"]["Entrypoint"], ["/baton"])

    def test_binary_inside_the_image_serves_and_answers_health(self):
        """/baton, run inside the image's root filesystem as the image's user, serves: liveness
        and readiness (Redis answers) SERVING on its health port; SIGTERM stops it with 0."""
        workdir = tempfile.mkdtemp(prefix="baton-image-run-")
        self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
        redis = Redis(workdir)
        self.addCleanup(redis.kill)
        port, health = free_port(), free_port()
        log_path = os.path.join(workdir, "baton.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [shutil.which("chroot"), f"--userspec={USER}", self.rootfs, "/baton", "serve",
                 "--listen", f"127.0.0.1:{port}", "--health-listen", f"127.0.0.1:{health}",
                 "--redis-url", f"redis://127.0.0.1:{redis.port}"],
                stdout=log, stderr=subprocess.STDOUT, env={})
        try:
            with grpc.insecure_channel(f"127.0.0.1:{health}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for service in ["liveness", "readiness"]:
                    wait_until(f"{service} SERVING from the image", lambda: stub.Check(
                        health_pb2.HealthCheckRequest(service=service), timeout=1).status
                        == health_pb2.HealthCheckResponse.SERVING, timeout=15)
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=15), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with open(log_path) as f:
                self.log = f.read()
        self.assertIn("serving gRPC health alone over TCP", self.log)


if __name__ == "__main__":
    unittest.main()
