"""Crash and concurrency tests: writers killed with SIGKILL, readers beside a writer."""

import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import as_in_0_3, brute_force, storage_of

from simhashdb import DB, DatabaseError

pytestmark = pytest.mark.usefixtures("backend")  # subprocesses inherit SIMHASHDB_BACKEND

BATCH = 1500
WRITER = """
import sys, simhashdb
from simhashdb.storage.lmdb.files import LmdbStorage
LmdbStorage.batch_merge = 4000  # bigger merges follow the batch's commit: killed there too
from simhashdb.storage.lmdb.native import NativeStorage
NativeStorage.threaded_merge = 8000  # and the biggest are merged in parts, on threads
path, start = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from test_durability import batch_records, batch_deletes
db = simhashdb.DB(path, distance=3, blocks=6)
db.delete_many(batch_deletes(start - 1))  # the killed writer's last deletes may not have landed
for i in range(start, start + 10000):
    db.insert_many(batch_records(i), batch_size=10**9)
    db.delete_many(batch_deletes(i))
    print(i, flush=True)
"""
COMPACTOR = """
import sys, simhashdb
db = simhashdb.DB(sys.argv[1])
while True:
    db.compact()
    print("compacted", flush=True)
"""


def fingerprint_of(i, j):
    return random.Random(i * 100003 + j).getrandbits(64)


def batch_records(i):
    return [("b%d-%d" % (i, j), fingerprint_of(i, j), [i, j]) for j in range(BATCH)]


def batch_deletes(i):
    """After batch i, the even records of batch i - 2 go (a transaction of their own)."""
    return ["b%d-%d" % (i - 2, j) for j in range(0, BATCH, 2)] if i >= 2 else []


def expected_docs(inserted, evens_gone):
    return {"b%d-%d" % (i, j): fingerprint_of(i, j) for i in range(inserted)
            for j in range(BATCH) if j % 2 or i >= evens_gone}


def committed_state(db):
    """(batches inserted, leading batches whose even records are deleted)."""
    inserted = 0
    while ("b%d-1" % inserted) in db:
        inserted += 1
    evens_gone = 0
    while evens_gone < inserted and ("b%d-0" % evens_gone) not in db:
        evens_gone += 1
    return inserted, evens_gone


def run_and_kill(script, args, min_lines, seconds):
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                             text=True)
    lines = []
    deadline = time.monotonic() + 60
    while len(lines) < min_lines and time.monotonic() < deadline:
        lines.append(child.stdout.readline().strip())
    time.sleep(seconds)
    child.send_signal(signal.SIGKILL)
    rest = child.communicate()[0].split()
    return lines + rest


@pytest.mark.slow
def test_sigkill_during_writes_loses_no_committed_batch(db_path):
    rng = random.Random(7)
    tests_dir = __file__.rsplit("/", 1)[0]
    start = 0
    for _ in range(6):
        reported = run_and_kill(WRITER, [db_path, str(start), tests_dir], 1, rng.uniform(0, 0.4))
        last_committed = int(reported[-1])
        with DB(db_path) as db:
            assert db.check() == []
            inserted, evens_gone = committed_state(db)
            assert inserted >= last_committed + 1
            assert evens_gone in (max(0, inserted - 2), max(0, inserted - 3))
            docs = expected_docs(inserted, evens_gone)
            assert {r.key: r.fingerprint for r in db} == docs
            probe = docs["b%d-1" % (inserted - 1)] ^ 0b101
            assert [(m.key, m.fingerprint, m.distance) for m in db.query(probe)] == \
                brute_force(docs, probe, 3)
        start = inserted


@pytest.mark.lmdb_only
def test_sigkill_during_compaction_keeps_every_record(db_path):
    with DB(db_path, distance=3, blocks=6) as db:
        for i in range(6):
            db.insert_many(batch_records(i))
        db.delete_many(k for i in range(0, 6, 2) for k, _, _ in batch_records(i))
        docs = {r.key: r.fingerprint for r in db}
    rng = random.Random(11)
    for _ in range(4):
        run_and_kill(COMPACTOR, [db_path], 0, rng.uniform(0.05, 0.5))
        with DB(db_path) as db:
            assert db.check() == []
            assert {r.key: r.fingerprint for r in db} == docs


