"""Merges too big for a batch's transaction, and the rewrite of the tables,
run after the batch commits, a table's worth a transaction (tidy): the
tables end each call merged, a rewrite cut short goes on where it stopped,
and a failed tidy loses nothing."""

import json
import random
import subprocess
import sys

import pytest
from conftest import brute_force, native_built, storage_of
from test_pylmdb_runs import LAYOUT, read_tables

from simhashdb import DB, MaintenanceWarning
from simhashdb.errors import DatabaseError
from simhashdb.storage.lmdb.files import LmdbStorage
from simhashdb.storage.lmdb.format import RUN_RATIO
from simhashdb.storage.lmdb import format as lmdb_format

BACKENDS = [pytest.param("lmdb", marks=pytest.mark.skipif(not native_built(),
                                                         reason="the native backend was not built")),
            "py-lmdb"]


def merges_left(runs):
    return any(len(new) * RUN_RATIO > len(old) for (_, _, old), (_, _, new) in zip(runs, runs[1:]))


def check(db, docs, rng):
    probes = [fp ^ (1 << rng.randrange(64)) for fp in rng.sample(sorted(docs.values()), 40)]
    for probe, found in zip(probes, db.query_many(probes)):
        assert sorted((m.key, m.fingerprint, m.distance) for m in found) == \
            sorted(brute_force(docs, probe, 3))


