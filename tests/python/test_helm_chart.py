"""The Helm chart (helm/baton) proven, not just present.

Rendered with Helm's own engine (helm-python-sdk, no helm binary) for every values file under
helm/baton/ci/ and through the example parent chart (helm/examples/myapp), linted strictly,
validated strictly against the Kubernetes 1.29 and 1.33 schemas (kubernetes-validate), and
then run: the Baton container of the rendered pod is started from its own command, args and
environment (each volume laid out in a temporary folder as the kubelet lays it out), its
startup, readiness and liveness probes are run as the kubelet runs them, its metrics port is
scraped, an app connects from the address in its own container's environment and takes a lock,
and the `helm test` hook's command is run against it.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
import helm_python as helm  # noqa: E402
import jsonschema  # noqa: E402
import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from harness import Redis, free_port, ms, wait_until  # noqa: E402
from baton.v1 import lock_pb2, lock_pb2_grpc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "helm", "baton")
CI_VALUES = os.path.join(CHART, "ci")
KUBE_VERSIONS = ["1.29.0", "1.33.0"]

# The Prometheus Operator's kinds are not in Kubernetes' schemas: these check the fields the
# chart writes, strictly (no field the operator would not know).
_MONITOR_ENDPOINT = {
    "type": "object", "additionalProperties": False, "required": ["port"],
    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                   "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}},
}
_MONITOR_SCHEMAS = {
    kind: {
        "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object", "additionalProperties": False,
                "required": ["selector", endpoints],
                "properties": {
                    "selector": {"type": "object", "additionalProperties": False,
                                 "properties": {"matchLabels": {
                                     "type": "object", "minProperties": 1,
                                     "additionalProperties": {"type": "string"}}}},
                    endpoints: {"type": "array", "minItems": 1, "items": _MONITOR_ENDPOINT},
                },
            },
        },
    }
    for kind, endpoints in [("PodMonitor", "podMetricsEndpoints"),
                            ("ServiceMonitor", "endpoints")]
}


def values_file(name):
    with open(os.path.join(CI_VALUES, name)) as f:
        return yaml.safe_load(f)


def merge(base, override):
    """`override` laid over `base`, maps merged key by key (as Helm merges values)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def documents(rendered):
    """The Kubernetes objects of a render (NOTES.txt and empty documents left out)."""
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


def pod_templates(objects):
    """(name, pod metadata, pod spec) of every Deployment."""
    for o in objects:
        if o["kind"] == "Deployment":
            template = o["spec"]["template"]
            yield o["metadata"]["name"], template["metadata"], template["spec"]


def batons(spec):
    """Baton's container in a pod spec and whether it is a native sidecar (an init container);
    fails unless there is exactly one."""
    native = [c for c in spec.get("initContainers", []) if c["name"] == "baton"]
    ordinary = [c for c in spec["containers"] if c["name"] == "baton"]
    assert len(native) + len(ordinary) == 1, spec
    return (native or ordinary)[0], bool(native)


def is_test_hook(obj):
    return obj["kind"] == "Pod" and obj["metadata"].get("annotations", {}).get(
        "helm.sh/hook") == "test"


def kubelet_write(folder, files, stamp):
    """Writes `files` (name -> text) into a Secret or ConfigMap volume `folder` the way the
    kubelet does, first and on every update: a new timestamped folder with the files, the
    `..data` symlink swapped to it atomically (a rename over the old one), one symlink per key
    into `..data`, the old timestamped folder removed."""
    old = os.path.join(folder, "..data")
    old_target = os.readlink(old) if os.path.islink(old) else None
    stamped = f"..2026_01_01_00_00_{stamp:02d}.{uuid.uuid4().int % 10**9:09d}"
    os.makedirs(os.path.join(folder, stamped))
    for name, text in files.items():
        with open(os.path.join(folder, stamped, name), "w") as f:
            f.write(text)
    os.symlink(stamped, os.path.join(folder, "..data_tmp"))
    os.replace(os.path.join(folder, "..data_tmp"), old)
    for name in os.listdir(folder):
        if not name.startswith("..") and name not in files:
            os.remove(os.path.join(folder, name))
    for name in files:
        link = os.path.join(folder, name)
        if not os.path.islink(link):
            os.symlink(os.path.join("..data", name), link)
    if old_target:
        shutil.rmtree(os.path.join(folder, old_target))


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def should_rate_limit(channel, domain, key, value):
    """Envoy's ShouldRateLimit for one descriptor of one entry, its messages written and read in
    the protobuf wire format (envoy.service.ratelimit.v3): the response's overall code, 1 (OK)
    or 2 (OVER_LIMIT)."""
    entry = _field(1, key.encode()) + _field(2, value.encode())
    request = _field(1, domain.encode()) + _field(2, _field(1, entry))
    call = channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
    response = call(request, timeout=10)
    i = 0
    while i < len(response):
        tag, i = _read_varint(response, i)
        if tag & 7 == 0:
            value, i = _read_varint(response, i)
            if tag >> 3 == 1:
                return value
        elif tag & 7 == 2:
            size, i = _read_varint(response, i)
            i += size
        else:
            raise AssertionError(f"unexpected wire type in {response!r}")
    return 0


def _read_varint(data, i):
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def pod_specs(objects):
    """(name, pod spec) of every Deployment and Pod."""
    for o in objects:
        if o["kind"] == "Deployment":
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o["metadata"]["name"], o["spec"]