READER = """
import random, sys, simhashdb
sys.path.insert(0, sys.argv[2])
from test_durability import fingerprint_of, BATCH
db = simhashdb.DB(sys.argv[1], readonly=True)
rng = random.Random(int(sys.argv[3]))
checked = 0
while checked < 300:
    i = rng.randrange(40)
    probes = [fingerprint_of(i, j) for j in range(0, BATCH, 50)]
    found = [any(m.key == "b%d-%d" % (i, j) for m in ms)
             for j, ms in zip(range(0, BATCH, 50), db.query_many(probes))]
    assert all(found) or not any(found), "batch %d seen half-written" % i
    checked += 1
print("ok", checked)
"""


@pytest.mark.slow
def test_readers_beside_a_writer_see_whole_batches(db_path):
    tests_dir = __file__.rsplit("/", 1)[0]
    with DB(db_path, distance=3, blocks=6) as db:
        db.insert_many(batch_records(0))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, db_path, "1", tests_dir],
                              stdout=subprocess.PIPE, text=True)
    readers = [subprocess.Popen([sys.executable, "-c", READER, db_path, tests_dir, str(s)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for s in range(2)]
    try:
        for reader in readers:
            out, err = reader.communicate(timeout=120)
            assert reader.returncode == 0, err
            assert out.strip() == "ok 300"
    finally:
        writer.kill()
        writer.communicate()
    with DB(db_path) as db:
        assert db.check() == []


@pytest.mark.lmdb_only
def test_threads_share_one_db_while_the_map_grows(db_path, monkeypatch):
    import threading
    monkeypatch.setattr("simhashdb.storage.lmdb.files.LmdbStorage.initial_map_size", 1 << 20)
    errors = []
    with DB(db_path, distance=3, blocks=6) as db:
        db.insert_many(batch_records(0))
        done = threading.Event()

        def reader(seed):
            rng = random.Random(seed)
            try:
                while not done.is_set():
                    i = rng.randrange(BATCH)
                    hits = db.query(fingerprint_of(0, i))
                    assert ("b0-%d" % i) in [m.key for m in hits]
            except Exception as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        for i in range(1, 8):
            db.insert_many(batch_records(i))
            db.insert_many(batch_records(i)[:100])  # upserts take the general path
            db.delete_many(["b%d-%d" % (i, j) for j in range(100, 110)])
            db.insert_many(batch_records(i)[100:110])
        done.set()
        for t in threads:
            t.join()
        assert errors == []
        assert db.stats()["map_size"] > 1 << 20 and len(db) == 8 * BATCH
        assert db.check() == []


@pytest.mark.lmdb_only
def test_growth_inside_an_iteration_of_the_same_thread_fails_clearly(db_path, monkeypatch):
    from simhashdb import DatabaseError
    monkeypatch.setattr("simhashdb.storage.lmdb.files.LmdbStorage.initial_map_size", 1 << 20)
    with DB(db_path, distance=3, blocks=6) as db:
        db.insert("a", 1)
        with pytest.raises(DatabaseError, match="holds a read snapshot"):
            for _ in db:
                db.insert_many([r for i in range(1, 9) for r in batch_records(i)])
        assert len(db) == 1 and db.check() == []


STREAM_IN_AN_ITERATION = """
import sys
from simhashdb import DB, DatabaseError
from simhashdb.storage.lmdb.files import LmdbStorage
LmdbStorage.initial_map_size = 1 << 20
with DB(sys.argv[1], distance=3, blocks=6) as db:
    db.insert("a", 1)
    try:
        for _ in db:
            db.insert_many(((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1, 100_000)),
                           batch_size=1000)
    except DatabaseError as exc:
        print(exc)
    print(db.check())
"""


@pytest.mark.lmdb_only
def test_a_stream_of_batches_inside_an_iteration_of_the_same_thread_fails_clearly(db_path):
    """A stream of batches written while this thread iterates: the map's
    growth refuses clearly (it waits for every snapshot to end, this thread's
    own too: a write on another thread would wait forever)."""
    done = subprocess.run([sys.executable, "-c", STREAM_IN_AN_ITERATION, db_path],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "cannot grow the map while this thread holds a read snapshot (an unfinished "
        "iteration); finish or close it first", "[]"]


ADDRESS_SPACE = """
import resource


def limit_address_space(extra):
    \"\"\"Limit this process's address space to what it maps now, and ``extra`` more.\"\"\"
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) for line in status if line.startswith("VmSize")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, resource.RLIM_INFINITY))
"""

GROWTH_REFUSED = ADDRESS_SPACE + """
import sys
import numpy as np
from simhashdb import DB
from simhashdb.storage.lmdb import files
limit_address_space(3 << 30)  # room for a map of 2 GiB, not 4
files.MAP_A_DOCUMENT = 1 << 20  # the next batch seems to need far more than that
with DB(sys.argv[1], distance=3, blocks=6) as db:
    fps = np.random.default_rng(1).integers(0, 2**64, 20000, dtype=np.uint64)
    db.insert_many(keys=np.arange(20000, dtype=np.uint64), fingerprints=fps)
    print(len(db), db.check(), db.stats()["map_size"] >> 20,
          [m.key for m in db.query(int(fps[7]), 0)])
"""


@pytest.mark.lmdb_only
def test_a_map_that_cannot_grow_ahead_of_a_batch_still_takes_it(db_path):
    """Growing the map ahead of a batch fails where address space is short
    (a limit on it here) past 2 GiB; the map is the last one that could be
    mapped, and the batch, which fits, is written."""
    done = subprocess.run([sys.executable, "-c", GROWTH_REFUSED, db_path],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "20000 [] 2048 [7]"


GROWTH_AND_REOPEN_REFUSED = ADDRESS_SPACE + """
import os, sys
import numpy as np
from simhashdb import DB
from simhashdb.storage import registry
from simhashdb.storage.lmdb import files
files.LmdbStorage.initial_map_size = 96 << 20
files.MAP_A_DOCUMENT = files.MAP_A_TABLE_ENTRY = 0  # no growth ahead while the file fills
with DB(sys.argv[1], distance=3, blocks=5, expected_size=250000) as db:
    db.insert_many(keys=np.arange(250000, dtype=np.uint64),
                   fingerprints=np.random.default_rng(1).integers(0, 2**64, 250000, dtype=np.uint64))
    print(db.stats()["map_size"] >> 20, os.path.getsize(sys.argv[1] + "/data.mdb") >> 20)
    limit_address_space(16 << 20)
    files.MAP_A_DOCUMENT = 1 << 20  # the next batch seems to need far more than the map
    backend = registry.backend_class(db.backend)
    refused, set_mapsize = [], backend._set_mapsize
    def watched(storage, size):
        try:
            set_mapsize(storage, size)
        except Exception:
            refused.append(size >> 20)
            raise
    backend._set_mapsize = watched
    try:
        db.insert_many((250000 + i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1000))
    except MemoryError:  # the batch's own memory, in little room: it lands whole or not at all
        pass
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
    print(refused, db.stats()["map_size"] >> 20, db.check(), len(db) in (250000, 251000))
    db.insert_many((260000 + i, i * 7919) for i in range(1000))
    print(len(db) in (251000, 252000), [m.key for m in db.query(999 * 7919, 0)])
"""


@pytest.mark.lmdb_only
def test_a_failed_growth_of_a_map_over_half_full_keeps_the_handle(db_path):
    """The map cannot grow (address space is short), and the data file is over
    half the map, so a map of twice the file (what opening it asks for) does
    not fit either: the file is opened again at the size it had, and the
    handle reads and writes as before."""
    done = subprocess.run([sys.executable, "-c", GROWTH_AND_REOPEN_REFUSED, db_path],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, after, written = done.stdout.split("\n")[:3]
    size, data = map(int, first.split())
    assert size == 96 and data > size // 2
    assert after == "[192] 96 [] True" and written == "True [260999]"


SNAPSHOT_HOLDER = """
import sys, simhashdb
with simhashdb.DB(sys.argv[1], readonly=True) as db:
    records = iter(db)  # a loop over the records holds one snapshot until it ends
    next(records)
    print("held", flush=True)
    sys.stdin.read()
    records.close()
"""


@pytest.mark.lmdb_only
def test_growing_the_map_warns_of_open_snapshots_not_of_kept_reader_slots(db_path, monkeypatch):
    """Growing the map warns of the snapshots open, whose pages cannot be
    reused until they end: one held by another process, not the reader slots
    that batch queries keep for the next ones."""
    import warnings
    native = pytest.importorskip("simhashdb.storage.lmdb.native")
    monkeypatch.setattr(native, "THREADS", 2)  # a batch query split over two threads
    with DB(db_path, distance=3) as db:
        rng = random.Random(5)
        fps = [rng.getrandbits(64) for _ in range(6000)]
        db.insert_many(enumerate(fps))
        db.query_many(fps)  # split over the cores: their threads' slots are kept

        def warned():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                storage_of(db).shared._grow()
            return [str(w.message).split(" while ")[-1][:20] for w in caught
                    if issubclass(w.category, ResourceWarning)]
        assert warned() == []
        holder = subprocess.Popen([sys.executable, "-c", SNAPSHOT_HOLDER, db_path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            assert warned() == ["1 snapshots are open"]
        finally:
            holder.communicate("", timeout=60)
        assert warned() == [] and len(db.query_many(fps)) == len(fps)


UPGRADER = """
import sys, simhashdb
print("begun", flush=True)
simhashdb.upgrade(sys.argv[1])
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.lmdb_only
def test_sigkill_during_an_upgrade_leaves_the_old_database_or_the_converted_one(db_path):
    """Upgrades of a database of format 6 killed at several moments: each
    leaves it refused as it was (to convert) or converted whole, and the next
    upgrade converts it with every record."""
    rng = random.Random(12)
    docs = {"d%d" % i: rng.getrandbits(64) for i in range(30_000)}
    with DB(db_path, distance=3) as db:
        db.insert_many(docs.items(), batch_size=10**9)
    as_in_0_3(db_path)
    old = db_path + ".old"
    shutil.copytree(db_path, old)
    probes = [fp ^ (1 << rng.randrange(64)) for fp in list(docs.values())[:200]]
    ends = set()
    for delay in (0.0, 0.05, 0.15, 0.4, 1.0):
        shutil.rmtree(db_path)
        shutil.copytree(old, db_path)
        run_and_kill(UPGRADER, [db_path], 1, delay)
        try:
            with DB(db_path, readonly=True) as db:
                assert len(db) == len(docs)
            ends.add("converted")
        except DatabaseError as exc:
            assert "simhashdb-cli upgrade" in str(exc)
            ends.add("old")
        from simhashdb import upgrade
        upgrade(db_path)
        with DB(db_path) as db:
            assert db.check() == []
            for probe, found in zip(probes, db.query_many(probes)):
                assert sorted((m.key, m.fingerprint, m.distance) for m in found) == \
                    brute_force(docs, probe, 3)
    assert "old" in ends  # (a kill landed before a copy was whole)


@pytest.mark.lmdb_only
def test_a_tidy_whose_map_can_neither_grow_nor_be_mapped_again_says_to_reopen(db_path, backend,
                                                                             monkeypatch):
    """The map fills during the merges after a batch, it cannot grow, and the
    file cannot be mapped again either: the batch is stored, the warning says
    to open the database again (not that the next write tries again), and
    the database opened again has the batch."""
    from simhashdb import MaintenanceWarning
    db = DB(db_path, distance=3, backend=backend)
    db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(2000))
    storage = storage_of(db).shared
    writer = storage._writer

    class Filling:  # a writer whose batches leave merges, and whose merges fill the map
        untidy = True

        def __init__(self, txn):
            self.txn = writer(txn)

        def tidy(self):
            raise storage.map_full("the map is full")

        def __getattr__(self, name):
            return getattr(self.txn, name)

    def refused(*args):
        raise DatabaseError("cannot map: Cannot allocate memory")
    monkeypatch.setattr(storage, "_writer", Filling)
    monkeypatch.setattr(storage, "_set_mapsize", refused)
    monkeypatch.setattr(storage, "_open_env", refused)
    with pytest.warns(MaintenanceWarning, match="could not be mapped again: open the database"):
        db.insert_many((i, i * 7919) for i in range(2000, 3000))
    with pytest.raises(DatabaseError, match="is closed"):
        len(db)
    monkeypatch.undo()
    db.close()
    with DB(db_path, backend=backend) as again:
        assert len(again) == 3000 and again.check() == []
