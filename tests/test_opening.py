"""Opening an LMDB database: an open that fails releases and removes what it
took and made, faults are named by what they are, a 0.3 database opens
read-only as it is, and handles of one process on one database share it."""

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import warnings

import lmdb
import pytest
from conftest import as_in_0_3

from simhashdb import DB, DamagedDatabaseWarning, DatabaseError, DiskFullError
from simhashdb.storage import registry
from simhashdb.storage.lmdb import format as lmdb_format
from simhashdb.storage.lmdb.directory import LmdbDirectory

pytestmark = pytest.mark.lmdb_only


def held_files(path):
    """The files of the database directory ``path`` this process has open or mapped."""
    with open("/proc/self/maps") as maps:
        mapped = [line.split(None, 5)[-1].strip() for line in maps]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    return sorted({name for name in mapped + fds if name.startswith(path + os.sep)})


def drop_sub_databases(path, *names):
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        for name in names:
            txn.drop(env.open_db(name, txn=txn), delete=True)
    env.close()


def test_a_failed_open_leaves_no_file_of_the_database_open_or_mapped(tmp_path, backend):
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(100))
    drop_sub_databases(path, lmdb_format.RECORD_BLOCKS.name(), lmdb_format.RUN_DIRECTORY.name())
    kept = []  # as a crawler retrying its open may keep them, with their tracebacks
    for _ in range(3):
        with pytest.raises(DatabaseError, match="not a simhashdb database") as refused:
            DB(path, readonly=True)
        kept.append(refused.value)
    assert held_files(path) == []


def test_an_open_that_fails_on_a_nearly_full_disk_is_named_by_its_fault(tmp_path, monkeypatch,
                                                                        backend):
    monkeypatch.setattr(LmdbDirectory, "free_bytes", lambda self: 1 << 20)
    with pytest.raises(DatabaseError) as refused:
        DB("/proc/self/db")
    assert not isinstance(refused.value, DiskFullError), refused.value
    pristine = str(tmp_path / "pristine")
    with DB(pristine) as db:
        db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(20_000))
    refusals = []
    for cut in (4097, 6000, 8191, 8192):  # within LMDB's newest pages
        path = str(tmp_path / ("cut%d" % cut))
        shutil.copytree(pristine, path)
        data = os.path.join(path, "data.mdb")
        os.truncate(data, os.path.getsize(data) - cut)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DamagedDatabaseWarning)
            try:
                DB(path).close()
            except DatabaseError as exc:
                refusals.append(exc)
    assert refusals
    for refused in refusals:
        assert not isinstance(refused, DiskFullError) and "cut short" in str(refused), refused


def test_a_database_whose_making_failed_leaves_nothing_behind(tmp_path, monkeypatch, backend):
    def no_space(self, txn):
        raise DiskFullError("the disk is full")

    monkeypatch.setattr(registry.backend_class(backend), "_writer", no_space)
    for path in (tmp_path / "new", tmp_path / "empty"):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(DiskFullError):
            DB(str(path))
        assert not path.exists() or os.listdir(path) == []
    assert held_files(str(tmp_path / "new")) == []
    monkeypatch.undo()
    with DB(str(tmp_path / "new")) as db:  # made whole at the next try
        db.insert("a", 1)
        assert len(db) == 1


def test_a_handle_that_made_the_file_but_found_the_parameters_stored_removes_nothing(
        tmp_path, backend):
    """Two processes making one database: the one whose parameters landed
    second writes nothing, and its close must not take the other's database."""
    path = str(tmp_path / "db")
    maker = registry.open_storage(path, backend=backend)  # made the file, stored nothing
    subprocess.run([sys.executable, "-c", "import simhashdb, sys\n"
                    "with simhashdb.DB(sys.argv[1], backend=sys.argv[2]) as db:\n"
                    "    db.insert_many([(i, i * 7919) for i in range(100)])", path, backend],
                   check=True)
    maker.close()
    with DB(path, create=False, backend=backend) as db:
        assert len(db) == 100 and db.check() == []


def file_digest(path):
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_a_database_of_0_3_is_refused_both_ways_and_a_refused_open_writes_nothing(
        tmp_path, backend):
    path = str(tmp_path / "db")
    fps = [i * 0x9E3779B97F4A7C15 % 2**64 for i in range(500)]
    with DB(path, distance=3) as db:
        db.insert_many(enumerate(fps))
    as_in_0_3(path)
    before = file_digest(path)
    for readonly in (True, False, True):
        with pytest.raises(DatabaseError, match="simhashdb-cli upgrade %s" % path):
            DB(path, readonly=readonly)
    assert file_digest(path) == before


def test_handles_of_one_process_on_one_database_share_it(tmp_path, backend):
    path = str(tmp_path / "db")
    first = DB(path, distance=3)
    second = DB(os.path.join(str(tmp_path), ".", "db"))
    reader = DB(path, readonly=True)
    first.insert("a", 1)
    second.insert("b", 2)
    assert [m.key for m in reader.query(3)] == ["a", "b"]
    with pytest.raises(DatabaseError, match="read-only"):
        reader.insert("c", 3)
    first.close()
    with pytest.raises(DatabaseError, match="closed"):
        first.query(1)
    second.insert("c", 3)
    assert len(second) == len(reader) == 3
    second.close()
    assert reader.get("c").fingerprint == 3
    reader.close()
    assert held_files(path) == []
    with DB(path, readonly=True) as reader:
        with pytest.raises(DatabaseError, match="open read-only in this process"):
            DB(path)
    with DB(path) as db:
        assert len(db) == 3 and db.check() == []


def test_threads_each_opening_the_database_write_and_read_beside_each_other(tmp_path, backend):
    path = str(tmp_path / "db")
    DB(path, distance=3).close()
    errors, threads = [], 8

    def component(number):
        try:
            for round_ in range(5):
                with DB(path) as db:
                    keys = ["t%d-%d-%d" % (number, round_, j) for j in range(20)]
                    db.insert_many((key, hash(key) % 2**64) for key in keys)
                    assert all(db.get(key) for key in keys)
        except Exception as exc:  # reported below, with the thread's number
            errors.append((number, exc))

    workers = [threading.Thread(target=component, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    with DB(path) as db:
        assert len(db) == threads * 5 * 20 and db.check() == []
    assert held_files(path) == []