class Rendered:
    """A chart copied to a temporary folder (helm/ whole, so that the example's relative
    `file://` dependency resolves), its dependencies updated there."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="baton-chart-")
        shutil.copytree(os.path.join(ROOT, "helm"), os.path.join(self.dir, "helm"))
        self.chart = os.path.join(self.dir, "helm", "baton")
        self.example = os.path.join(self.dir, "helm", "examples", "myapp")
        helm.dependency_update(self.example)

    def render(self, chart, values, name="baton"):
        with helm.Chart.load(chart) as c:
            return c.render(values=values, name=name, namespace="default", is_install=True)

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class ChartRenders(unittest.TestCase):
    """Lint, schemas, Kubernetes validation and the chart's own promises, without running."""

    @classmethod
    def setUpClass(cls):
        cls.charts = Rendered()
        cls.cases = {f: values_file(f) for f in sorted(os.listdir(CI_VALUES))}
        cls.renders = {f: cls.charts.render(cls.charts.chart, v) for f, v in cls.cases.items()}
        cls.renders["examples/myapp"] = cls.charts.render(cls.charts.example, {})
        cls.renders["examples/myapp, ordinary container"] = cls.charts.render(
            cls.charts.example, {"baton": {"nativeSidecar": False, "shutdownDelay": "5s"}})

    @classmethod
    def tearDownClass(cls):
        cls.charts.close()

    def test_values_files_cover_every_case(self):
        """The CI values files cover the demo, Cluster, Sentinel, TCP, metrics, ordinary
        container (no native sidecar) and security (Redis TLS, API token) cases."""
        self.assertEqual(
            sorted(self.cases),
            ["cluster-values.yaml", "demo-values.yaml", "metrics-values.yaml",
             "ordinary-container-values.yaml", "security-values.yaml", "sentinel-values.yaml",
             "tcp-values.yaml"])

    def test_lint_is_clean_in_strict_mode(self):
        """`helm lint --strict` finds nothing, for the defaults, every values file, the example."""
        for kube in ["v1.29.0", "v1.33.0"]:
            for name, values in [("defaults", None), *self.cases.items()]:
                with self.subTest(values=name, kube=kube):
                    report = helm.lint(self.charts.chart, values, strict=True, kube_version=kube)
                    self.assertEqual(report["errors"], [], report)
                    self.assertEqual([m for m in report["messages"] if m["severity"] >= 2], [],
                                     report)
            with self.subTest(values="examples/myapp", kube=kube):
                report = helm.lint(self.charts.example, strict=True, with_subcharts=True,
                                   kube_version=kube)
                self.assertEqual(report["errors"], [], report)
                self.assertEqual([m for m in report["messages"] if m["severity"] >= 2], [], report)

    def test_every_manifest_validates_strictly_against_kubernetes(self):
        """Every rendered object validates against the 1.29 and 1.33 schemas in strict mode (no
        unknown field); the Prometheus Operator's kinds against the fields they define."""
        kinds = set()
        for name, rendered in self.renders.items():
            for obj in documents(rendered):
                kinds.add(obj["kind"])
                for version in KUBE_VERSIONS:
                    with self.subTest(values=name, object=f'{obj["kind"]}/{obj["metadata"]["name"]}',
                                      kube=version):
                        if obj["kind"] in _MONITOR_SCHEMAS:
                            jsonschema.validate(obj, _MONITOR_SCHEMAS[obj["kind"]])
                        else:
                            kubernetes_validate.validate(obj, version, strict=True)
        self.assertEqual(kinds, {"ConfigMap", "Deployment", "Pod", "PodMonitor", "Service",
                                 "ServiceMonitor"})

    def test_baton_runs_as_a_restricted_sidecar(self):
        """In every render Baton is a native sidecar (an init container with restartPolicy
        Always), or with `nativeSidecar: false` the first of the pod's containers with a shutdown
        delay; either way with gRPC startup, readiness and liveness probes on its health port and
        the restrictive security context; every pod's grace period covers the shutdown delay and
        the drain."""
        ordinary_renders = {"ordinary-container-values.yaml", "examples/myapp, ordinary container"}
        seen = set()
        for name, rendered in self.renders.items():
            for pod, _, spec in pod_templates(documents(rendered)):
                if pod.endswith("-redis"):
                    continue
                with self.subTest(values=name, pod=pod):
                    baton, native = batons(spec)
                    seen.add(name)
                    flags = dict(a.split("=", 1) for a in baton["args"][1:] if "=" in a)
                    if name in ordinary_renders:
                        self.assertFalse(native)
                        self.assertEqual(spec["containers"][0]["name"], "baton")
                        self.assertNotIn("restartPolicy", baton)
                        self.assertNotIn("initContainers", spec)
                        self.assertNotEqual(flags["--shutdown-delay"], "0s")
                    else:
                        self.assertTrue(native)
                        self.assertEqual(baton["restartPolicy"], "Always")
                    health_port = int(flags["--health-listen"].rsplit(":", 1)[1])
                    probes = {k: baton[f"{k}Probe"]["grpc"] for k in
                              ["startup", "readiness", "liveness"]}
                    self.assertEqual({p["port"] for p in probes.values()}, {health_port})
                    self.assertEqual(probes["readiness"]["service"], "readiness")
                    self.assertEqual(probes["liveness"]["service"], "liveness")
                    sc = baton["securityContext"]
                    self.assertTrue(sc["runAsNonRoot"])
                    self.assertNotEqual(sc["runAsUser"], 0)
                    self.assertTrue(sc["readOnlyRootFilesystem"])
                    self.assertFalse(sc["allowPrivilegeEscalation"])
                    self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
                    self.assertEqual(sc["seccompProfile"]["type"], "RuntimeDefault")
                    self.assertIn("requests", baton["resources"])
                    seconds = lambda d: float(d[:-2]) / 1000 if d.endswith("ms") else (
                        float(d[:-1]) * 60 if d.endswith("m") else float(d[:-1]))
                    self.assertGreater(spec["terminationGracePeriodSeconds"],
                                       seconds(flags["--shutdown-delay"])
                                       + seconds(flags["--drain-timeout"]))
                    self.assertNotRegex(" ".join(baton["args"]), r"redis://[^ ,]*:[^ ,]*@",
                                        "a password in the arguments")
                    self.assertNotIn("valueFrom", str(baton.get("env", [])))
        self.assertEqual(seen, set(self.renders), "a render without Baton")

    def test_password_comes_from_the_secret_as_a_file(self):
        """With an existing Secret, the password reaches Baton as a mounted file named by
        --redis-password-file: never in arguments, the environment or a ConfigMap."""
        objects = documents(self.renders["tcp-values.yaml"])
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        (baton,) = spec["initContainers"]
        self.assertIn("--redis-password-file=/var/run/secrets/baton/redis/password", baton["args"])
        (volume,) = [v for v in spec["volumes"] if "secret" in v]
        self.assertEqual(volume["secret"]["secretName"], "redis-auth")
        self.assertEqual(volume["secret"]["items"], [{"key": "redis-password", "path": "password"}])
        mount = [m for m in baton["volumeMounts"] if m["name"] == volume["name"]]
        self.assertEqual(mount, [{"name": volume["name"], "readOnly": True,
                                  "mountPath": "/var/run/secrets/baton/redis"}])
        self.assertEqual([o for o in objects if o["kind"] == "Secret"], [])

    def test_metrics_are_on_by_default(self):
        """Without a word about metrics (the demo values, the example chart), Baton serves them
        on port 9090, named `metrics`, with the scrape annotations; no monitor is created."""
        for name in ["demo-values.yaml", "examples/myapp"]:
            with self.subTest(values=name):
                objects = documents(self.renders[name])
                (_, metadata, spec), = [p for p in pod_templates(objects)
                                        if p[0].endswith(("-demo", "-myapp"))]
                baton, _ = batons(spec)
                self.assertIn("--metrics-listen=0.0.0.0:9090", baton["args"])
                self.assertIn({"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                              baton["ports"])
                self.assertEqual(metadata["annotations"], {
                    "prometheus.io/scrape": "true", "prometheus.io/port": "9090",
                    "prometheus.io/path": "/metrics"})
                self.assertEqual([o for o in objects if o["kind"].endswith("Monitor")], [])
        objects = documents(self.charts.render(self.charts.chart, {
            "demo": {"enabled": True}, "metrics": {"enabled": False}}))
        (_, metadata, spec), = [p for p in pod_templates(objects) if p[0].endswith("-demo")]
        baton, _ = batons(spec)
        self.assertNotIn("metrics", str(baton["args"]) + str(baton["ports"]))
        self.assertEqual(metadata["annotations"], {})

    def test_metrics_are_exposed_when_asked(self):
        """With metrics on: the flag, the port, the scrape annotations, a PodMonitor and a
        ServiceMonitor whose Service selects the pods carrying Baton."""
        objects = documents(self.renders["metrics-values.yaml"])
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"
                         and o["metadata"]["name"].endswith("-demo")]
        (baton,) = spec["initContainers"]
        self.assertIn("--metrics-listen=0.0.0.0:9090", baton["args"])
        self.assertIn({"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                      baton["ports"])
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(annotations["prometheus.io/port"], "9090")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        (service,) = [o for o in objects if o["kind"] == "Service"
                      and o["metadata"]["name"].endswith("-metrics")]
        self.assertTrue(service["spec"]["selector"].items() <= pod_labels.items())
        (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
        self.assertTrue(monitor["spec"]["selector"]["matchLabels"].items()
                        <= service["metadata"]["labels"].items())
        (podmonitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
        self.assertEqual(podmonitor["metadata"]["labels"]["release"], "prometheus")
        self.assertTrue(podmonitor["spec"]["selector"]["matchLabels"].items()
                        <= pod_labels.items())

    def test_helm_test_hook_reaches_baton(self):
        """The `helm test` hook asks for `readiness` through a Service that selects the pods
        carrying Baton and targets its health port: the demo's Service, or with Baton embedded in
        another chart the `RELEASE-baton-health` Service this chart renders for it."""
        for name in ["demo-values.yaml", "examples/myapp", "examples/myapp, ordinary container"]:
            with self.subTest(values=name):
                objects = documents(self.renders[name])
                (hook,) = [o for o in objects if is_test_hook(o)]
                (container,) = hook["spec"]["containers"]
                self.assertEqual(container["command"], ["/baton"])
                self.assertIn("--service=readiness", container["args"])
                (addr,) = [a.split("=", 1)[1] for a in container["args"]
                           if a.startswith("--addr=")]
                host, port = addr.rsplit(":", 1)
                expected = "baton-demo" if name == "demo-values.yaml" else "baton-health"
                self.assertEqual(host, expected)
                (service,) = [o for o in objects if o["kind"] == "Service"
                              and o["metadata"]["name"] == host]
                (service_port,) = service["spec"]["ports"]
                self.assertEqual(service_port["port"], int(port))
                (_, metadata, spec), = [p for p in pod_templates(objects)
                                        if p[0].endswith(("-demo", "-myapp"))]
                self.assertTrue(service["spec"]["selector"].items() <= metadata["labels"].items(),
                                (service["spec"]["selector"], metadata["labels"]))
                baton, _ = batons(spec)
                self.assertIn(service_port["targetPort"], [p["name"] for p in baton["ports"]])
        disabled = documents(self.charts.render(self.charts.chart, {"tests": {"enabled": False}}))
        self.assertEqual(disabled, [])

    def test_modes_reach_the_flags(self):
        """Cluster and Sentinel values become Baton's flags (the limits too); the evaluation Redis
        is absent."""
        cluster = documents(self.renders["cluster-values.yaml"])
        sentinel = documents(self.renders["sentinel-values.yaml"])
        for objects, expected in [
            (cluster, ["--redis-mode=cluster", "--min-replicas-ack=1",
                       "--min-replicas-ack-timeout=100ms", "--max-lease-streams=16384",
                       "--max-waiters=2048"]),
            (sentinel, ["--redis-mode=sentinel", "--redis-sentinel-master=mymaster",
                        "--shutdown-delay=5s", "--drain-timeout=15s"]),
        ]:
            (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
            for flag in expected:
                self.assertIn(flag, spec["initContainers"][0]["args"])
            self.assertFalse([o for o in objects if o["metadata"]["name"].endswith("-redis")])

    def test_labels_and_notes(self):
        """Every object carries the app.kubernetes.io labels and helm.sh/chart; NOTES.txt gives
        the app's address."""
        for name, rendered in self.renders.items():
            if name == "examples/myapp":
                continue
            for obj in documents(rendered):
                with self.subTest(values=name, object=obj["metadata"]["name"]):
                    labels = obj["metadata"]["labels"]
                    for key in ["app.kubernetes.io/name", "app.kubernetes.io/instance",
                                "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                                "helm.sh/chart"]:
                        self.assertIn(key, labels)
        notes = self.renders["demo-values.yaml"]["baton/templates/NOTES.txt"]
        self.assertIn("BATON_ADDR=unix:///var/run/baton/baton.sock", notes)
        notes = self.renders["tcp-values.yaml"]["baton/templates/NOTES.txt"]
        self.assertIn("BATON_ADDR=127.0.0.1:50051", notes)
        self.assertNotIn("BATON_API_TOKEN_FILE", notes)
        notes = self.renders["security-values.yaml"]["baton/templates/NOTES.txt"]
        self.assertIn("BATON_API_TOKEN_FILE=/var/run/secrets/baton/api-token/token", notes)

    def test_bad_values_are_rejected(self):
        """Typos, wrong types, a password in the URL, a TLS URL, a Sentinel without its master, a
        key prefix with braces and a grace period shorter than the drain are refused before
        anything is rendered, each with the value's path in the message."""
        bad = [
            ({"redis": {"urll": "redis://x:6379"}}, "urll"),
            ({"demo": {"enabled": "yes"}}, "/demo/enabled"),
            ({"transport": "udp"}, "/transport"),
            # A password in the URL: refused when rendering, naming the Secret's value and
            # without repeating the URL (tests/python/test_helm_chart_hostile.py).
            ({"redis": {"url": "redis://:secret@redis:6379"}}, "redis.password.existingSecret"),
            ({"redis": {"url": "rediss://:secret@redis:6380"}}, "redis.password.existingSecret"),
            ({"redis": {"username": "a b"}}, "/redis/username"),
            ({"redis": {"tls": {"insecure": "yes"}}}, "/redis/tls/insecure"),
            ({"redis": {"tls": {"existingSecret": "Not_A_Name"}}}, "/redis/tls/existingSecret"),
            ({"redis": {"tls": {"cert": "x"}}}, "cert"),
            ({"tls": {"clientCA": "yes"}}, "/tls/clientCA"),
            ({"apiToken": {"existingSecret": "a/b"}}, "/apiToken/existingSecret"),
            ({"apiToken": {"key": ""}}, "/apiToken/key"),
            ({"credentialsReload": "10"}, "/credentialsReload"),
            ({"redis": {"mode": "sentinel"}}, "/redis/sentinelMaster"),
            ({"redis": {"url": "redis://a:1,redis://b:1"}}, "/redis/url"),
            ({"redis": {"keyPrefix": "a{b}"}}, "/redis/keyPrefix"),
            ({"drainTimeout": "10"}, "/drainTimeout"),
            ({"health": {"port": 70000}}, "/health/port"),
            ({"securityContext": {"runAsNonRoot": False}}, "/securityContext/runAsNonRoot"),
            ({"rateLimit": {"rules": [{"descriptors": []}]}}, "domain"),
        ]
        for values, path in bad:
            with self.subTest(values=values):
                with self.assertRaises(helm.HelmError) as caught:
                    self.charts.render(self.charts.chart, values)
                self.assertIn(path, str(caught.exception))
        with self.assertRaises(helm.HelmError) as caught:
            self.charts.render(self.charts.chart, {"shutdownDelay": "25s", "drainTimeout": "10s",
                                                   "demo": {"enabled": True}})
        self.assertIn("terminationGracePeriodSeconds (30) must be longer", str(caught.exception))

    def test_security_values_that_cannot_work_are_refused(self):
        """TLS with the socket transport, mutual TLS or a Redis client certificate without their
        Secret, Redis TLS settings with a plaintext URL, and the demo (a plaintext client) with
        TLS each fail the render with a message that says why."""
        refused = [
            ({"tls": {"existingSecret": "baton-tls"}, "demo": {"enabled": True}},
             "tls.existingSecret needs transport: tcp"),
            ({"transport": "tcp", "tls": {"clientCA": True}, "demo": {"enabled": True}},
             "tls.clientCA (mutual TLS) needs tls.existingSecret"),
            ({"redis": {"url": "rediss://r:6380", "tls": {"clientCert": True}},
              "demo": {"enabled": True, "redis": {"enabled": False}}},
             "redis.tls.clientCert needs redis.tls.existingSecret"),
            ({"redis": {"tls": {"existingSecret": "redis-tls"}},
              "demo": {"enabled": True, "redis": {"enabled": False}}},
             "redis.tls needs rediss:// Redis URLs"),
            ({"redis": {"url": "rediss://r:6380", "tls": {"insecure": True}},
              "demo": {"enabled": True}},
             "redis.tls needs rediss:// Redis URLs"),
            ({"transport": "tcp", "tls": {"existingSecret": "baton-tls"},
              "demo": {"enabled": True}},
             "the demo app talks to Baton without TLS"),
        ]
        for values, message in refused:
            with self.subTest(values=values):
                with self.assertRaises(helm.HelmError) as caught:
                    self.charts.render(self.charts.chart, values)
                self.assertIn(message, str(caught.exception))
        with self.assertRaises(helm.HelmError) as caught:
            self.charts.render(self.charts.example, {"baton": {"tls": {
                "existingSecret": "baton-tls"}}})
        self.assertIn("tls.existingSecret needs transport: tcp", str(caught.exception))

    def test_security_values_reach_flags_mounts_and_the_app(self):
        """The security values: the Redis ACL user, CA bundle and client certificate, the API
        token and the reload interval become Baton's flags, naming files of Secrets mounted
        read-only with mode 0440; the API token is mounted in the app container too, named by
        BATON_API_TOKEN_FILE. Nothing of it appears in the defaults."""
        objects = documents(self.renders["security-values.yaml"])
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        (baton,) = spec["initContainers"]
        for flag in ["--redis-url=rediss://redis.example.svc:6380", "--redis-username=baton",
                     "--redis-tls-ca=/var/run/secrets/baton/redis-tls/ca.crt",
                     "--redis-tls-cert=/var/run/secrets/baton/redis-tls/tls.crt",
                     "--redis-tls-key=/var/run/secrets/baton/redis-tls/tls.key",
                     "--api-token-file=/var/run/secrets/baton/api-token/token",
                     "--credentials-reload=5s"]:
            self.assertIn(flag, baton["args"])
        self.assertNotIn("--redis-tls-insecure", baton["args"])
        self.assertFalse([a for a in baton["args"] if a.startswith("--tls-")])
        volumes = {v["name"]: v for v in spec["volumes"]}
        self.assertEqual(volumes["baton-redis-tls"]["secret"], {
            "secretName": "redis-tls", "defaultMode": 0o440,
            "items": [{"key": "ca.crt", "path": "ca.crt"}, {"key": "tls.crt", "path": "tls.crt"},
                      {"key": "tls.key", "path": "tls.key"}]})
        self.assertEqual(volumes["baton-api-token"]["secret"], {
            "secretName": "baton-api-token", "defaultMode": 0o440,
            "items": [{"key": "api-token", "path": "token"}]})
        self.assertNotIn("baton-tls", volumes)
        mounts = {m["name"]: m for m in baton["volumeMounts"]}
        self.assertEqual(mounts["baton-redis-tls"], {
            "name": "baton-redis-tls", "mountPath": "/var/run/secrets/baton/redis-tls",
            "readOnly": True})
        self.assertEqual(mounts["baton-api-token"], {
            "name": "baton-api-token", "mountPath": "/var/run/secrets/baton/api-token",
            "readOnly": True})
        (app,) = spec["containers"]
        self.assertIn({"name": "BATON_API_TOKEN_FILE",
                       "value": "/var/run/secrets/baton/api-token/token"}, app["env"])
        self.assertIn(mounts["baton-api-token"], app["volumeMounts"])
        self.assertNotIn("baton-redis-tls", [m["name"] for m in app["volumeMounts"]])

        # Serving TLS and mutual TLS, in the example parent chart over TCP; insecure Redis TLS.
        objects = documents(self.charts.render(self.charts.example, {"baton": {
            "transport": "tcp", "tls": {"existingSecret": "baton-tls", "clientCA": True},
            "redis": {"url": "rediss://redis:6380", "tls": {"insecure": True}}}}))
        for version in KUBE_VERSIONS:
            for obj in objects:
                kubernetes_validate.validate(obj, version, strict=True)
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-myapp")]
        baton, _ = batons(spec)
        for flag in ["--tls-cert=/var/run/secrets/baton/tls/tls.crt",
                     "--tls-key=/var/run/secrets/baton/tls/tls.key",
                     "--tls-client-ca=/var/run/secrets/baton/tls/ca.crt",
                     "--redis-tls-insecure", "--credentials-reload=10s"]:
            self.assertIn(flag, baton["args"])
        self.assertFalse([a for a in baton["args"] if a.startswith("--redis-tls-ca")])
        volumes = {v["name"]: v for v in spec["volumes"]}
        self.assertEqual(volumes["baton-tls"]["secret"], {
            "secretName": "baton-tls", "defaultMode": 0o440,
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"},
                      {"key": "ca.crt", "path": "ca.crt"}]})
        self.assertIn({"name": "baton-tls", "mountPath": "/var/run/secrets/baton/tls",
                       "readOnly": True}, baton["volumeMounts"])
        self.assertNotIn("baton-redis-tls", volumes)
        self.assertNotIn("baton-api-token", volumes)

        # The defaults: no credential flags, volumes or app environment beyond BATON_ADDR.
        for name in ["demo-values.yaml", "tcp-values.yaml"]:
            (_, spec), = [p for p in pod_specs(documents(self.renders[name]))
                          if p[0].endswith("-demo")]
            baton, _ = batons(spec)
            args = " ".join(baton["args"])
            for flag in ["--tls-", "--redis-tls", "--redis-username", "--api-token-file"]:
                self.assertNotIn(flag, args)
            self.assertFalse({"baton-tls", "baton-redis-tls", "baton-api-token"}
                             & {v["name"] for v in spec["volumes"]})
            app = [c for c in spec["containers"] if c["name"] == "app"][0]
            self.assertEqual([e["name"] for e in app["env"]], ["BATON_ADDR", "HOSTNAME"])

    # (value's path, `baton serve` flag, least, greatest, whether 0s (off) is accepted too): the
    # ranges Baton accepts, as its errors state them ("... is outside 10ms to 10s").
    DURATION_RANGES = [
        ("redis.commandTimeout", "--redis-command-timeout", "10ms", "10s", False),
        ("redis.connectTimeout", "--redis-connect-timeout", "10ms", "10s", False),
        ("redis.minReplicasAckTimeout", "--min-replicas-ack-timeout", "1ms", "5s", False),
        ("limits.handshakeTimeout", "--handshake-timeout", "100ms", "10m", False),
        ("credentialsReload", "--credentials-reload", "10ms", "60m", True),
        ("rateLimit.timeout", "--ratelimit-timeout", "1ms", "10s", False),
        ("rateLimit.reloadInterval", "--ratelimit-config-reload", "10ms", "60m", True),
        ("drainTimeout", "--drain-timeout", "0s", "10m", False),
        ("shutdownDelay", "--shutdown-delay", "0s", "10m", False),
    ]

    @staticmethod
    def _at(path, value):
        """{"a": {"b": value}} for the path "a.b"."""
        out = value
        for key in reversed(path.split(".")):
            out = {key: out}
        return out

    def _refused(self, chart, values, message, name="baton"):
        with self.assertRaises(helm.HelmError) as caught:
            self.charts.render(chart, values, name=name)
        self.assertIn(message, str(caught.exception))

    def test_durations_outside_batons_ranges_are_refused(self):
        """Each duration the chart passes to `baton serve` renders at the ends of the range Baton
        accepts and is refused a millisecond outside it, with a message naming the value, the
        range and the flag; Baton itself (asked with each value) draws the same line. The demo's
        holdFor is refused past 3590s: its app waits that long plus its 10s ttl, and Baton bounds
        a wait to 1h."""
        def ms(d):
            return int(d[:-2]) if d.endswith("ms") else int(d[:-1]) * (60_000 if d.endswith(
                "m") else 1000)
        # Grace period long enough for every accepted drain and delay.
        base = {"terminationGracePeriodSeconds": 3600}
        for path, flag, low, high, off in self.DURATION_RANGES:
            inside = [low, high] + (["0s"] if off else [])
            outside = [f"{ms(high) + 1}ms"] + ([f"{ms(low) - 1}ms"] if ms(low) > 0 else [])
            if off and ms(low) > 1:
                outside.append("1ms")
            for value in inside + outside:
                with self.subTest(value=path, duration=value):
                    # Baton's own verdict: `--listen=` without a socket is always an invalid
                    # configuration, and Baton lists every other problem with it.
                    run = subprocess.run([os.environ["BATON_BIN"], "serve", "--listen=",
                                          f"{flag}={value}"], capture_output=True, text=True,
                                         timeout=30)
                    self.assertEqual(run.returncode, 2, run.stderr)
                    baton_refuses = f"  - {flag} " in run.stderr
                    self.assertEqual(baton_refuses, value in outside, run.stderr)
                    values = merge(base, self._at(path, value))
                    if value in outside:
                        self._refused(self.charts.chart, values,
                                      f"{path}: {value} is outside {low} to {high}")
                        self._refused(self.charts.chart, values, f"({flag})")
                    else:
                        objects = documents(self.charts.render(self.charts.chart, merge(
                            values, {"demo": {"enabled": True},
                                     "rateLimit": {"rules": [{"domain": "d"}]}})))
                        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
                        baton, _ = batons(spec)
                        self.assertIn(f"{flag}={value}", baton["args"])
        self.charts.render(self.charts.chart, {"demo": {"enabled": True, "holdFor": "3590s"}})
        self._refused(self.charts.chart, {"demo": {"enabled": True, "holdFor": "3591s"}},
                      "demo.holdFor: 3591s is outside 0s to 3590s")
        self._refused(self.charts.chart, {"demo": {"enabled": True, "holdFor": "61m"}},
                      "Baton bounds a wait to 1h")
        # A parent chart's pods are checked as well.
        self._refused(self.charts.example, {"baton": {"redis": {"commandTimeout": "15s"}}},
                      "redis.commandTimeout: 15s is outside 10ms to 10s")

    def test_other_values_baton_would_refuse_are_refused(self):
        """Two listeners on one port, Redis URLs Baton does not take (a port outside 1..65535,
        rediss:// mixed with redis://, a Cluster seed on a Unix socket), a rate limit domain given
        twice, extraArgs repeating a flag (the chart's or its own) and a blank log filter fail
        the render, each with a message naming the value; the URLs Baton takes still render."""
        refused = [
            ({"metrics": {"port": 50052}}, "health.port and metrics.port are both 50052"),
            ({"transport": "tcp", "tcp": {"port": 50052}},
             "health.port and tcp.port are both 50052"),
            ({"transport": "tcp", "tcp": {"port": 9090}},
             "metrics.port and tcp.port are both 9090"),
            ({"redis": {"url": "redis://redis:99999"}},
             'the port of "redis://redis:99999" is "99999", not a port from 1 to 65535'),
            ({"redis": {"url": "redis://redis:0"}}, "not a port from 1 to 65535"),
            ({"redis": {"url": "redis://[::1]:65536/0"}}, "not a port from 1 to 65535"),
            ({"redis": {"url": "rediss://user@redis:6x79"}}, "not a port from 1 to 65535"),
            ({"redis": {"mode": "cluster", "url": "redis://a:7000, rediss://b:7000"}},
             "redis.url: \"redis://a:7000, rediss://b:7000\" mixes rediss://"),
            ({"redis": {"mode": "sentinel", "sentinelMaster": "m",
                        "url": "rediss://a:26379,redis://b:26379"}}, "mixes rediss://"),
            ({"redis": {"mode": "cluster", "url": "unix:///var/run/redis.sock"}},
             'redis.url: "unix:///var/run/redis.sock" is a Unix socket, and every seed of a '
             "Redis Cluster"),
            ({"rateLimit": {"rules": [{"domain": "edge"}, {"domain": "api"},
                                      {"domain": "edge"}]}},
             'rateLimit.rules: the domain "edge" is configured twice'),
            ({"extraArgs": ["--log=debug"]}, "extraArgs: --log is already set by the chart"),
            ({"extraArgs": ["--redis-url=redis://x:1"]}, "extraArgs: --redis-url is already set"),
            ({"transport": "tcp", "extraArgs": ["--listen=0.0.0.0:1"]},
             "extraArgs: --listen is already set"),
            ({"extraArgs": ["--client-keepalive-interval=1s", "--client-keepalive-interval=2s"]},
             "extraArgs: --client-keepalive-interval is given twice"),
            ({"log": {"level": " \t"}}, "/log/level"),
        ]
        for values, message in refused:
            with self.subTest(values=values):
                self._refused(self.charts.chart, values, message)
        # Baton refuses each of them too (a render that went through would crash-loop).
        for args, error in [
            (["--redis-url=redis://redis:99999"], "is not a Redis URL"),
            (["--redis-mode=cluster", "--redis-url=redis://a:7000,rediss://b:7000"],
             "some URLs are rediss://"),
            (["--log= \t"], "is not a log filter"),
            (["--log=debug", "--log=info"], "cannot be used multiple times"),
        ]:
            with self.subTest(baton=args):
                run = subprocess.run([os.environ["BATON_BIN"], "serve", "--listen=", *args],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(run.returncode, 2)
                self.assertIn(error, run.stderr)
        for url in ["redis://[::1]:6379", "rediss://user@redis:6380/2?protocol=resp3",
                    "unix:///var/run/redis/redis.sock", "redis://redis"]:
            with self.subTest(url=url):
                self.charts.render(self.charts.chart, {"redis": {"url": url}})
        self.charts.render(self.charts.chart, {"redis": {
            "mode": "cluster", "url": "rediss://a:7000, rediss://b:65535"}})
        self.charts.render(self.charts.chart, {"metrics": {"enabled": False, "port": 50052}})
        self.charts.render(self.charts.chart, {"extraArgs": [
            "--client-keepalive-interval=2s", "--client-keepalive-timeout=30s"]})
        self._refused(self.charts.example, {"baton": {"metrics": {"port": 50052}}},
                      "health.port and metrics.port are both 50052")

    def test_socket_path_fits_and_has_a_folder_of_its_own(self):
        """The socket's path (socket.dir/socket.name) renders at 107 bytes, the most a Unix
        socket's path can hold (Baton's own client then connects), and is refused at 108; "."
        and ".." are refused as socket names; a socket.dir on, inside or above a folder the chart
        mounts a Secret or the rules in is refused, as is /."""
        def socket_values(path_length, name="baton.sock"):
            folder = "/var/run/" + "d" * (path_length - len("/var/run/") - len(name) - 1)
            return {"demo": {"enabled": True}, "socket": {"dir": folder, "name": name}}
        objects = documents(self.charts.render(self.charts.chart, socket_values(107)))
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        (app,) = [c for c in spec["containers"] if c["name"] == "app"]
        (addr,) = [e["value"] for e in app["env"] if e["name"] == "BATON_ADDR"]
        self.assertEqual(len(addr), len("unix://") + 107)
        self._refused(self.charts.chart, socket_values(108),
                      "is 108 bytes, and a Unix socket's path can have at most 107")
        self._refused(self.charts.chart, merge(socket_values(108), {"socket": {
            "dir": "/var/run/" + "d" * 40 + "/", "name": "s" * 58}}), "socket.dir and socket.name")
        self._refused(self.charts.example, {"baton": {"socket": {"dir": "/" + "d" * 100,
                                                                 "name": "s" * 10}}},
                      "at most 107")
        for name in [".", ".."]:
            with self.subTest(name=name):
                self._refused(self.charts.chart, {"socket": {"name": name}},
                              f'socket.name: "{name}" is a folder')
        for folder in ["/var/run/secrets/baton/redis", "/var/run/secrets/baton/redis-tls/",
                       "/var/run/secrets/baton/tls", "/var/run/secrets/baton/api-token",
                       "/etc/baton/ratelimit", "/etc/baton/ratelimit/sock", "/etc/baton",
                       "/var/run/secrets/baton"]:
            with self.subTest(folder=folder):
                self._refused(self.charts.chart, {"socket": {"dir": folder}},
                              f'socket.dir: "{folder}" overlaps')
        self._refused(self.charts.chart, {"socket": {"dir": "/"}}, "socket.dir: / cannot be")
        # Folders beside them are fine; with TCP the socket's values are not used.
        self.charts.render(self.charts.chart, {"socket": {"dir": "/var/run/secrets/baton-sock"}})
        self.charts.render(self.charts.chart, {"transport": "tcp", "socket": {"dir": "/"}})
        # Baton's client reaches a socket at 107 bytes; Baton refuses to serve one at 108, which
        # no client could reach.
        with tempfile.TemporaryDirectory(prefix="baton-sock-") as folder:
            path = os.path.join(folder, "s" * (107 - len(folder) - 1))
            self.assertEqual(len(path), 107)
            server = subprocess.Popen(
                [os.environ["BATON_BIN"], "serve", "--listen=", f"--socket={path}",
                 "--redis-url=redis://127.0.0.1:1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_until("the socket", lambda: os.path.exists(path), timeout=20)
                check = subprocess.run(
                    [os.environ["BATON_BIN"], "health", f"--addr=unix://{path}",
                     "--service=liveness", "--timeout=5s"],
                    capture_output=True, text=True, timeout=30)
                self.assertEqual(check.returncode, 0, check.stderr)
            finally:
                server.kill()
                server.wait()
            path = os.path.join(folder, "s" * (108 - len(folder) - 1))
            self.assertEqual(len(path), 108)
            refused = subprocess.run(
                [os.environ["BATON_BIN"], "serve", "--listen=", f"--socket={path}",
                 "--redis-url=redis://127.0.0.1:1"],
                capture_output=True, text=True, timeout=30)
            self.assertEqual(refused.returncode, 2, refused.stderr)
            self.assertIn("is 108 bytes long", refused.stderr)
            self.assertFalse(os.path.exists(path))

    def test_names_are_valid_and_distinct(self):
        """Whatever the release name (up to Helm's 53 characters) or the overrides, every name the
        chart renders is valid (a DNS-1035 label for Services, at most 63 characters) and no two
        objects of a kind share one; the demo's Redis URL names the Redis Service as rendered.
        Overrides Kubernetes would refuse, and release names that would give invalid Service
        names, fail the render; the image tag becomes a valid version label (digest left out)."""
        service_name = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
        label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
        everything = {"demo": {"enabled": True},
                      "metrics": {"podMonitor": {"enabled": True},
                                  "serviceMonitor": {"enabled": True}},
                      "rateLimit": {"rules": [{"domain": "d" * 245}]}}
        cases = [
            ("payments-coordination-service-production-eu-west-1234", everything),
            ("payments-coordination-service-production-eu-west-12", everything),
            ("p" * 53, merge(everything, {"demo": {"enabled": False}})),
            ("rel", merge(everything, {"fullnameOverride": "f" * 51})),
            ("rel", merge(everything, {"fullnameOverride": "x" * 50 + "y",
                                       "demo": {"enabled": False}})),
            ("rel", merge(everything, {"nameOverride": "n" * 63})),
            ("a" * 50 + "-b", everything),
        ]
        for release, values in cases:
            with self.subTest(release=release, values=str(values)[:80]):
                objects = documents(self.charts.render(self.charts.chart, values, name=release))
                names = [(o["kind"], o["metadata"]["name"]) for o in objects]
                self.assertEqual(len(names), len(set(names)), names)
                services = [n for k, n in names if k == "Service"]
                for kind, name in names:
                    self.assertLessEqual(len(name), 63, name)
                    self.assertRegex(name, r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
                for name in services:
                    self.assertRegex(name, service_name)
                self.assertEqual(len(set(services)), len(services), services)
                for o in objects:
                    for key, value in o["metadata"]["labels"].items():
                        self.assertLessEqual(len(value), 63, (key, value))
                        self.assertRegex(value, label_value)
                    if o["kind"] == "ConfigMap":
                        for key in o["data"]:
                            self.assertLessEqual(len(key), 253)
                for _, spec in pod_specs(objects):
                    for c in spec.get("initContainers", []) + spec["containers"]:
                        for a in c.get("args", []):
                            if a.startswith("--redis-url=redis://"):
                                host = a.split("//", 1)[1].rsplit(":", 1)[0]
                                self.assertIn(host, services)
                            if a.startswith("--addr="):
                                self.assertIn(a.split("=", 1)[1].rsplit(":", 1)[0], services)
        refused = [
            ("rel", {"fullnameOverride": "f" * 52}, "/fullnameOverride"),
            ("rel", {"fullnameOverride": "Baton"}, "/fullnameOverride"),
            ("rel", {"fullnameOverride": "1baton"}, "/fullnameOverride"),
            ("rel", {"nameOverride": "my_baton"}, "/nameOverride"),
            ("1st-release", {}, 'from the release name "1st-release"'),
            ("my.release", {"demo": {"enabled": True}}, "set fullnameOverride"),
            ("rel", {"rateLimit": {"rules": [{"domain": "d" * 246}]}},
             "/rateLimit/rules/0/domain"),
        ]
        for release, values, message in refused:
            with self.subTest(release=release, values=values):
                self._refused(self.charts.chart, values, message, name=release)
        # The same release renders with an override, or where it names no Service.
        self.charts.render(self.charts.chart, {"fullnameOverride": "first"}, name="1st-release")
        self.charts.render(self.charts.chart, {"tests": {"enabled": False}}, name="1st-release")
        for tag, label in [("0.1.0@sha256:" + "0" * 64, "0.1.0"),
                           ("v1.2.3+build.7", "v1.2.3-build.7"),
                           ("_" + "x" * 70, "x" * 62), ("1.0-" + "-" * 70, "1.0"),
                           ("@sha256:" + "a" * 64, "")]:
            with self.subTest(tag=tag):
                objects = documents(self.charts.render(self.charts.chart, {
                    "image": {"tag": tag}, "demo": {"enabled": True}}))
                for o in objects:
                    self.assertEqual(o["metadata"]["labels"]["app.kubernetes.io/version"], label)
                (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
                self.assertEqual(batons(spec)[0]["image"], f"baton:{tag}")

    def test_large_ids_render_as_integers(self):
        """User and group IDs of a million and more (an OpenShift-style range) and large numbers
        in the rate limit rules render as integers, never in float notation such as 1e+06, and
        validate strictly."""
        values = {"socket": {"group": 1000680000},
                  "demo": {"enabled": True, "appUser": 2147483647},
                  "securityContext": {"runAsUser": 1000000, "runAsGroup": 1000680000},
                  "rateLimit": {"rules": [{"domain": "edge", "descriptors": [{
                      "key": "remote_address",
                      "rate_limit": {"unit": "hour", "requests_per_unit": 10000000}}]}]}}
        rendered = self.charts.render(self.charts.chart, values)
        for path, text in rendered.items():
            self.assertNotRegex(text, r"\d(\.\d+)?e\+\d", path)
        objects = documents(rendered)
        for obj in objects:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        self.assertEqual(spec["securityContext"]["fsGroup"], 1000680000)
        baton, _ = batons(spec)
        self.assertEqual(baton["securityContext"]["runAsUser"], 1000000)
        self.assertEqual(baton["securityContext"]["runAsGroup"], 1000680000)
        self.assertIn("--socket-group=1000680000", baton["args"])
        (app,) = [c for c in spec["containers"] if c["name"] == "app"]
        self.assertEqual(app["securityContext"]["runAsUser"], 2147483647)
        self.assertEqual(app["securityContext"]["runAsGroup"], 2147483647)
        (hook,) = [o for o in objects if is_test_hook(o)]
        self.assertEqual(hook["spec"]["containers"][0]["securityContext"]["runAsUser"], 1000000)
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        (rules,) = [yaml.safe_load(t) for t in cm["data"].values()]
        self.assertEqual(rules["descriptors"][0]["rate_limit"]["requests_per_unit"], 10000000)
        self.assertIn("group 1000680000", rendered["baton/templates/NOTES.txt"])
        # The example parent chart: its own app user, and Baton's values through it.
        rendered = self.charts.render(self.charts.example, {
            "runAsUser": 1000680000, "baton": {"socket": {"group": 1000680000}}})
        for path, text in rendered.items():
            self.assertNotRegex(text, r"\d(\.\d+)?e\+\d", path)
        (_, spec), = [p for p in pod_specs(documents(rendered)) if p[0].endswith("-myapp")]
        self.assertEqual(spec["securityContext"]["fsGroup"], 1000680000)
        (app,) = [c for c in spec["containers"] if c["name"] == "app"]
        self.assertEqual(app["securityContext"]["runAsUser"], 1000680000)

    # Values and release names YAML would read as something else than text: booleans, numbers,
    # null. Every one of them is a valid name, Secret name or key for Kubernetes.
    _RETYPED = ["on", "yes", "true", "off", "null", "y", "123", "1e3", "0x1f", "1.5", "0o17"]

    def _assert_all_text(self, objects, where):
        """Every label and selector value, object name, Secret name, ConfigMap name and key,
        and every `secretName`/`key`/`name`/`mountPath` in the pod specs is a string."""
        def walk(node, path):
            if isinstance(node, dict):
                for k, v in node.items():
                    self.assertIsInstance(k, str, (where, path))
                    if k in ("name", "secretName", "key", "mountPath", "path", "sizeLimit",
                             "service", "imagePullPolicy", "image", "interval"):
                        self.assertIsInstance(v, str, (where, f"{path}.{k}"))
                    if k in ("labels", "matchLabels", "selector", "annotations", "data"):
                        if isinstance(v, dict) and k != "selector" or (
                                k == "selector" and isinstance(v, dict)
                                and "matchLabels" not in v):
                            for lk, lv in v.items():
                                self.assertIsInstance(lv, str, (where, f"{path}.{k}.{lk}"))
                    walk(v, f"{path}.{k}")
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, f"{path}[{i}]")
        for obj in objects:
            walk(obj, f'{obj["kind"]}')

    def _validate(self, objects, where):
        for obj in objects:
            for version in KUBE_VERSIONS:
                with self.subTest(where=where, object=obj["kind"], kube=version):
                    if obj["kind"] in _MONITOR_SCHEMAS:
                        jsonschema.validate(obj, _MONITOR_SCHEMAS[obj["kind"]])
                    else:
                        kubernetes_validate.validate(obj, version, strict=True)

    def test_names_and_keys_yaml_would_retype_stay_text(self):
        """Release names, overrides, Secret names and keys that YAML reads as booleans, numbers
        or null (`on`, `123`, `yes`, `1e3`, `null`...) are all valid for Kubernetes: every
        template writes them quoted, so each object validates strictly and carries them as text,
        in this chart and in the example parent chart."""
        rules = [{"domain": d, "descriptors": [{"key": d, "value": d, "rate_limit": {
            "unit": "second", "requests_per_unit": 5}}]} for d in ["on", "123"]]
        for word in self._RETYPED:
            starts_with_letter = word[0].isalpha()
            everything = {"demo": {"enabled": True},
                          "metrics": {"podMonitor": {"enabled": True, "labels": {word: word}},
                                      "serviceMonitor": {"enabled": True,
                                                         "labels": {word: word}}},
                          "rateLimit": {"rules": rules}}
            cases = [
                # A release name that gives valid Service names, or none at all.
                (word, everything if starts_with_letter else {
                    "tests": {"enabled": False}, "rateLimit": {"rules": rules},
                    "metrics": {"podMonitor": {"enabled": True}}}),
                ("rel", merge(everything, {"fullnameOverride": word})
                 if re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", word) else everything),
                ("rel", merge(everything, {"nameOverride": word})
                 if re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", word) else everything),
                ("rel", merge(everything, {
                    "apiToken": {"existingSecret": word.lower().replace("_", "-"), "key": word},
                    "demo": {"redis": {"enabled": False}},
                    "redis": {"url": "rediss://r:6380",
                              "password": {"existingSecret": word.lower(), "key": word},
                              "tls": {"existingSecret": word.lower(), "clientCert": True}}})
                 if re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", word.lower()) else everything),
            ]
            for release, values in cases:
                where = f"release={release} {str(values)[:200]}"
                with self.subTest(where=where):
                    objects = documents(self.charts.render(self.charts.chart, values,
                                                           name=release))
                    self._assert_all_text(objects, where)
                    self._validate(objects, where)
                    for obj in objects:
                        self.assertEqual(obj["metadata"]["labels"]["app.kubernetes.io/instance"],
                                         release)
            with self.subTest(example=word):
                secret = word.lower()
                if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", secret):
                    secret = "s"
                objects = documents(self.charts.render(self.charts.example, {"baton": {
                    "transport": "tcp",
                    "tls": {"existingSecret": secret, "clientCA": True},
                    "apiToken": {"existingSecret": secret, "key": word},
                    "redis": {"url": "rediss://r:6380",
                              "password": {"existingSecret": secret, "key": word},
                              "tls": {"existingSecret": secret}}}},
                    name=word if starts_with_letter else "rel"))
                self._assert_all_text(objects, f"example {word}")
                self._validate(objects, f"example {word}")
                (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-myapp")]
                for volume in spec["volumes"]:
                    self.assertEqual(volume["secret"]["secretName"], secret)
                keys = {v["name"]: [i["key"] for i in v["secret"]["items"]]
                        for v in spec["volumes"]}
                self.assertEqual(keys["baton-api-token"], [word])
                self.assertEqual(keys["baton-redis-password"], [word])

    def test_socket_dir_never_hides_what_the_image_needs(self):
        """A socket.dir on, inside or above the image's binary /baton (Baton's entrypoint and the
        demo app's), or on the kernel's /proc, /sys or /dev, is refused: the emptyDir would be
        mounted over it; folders merely named alike render."""
        for folder in ["/baton", "/baton/", "/baton/sock", "/proc", "/sys/fs", "/dev",
                       "/dev/shm/baton"]:
            with self.subTest(folder=folder):
                self._refused(self.charts.chart, {"socket": {"dir": folder},
                                                  "demo": {"enabled": True}},
                              f'socket.dir: "{folder}"')
                self._refused(self.charts.example, {"baton": {"socket": {"dir": folder}}},
                              f'socket.dir: "{folder}"')
        self._refused(self.charts.chart, {"socket": {"dir": "/baton"}}, "the binary /baton")
        for folder in ["/batons", "/var/baton", "/run/baton", "/devices", "/tmp/baton"]:
            with self.subTest(folder=folder):
                self.charts.render(self.charts.chart, {"socket": {"dir": folder},
                                                       "demo": {"enabled": True}})
        # With TCP the socket's folder is not mounted.
        self.charts.render(self.charts.chart, {"transport": "tcp", "socket": {"dir": "/baton"}})

    def _baton_refuses(self, *args):
        """Baton's `serve` error lines for args (with `--listen=`, always refused alone)."""
        run = subprocess.run([os.environ["BATON_BIN"], "serve", "--listen=", *args],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 2, run.stderr)
        return [line for line in run.stderr.splitlines()
                if line.startswith("  - ") and not line.startswith("  - --listen")]

    def test_redis_user_in_one_place_and_database_numbers(self):
        """A Redis URL naming a user together with redis.username is refused, as Baton refuses it;
        a database path or `db` parameter that is not a number is refused, as Baton refuses it;
        the forms Baton takes render."""
        for mode, url in [("standalone", "redis://u@r:6379"), ("standalone", "rediss://u@r:6380"),
                          ("sentinel", "redis://a:26379,redis://u@b:26379"),
                          ("cluster", "redis://a:7000, redis://u@b:7000")]:
            values = {"redis": {"mode": mode, "url": url, "username": "baton",
                                "sentinelMaster": "m" if mode == "sentinel" else ""}}
            with self.subTest(url=url):
                self._refused(self.charts.chart, values, "a Redis URL already names a user")
                self._refused(self.charts.chart, values, "redis.url")
                self.assertTrue(any("already names a user" in line for line in self._baton_refuses(
                    f"--redis-mode={mode}", f"--redis-url={url}", "--redis-username=baton",
                    *(["--redis-sentinel-master=m"] if mode == "sentinel" else []))))
                self.charts.render(self.charts.chart, merge(values, {"redis": {"username": ""}}))
        self.charts.render(self.charts.chart, {"redis": {"username": "baton"}})
        for url in ["redis://r:6379/abc", "redis://r:6379/2/3", "unix:///x.sock?db=x",
                    "unix:///x.sock?db=", "rediss://r:6380/%32?protocol=resp3",
                    "redis://r:6379/99999999999999999999", "redis://[::1]:6379/x#y"]:
            with self.subTest(url=url):
                self._refused(self.charts.chart, {"redis": {"url": url}},
                              "is not a database number")
                self.assertTrue(any("Invalid database number" in line
                                    for line in self._baton_refuses(f"--redis-url={url}")))
        self._refused(self.charts.chart, {"redis": {"mode": "cluster",
                                                    "url": "redis://a:7000,redis://b:7000/x"}},
                      "is not a database number")
        self._refused(self.charts.example, {"baton": {"redis": {"url": "redis://r/abc"}}},
                      "is not a database number")
        # A rediss:// URL takes no fragment but #insecure, which redis.tls.insecure sets instead.
        for url in ["rediss://r:6380/1#x", "rediss://r:6380#insecure"]:
            with self.subTest(url=url):
                self._refused(self.charts.chart, {"redis": {"url": url}}, "redis.tls.insecure")
        self.assertTrue(any("only #insecure is supported" in line for line in
                            self._baton_refuses("--redis-url=rediss://r:6380/1#x")))
        for url in ["redis://r:6379/2", "redis://r:6379/", "redis://r:6379//3/",
                    "unix:///x.sock?db=3", "unix:///x.sock", "redis://[::1]:6379/0?protocol=resp3",
                    "rediss://user@r:6380/15", "redis://user@r:6379/15#x", "redis://r?db=x"]:
            with self.subTest(url=url):
                self.charts.render(self.charts.chart, {"redis": {"url": url}})
                self.assertEqual(self._baton_refuses(f"--redis-url={url}"), [])

    def test_log_filter_is_one_baton_takes(self):
        """log.level is refused exactly when Baton refuses it (tracing's EnvFilter directives:
        `target[span{field}]=level`, comma-separated), and also when it holds whitespace or no
        directive at all, which Baton would take but match nothing with."""
        for level in ["info", "INFO", "3", "off", "info,baton=debug", "warn,baton::lock=trace",
                      "debug,h2=off", "[span]=debug", "[span{field=1}]=debug",
                      "baton[span{f}]=debug", "baton[span]", "[]", "info,", ",info",
                      "info,,debug", "baton=", "target-with-dash=debug", "a]b", "05",
                      "baton=+3", "Info", "tower_http=debug,axum::rejection=trace",
                      "[{f=a.*}]=trace", "[s]="]:
            with self.subTest(level=level):
                self.assertEqual(self._baton_refuses(f"--log={level}"), [])
                self.charts.render(self.charts.chart, {"log": {"level": level}})
        for level in ["info,baton=[debug", "baton=verbose", "baton=debug=x", "=debug",
                      "info, baton=debug", "[{}]", "[s]x", "+3", "baton=6", "[s]]",
                      " ", "baton[s]=debug]"]:
            with self.subTest(level=level):
                self.assertTrue(any(line.startswith("  - --log ")
                                    for line in self._baton_refuses(f"--log={level}")))
                self._refused(self.charts.chart, {"log": {"level": level}}, "/log/level")
        for level in [",", "info baton=debug", "bat on=debug", "info\n"]:
            with self.subTest(level=level):
                self._refused(self.charts.chart, {"log": {"level": level}}, "/log/level")

    _DOCS_RULE = {"domain": "edge", "descriptors": [
        {"key": "remote_address", "rate_limit": {"unit": "minute", "requests_per_unit": 100}},
        {"key": "path", "value": "/login",
         "rate_limit": {"name": "login", "unit": "hour", "requests_per_unit": 5}},
        {"key": "path", "value": "/api/*", "rate_limit": {
            "name": "api", "period": "1500ms", "requests_per_unit": 3, "algorithm": "gcra",
            "burst": 2}},
        {"key": "tenant", "descriptors": [
            {"key": "plan", "value": "free", "rate_limit": {
                "unit": "day", "requests_per_unit": 1000, "algorithm": "sliding_window"}},
            {"key": "plan", "value": "gold", "rate_limit": {"unlimited": True}}]},
        {"key": "experiment", "value": "new-limits", "shadow_mode": True,
         "rate_limit": {"name": "experiment", "unit": "second", "requests_per_unit": 10}},
        {"key": "vip", "value": "true", "detailed_metric": False, "rate_limit": {
            "name": "vip", "replaces": [{"name": "login"}], "unit": "hour",
            "requests_per_unit": 100}}]}

    def test_rate_limit_rules_have_the_shape_baton_reads(self):
        """Each rateLimit.rules entry is checked against the rules format Baton reads
        (docs/ratelimit.md): a domain and a list of descriptors, each with a key, an optional
        value, rate_limit, nested descriptors and the shadow_mode, detailed_metric and
        value_to_metric flags, nothing else; the documentation's example renders and Baton loads
        what the chart writes."""
        rendered = self.charts.render(self.charts.chart, {"rateLimit": {"rules": [
            self._DOCS_RULE]}})
        (cm,) = [o for o in documents(rendered) if o["kind"] == "ConfigMap"]
        with tempfile.TemporaryDirectory(prefix="baton-rules-") as folder:
            for name, text in cm["data"].items():
                with open(os.path.join(folder, name), "w") as f:
                    f.write(text)
            self.assertEqual(self._baton_refuses(f"--ratelimit-config={folder}"), [])
        bad = [
            ({"domain": "d", "descriptors": "x"}, "/rateLimit/rules/0/descriptors"),
            ({"domain": "d", "descriptors": ["x"]}, "/rateLimit/rules/0/descriptors/0"),
            ({"domain": "d", "descriptor": []}, "descriptor"),
            ({"domain": "d", "descriptors": [{"value": "v"}]}, "key"),
            ({"domain": "d", "descriptors": [{"key": "k", "limit": 1}]}, "limit"),
            ({"domain": "d", "descriptors": [{"key": "k", "shadow_mode": "yes"}]},
             "/rateLimit/rules/0/descriptors/0/shadow_mode"),
            ({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "second", "requests_per_unit": "5"}}]}, "requests_per_unit"),
            ({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "second", "requests_per_unit": 5, "algorithm": "leaky"}}]}, "algorithm"),
            ({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "fortnight", "requests_per_unit": 5}}]}, "unit"),
            ({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "second", "requests_per_unit": 5, "replaces": ["login"]}}]}, "replaces"),
            ({"domain": "d", "descriptors": [{"key": "k", "descriptors": [
                {"key": "n", "rate_limit": "x"}]}]},
             "/rateLimit/rules/0/descriptors/0/descriptors/0/rate_limit"),
        ]
        for rule, message in bad:
            with self.subTest(rule=rule):
                self._refused(self.charts.chart, {"rateLimit": {"rules": [rule]}}, message)

    def test_extra_args_are_flags_baton_serve_knows(self):
        """extraArgs items are `--flag` or `--flag=value` for a flag of `baton serve` (the
        schema's list is the one `baton serve --help` gives); a space outside the value, a
        short or unknown flag, or a positional argument is refused."""
        with open(os.path.join(CHART, "values.schema.json")) as f:
            pattern = json.load(f)["properties"]["extraArgs"]["items"]["pattern"]
        listed = set(re.search(r"\(([-a-z0-9|]+)\)", pattern).group(1).split("|"))
        run = subprocess.run([os.environ["BATON_BIN"], "serve", "--help"], capture_output=True,
                             text=True, timeout=30)
        known = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", run.stdout, re.M)) - {"help"}
        self.assertEqual(listed, known)
        for arg in ["--log debug", "--client-keepalive-interval =2s", " --log-format=json",
                    "-v", "serve", "--no-such-flag=1", "--client keepalive=1", "--help",
                    "--client-keepalive-interval\n=2s", "--client-keepalive-intervals=2s"]:
            with self.subTest(arg=arg):
                self._refused(self.charts.chart, {"extraArgs": [arg]}, "/extraArgs/0")
        objects = documents(self.charts.render(self.charts.chart, {
            "demo": {"enabled": True}, "extraArgs": [
                "--client-keepalive-interval=2s", "--client-keepalive-timeout=30s"]}))
        (_, spec), = [p for p in pod_specs(objects) if p[0].endswith("-demo")]
        self.assertEqual(batons(spec)[0]["args"][-2:], [
            "--client-keepalive-interval=2s", "--client-keepalive-timeout=30s"])
        self._refused(self.charts.chart, {"extraArgs": ["--log=debug"]},
                      "extraArgs: --log is already set by the chart")

    def test_security_context_labels_and_resources_kubernetes_takes(self):
        """securityContext holds only a container SecurityContext's fields and never root;
        the monitors' extra labels are valid label keys and values, none of the chart's own;
        resources are Kubernetes quantities. Each is refused by the schema."""
        refused = [
            ({"securityContext": {"foo": 1}}, "foo"),
            ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
            ({"securityContext": {"runAsNonRoot": True, "runAsUser": 0}},
             "/securityContext/runAsUser"),
            ({"securityContext": {"capabilities": {"drop": ["ALL"], "ad": ["X"]}}}, "ad"),
            ({"securityContext": {"seccompProfile": {"type": "Custom"}}},
             "/securityContext/seccompProfile/type"),
        ]
        for monitor in ["podMonitor", "serviceMonitor"]:
            for labels in [{"bad key!": "a"}, {"release": "a b"}, {"a/b/c": "x"},
                           {"x" * 64: "a"}, {"release": "v" * 64},
                           {"app.kubernetes.io/name": "x"}, {"helm.sh/chart": "x"},
                           {"app.kubernetes.io/instance": "x"},
                           {"app.kubernetes.io/version": "x"},
                           {"app.kubernetes.io/managed-by": "x"}]:
                # A key's error names the key; a value's, its path.
                (key, value), = labels.items()
                if key.startswith(("app.kubernetes.io/", "helm.sh/")):
                    message = (f'metrics.{monitor}.labels: "{key}" is one of the chart\'s own '
                               "labels")
                else:
                    message = (f"/metrics/{monitor}/labels/{key}" if key == "release"
                               else f"'{key}'")
                refused.append(({"metrics": {monitor: {"enabled": True, "labels": labels}}},
                                message))
        for quantity in ["lots", "1 Gi", "1GB", "-", "1.5.2", ""]:
            refused.append(({"resources": {"limits": {"memory": quantity}}},
                            "/resources/limits/memory"))
            refused.append(({"resources": {"requests": {"cpu": quantity}}},
                            "/resources/requests/cpu"))
        refused.append(({"resources": {"requests": {"cpu": -1}}}, "/resources/requests/cpu"))
        for values, message in refused:
            with self.subTest(values=values):
                self._refused(self.charts.chart, values, message)
        values = {"demo": {"enabled": True},
                  "securityContext": {"runAsUser": 1000, "seLinuxOptions": {"level": "s0:c1"},
                                      "procMount": "Default"},
                  "metrics": {"podMonitor": {"enabled": True, "labels": {
                      "release": "prometheus", "example.com/team": "a-b.c_d", "x": ""}},
                              "serviceMonitor": {"enabled": True, "labels": {"release": "p"}}},
                  "resources": {"requests": {"cpu": 0.5, "memory": "64Mi",
                                             "ephemeral-storage": "1e3"},
                                "limits": {"cpu": "1500m", "memory": "1G"}}}
        objects = documents(self.charts.render(self.charts.chart, values))
        self._validate(objects, "accepted")
        (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
        self.assertEqual(monitor["metadata"]["labels"]["example.com/team"], "a-b.c_d")

    def test_notes_and_comments_say_what_is_set(self):
        """NOTES.txt gives the socket's mode as set, and who can connect with it; values.yaml
        says the Redis CA comes from redis.tls.existingSecret."""
        for mode, who in [("0660", "any app user in the pod"), ("660", "any app user in the pod"),
                          ("0600", "only Baton's own user"), ("0666", "any app user in the pod"),
                          ("0640", "only Baton's own user")]:
            with self.subTest(mode=mode):
                notes = " ".join(self.charts.render(self.charts.chart, {"socket": {
                    "mode": mode}})["baton/templates/NOTES.txt"].split())
                self.assertIn(f"The socket (mode {mode})", notes)
                self.assertIn(who, notes)
        with open(os.path.join(CHART, "values.yaml")) as f:
            text = f.read()
        url_comment = text.split("\n  url:")[0].rsplit("redis:\n", 1)[1]
        self.assertIn("`redis.tls.existingSecret`'s `ca.crt`", url_comment)

    def test_every_value_is_documented(self):
        """Each key of values.yaml has a `# --` comment, or lies in a value documented as a whole,
        or is a section whose keys are; the image tag is the chart's appVersion."""
        with open(os.path.join(CHART, "values.yaml")) as f:
            lines = f.read().splitlines()
        comments = []  # the comment lines right above this line
        documented_above = []  # (indent, documented) of the keys enclosing this line
        for i, line in enumerate(lines):
            m = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):(.*)$", line)
            if m:
                indent = len(m.group(1))
                while documented_above and documented_above[-1][0] >= indent:
                    documented_above.pop()
                documented = any(c.startswith("# --") for c in comments) or any(
                    d for _, d in documented_above)
                section = m.group(3).strip() == "" and not documented
                with self.subTest(line=line):
                    self.assertTrue(section or documented, f"line {i + 1} is not documented")
                documented_above.append((indent, documented))
            comments = comments + [line.strip()] if line.strip().startswith("#") else []
        with helm.Chart.load(self.charts.chart) as c:
            self.assertEqual(c.values["image"]["tag"], c.metadata["appVersion"])
            self.assertEqual(c.metadata["kubeVersion"], ">=1.29.0-0")


class RunWhatTheChartRenders(unittest.TestCase):
    """The rendered pod, run: Baton from its container's command, args and environment; its
    probes as the kubelet runs them; an app from its container's environment."""

    @classmethod
    def setUpClass(cls):
        cls.charts = Rendered()

    @classmethod
    def tearDownClass(cls):
        cls.charts.close()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="baton-pod-")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def volumes(self, spec, objects, password):
        """Each volume of the pod as a folder: emptyDirs empty, the Secret's items and the
        ConfigMap's data laid out as the kubelet lays them out (`kubelet_write`)."""
        folders = {}
        for v in spec["volumes"]:
            folder = os.path.join(self.dir, v["name"])
            os.makedirs(folder)
            if "secret" in v:
                kubelet_write(folder, {item["path"]: password + "\n"
                                       for item in v["secret"]["items"]}, 0)
            if "configMap" in v:
                (cm,) = [o for o in objects if o["kind"] == "ConfigMap"
                         and o["metadata"]["name"] == v["configMap"]["name"]]
                kubelet_write(folder, cm["data"], 0)
            folders[v["name"]] = folder
        return folders

    @staticmethod
    def mapper(container, folders):
        """Rewrites a string naming a path under one of the container's mounts to the folder."""
        mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))

        def rewrite(text):
            for m in mounts:
                text = text.replace(m["mountPath"], folders[m["name"]])
            return text
        return rewrite

    @staticmethod
    def environment(container, rewrite, pod_name):
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = rewrite(e["value"])
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = pod_name
            else:
                raise AssertionError(f"cannot play {e}")
        return env

    def start(self, container, rewrite, pod_name):
        """Starts a container's process: its command (the image's /baton is the binary under
        test) and args, with its environment; returns the process and its output file."""
        command = [rewrite(c) for c in container["command"] + container.get("args", [])]
        self.assertEqual(command[0], "/baton", "the image's entrypoint path")
        command[0] = os.environ["BATON_BIN"]
        out_path = os.path.join(self.dir, f'{container["name"]}.log')
        out = open(out_path, "wb")
        proc = subprocess.Popen(command, env=self.environment(container, rewrite, pod_name),
                                stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs.append(proc)
        return proc, out_path

    @staticmethod
    def probe(probe, passes, proc):
        """Runs a gRPC probe as the kubelet does: Health/Check of the probe's service on the
        pod's address and port, `timeoutSeconds` each, every `periodSeconds`; returns after the
        first success, fails after `passes` attempts or as soon as the process has exited."""
        target = f'127.0.0.1:{probe["grpc"]["port"]}'
        service = probe["grpc"].get("service", "")
        last = None
        for attempt in range(passes):
            if proc.poll() is not None:
                raise AssertionError(f"baton exited with {proc.returncode} before its "
                                     f"{service!r} probe passed")
            if attempt:
                time.sleep(probe.get("periodSeconds", 10))
            with grpc.insecure_channel(target) as channel:
                try:
                    status = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=service),
                        timeout=probe.get("timeoutSeconds", 1)).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return attempt + 1
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                except grpc.RpcError as e:
                    last = e.code()
        raise AssertionError(f"probe {service!r} on {target} failed {passes} times: {last}")

    def scrape(self, baton, metadata):
        """Scrapes the metrics port as Prometheus would from the pod's annotations: the
        container port named `metrics`, at the annotated path."""
        (port,) = [p["containerPort"] for p in baton["ports"] if p["name"] == "metrics"]
        annotations = metadata.get("annotations", {})
        self.assertEqual(annotations.get("prometheus.io/port"), str(port))
        path = annotations.get("prometheus.io/path")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            self.assertEqual(response.status, 200)
            return response.read().decode()

    def run_hook(self, objects, baton):
        """Runs the `helm test` hook's command, its Service's name resolved as the cluster's DNS
        would (to the pod, whose Baton serves the Service's target port)."""
        (hook,) = [o for o in objects if is_test_hook(o)]
        (container,) = hook["spec"]["containers"]
        args = []
        for a in container["args"]:
            if a.startswith("--addr="):
                host, port = a.split("=", 1)[1].rsplit(":", 1)
                (service,) = [o for o in objects if o["kind"] == "Service"
                              and o["metadata"]["name"] == host]
                (target,) = [p["targetPort"] for p in service["spec"]["ports"]
                             if p["port"] == int(port)]
                (pod_port,) = [p["containerPort"] for p in baton["ports"] if p["name"] == target]
                a = f"--addr=127.0.0.1:{pod_port}"
            args.append(a)
        self.assertEqual(container["command"], ["/baton"])
        hook_run = subprocess.run([os.environ["BATON_BIN"], *args], capture_output=True,
                                  text=True, timeout=30)
        self.assertEqual(hook_run.returncode, 0, hook_run.stdout + hook_run.stderr)

    def run_pod(self, chart, values, password=None, demo_app=False, while_running=None):
        """Renders `chart` with `values`, runs its Baton container against a private Redis and
        proves it as described in the class, then calls `while_running(ctx)` (a dict of the
        pod's pieces) before stopping it; returns the rendered objects."""
        redis = Redis(self.dir, password=password)
        self.addCleanup(redis.kill)
        prefix = f"chart-{uuid.uuid4().hex[:8]}:"
        objects = documents(self.charts.render(chart, values(redis.port, prefix)))
        (pod_name, metadata, spec), = [p for p in pod_templates(objects)
                                       if p[0].endswith(("-demo", "-myapp"))]
        baton, _ = batons(spec)
        (app,) = [c for c in spec["containers"] if c["name"] != "baton"]
        folders = self.volumes(spec, objects, password)

        proc, log = self.start(baton, self.mapper(baton, folders), pod_name + "-0")
        try:
            startup = baton["startupProbe"]
            self.probe(startup, startup["failureThreshold"], proc)
            # Readiness follows Redis (checked every second): allow a few probe periods.
            self.probe(baton["readinessProbe"], 10, proc)
            self.probe(baton["livenessProbe"], 1, proc)
            if "--metrics-listen" in " ".join(baton["args"]):
                self.assertIn("baton_build_info{", self.scrape(baton, metadata))
            self.run_hook(objects, baton)

            # The app: its own environment names Baton; it sees the socket through its mounts.
            app_env = self.environment(app, self.mapper(app, folders), pod_name + "-0")
            addr = app_env["BATON_ADDR"]
            if addr.startswith("unix://"):
                socket_path = addr[len("unix://"):]
                self.assertEqual(oct(os.stat(socket_path).st_mode & 0o777), "0o660")
            # With an API token, the app reads it from the file its environment names (mounted
            # from the same Secret as Baton's); a call without it is refused.
            auth = ()
            if "BATON_API_TOKEN_FILE" in app_env:
                with open(app_env["BATON_API_TOKEN_FILE"]) as f:
                    auth = (("authorization", f"Bearer {f.read().strip()}"),)
                with grpc.insecure_channel(addr) as channel:
                    with self.assertRaises(grpc.RpcError) as caught:
                        lock_pb2_grpc.LockServiceStub(channel).Acquire(
                            lock_pb2.LockServiceAcquireRequest(name="no-token", ttl=ms(10_000)),
                            timeout=10)
                    self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            # A stock grpcio channel, as an app would open it: over the socket it names the
            # socket's path as the HTTP/2 authority, which Baton accepts.
            with grpc.insecure_channel(addr) as channel:
                locks = lock_pb2_grpc.LockServiceStub(channel)
                got = locks.Acquire(lock_pb2.LockServiceAcquireRequest(
                    name="from-the-app", ttl=ms(10_000), owner=pod_name), timeout=10,
                    metadata=auth)
                self.assertTrue(got.acquired, got)
                self.assertGreater(got.lease.fencing_token, 0)
                described = locks.Describe(
                    lock_pb2.LockServiceDescribeRequest(name="from-the-app"), timeout=10,
                    metadata=auth)
                self.assertTrue(described.held)
                self.assertEqual(described.owner, pod_name)

            if demo_app:
                # The demo's app container as rendered: it takes the demo lock and says so.
                app_proc, app_log = self.start(app, self.mapper(app, folders), pod_name + "-0")

                def holds():
                    with open(app_log) as f:
                        return re.search(r'holds "demo" with fencing token \d+', f.read())
                wait_until("the demo app to take its lock", holds, timeout=20)
                app_proc.send_signal(signal.SIGTERM)
                self.assertEqual(app_proc.wait(timeout=10), 0)

            if while_running:
                while_running({"objects": objects, "spec": spec, "baton": baton, "app": app,
                               "folders": folders, "log": log, "app_env": app_env})

            proc.send_signal(signal.SIGTERM)
            grace = spec["terminationGracePeriodSeconds"]
            self.assertEqual(proc.wait(timeout=grace), 0, "exit status after SIGTERM")
        except AssertionError as e:
            with open(log) as f:
                raise AssertionError(f"{e}\nbaton's output:\n{f.read()}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with open(log) as f:
                self.log = f.read()
        return objects

    def test_demo_over_the_socket(self):
        """The demo values: Baton on the Unix socket in the shared folder, probes pass, the app
        takes a lock from BATON_ADDR, and the demo app container takes the demo lock."""
        def values(port, prefix):
            return merge(values_file("demo-values.yaml"), {
                "health": {"port": free_port()},
                "metrics": {"port": free_port()},
                "redis": {"url": f"redis://127.0.0.1:{port}", "keyPrefix": prefix},
                "demo": {"redis": {"enabled": False}},
            })
        self.run_pod(self.charts.chart, values, demo_app=True)
        self.assertIn("serving gRPC over a Unix socket", self.log)
        self.assertNotIn("serving gRPC over TCP", self.log)

    def test_api_token_for_baton_and_the_app(self):
        """The security values with a plaintext Redis: Baton requires the API token of the
        mounted Secret; the app finds it through BATON_API_TOKEN_FILE (a call without it is
        refused UNAUTHENTICATED), and the demo app, Baton's own CLI, takes its lock with no flag
        but what the chart's environment gives it."""
        def values(port, prefix):
            return merge(values_file("security-values.yaml"), {
                "health": {"port": free_port()},
                "metrics": {"port": free_port()},
                "redis": {"url": f"redis://127.0.0.1:{port}", "keyPrefix": prefix,
                          "username": "",
                          "tls": {"existingSecret": "", "clientCert": False}},
            })
        # Every Secret item holds this value, as `volumes` lays them out: the Redis password and
        # the API token alike.
        self.run_pod(self.charts.chart, values, password=uuid.uuid4().hex, demo_app=True)

    def test_tcp_with_password_secret_and_rate_limit_rules(self):
        """The TCP values: Baton on 127.0.0.1, the Redis password read from the mounted Secret
        (Redis requires it), Envoy's rules read from the mounted ConfigMap."""
        password = "p@ss word/" + uuid.uuid4().hex

        def values(port, prefix):
            return merge(values_file("tcp-values.yaml"), {
                "tcp": {"port": free_port()},
                "health": {"port": free_port()},
                "metrics": {"port": free_port()},
                "redis": {"url": f"redis://127.0.0.1:{port}", "keyPrefix": prefix},
            })
        self.run_pod(self.charts.chart, values, password=password)
        self.assertIn("serving Envoy's rate limit API", self.log)
        self.assertNotIn(password, self.log)

    def test_embedded_in_the_example_parent_chart(self):
        """The example parent chart (helm/examples/myapp) with its defaults: its pod carries
        Baton; the password comes from its Secret; its app container finds Baton."""
        def values(port, prefix):
            return {"baton": {"health": {"port": free_port()},
                              "metrics": {"port": free_port()},
                              "redis": {"url": f"redis://127.0.0.1:{port}",
                                        "keyPrefix": prefix}}}
        self.run_pod(self.charts.example, values, password=uuid.uuid4().hex)

    def test_ordinary_container_without_native_sidecars(self):
        """The ordinary-container values (`nativeSidecar: false`): Baton is the first of the
        pod's containers; it serves, the demo app takes its lock, and after SIGTERM Baton keeps
        serving for the shutdown delay, then drains and exits 0."""
        def values(port, prefix):
            return merge(values_file("ordinary-container-values.yaml"), {
                "health": {"port": free_port()},
                "metrics": {"port": free_port()},
                "redis": {"url": f"redis://127.0.0.1:{port}", "keyPrefix": prefix},
                "demo": {"redis": {"enabled": False}},
                # Short, so the test stays short; the values file's 5 s is rendered above.
                "shutdownDelay": "1s",
            })
        objects = self.run_pod(self.charts.chart, values, demo_app=True)
        (_, _, spec), = [p for p in pod_templates(objects) if p[0].endswith("-demo")]
        self.assertEqual([c["name"] for c in spec["containers"]], ["baton", "app"])
        self.assertNotIn("initContainers", spec)
        self.assertIn("shutdown delay over; draining", self.log)

    def test_rate_limit_rules_reload_when_the_kubelet_swaps_the_configmap(self):
        """Envoy's rules in the ConfigMap, mounted as the kubelet mounts it (a timestamped
        folder, the `..data` symlink, one symlink per key), reread every `reloadInterval`: when
        the kubelet swaps `..data` to new rules, the new limits take effect; when it swaps in
        rules that do not parse, Baton says so and keeps the ones in force."""
        def values(port, prefix):
            return merge(values_file("tcp-values.yaml"), {
                "tcp": {"port": free_port()},
                "health": {"port": free_port()},
                "metrics": {"port": free_port()},
                "redis": {"url": f"redis://127.0.0.1:{port}", "keyPrefix": prefix},
                "rateLimit": {"reloadInterval": "1s"},
            })

        def reload(ctx):
            (volume,) = [v for v in ctx["spec"]["volumes"] if "configMap" in v]
            folder = ctx["folders"][volume["name"]]
            (key,) = [k for k in os.listdir(folder) if not k.startswith("..")]
            self.assertTrue(os.path.islink(os.path.join(folder, key)))
            with open(os.path.join(folder, key)) as f:
                rules = yaml.safe_load(f)

            def log_count(line):
                with open(ctx["log"]) as f:
                    return f.read().count(line)

            with grpc.insecure_channel(ctx["app_env"]["BATON_ADDR"]) as channel:
                def codes(value):
                    return [should_rate_limit(channel, "edge", "remote_address", value)
                            for _ in range(2)]
                # 10 a second: two in a row pass.
                self.assertEqual(codes("before"), [1, 1])

                rules["descriptors"][0]["rate_limit"] = {"unit": "hour", "requests_per_unit": 1}
                kubelet_write(folder, {key: yaml.safe_dump(rules)}, 1)
                wait_until("the new rules reloaded",
                           lambda: log_count("rate limit rules reloaded") == 1, timeout=15)
                self.assertEqual(codes("after"), [1, 2], "one an hour: the second is over")

                kubelet_write(folder, {key: "domain: edge\ndescriptors: [\n"}, 2)
                wait_until("the malformed rules refused",
                           lambda: log_count("invalid rate limit rules") == 1, timeout=15)
                self.assertEqual(codes("malformed"), [1, 2], "the rules in force are kept")
                self.assertEqual(log_count("rate limit rules reloaded"), 1)

        self.run_pod(self.charts.chart, values, password=uuid.uuid4().hex, while_running=reload)


if __name__ == "__main__":
    unittest.main()
