"""The band index kept as runs (format 5), on both LMDB backends: removals
leave stale entries that searches confirm away until the bands are written
again from the documents; the backends write and read each other's band runs;
a database of 0.5 (dupsort bands) opens read-only and converts; a long stream
of small batches keeps the file bounded; a writer killed among band merges and
rewrites loses no committed batch. The oracle is a database built afresh from
the documents left."""

import os
import random
import signal
import subprocess
import sys
import time

import lmdb
import pytest
from conftest import LMDB_BACKENDS, bands_as_in_0_5, edited, native_built, page

import simhashdb
from simhashdb.errors import DatabaseError
from simhashdb.storage import BANDS
from simhashdb.storage.lmdb import format as lmdb_format



def corpus(seed, n, copies):
    """``n`` pages keyed by URL, ``copies`` of them again (lightly edited) under other URLs."""
    rng = random.Random(seed)
    pages = {"https://site%d.example/p/%d" % (i % 7, i): page(rng) for i in range(n)}
    originals = list(pages.values())
    for i in range(copies):
        pages["https://mirror.example/%d" % i] = edited(rng, originals[i * 3 % n], 0.02)
    return pages


def band_state(path):
    """(each band's runs [(run id, slot, entries)], meta's band stale count), read raw."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            runs = [lmdb_format.directory_runs(txn.get(lmdb_format.band_directory_key(band),
                                                       b"", db=directory))
                    for band in range(BANDS)]
            stale = int.from_bytes(txn.get(lmdb_format.BAND_STALE, bytes(8), db=meta), "big")
    finally:
        env.close()
    return runs, stale


def answers(db, probes):
    return [sorted((m.key, m.fingerprint, round(m.resemblance, 9)) for m in found)
            for found in db.query_text_many(probes)]


def fresh_answers(tmp_path, name, pages, probes, backend):
    """The answers of a database built afresh from ``pages``: the oracle."""
    with simhashdb.DB(tmp_path / name, backend=backend) as fresh:
        fresh.insert_text_many(pages.items())
        return answers(fresh, probes)


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_removals_leave_stale_entries_until_the_bands_are_written_from_the_documents(
        tmp_path, backend):
    pages = corpus(1, 900, 100)
    rng = random.Random(2)
    probes = [edited(rng, text, 0.03) for text in rng.sample(sorted(pages.values()), 60)]
    path = str(tmp_path / "db")
    keys = sorted(pages)
    with simhashdb.DB(path, backend=backend) as db:
        for start in range(0, len(keys), 100):
            db.insert_text_many((k, pages[k]) for k in keys[start:start + 100])
    runs, stale = band_state(path)
    entries = sum(run[2] for band in runs for run in band)
    assert stale == 0 and entries >= len(pages) * BANDS * 0.9
    for share, name in ((150, "fresh1"), (200, "fresh2")):
        gone = rng.sample(sorted(pages), share)
        with simhashdb.DB(path, backend=backend) as db:
            assert db.delete_many(gone) == len(gone)
            for key in gone:
                del pages[key]
            assert db.check() == []
            assert answers(db, probes) == fresh_answers(tmp_path, name, pages, probes, backend)
        after, stale = band_state(path)
        if share == 150:  # a sixth: the entries stay, stale
            # every entry of a removed text, counted (once where two removed share one)
            assert len(gone) * BANDS * 0.95 <= stale <= len(gone) * BANDS
            assert sum(run[2] for band in after for run in band) == entries
        else:  # past a quarter: the bands are written again from the documents
            assert stale == 0 and all(len(band) == 1 for band in after)
            assert sum(run[2] for band in after for run in band) < entries * 0.8


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.skipif(not native_built(), reason="the native backend was not built")
def test_the_backends_write_and_read_each_others_band_runs(tmp_path):
    pages = corpus(3, 600, 60)
    rng = random.Random(4)
    probes = [edited(rng, text, 0.03) for text in rng.sample(sorted(pages.values()), 40)]
    path = str(tmp_path / "db")
    keys = sorted(pages)
    for turn, (backend, start) in enumerate([("lmdb", 0), ("py-lmdb", 200), ("lmdb", 400),
                                             ("py-lmdb", 500)]):
        with simhashdb.DB(path, backend=backend) as db:
            db.insert_text_many((k, pages[k]) for k in keys[start:start + 200])
            changed = {k: edited(rng, pages[k], 0.3)  # new texts under stored URLs
                       for k in rng.sample(keys[:start + 100], 20)}
            db.insert_text_many(changed.items())
            pages.update(changed)
            db.delete_many(rng.sample(keys[:start], 10 * turn))
    found = []
    for backend in ("lmdb", "py-lmdb"):
        with simhashdb.DB(path, backend=backend, readonly=True) as db:
            assert db.check() == []
            kept = {record.key: pages[record.key] for record in db}
            found.append(answers(db, probes))
    assert found[0] == found[1] == fresh_answers(tmp_path, "fresh", kept, probes, "lmdb")


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_database_of_0_5_is_converted_by_upgrade_with_its_text_decisions(tmp_path, backend):
    pages = corpus(5, 500, 50)
    rng = random.Random(6)
    probes = [edited(rng, text, 0.03) for text in rng.sample(sorted(pages.values()), 40)]
    path = str(tmp_path / "db")
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many(pages.items())
        before = answers(db, probes)
    assert any(before)
    bands_as_in_0_5(path)
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="simhashdb 0.8 and earlier.*simhashdb-cli upgrade"):
            simhashdb.DB(path, readonly=readonly, backend=backend)
    simhashdb.upgrade(path, backend=backend)
    with simhashdb.DB(path, backend=backend) as db:
        assert db.stats()["format"] == simhashdb.db.FORMAT_VERSION and db.check() == []
        assert answers(db, probes) == before
        db.insert_text_many([("late", probes[0])])
        assert "late" in {m.key for m in db.query_text(probes[0])}
    runs, _ = band_state(path)
    assert all(band and band[0][0] == lmdb_format.new_run_id(0) for band in runs)  # the first, then the batch's


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_long_stream_of_small_batches_keeps_the_file_bounded(tmp_path, backend):
    """A crawler's recrawls: 2,000 pages kept, each small batch replacing 25 of
    them with edited texts and removing 5 for 5 new ones. The file stops
    growing once the stale entries and free pages reach their steady state
    (after about 120 batches: the bands merge only once they have 6 runs)."""
    rng = random.Random(7)
    live = {"https://example.org/%d" % i: page(rng) for i in range(2000)}
    path = str(tmp_path / "db")
    size = []
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many(live.items())
        for batch in range(200):
            changed = {k: edited(rng, live[k], 0.2) for k in rng.sample(sorted(live), 25)}
            born = {"https://example.org/b%d-%d" % (batch, i): page(rng) for i in range(5)}
            dead = rng.sample(sorted(set(live) - set(changed)), 5)
            live.update(changed)
            live.update(born)
            db.insert_text_many(list(changed.items()) + list(born.items()))
            db.delete_many(dead)
            for key in dead:
                del live[key]
            size.append(os.path.getsize(os.path.join(path, "data.mdb")))
        assert db.check() == []
    assert size[-1] <= 1.15 * size[119], size[119::20]


@pytest.mark.usefixtures("runs_only")  # the batches' band entries go to the runs
@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_bands_merge_lazily_and_a_batch_keeps_room_for_the_next(tmp_path, backend, monkeypatch):
    """A band merges once it has RUN_SLOTS - 2 runs, and a merge too big for
    the batch is left for tidy. Where tidy never runs (it failed, or the
    process died after the commit), the next batch merges whatever the size
    once its run leaves the slots short: no batch fails and no band keeps
    more runs than 0.13.0 left (which it can write to). Then one batch's
    tidy finishes every band's merges, and every page is found."""
    from simhashdb.storage import registry
    storage_class = registry.backend_class(backend)
    monkeypatch.setattr(storage_class, "batch_merge", 1)  # every merge too big for a batch
    tidy = storage_class._tidy
    monkeypatch.setattr(storage_class, "_tidy", lambda storage: None)
    rng = random.Random(3)
    items = [("p%d" % i, page(rng)) for i in range(320)]
    path = str(tmp_path / "db")
    most = []
    for start in range(0, 300, 20):
        with simhashdb.DB(path, backend=backend) as db:
            db.insert_text_many(items[start:start + 20])
        runs, _ = band_state(path)
        most.append(max(map(len, runs)))
    full = most.index(lmdb_format.RUN_SLOTS - 2)  # committed so: the merge left for tidy
    assert max(most) == lmdb_format.RUN_SLOTS - 2 > min(most[full:]), most  # then forced
    monkeypatch.setattr(storage_class, "_tidy", tidy)
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many(items[300:])
    runs, _ = band_state(path)
    assert max(map(len, runs)) < lmdb_format.RUN_SLOTS - 2  # every band's merges done
    with simhashdb.DB(path, backend=backend) as db:
        assert db.check() == []
        found = db.query_text_many([text for _, text in items])
    assert all(key in {m.key for m in hits} for (key, _), hits in zip(items, found))


