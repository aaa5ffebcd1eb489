"""The AutocompleteService contract, checked from Python through a client generated from proto/.

Run by scripts/python-tests.sh, which generates the client into BATON_PY_GEN and builds the
binary named by BATON_BIN. The test class starts its own redis-server on a free port (no
persistence) and its own Baton process, and stops both by pid.
"""

import os
import shutil
import sys
import tempfile
import unicodedata
import unittest
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase,
)

from harness import Baton, Redis  # noqa: E402
from baton.v1 import autocomplete_pb2 as pb  # noqa: E402
from baton.v1 import autocomplete_pb2_grpc as rpc  # noqa: E402

PREFIX = pb.AUTOCOMPLETE_MATCH_MODE_PREFIX
WORD = pb.AUTOCOMPLETE_MATCH_MODE_WORD_PREFIX
SUFFIX = pb.AUTOCOMPLETE_MATCH_MODE_SUFFIX
CONTAINS = pb.AUTOCOMPLETE_MATCH_MODE_CONTAINS
AUTO = pb.AUTOCOMPLETE_MATCH_MODE_AUTOMATIC
LEX = pb.AUTOCOMPLETE_ORDER_LEXICOGRAPHIC
SCORE = pb.AUTOCOMPLETE_ORDER_SCORE


