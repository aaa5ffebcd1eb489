"""The Helm chart (helm/baton) against values meant to break its promises: a Redis password in a
URL, rate limit rules Baton refuses at start, a socket folder mounted over the image's own files,
a security context stripped with nulls or widened, extra arguments Baton refuses.

Each case is rendered with Helm's own engine (helm-python-sdk), as tests/python/test_helm_chart.py
does, and, where Baton is the judge, handed to Baton itself (`baton serve`), so that what the
chart lets through is what Baton takes.
"""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))

import helm_python as helm  # noqa: E402
import yaml  # noqa: E402

from test_helm_chart import Rendered, batons, documents, merge, pod_templates  # noqa: E402

PASSWORD = "hunter2"


def baton_problems(*args):
    """Baton's `serve` error lines for args (with `--listen=`, always refused alone, so that
    Baton checks everything and exits)."""
    run = subprocess.run([os.environ["BATON_BIN"], "serve", "--listen=", *args],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    return [line for line in run.stderr.splitlines()
            if line.startswith("  - ") and not line.startswith("  - --listen")]


def rules_problems(texts):
    """Baton's error lines for the rate limit rules files `texts` (file name -> text)."""
    with tempfile.TemporaryDirectory(prefix="baton-rules-") as folder:
        for name, text in texts.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        return baton_problems(f"--ratelimit-config={folder}")


class HostileValues(unittest.TestCase):
    """Values the schema used to let through, refused at render time with a message naming
    the value, and the safe ones still rendering."""

    @classmethod
    def setUpClass(cls):
        cls.charts = Rendered()

    @classmethod
    def tearDownClass(cls):
        cls.charts.close()

    def render(self, values, example=False):
        chart = self.charts.example if example else self.charts.chart
        return documents(self.charts.render(chart, {"baton": values} if example else values))

    def refused(self, values, message, example=False):
        chart = self.charts.example if example else self.charts.chart
        with self.assertRaises(helm.HelmError) as caught:
            self.charts.render(chart, {"baton": values} if example else values)
        self.assertIn(message, str(caught.exception))
        return str(caught.exception)

    @staticmethod
    def baton_pod(objects):
        """(pod metadata, pod spec) of the one Deployment whose pods carry Baton."""
        (pod,) = [(metadata, spec) for _, metadata, spec in pod_templates(objects)
                  if any(c["name"] == "baton"
                         for c in spec.get("initContainers", []) + spec["containers"])]
        return pod

    def baton(self, values, example=False):
        """Baton's container in the pods of a render."""
        return batons(self.baton_pod(self.render(values, example))[1])[0]

    # 1. Credentials in Redis URLs.

    def test_no_redis_password_or_user_in_a_url_reaches_the_arguments(self):
        """A password (or user) in a Redis URL, in any form Baton reads, would be in the pod's
        arguments: refused, in every URL of a list, pointing at redis.password.existingSecret,
        without repeating the password; URLs without credentials render."""
        cases = [
            ("standalone", f"unix:///run/redis/redis.sock?pass={PASSWORD}", "existingSecret"),
            ("standalone", f"unix:///run/redis/redis.sock?db=1&user=u&pass={PASSWORD}",
             "redis.username"),
            ("standalone", f"unix:///run/redis/redis.sock?db=1&pass={PASSWORD}&user=u",
             "existingSecret"),
            ("standalone", f"unix:///r.sock?PASS={PASSWORD}", "existingSecret"),
            ("standalone", f"unix:///r.sock?Password={PASSWORD}", "existingSecret"),
            ("standalone", f"unix:///r.sock?p%61ss={PASSWORD}", "redis.password.existingSecret"),
            ("standalone", "unix:///r.sock?username=u", "redis.username"),
            ("standalone", f"redis://r:6379/0?password={PASSWORD}", "existingSecret"),
            ("standalone", f"rediss://r:6380/?pass={PASSWORD}", "existingSecret"),
            ("standalone", f"redis://u%3A{PASSWORD}@r:6379", "existingSecret"),
            ("sentinel", f"redis://a:26379,unix:///s.sock?pass={PASSWORD}", "existingSecret"),
            ("cluster", f"redis://a:7000, redis://b:7000/?password={PASSWORD}",
             "existingSecret"),
        ]
        for mode, url, message in cases:
            values = {"redis": {"mode": mode, "url": url,
                                "sentinelMaster": "m" if mode == "sentinel" else ""}}
            for example in (False, True):
                with self.subTest(url=url, example=example):
                    text = self.refused(values, message, example)
                    self.assertIn("redis.url", text)
                    self.assertNotIn(PASSWORD, text)
        # A password in the user part: the schema refuses it, without repeating it either.
        for url in [f"redis://u:{PASSWORD}@r:6379", f"redis://:{PASSWORD}@r:6379",
                    f"rediss://u:{PASSWORD}@r:6380/1"]:
            with self.subTest(url=url):
                with self.assertRaises(helm.HelmError) as caught:
                    self.charts.render(self.charts.chart, {"redis": {"url": url}})
                self.assertNotIn(PASSWORD, str(caught.exception))
        # Baton does read these as credentials: the chart is what keeps them out.
        self.assertTrue(any("already carries a password" in line for line in baton_problems(
            f"--redis-url=unix:///r.sock?pass={PASSWORD}", "--redis-password-file=/nonexistent")))
        for url in ["redis://u@r:6379/2", "unix:///r.sock?db=1&protocol=resp3",
                    "redis://r:6379?protocol=resp3", "unix:///r.sock", "rediss://r:6380/0"]:
            with self.subTest(url=url):
                args = self.baton({"redis": {"url": url}, "demo": {"enabled": True,
                                                                   "redis": {"enabled": False}}})
                self.assertIn(f"--redis-url={url}", args["args"])

    # 2. Rate limit rules.

    _BAD_RULES = [
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 10}},
          {"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 5}}],
         "descriptors[1]: key \"k\" is given twice"),
        ([{"key": "t", "descriptors": [{"key": "p", "value": "f"}, {"key": "p", "value": "f"}]}],
         "descriptors[0].descriptors[1]: key \"p\" with value \"f\" is given twice"),
        ([{"key": "k", "rate_limit": {"unit": "second", "period": "5s",
                                      "requests_per_unit": 10}}],
         "give either unit or period, not both"),
        ([{"key": "k", "rate_limit": {"requests_per_unit": 10}}], "needs unit"),
        ([{"key": "k", "rate_limit": {}}], "needs unit"),
        ([{"key": "k", "rate_limit": {"unit": "second"}}], "needs requests_per_unit"),
        ([{"key": "k", "rate_limit": {"period": "banana", "requests_per_unit": 1}}],
         "rate_limit.period: \"banana\""),
        ([{"key": "k", "rate_limit": {"period": "1500us", "requests_per_unit": 1}}],
         "is not a whole number of milliseconds"),
        ([{"key": "k", "rate_limit": {"period": "367d", "requests_per_unit": 1}}],
         "outside 1ms to 366 days"),
        ([{"key": "k", "rate_limit": {"period": "0ms", "requests_per_unit": 1}}],
         "outside 1ms to 366 days"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "burst": 5,
                                      "algorithm": "fixed_window"}}],
         "burst: applies to algorithm: gcra only"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "burst": 5}}],
         "burst: applies to algorithm: gcra only"),
        ([{"key": "k", "rate_limit": {"unit": "second", "unlimited": True,
                                      "requests_per_unit": 5}}],
         "unlimited: true takes no unit"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 20000,
                                      "algorithm": "sliding_window"}}],
         "more than 10000"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 5, "name": "x",
                                      "replaces": [{"name": "x"}]}}],
         "this rule's own name"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 5000000000}}],
         "requests_per_unit"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1e20}}],
         "requests_per_unit"),
        ([{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 5, "burst": 0,
                                      "algorithm": "gcra"}}],
         "burst"),
    ]

    def test_rate_limit_rules_baton_refuses_are_refused_at_render(self):
        """Rules Baton refuses when it loads them (at start it exits 2; on a reload it keeps the
        old ones) are refused by the chart, naming the descriptor, in this chart and a parent's;
        Baton itself refuses each of them."""
        for descriptors, message in self._BAD_RULES:
            rules = [{"domain": "d", "descriptors": descriptors}]
            with self.subTest(descriptors=descriptors):
                self.refused({"rateLimit": {"rules": rules}}, message)
                self.refused({"rateLimit": {"rules": rules}}, message, example=True)
                text = yaml.safe_dump(rules[0])
                if "1e+20" not in text:
                    self.assertNotEqual(rules_problems({"00-d.yaml": text}), [])

    def test_rate_limit_rules_baton_takes_render_and_load(self):
        """Periods in the forms Baton reads, unlimited rules, GCRA bursts and the same key with
        different values render, and Baton loads what the chart writes."""
        descriptors = []
        periods = ["1ms", "1500ms", "90s", "1h 30m", "1h30m", "2days", "1w", "1M", "1y", "366d",
                   "8784h", "1000us", "2000000ns", "5 minutes"]
        for i, period in enumerate(periods):
            descriptors.append({"key": "p", "value": str(i),
                                "rate_limit": {"period": period, "requests_per_unit": 3}})
        descriptors += [
            {"key": "u", "rate_limit": {"unlimited": True}},
            {"key": "g", "rate_limit": {"unit": "minute", "requests_per_unit": 4294967295}},
            {"key": "b", "rate_limit": {"unit": "second", "requests_per_unit": 10,
                                        "algorithm": "gcra", "burst": 5}},
            {"key": "s", "rate_limit": {"unit": "hour", "requests_per_unit": 10000,
                                        "algorithm": "sliding_window"}},
            {"key": "z", "rate_limit": {"unit": "hour", "requests_per_unit": 0}},
            {"key": "k", "value": "1"}, {"key": "k", "value": "2"}, {"key": "k"},
            {"key": "n", "descriptors": [{"key": "k"}, {"key": "m", "value": "k"}]},
        ]
        objects = self.render({"rateLimit": {"rules": [{"domain": "d",
                                                         "descriptors": descriptors}]}})
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        self.assertEqual(rules_problems(cm["data"]), [])

    def test_changing_the_rules_rolls_the_pods(self):
        """With `rateLimit.rollOnChange` the pod template carries the SHA-256 of the rules
        ConfigMap's content (the demo's and a parent chart's pods, through
        "baton.podAnnotations"): the same rules give the same annotation, other rules another,
        and no rules none. Without it (the default), none: Baton rereads the rules."""
        def annotation(rules, example=False, roll=True):
            objects = self.render(merge({"demo": {"enabled": not example}},
                                        {"rateLimit": {"rules": rules,
                                                       "rollOnChange": roll}}), example)
            metadata, _ = self.baton_pod(objects)
            return (metadata.get("annotations") or {}).get("checksum/baton-ratelimit")

        one = [{"domain": "d", "descriptors": [
            {"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 10}}]}]
        two = [{"domain": "d", "descriptors": [
            {"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 11}}]}]
        for example in (False, True):
            with self.subTest(example=example):
                first = annotation(one, example)
                self.assertRegex(first, "^[0-9a-f]{64}$")
                self.assertEqual(annotation(one, example), first)
                self.assertNotEqual(annotation(two, example), first)
                self.assertIsNone(annotation([], example))
                self.assertIsNone(annotation(one, example, roll=False))
        # Without metrics annotations the pod still gets the checksum, and valid YAML without.
        objects = self.render({"demo": {"enabled": True}, "metrics": {"annotations": False},
                               "rateLimit": {"rules": one, "rollOnChange": True}})
        metadata, _ = self.baton_pod(objects)
        self.assertEqual(list(metadata["annotations"]), ["checksum/baton-ratelimit"])
        objects = self.render({"demo": {"enabled": True}, "metrics": {"annotations": False}})
        metadata, _ = self.baton_pod(objects)
        self.assertEqual(metadata["annotations"], {})

    # 3. The socket's folder.

    def test_socket_dir_never_hides_the_images_files_or_the_runtimes(self):
        """An emptyDir on, inside or above what the image ships (/baton, the loader and the
        libraries under /lib, /lib64, /usr/lib) or what the runtime and the kubelet mount
        (/proc, /sys, /dev, /etc, the service account token) is refused, saying where a socket
        may go; folders of their own under /run, /var/run or /tmp render."""
        for folder in ["/lib64", "/lib", "/lib/x86_64-linux-gnu", "/usr/lib", "/usr", "/",
                       "/etc", "/proc", "/dev", "/sys", "/bin", "/sbin", "/var", "/var/run",
                       "/var/run/secrets", "/var/run/secrets/kubernetes.io/serviceaccount",
                       "/lib/aarch64-linux-gnu", "/usr/local/baton"]:
            for example in (False, True):
                with self.subTest(folder=folder, example=example):
                    self.refused({"socket": {"dir": folder}}, "socket.dir", example)
                    self.refused({"socket": {"dir": folder}}, "under /run, /var/run or /tmp",
                                 example)
        for folder in ["/var/run/baton", "/run/baton", "/tmp", "/tmp/baton", "/baton-socket",
                       "/libs", "/usrdata", "/var/run/secrets/baton-sock"]:
            with self.subTest(folder=folder):
                baton = self.baton({"socket": {"dir": folder}, "demo": {"enabled": True}})
                self.assertIn(folder, [m["mountPath"] for m in baton["volumeMounts"]])

    # 4. The security context.

    _HARDENED = {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                 "allowPrivilegeEscalation": False, "privileged": False,
                 "capabilities": {"drop": ["ALL"]}}

    def test_security_context_cannot_be_stripped_with_nulls(self):
        """Keys set to null (which Helm deletes before the schema sees the values) leave the
        hardening in place: it is rendered whatever the values hold."""
        nulls = {"securityContext": {k: None for k in [
            "runAsNonRoot", "runAsUser", "runAsGroup", "allowPrivilegeEscalation",
            "capabilities", "readOnlyRootFilesystem", "seccompProfile"]}}
        for example in (False, True):
            with self.subTest(example=example):
                values = nulls if example else merge(nulls, {"demo": {"enabled": True}})
                context = self.baton(values, example)["securityContext"]
                self.assertEqual({k: context[k] for k in self._HARDENED}, self._HARDENED)
                self.assertEqual(context["seccompProfile"], {"type": "RuntimeDefault"})
                self.assertEqual((context["runAsUser"], context["runAsGroup"]), (65532, 65532))

    def test_security_context_values_only_choose_what_is_safe(self):
        """Capabilities added, an empty drop list, an Unconfined seccomp or AppArmor profile, a
        writable root filesystem, root's IDs, an unmasked /proc or a Windows host process are
        refused naming the key; other IDs and a Localhost profile render, hardened."""
        bad = [
            ({"capabilities": {"add": ["SYS_ADMIN"], "drop": []}}, "capabilities.add"),
            ({"capabilities": {"add": ["NET_RAW"]}}, "capabilities.add"),
            ({"capabilities": {"drop": []}}, "capabilities.drop"),
            ({"capabilities": {"drop": ["NET_RAW"]}}, "capabilities.drop"),
            ({"seccompProfile": {"type": "Unconfined"}}, "seccompProfile.type"),
            ({"seccompProfile": {"type": "Localhost"}}, "needs a localhostProfile"),
            ({"appArmorProfile": {"type": "Unconfined"}}, "appArmorProfile.type"),
            ({"readOnlyRootFilesystem": False}, "readOnlyRootFilesystem"),
            ({"runAsGroup": 0}, "runAsGroup"),
            ({"runAsUser": 0}, "runAsUser"),
            ({"runAsNonRoot": False}, "runAsNonRoot"),
            ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
            ({"privileged": True}, "privileged"),
            ({"procMount": "Unmasked"}, "procMount"),
            ({"windowsOptions": {"hostProcess": True}}, "hostProcess"),
        ]
        for context, message in bad:
            for example in (False, True):
                with self.subTest(context=context, example=example):
                    self.refused({"securityContext": context}, message, example)
        context = self.baton({"demo": {"enabled": True}, "securityContext": {
            "runAsUser": 1000, "runAsGroup": 2000,
            "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/baton.json"},
            "appArmorProfile": {"type": "RuntimeDefault"}}})["securityContext"]
        self.assertEqual({k: context[k] for k in self._HARDENED}, self._HARDENED)
        self.assertEqual(context["seccompProfile"],
                         {"type": "Localhost", "localhostProfile": "profiles/baton.json"})
        self.assertEqual(context["appArmorProfile"], {"type": "RuntimeDefault"})
        self.assertEqual((context["runAsUser"], context["runAsGroup"]), (1000, 2000))

    # 5. Extra arguments, URLs Baton cannot use, monitors without metrics, resources.

    def test_extra_args_baton_refuses_or_the_chart_governs_are_refused(self):
        """An extraArgs item without the value its flag needs, or with an empty one, is refused
        (Baton exits 2 on it); a flag the chart sets from its values in other configurations
        (metrics, the socket, the TLS switches) is refused even where the chart leaves it unset,
        pointing at the values; the keepalive flags with values render."""
        for arg, message in [
                ("--client-keepalive-interval", "gives --client-keepalive-interval no value"),
                ("--client-keepalive-timeout=", "gives --client-keepalive-timeout no value"),
                ("--redis-tls-insecure=true", "redis.tls.insecure"),
                ("--redis-tls-insecure", "redis.tls.insecure")]:
            with self.subTest(arg=arg):
                self.refused({"extraArgs": [arg]}, message)
                self.refused({"extraArgs": [arg]}, message, example=True)
        for arg in ["--client-keepalive-interval", "--client-keepalive-timeout="]:
            with self.subTest(arg=arg):
                run = subprocess.run([os.environ["BATON_BIN"], "serve", "--socket=/tmp/x.sock",
                                      arg], capture_output=True, text=True, timeout=30)
                self.assertEqual(run.returncode, 2, run.stderr)
        for values, message in [
                ({"metrics": {"enabled": False},
                  "extraArgs": ["--metrics-listen=0.0.0.0:9999"]}, "metrics.enabled"),
                ({"transport": "tcp", "extraArgs": ["--socket=/tmp/x.sock"]}, "socket.dir"),
                ({"extraArgs": ["--tls-cert=/x"]}, "tls.existingSecret"),
                ({"extraArgs": ["--redis-username=u"]}, "redis.username")]:
            with self.subTest(values=values):
                self.refused(values, message)
        args = self.baton({"demo": {"enabled": True}, "extraArgs": [
            "--client-keepalive-interval=2s", "--client-keepalive-timeout=30s"]})["args"]
        self.assertEqual(args[-2:], ["--client-keepalive-interval=2s",
                                     "--client-keepalive-timeout=30s"])

    def test_redis_urls_without_a_host_or_with_a_relative_socket_are_refused(self):
        """`redis://:6379` (no host) and `unix://tmp/x.sock` (tmp read as a host) are refused, as
        Baton refuses them."""
        for url, message in [("redis://:6379", "names no host"),
                             ("rediss://u@:6380", "names no host"),
                             ("unix://tmp/x.sock", "unix:///PATH"),
                             ("redis://a:1,redis://:2", "names no host")]:
            with self.subTest(url=url):
                mode = "cluster" if "," in url else "standalone"
                self.refused({"redis": {"url": url, "mode": mode}}, message)
                self.assertTrue(any("is not a Redis URL" in line
                                    for line in baton_problems(f"--redis-url={url}",
                                                               f"--redis-mode={mode}")))

    def test_monitors_need_metrics(self):
        """A PodMonitor or ServiceMonitor with metrics off is refused rather than dropped."""
        for monitor in ["podMonitor", "serviceMonitor"]:
            with self.subTest(monitor=monitor):
                self.refused({"metrics": {"enabled": False, monitor: {"enabled": True}}},
                             f"metrics.{monitor}.enabled needs metrics.enabled")
        self.render({"metrics": {"enabled": False}})

    def test_resource_requests_above_limits_are_refused(self):
        """A request above its limit, in any of the quantities' notations, is refused; equal
        ones in different notations render."""
        for requests, limits in [({"memory": "256Mi"}, {"memory": "128Mi"}),
                                 ({"cpu": "600m"}, {"cpu": 0.5}),
                                 ({"cpu": 2}, {"cpu": "1"}),
                                 ({"memory": "2e9"}, {"memory": "1Gi"}),
                                 ({"memory": "1.5G"}, {"memory": "1G"})]:
            with self.subTest(requests=requests, limits=limits):
                self.refused({"resources": {"requests": requests, "limits": limits}},
                             "Kubernetes refuses a request above its limit")
        for requests, limits in [({"memory": "1Gi"}, {"memory": "1073741824"}),
                                 ({"cpu": "500m"}, {"cpu": 0.5}),
                                 ({"cpu": "300m"}, {"cpu": "0.3"}),
                                 ({"memory": "1G"}, {"memory": "1Gi"})]:
            with self.subTest(requests=requests, limits=limits):
                self.render({"resources": {"requests": requests, "limits": limits}})


if __name__ == "__main__":
    unittest.main()