WRITER = """
import random, sys, simhashdb
from simhashdb.storage.lmdb.files import LmdbStorage
LmdbStorage.batch_merge = 3000  # bigger merges follow the batch's commit: killed there too
path, start = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from test_band_runs import batch_pages
db = simhashdb.DB(path)
for i in range(start, start + 10000):
    db.insert_text_many(batch_pages(i).items())
    db.delete_many(list(batch_pages(i - 3))[::2])  # removals: band rewrites follow
    print(i, flush=True)
"""


def batch_pages(i):
    rng = random.Random(i)
    return {"b%d-%d" % (i, j): page(rng, 40) for j in range(150)} if i >= 0 else {}


@pytest.mark.slow
@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_sigkill_among_band_merges_and_rewrites_loses_no_committed_batch(tmp_path, backend,
                                                                        monkeypatch):
    monkeypatch.setenv("SIMHASHDB_BACKEND", backend)
    path, tests = str(tmp_path / "db"), os.path.dirname(__file__)
    start, rng = 0, random.Random(8)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", WRITER, path, str(start), tests],
                                 stdout=subprocess.PIPE, text=True)
        lines = [child.stdout.readline() for _ in range(3)]
        time.sleep(rng.uniform(0.0, 1.5))
        child.send_signal(signal.SIGKILL)
        lines += child.communicate()[0].split()
        done = [int(line) for line in lines if line.strip()]
        assert done, "the writer committed nothing before it was killed"
        with simhashdb.DB(path, backend=backend) as db:
            assert db.check() == []
            for i in range(done[-1] + 1):  # every committed batch, its committed removals too
                keys = list(batch_pages(i))
                assert all(key in db for key in keys[1::2])
                if i + 3 <= done[-1]:
                    assert not any(key in db for key in keys[::2])
                elif i + 3 > done[-1] + 1:
                    assert all(key in db for key in keys[::2])
        start = done[-1] + 1
