"""Merges too big for a batch's transaction, and the rewrite of the tables,
run after the batch commits, a table's worth a transaction (tidy): the
tables end each call merged, a rewrite cut short goes on where it stopped,
and a failed tidy loses nothing."""

import random

import pytest
from conftest import brute_force, native_built
from test_pylmdb_runs import LAYOUT, read_tables

from simhashdb import DB, MaintenanceWarning
from simhashdb.errors import DatabaseError
from simhashdb.storage.lmdb.files import RUN_RATIO, LmdbStorage

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
    monkeypatch.setattr(LmdbStorage, "_tidy", lambda self: None)
    batch = {"late%d" % i: rng.getrandbits(64) for i in range(3000)}
    with DB(path, backend=backend) as db:
        db.insert_many(batch.items())
        docs.update(batch)
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert all(merges_left(runs) for runs in tables)
    monkeypatch.undo()
    monkeypatch.setattr(LmdbStorage, "batch_merge", 300)
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
            assert db._storage._transact(lambda txn: txn.tidy()) == (True, False)
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_tidy_warns_and_the_batch_stays(tmp_path, backend, small_merges, monkeypatch):
    path, rng = str(tmp_path / "db"), random.Random(3)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(1000)}
    batch = {"new%d" % i: rng.getrandbits(64) for i in range(1000)}
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        writer = type(db._storage)._writer

        def failing_writer(self, txn):
            made = writer(self, txn)
            made.tidy = lambda: (_ for _ in ()).throw(DatabaseError("the disk is full"))
            return made

        monkeypatch.setattr(type(db._storage), "_writer", failing_writer)
        with pytest.warns(MaintenanceWarning, match="the batch is stored"):
            db.insert_many(batch.items())
        docs.update(batch)
        monkeypatch.setattr(type(db._storage), "_writer", writer)
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert all(merges_left(runs) for runs in tables)
    with DB(path, backend=backend) as db:
        db.insert_many([("last", 5)])
        docs["last"] = 5
        check(db, docs, rng)
    tables, _ = read_tables(path, LAYOUT.tables)
    assert not any(merges_left(runs) for runs in tables)


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
    assert all([(run, slot) for run, slot, _ in runs] == [(1, 0)] for runs in tables)  # rewritten


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
        db._storage._transact(lambda txn: txn.tidy())
        db.compact()
        check(db, docs, rng)
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (600, 0)
    assert all([(run, slot, len(values)) for run, slot, values in runs] == [(1, 0, 600)]
               for runs in tables)
    monkeypatch.undo()
    with DB(path, backend=backend) as db:  # nothing left to rewrite
        assert db._storage._transact(lambda txn: txn.tidy()) == (False, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_rewrite_marker_is_refused_not_followed(tmp_path, backend):
    import lmdb
    path = str(tmp_path / "db")
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many((i, i * 7919) for i in range(100))
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        txn.put(b"rewrite", (2**63 + 5).to_bytes(8, "big") + bytes(8),
                db=env.open_db(b"meta", txn=txn))
    env.close()
    with DB(path, backend=backend) as db:
        with pytest.warns(MaintenanceWarning, match="the batch is stored"):
            db.delete_many([1])
        assert 1 not in db and 2 in db
