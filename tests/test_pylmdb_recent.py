"""Format 9's recent in the py-lmdb backend (tests/test_recent.py tests both
LMDB backends alike): a writer killed while it appends small writes to recent
or writes recent out as runs leaves a committed state, damaged records of
recent are damage, and a read-only handle on a format-8 file reads the recent
a writer adds since. (test_pylmdb_records.py: the backends write the same
records of recent from the same batches, and read each other's.)"""

import random
import subprocess
import sys

import lmdb
import pytest
from conftest import brute_force, store_format
from test_durability import run_and_kill

from simhashdb import DB
from simhashdb.errors import DamagedError
from simhashdb.storage.lmdb import format as lmdb_format

RECENT_NAME = lmdb_format.RECENT_WRITES.name()


def raw_recent(path):
    """(recent's records [(key, value)] as stored, meta's recent counter bytes)."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            recent = env.open_db(RECENT_NAME, txn=txn, create=False)
            return list(txn.cursor(recent).iternext()), txn.get(lmdb_format.RECENT, db=meta)
    finally:
        env.close()


def fp_of(b, i):
    return random.Random(b * 7919 + i).getrandbits(64)


KILLED_WRITER = """
import sys
from simhashdb import DB
from simhashdb.storage.lmdb.pylmdb import PyLmdbStorage
path, start, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PyLmdbStorage.recent_limit = limit
sys.path.insert(0, sys.argv[4])
from test_pylmdb_recent import fp_of
with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
    print("open", flush=True)
    for b in range(start, start + 10000):
        db.insert_many(("%d/%d" % (b, i), fp_of(b, i)) for i in range(30))
        print(b, flush=True)
"""


@pytest.mark.parametrize("limit", [lmdb_format.RECENT_LIMIT, 100])
def test_sigkill_during_appends_to_recent_and_its_flushes_keeps_a_committed_state(tmp_path,
                                                                                  limit):
    """Writes of 30 documents, each a record of recent (``limit`` the
    default) or, with recent's limit 100, written out as runs every fourth:
    killed at random moments, the database holds every write it reported and
    at most one more, whole, and searches answer as brute force does."""
    path, rng, start = str(tmp_path / "db"), random.Random(limit), 0
    tests_dir = __file__.rsplit("/", 1)[0]
    for _ in range(3):
        printed = run_and_kill(KILLED_WRITER, [path, str(start), str(limit), tests_dir], 1,
                               rng.uniform(0.1, 0.6))
        assert printed[0] == "open"
        with DB(path, backend="py-lmdb") as db:
            docs = {r.key: r.fingerprint for r in db}
            start = next(b for b in range(10**6) if "%d/0" % b not in docs)
            assert start >= (int(printed[-1]) + 1 if printed[1:] else 0)
            assert docs == {"%d/%d" % (b, i): fp_of(b, i) for b in range(start) for i in range(30)}
            assert db.check() == []
            probes = [fp_of(b, 3) ^ 0b1001 for b in range(start)][-20:] + [rng.getrandbits(64)]
            for probe, found in zip(probes, db.query_many(probes)):
                assert [(m.key, m.fingerprint, m.distance) for m in found] == \
                    brute_force(docs, probe, 3)
        records, counter = raw_recent(path)
        held = [lmdb_format.recent_groups(value) for _, value in records]
        assert int.from_bytes(counter or b"", "big") == sum(len(v) for g in held for v in g.values())


@pytest.mark.parametrize("damage", ["empty record", "another group", "short key", "counter"])
def test_a_damaged_record_of_recent_is_damage_not_a_signal(tmp_path, damage):
    path = str(tmp_path / "db")
    with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
        for i in range(5):
            db.insert(i, fp_of(0, i))
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64))
    with env.begin(write=True) as txn:
        recent, meta = (env.open_db(name, txn=txn) for name in (RECENT_NAME, lmdb_format.META.name()))
        key, value = next(iter(txn.cursor(recent)))
        if damage == "empty record":
            txn.put(key, b"", db=recent)
        elif damage == "another group":  # a group key of a table's directory
            txn.put(key, (3).to_bytes(2, "big") + value[2:], db=recent)
        elif damage == "short key":
            txn.delete(key, db=recent)
            txn.put(b"\0", value, db=recent)
        else:
            txn.put(lmdb_format.RECENT, (6).to_bytes(8, "big"), db=meta)
    env.close()
    with DB(path, backend="py-lmdb", readonly=True) as db:
        with pytest.raises(DamagedError, match="recent"):
            db.query(fp_of(0, 1))
        assert any("recent" in problem for problem in db.check())


WRITER = """
import sys
from simhashdb import DB
with DB(sys.argv[1], backend="py-lmdb") as db:
    db.insert("new", 12345)
"""


def test_a_read_only_handle_on_a_format_8_file_reads_the_recent_a_writer_makes(tmp_path):
    path = str(tmp_path / "db")
    with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
        db.insert_many([("old", 1)])
        db.compact()  # (its entries in the runs)
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64))
    with env.begin(write=True) as txn:  # as format 8 has it: no recent, no counter of it
        txn.drop(env.open_db(RECENT_NAME, txn=txn), delete=True)
        txn.delete(lmdb_format.RECENT, db=env.open_db(lmdb_format.META.name(), txn=txn))
        store_format(env, txn, 8)
    env.close()
    with DB(path, backend="py-lmdb", readonly=True) as reader:
        assert [m.key for m in reader.query(12345)] == []
        subprocess.run([sys.executable, "-c", WRITER, path], check=True)
        assert [m.key for m in reader.query(12345)] == ["new"]
        assert [m.key for m in reader.query(1)] == ["old"]
    assert len(raw_recent(path)[0]) == 1
