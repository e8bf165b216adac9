"""A hypothesis state machine: after any sequence of writes, compactions and
reopenings, every query (also above the built distance) equals a brute-force
scan of a dict, on each backend."""

import shutil
import tempfile

import pytest
from conftest import BACKENDS, brute_force
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simhashdb import DB

MAX = 2**64 - 1
keys = st.one_of(st.integers(0, 12), st.sampled_from(["a", "b", "c", b"a", b"b"]))
bases = st.one_of(st.sampled_from([0, MAX, 0x5555555555555555]), st.integers(0, MAX))


class DatabaseMachine(RuleBasedStateMachine):
    backend = None  # set by each backend's subclass

    @initialize(params=st.sampled_from([(4, 3), (5, 3), (6, 2), (3, 1), (2, 0)]))
    def open(self, params):
        self.blocks, self.distance = params
        self.dir = tempfile.mkdtemp()
        self.path = self.dir + "/db"
        self.db = DB(self.path, distance=self.distance, blocks=self.blocks, backend=self.backend)
        self.docs = {}
        self.seen = [0]

    def near(self, data):
        """A fingerprint near one already used: bits flipped spread, or in one block."""
        base = data.draw(st.sampled_from(self.seen))
        width = 64 // self.blocks
        block = data.draw(st.integers(0, self.blocks - 1))
        spread = data.draw(st.lists(st.integers(0, 63), max_size=self.distance + 2))
        packed = data.draw(st.lists(st.integers(block * width, block * width + width - 1),
                                    max_size=self.distance + 2))
        for bit in data.draw(st.sampled_from([spread, packed])):
            base ^= 1 << bit
        return base

    @rule(key=keys, base=bases, data=st.data())
    def insert(self, key, base, data):
        fp = data.draw(st.sampled_from([base, self.near(data)]))
        self.db.insert(key, fp, {"fp": fp})
        self.docs[key] = fp
        self.seen.append(fp)

    @rule(records=st.lists(st.tuples(keys, bases), max_size=8))
    def insert_many(self, records):
        self.db.insert_many(records)
        self.docs.update(records)
        self.seen.extend(fp for _, fp in records)

    @rule(key=keys)
    def delete(self, key):
        assert self.db.delete(key) == (key in self.docs)
        self.docs.pop(key, None)

    @rule(key=keys, data=st.data())
    def insert_if_new(self, key, data):
        fp = self.near(data)
        distance = data.draw(st.sampled_from([None, self.distance + 1, 2 * self.distance]))
        expected = brute_force(self.docs, fp, self.distance if distance is None else distance)
        got = self.db.insert_if_new(key, fp, distance=distance)
        assert [(m.key, m.fingerprint, m.distance) for m in got] == expected
        if not expected:
            self.docs[key] = fp
            self.seen.append(fp)

    @rule()
    def compact(self):
        self.db.compact()

    @rule()
    def reopen(self):
        self.db.close()
        self.db = DB(self.path, backend=self.backend)

    @rule(data=st.data())
    def query(self, data):
        fp = self.near(data)
        for d in list(range(self.distance + 1)) + [self.distance + 1, 2 * self.distance]:
            got = self.db.query(fp, d)
            assert [(m.key, m.fingerprint, m.distance) for m in got] == \
                brute_force(self.docs, fp, d)

    @invariant()
    def documents_agree(self):
        if hasattr(self, "db"):
            assert len(self.db) == len(self.docs)

    @precondition(lambda self: hasattr(self, "db"))
    @rule()
    def check(self):
        assert self.db.check() == []
        assert {r.key: r.fingerprint for r in self.db} == self.docs

    def teardown(self):
        if hasattr(self, "db"):
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)


class NativeMachine(DatabaseMachine):
    backend = "lmdb"


class PyLmdbMachine(DatabaseMachine):
    backend = "py-lmdb"


class RedisMachine(DatabaseMachine):
    backend = "redis"


TestPyLmdbMachine = PyLmdbMachine.TestCase
if "lmdb" in BACKENDS:
    TestNativeMachine = NativeMachine.TestCase
if "redis" in BACKENDS:
    TestRedisMachine = pytest.mark.usefixtures("redis_names")(RedisMachine.TestCase)
    # A third of the examples: the rules above run at the full count on both
    # LMDB backends, and the Redis storage under them also runs the storage
    # and band machines (test_storage.py, test_bands.py).
    TestRedisMachine.settings = settings(TestRedisMachine.settings,
                                         max_examples=settings().max_examples // 3 or 1)