@pytest.fixture
def small_merges(monkeypatch):
    """Batches merge runs of at most 300 entries themselves."""
    monkeypatch.setattr(LmdbStorage, "batch_merge", 300)


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("backend", BACKENDS)
def test_merges_bigger_than_a_batch_takes_follow_its_commit(tmp_path, backend, small_merges,
                                                            monkeypatch):
    path, rng = str(tmp_path / "db"), random.Random(1)
    docs = {}
    for size in (1000, 50, 400, 400, 10, 900, 30, 2000):
        batch = {"k%d" % (len(docs) + i): rng.getrandbits(64) for i in range(size)}
        with DB(path, distance=3, blocks=5, backend=backend) as db:
            db.insert_many(batch.items())
            docs.update(batch)
            check(db, docs, rng)
        tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
        assert distinct == len(docs) and stale == 0
        assert not any(merges_left(runs) for runs in tables)
        assert all(set().union(*(set(v) for _, _, v in runs)) ==
                   set(LAYOUT.table_values(list(docs.values()), t))
                   for t, runs in enumerate(tables))
    # without tidy, a batch leaves the big merges undone, and searches are exact
    tidy = LmdbStorage._tidy
    monkeypatch.setattr(LmdbStorage, "_tidy", lambda self: None)
    batch = {"late%d" % i: rng.getrandbits(64) for i in range(3000)}
    with DB(path, backend=backend) as db:
        db.insert_many(batch.items())
        docs.update(batch)
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert all(merges_left(runs) for runs in tables)
    monkeypatch.setattr(LmdbStorage, "_tidy", tidy)  # (small merges and runs_only stay)
    with DB(path, backend=backend) as db:
        db.insert_many([("one more", 12345)])  # the next batch tidies
        docs["one more"] = 12345
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert not any(merges_left(runs) for runs in tables)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rewrite_cut_short_goes_on_and_counts_the_removals_since(tmp_path, backend,
                                                                   monkeypatch):
    path, rng = str(tmp_path / "db"), random.Random(2)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(2000)}
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        monkeypatch.setattr(LmdbStorage, "_tidy", lambda self: None)
        gone = sorted(docs)[:600]  # 600 * 4 > 1400: a rewrite is due
        db.delete_many(gone)
        for key in gone:
            del docs[key]
        for _ in range(3):  # three tables rewritten, as if the process then died
            assert storage_of(db).shared._transact(lambda txn: txn.tidy()) == (True, False)
    monkeypatch.undo()
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (1400, 600)
    assert [len(runs[0][2]) for runs in tables] == [1400] * 3 + [2000] * 7
    more = sorted(docs)[:50]  # removed while the rewrite is under way
    with DB(path, backend=backend) as db:
        check(db, docs, rng)
        db.delete_many(more)
        for key in more:
            del docs[key]
        check(db, docs, rng)
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (1350, 50)  # the 50 may still be in tables 0-2
    assert [len(runs[0][2]) for runs in tables] == [1400] * 3 + [1350] * 7
    assert [len(runs) for runs in tables] == [1] * LAYOUT.tables
    with DB(path, backend=backend) as db:
        db.compact()
        check(db, docs, rng)
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (1350, 0)


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_tidy_warns_and_the_batch_stays(tmp_path, backend, small_merges, monkeypatch):
    path, rng = str(tmp_path / "db"), random.Random(3)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(1000)}
    batch = {"new%d" % i: rng.getrandbits(64) for i in range(1000)}
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        writer = type(storage_of(db).shared)._writer

        def failing_writer(self, txn):
            made = writer(self, txn)
            made.tidy = lambda: (_ for _ in ()).throw(DatabaseError("the disk is full"))
            return made

        monkeypatch.setattr(type(storage_of(db).shared), "_writer", failing_writer)
        with pytest.warns(MaintenanceWarning, match="the batch is stored"):
            db.insert_many(batch.items())
        docs.update(batch)
        monkeypatch.setattr(type(storage_of(db).shared), "_writer", writer)
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert all(merges_left(runs) for runs in tables)
    with DB(path, backend=backend) as db:
        db.insert_many([("last", 5)])
        docs["last"] = 5
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert not any(merges_left(runs) for runs in tables)


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.skipif(not native_built(), reason="the native backend was not built")
def test_both_backends_merge_and_rewrite_to_the_same_file(tmp_path, small_merges):
    """The same batches, with merges bigger than a batch takes and rewrites,
    leave the same runs (ids, slots, values) and counters on each backend."""
    files = []
    for backend in ("lmdb", "py-lmdb"):
        path, rng = str(tmp_path / backend), random.Random(4)
        docs = {}
        with DB(path, distance=3, blocks=5, backend=backend) as db:
            for _ in range(8):
                batch = {"k%d" % rng.randrange(6000): rng.getrandbits(64)
                         for _ in range(rng.choice([10, 400, 1500]))}
                db.insert_many(batch.items())
                docs.update(batch)
                gone = rng.sample(sorted(docs), len(docs) // 4)
                db.delete_many(gone)
                for key in gone:
                    del docs[key]
            check(db, docs, rng)
        files.append(read_tables(path, LAYOUT.tables))
    assert files[0] == files[1]
    tables, (distinct, stale) = files[0]
    assert distinct == len(set(docs.values())) and stale == 0
    # rewritten: one run in the first slot, its id above those of the runs it replaced
    assert all([slot for _, slot, _ in runs] == [0] and runs[0][0] > 1 for runs in tables)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compaction_during_a_rewrite_ends_it(tmp_path, backend, monkeypatch):
    path, rng = str(tmp_path / "db"), random.Random(5)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(1000)}
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        monkeypatch.setattr(LmdbStorage, "_tidy", lambda self: None)
        gone = sorted(docs)[:400]
        db.delete_many(gone)
        for key in gone:
            del docs[key]
        storage_of(db).shared._transact(lambda txn: txn.tidy())
        db.compact()
        check(db, docs, rng)
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (600, 0)
    assert all([(slot, len(values)) for _, slot, values in runs] == [(0, 600)] for runs in tables)
    monkeypatch.undo()
    with DB(path, backend=backend) as db:  # nothing left to rewrite
        assert storage_of(db).shared._transact(lambda txn: txn.tidy()) == (False, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_rewrite_marker_is_refused_not_followed(tmp_path, backend):
    import lmdb
    path = str(tmp_path / "db")
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many((i, i * 7919) for i in range(100))
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        txn.put(b"rewrite", (2**63 + 5).to_bytes(8, "big") + bytes(8),
                db=env.open_db(lmdb_format.META.name(), txn=txn))
    env.close()
    with DB(path, backend=backend) as db:
        with pytest.warns(MaintenanceWarning, match="the batch is stored"):
            db.delete_many([1])
        assert 1 not in db and 2 in db


WRITER = """
import json, sys
from simhashdb import DB
from simhashdb.storage import registry
path, backend, gone, second = sys.argv[1], sys.argv[2], *json.load(open(sys.argv[3]))
registry.backend_class(backend).recent_limit = 0  # as runs_only: the runs themselves
with DB(path, backend=backend) as db:
    db.delete_many(gone)
    db.insert_many(second.items())
"""


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.skipif(not native_built(), reason="the native backend was not built")
@pytest.mark.parametrize("writer", ["lmdb", "py-lmdb"])
def test_a_readers_block_directories_never_outlive_their_runs(tmp_path, writer):
    """A native reader keeps each run's block directory, matched by the run's
    id, slot and entries. Another process empties the tables and fills them
    again with as many other fingerprints, so the new runs take the old ones'
    slots and sizes: they take new ids, and the reader's searches stay exact."""
    path, rng = str(tmp_path / "db"), random.Random(8)
    size = lmdb_format.RECENT_LIMIT + 1  # (past recent's limit: the writer's process writes runs)
    first = {"a%d" % i: rng.getrandbits(64) for i in range(size)}
    second = {"b%d" % i: rng.getrandbits(64) for i in range(size)}
    with DB(path, distance=3, blocks=5, backend=writer) as db:
        db.insert_many(first.items())
    before, _ = read_tables(path, LAYOUT.tables)
    (tmp_path / "batches.json").write_text(json.dumps([sorted(first), second]))
    with DB(path, backend="lmdb", readonly=True) as reader:
        check(reader, first, rng)  # reads the directories
        subprocess.run([sys.executable, "-c", WRITER, path, writer, str(tmp_path / "batches.json")],
                       check=True)
        check(reader, second, rng)
    after, _ = read_tables(path, LAYOUT.tables)
    for old, new in zip(before, after):
        assert [(slot, len(values)) for _, slot, values in new] == \
            [(slot, len(values)) for _, slot, values in old] == [(0, size)]
        assert new[0][0] > old[0][0]