class Servers:
    """A private redis-server and a Baton process serving over it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="baton-py-ac-")
        self.redis = Redis(self.dir)
        self.baton = Baton(self.redis.port, self.dir)
        self.channel = self.baton.channel

    def stop(self):
        self.baton.stop()
        self.redis.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class AutocompleteContract(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = Servers()
        cls.ac = rpc.AutocompleteServiceStub(cls.servers.channel)

    @classmethod
    def tearDownClass(cls):
        cls.servers.stop()

    def dictionary(self):
        return f"{self._testMethodName}-{uuid.uuid4().hex[:6]}"

    def add(self, dictionary, *terms):
        entries = [t if isinstance(t, pb.AutocompleteTerm) else pb.AutocompleteTerm(display=t)
                   for t in terms]
        return self.ac.Add(pb.AutocompleteServiceAddRequest(dictionary=dictionary, terms=entries))

    def complete(self, dictionary, query, mode=PREFIX, order=LEX, limit=10, page_token=""):
        return self.ac.Complete(pb.AutocompleteServiceCompleteRequest(
            dictionary=dictionary, query=query, mode=mode, order=order, limit=limit,
            page_token=page_token))

    def names(self, dictionary, query, mode=PREFIX, order=LEX, limit=10):
        return [s.display for s in self.complete(dictionary, query, mode, order, limit).suggestions]

    def test_unicode_matching_keeps_display_form(self):
        """Case folding and normalization in several scripts; results in their display form."""
        d = self.dictionary()
        decomposed = unicodedata.normalize("NFD", "Renée Dubois")
        self.add(d, "Straße", decomposed, "Ελένη Παπαδοπούλου", "Иван Петров", "王伟", "张伟明",
                 "🎸 Guitar Shop", "Rock 🎸", "𠮷野家")
        self.assertEqual(self.names(d, "STRASSE"), ["Straße"])
        self.assertEqual(self.names(d, "renée"), [decomposed])
        self.assertEqual(self.names(d, "ΕΛΈΝΗ"), ["Ελένη Παπαδοπούλου"])
        self.assertEqual(self.names(d, "петр", WORD), ["Иван Петров"])
        self.assertEqual(self.names(d, "伟", CONTAINS), ["张伟明", "王伟"])
        self.assertEqual(self.names(d, "🎸", CONTAINS), ["Rock 🎸", "🎸 Guitar Shop"])
        self.assertEqual(self.names(d, "𠮷"), ["𠮷野家"])
        self.assertEqual(self.names(d, "guitar shop", SUFFIX), ["🎸 Guitar Shop"])

    def test_pagination_returns_each_term_once(self):
        """Page tokens walk a large result exactly once; a token only fits its own query."""
        d = self.dictionary()
        names = [f"user {i:04d}" for i in range(1500)]
        for start in range(0, len(names), 1000):
            self.add(d, *names[start:start + 1000])
        for mode, order in [(PREFIX, LEX), (PREFIX, SCORE), (CONTAINS, LEX), (AUTO, LEX)]:
            seen, token = [], ""
            while True:
                page = self.complete(d, "user", mode, order, 97, token)
                self.assertLessEqual(len(page.suggestions), 97)
                seen += [s.display for s in page.suggestions]
                token = page.next_page_token
                if not token:
                    break
            self.assertEqual(sorted(seen), names, (mode, order))
            self.assertEqual(len(set(seen)), len(names), (mode, order))
        first = self.complete(d, "user", limit=5)
        self.assertEqual([s.display for s in first.suggestions], names[:5])
        second = self.complete(d, "user", limit=5, page_token=first.next_page_token)
        self.assertEqual([s.display for s in second.suggestions], names[5:10])
        with self.assertRaises(grpc.RpcError) as caught:
            self.complete(d, "use", limit=5, page_token=first.next_page_token)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(caught.exception.details().startswith("page_token:"))
        with self.assertRaises(grpc.RpcError) as caught:
            self.complete(d, "user", limit=5, page_token=first.next_page_token[:-3] + "xyz")
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_automatic_mode_and_scores(self):
        """Exact, then prefix, word-prefix and contains matches; score order and payloads."""
        d = self.dictionary()
        self.add(d, "Anna Karenina", "Ann", "Joanna Anna", "Hanna",
                 pb.AutocompleteTerm(display="Annabel", score=5, payload=b"\x00id-7"))
        page = self.complete(d, "ann", AUTO)
        self.assertEqual(
            [(s.display, s.match_kind) for s in page.suggestions],
            [("Ann", pb.AUTOCOMPLETE_MATCH_KIND_EXACT),
             ("Anna Karenina", pb.AUTOCOMPLETE_MATCH_KIND_PREFIX),
             ("Annabel", pb.AUTOCOMPLETE_MATCH_KIND_PREFIX),
             ("Joanna Anna", pb.AUTOCOMPLETE_MATCH_KIND_WORD_PREFIX),
             ("Hanna", pb.AUTOCOMPLETE_MATCH_KIND_CONTAINS)])
        ranked = self.complete(d, "ann", PREFIX, SCORE).suggestions
        self.assertEqual((ranked[0].display, ranked[0].score, ranked[0].payload),
                         ("Annabel", 5.0, b"\x00id-7"))
        self.assertEqual([s.display for s in ranked[1:]], ["Ann", "Anna Karenina"])
        r = self.add(d, pb.AutocompleteTerm(display="Anna Karenina", score=10, increment=True))
        self.assertEqual((r.added, r.updated, list(r.scores)), (0, 1, [10.0]))
        self.assertEqual(self.names(d, "ann", PREFIX, SCORE)[0], "Anna Karenina")
        removed = self.ac.Remove(pb.AutocompleteServiceRemoveRequest(
            dictionary=d, displays=["Ann", "nobody"]))
        self.assertEqual((removed.removed, removed.term_count), (1, 4))

    def test_recent_list(self):
        """A recent list keeps the newest items first, moves re-recorded ones to the front."""
        lst = f"recent-{uuid.uuid4().hex[:6]}"
        for i in range(12):
            r = self.ac.RecordRecent(pb.AutocompleteServiceRecordRecentRequest(
                list=lst, display=f"Contact {i}", max_items=10))
        self.assertEqual((r.size, r.evicted), (10, 1))
        self.ac.RecordRecent(pb.AutocompleteServiceRecordRecentRequest(list=lst, display="Contact 3",
                                                                      max_items=10))
        items = self.ac.ListRecent(pb.AutocompleteServiceListRecentRequest(list=lst)).items
        self.assertEqual([i.display for i in items][:3], ["Contact 3", "Contact 11", "Contact 10"])
        self.assertEqual(len(items), 10)
        found = self.ac.CompleteRecent(pb.AutocompleteServiceCompleteRecentRequest(
            list=lst, query="CONTACT 1", limit=2))
        self.assertEqual([i.display for i in found.items], ["Contact 11", "Contact 10"])
        self.assertFalse(found.next_page_token)
        found = self.ac.CompleteRecent(pb.AutocompleteServiceCompleteRecentRequest(
            list=lst, query="tact", mode=CONTAINS, limit=2))
        self.assertEqual([i.display for i in found.items], ["Contact 3", "Contact 11"])
        self.assertTrue(found.next_page_token)

    def test_invalid_arguments_name_the_field(self):
        """Bad input fails with INVALID_ARGUMENT, the message starting with the field's name."""
        d = self.dictionary()
        cases = [
            (lambda: self.add(d, "ok", ""), "terms[1].display:"),
            (lambda: self.add(d, pb.AutocompleteTerm(display="x", score=float("nan"))),
             "terms[0].score:"),
            (lambda: self.add("", "x"), "dictionary:"),
            (lambda: self.complete(d, ""), "query:"),
            (lambda: self.complete(d, "x", limit=5000), "limit:"),
            (lambda: self.complete(d, "x", page_token="not-a-token"), "page_token:"),
        ]
        for call, prefix in cases:
            with self.assertRaises(grpc.RpcError) as caught:
                call()
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(caught.exception.details().startswith(prefix),
                            caught.exception.details())
        self.assertEqual(self.ac.Describe(
            pb.AutocompleteServiceDescribeRequest(dictionary=d)).term_count, 0)

    def test_reflection_and_health(self):
        """Reflection lists the Autocomplete service; its health follows readiness."""
        db = ProtoReflectionDescriptorDatabase(self.servers.channel)
        self.assertIn("baton.v1.AutocompleteService", db.get_services())
        health = health_pb2_grpc.HealthStub(self.servers.channel)
        status = health.Check(health_pb2.HealthCheckRequest(
            service="baton.v1.AutocompleteService")).status
        self.assertEqual(status, health_pb2.HealthCheckResponse.SERVING)


if __name__ == "__main__":
    unittest.main()
