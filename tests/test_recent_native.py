"""The native engine's recent (format 9) under a writer killed with SIGKILL
while it appends small writes and while it writes recent out as runs, and
with a damaged record: every answer is a committed state's (the oracle: the
documents of the writes that committed, brute force), and damage is a
DamagedError, never a signal, which compact() mends."""

import random
import signal
import subprocess
import sys
import time

import lmdb
import pytest
from conftest import brute_force, native_built, raw_snapshot

import simhashdb
from simhashdb.errors import DamagedError
from simhashdb.storage.lmdb import format as lmdb_format

pytestmark = pytest.mark.skipif(not native_built(), reason="the native backend was not built")

WORDS = ["w%d" % i for i in range(2000)]
WRITER = """
import sys, simhashdb
from simhashdb.storage.lmdb.native import NativeStorage
NativeStorage.recent_limit = 300  # written out as runs every few writes: killed there too
sys.path.insert(0, sys.argv[3])
from test_recent_native import step
path, start = sys.argv[1], int(sys.argv[2])
db = simhashdb.DB(path, distance=3, blocks=5, recipe=simhashdb.RECIPE, backend="lmdb")
for i in range(start, start + 100000):
    key, fp, text = step(i)
    db.insert(key, fp)
    db.insert_text("t" + key, text)
    print(i, flush=True)
"""


def step(i):
    """Write ``i``'s key, fingerprint and text."""
    rng = random.Random(i)
    return "k%d" % i, rng.getrandbits(64), " ".join(rng.choice(WORDS) for _ in range(60))


def recent_state(path):
    """(the values recent's records hold, meta's count of them), read raw."""
    with raw_snapshot(path) as (env, txn):
        meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
        recent = env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn, create=False)
        held = sum(len(values) for _, raw in txn.cursor(recent)
                   for values in lmdb_format.recent_groups(raw).values())
        return held, int.from_bytes(txn.get(lmdb_format.RECENT, b"", db=meta), "big")


def test_sigkill_among_small_writes_and_their_runs_leaves_a_committed_state(tmp_path):
    path, tests = str(tmp_path / "db"), __file__.rsplit("/", 1)[0]
    rng, start = random.Random(3), 0
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", WRITER, path, str(start), tests],
                                 stdout=subprocess.PIPE, text=True)
        lines = [child.stdout.readline()]
        time.sleep(rng.uniform(0.2, 0.8))
        child.send_signal(signal.SIGKILL)
        done = [int(line) for line in lines + child.communicate()[0].split() if line.strip()]
        assert done, "the writer committed nothing before it was killed"
        held, counted = recent_state(path)
        assert held == counted
        with simhashdb.DB(path, backend="lmdb") as db:
            assert db.check() == []
            last = max(i for i in range(done[-1], done[-1] + 2) if "k%d" % i in db)
            docs = {key: fp for key, fp, _ in map(step, range(last + 1))}
            texts = {"t" + key: text for key, _, text in map(step, range(last + 1))}
            whole = "t" + step(last)[0] in db  # else killed between a step's two writes
            if not whole:
                del texts["t" + step(last)[0]]
            stored = {r.key: r.fingerprint for r in db}
            assert {k: fp for k, fp in stored.items() if k in docs} == docs
            assert set(stored) == set(docs) | set(texts)
            probes = [fp ^ 0b1011 for fp in list(docs.values())[-20:]]
            for probe, found in zip(probes, db.query_many(probes)):
                assert [(m.key, m.fingerprint, m.distance) for m in found] == \
                    brute_force(stored, probe, 3)
            last_texts = list(texts.items())[-10:]
            found = db.query_text_many([text for _, text in last_texts])
            assert all(key in [m.key for m in f] for (key, _), f in zip(last_texts, found))
        start = last + 1 if whole else last  # (the next writer writes it whole)


def damage(path, how):
    """Damage recent's first record: ``cut`` (its length off) or ``order``
    (its groups out of order)."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64))
    with env.begin(write=True) as txn:
        recent = env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn)
        key, raw = next(iter(txn.cursor(recent)))
        groups = lmdb_format.recent_groups(raw)
        assert len(groups) == lmdb_format.BANDS + 1  # a text's: each band's, then the fingerprints
        head = lmdb_format.RECENT_GROUP_BYTES + 8  # a group of one value
        swapped = raw[head:2 * head] + raw[:head] + raw[2 * head:]  # bands 1 and 0
        txn.put(key, raw[:-5] if how == "cut" else swapped, db=recent)
    env.close()


@pytest.mark.parametrize("how", ["cut", "order"])
def test_a_damaged_recent_record_raises_and_compact_mends_it(tmp_path, how):
    path, rng = str(tmp_path / "db"), random.Random(5)
    texts = {"t%d" % i: " ".join(rng.choice(WORDS) for _ in range(60)) for i in range(12)}
    with simhashdb.DB(path, recipe=simhashdb.RECIPE, backend="lmdb") as db:
        for key, text in texts.items():
            db.insert_text(key, text)
    damage(path, how)
    with simhashdb.DB(path, backend="lmdb") as db:
        with pytest.raises(DamagedError, match="recent"):
            db.query_text(texts["t3"])  # a band search
        with pytest.raises(DamagedError, match="recent"):
            db.query(db.get("t3").fingerprint)
        assert any("recent" in problem for problem in db.check())
        with pytest.raises(DamagedError, match="recent"):  # a write that would write it out
            db.insert_many([(i, rng.getrandbits(64)) for i in range(lmdb_format.RECENT_LIMIT)])
        assert len(db) == len(texts)  # (that batch did not land)
        db.compact()
        assert db.check() == []
        assert recent_state(path) == (0, 0)
        for key, text in texts.items():
            assert key in [m.key for m in db.query_text(text)]


def test_many_probes_seek_recent_a_table_at_a_time_as_exactly_as_few_compare_it(tmp_path):
    """A batch of probes times recent's fingerprints past COMPARED_AT_MOST
    seeks each probe's ranges in recent sorted a table; fewer compare each
    fingerprint: both are brute force's answers, at and above the tables' distance."""
    rng = random.Random(9)
    docs = {i: rng.getrandbits(64) for i in range(5000)}
    docs.update((-i, docs[i] ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64)))
                for i in range(1, 2000))
    with simhashdb.DB(str(tmp_path / "db"), distance=3, blocks=5, backend="lmdb") as db:
        db.insert_many(docs.items())
        assert recent_state(str(tmp_path / "db"))[0] == len(set(docs.values()))
        probes = [fp ^ (1 << rng.randrange(64)) for fp in list(docs.values())[:150]]
        probes += [rng.getrandbits(64) for _ in range(50)]
        for distance in (3, 4):
            many = db.query_many(probes, distance=distance)  # 200 x 7,000: sought
            for probe, found in zip(probes, many):
                assert [(m.key, m.fingerprint, m.distance) for m in found] == \
                    brute_force(docs, probe, distance)
            assert all(db.query(probe, distance=distance) == found  # one by one: compared
                       for probe, found in zip(probes[:20], many))
