"""The LMDB backends' files under what users and disks do to them: most of a
database deleted, a full disk, LMDB's lock file removed under a writer, a data
file cut short."""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import threading
import warnings

import pytest
from conftest import storage_of

from simhashdb import DB, DamagedDatabaseWarning, DatabaseError
from simhashdb.records import MAX_KEY_BYTES, encode_documents, encode_key
from simhashdb.storage.lmdb.datafile import inspect_data_file
from simhashdb.storage.lmdb.directory import LOCK_FILE
from simhashdb.storage.lmdb import format as lmdb_format

pytestmark = [pytest.mark.lmdb_only, pytest.mark.usefixtures("backend")]


# A healthy database is never refused (LMDB leaves the pages it allocated and
# freed in one transaction unwritten, so a sound file may end before its last page)

def test_a_database_with_most_documents_deleted_reopens_writable(tmp_path, backend):
    rng = random.Random(0)
    short = 0
    for trial, size in enumerate([1000, 1000, 3000, 3000, 10_000, 10_000, 20_000, 20_000,
                                  100_000, 100_000]):
        path = str(tmp_path / ("db%d" % trial))
        with DB(path) as db:  # most removed in place: by a transaction that stored one first
            db.insert_many((i, rng.getrandbits(64)) for i in range(size))
            gone = [encode_key(i) for i in range(int(size * rng.choice([0.95, 0.99, 1.0])))]
            first = encode_documents([("first", 1)], MAX_KEY_BYTES, 0)
            storage_of(db).write(lambda txn: (txn.upsert(first), txn.remove(gone)))
        short += inspect_data_file(os.path.join(path, "data.mdb"))[1] is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with DB(path) as db:
                kept = len(db)
                db.insert("after", 1)
                assert db.check() == []
                assert len(db) == kept + 1
    with DB(path) as db:
        version = tuple(map(int, db.stats()["lmdb_version"].split(".")))
    if version <= (0, 9, 24):  # later versions seem to write the pages at the end
        assert short, "no trial left the file short of its last page: the case is not exercised"


def test_the_expire_command_after_an_import_leaves_a_database_that_opens(tmp_path):
    from simhashdb import cli
    path = str(tmp_path / "db")
    lines = tmp_path / "fps.txt"
    lines.write_text("".join("%d\n" % random.Random(i).getrandbits(64) for i in range(3000)))
    assert cli.main(["import", path, str(lines), "--format", "dec"]) == 0
    assert cli.main(["expire", path, "--older-than", "0s"]) == 0
    assert cli.main(["check", path]) == 0


# A data file cut short opens read-only (native) or not at all with the reason
# (py-lmdb, which has no fault guard); never a signal (tests/test_faults.py)

def test_a_data_file_cut_short_opens_read_only_with_a_warning(tmp_path, backend):
    pristine = str(tmp_path / "pristine")
    with DB(pristine) as db:
        db.insert_many((i, random.Random(i).getrandbits(64)) for i in range(20_000))
    opened = cut_off = 0
    for pages in range(1, 9):
        path = str(tmp_path / ("cut%d" % pages))
        shutil.copytree(pristine, path)
        data = os.path.join(path, "data.mdb")
        os.truncate(data, os.path.getsize(data) - pages * 4096)
        if backend == "py-lmdb":
            with pytest.raises(DatabaseError, match="cut short.*native backend"):
                DB(path)
            continue
        with pytest.warns(DamagedDatabaseWarning, match="read-only.*cut short"):
            try:
                db = DB(path)
            except DatabaseError as exc:  # what LMDB must read to open it is gone: it says why
                assert "cut short" in str(exc) and str(exc).endswith("restore it from a backup")
                cut_off += 1
                continue
        with db:
            opened += 1
            problems = db.check()
            assert problems and "cut short" in problems[0]
            with pytest.raises(DatabaseError, match="read-only: its data file ends"):
                db.insert("x", 1)
    assert (opened and cut_off) or backend == "py-lmdb", (opened, cut_off)


# A damaged page of LMDB's own list of sub-databases opens read-only: LMDB 0.9
# trusts a page's node bounds when a write copies it (a heap overflow)

def test_a_damaged_page_of_lmdbs_list_of_sub_databases_opens_read_only(tmp_path, backend):
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many((i, random.Random(i).getrandbits(64)) for i in range(2_000))
    data = os.path.join(path, "data.mdb")
    with open(data, "r+b") as f:
        metas = [f.read(4096) for _ in range(2)]
        newest = max(metas, key=lambda page: struct.unpack_from("<Q", page, 144)[0])
        main_root, = struct.unpack_from("<Q", newest, 128)  # the main DB's record: its root
        f.seek(main_root * 4096 + 14)
        f.write(struct.pack("<H", 0xFFFF))  # the page's upper bound, past its end
    assert "list of sub-databases" in inspect_data_file(data)[0]
    if backend == "py-lmdb":
        with pytest.raises(DatabaseError, match="sub-databases.*native backend"):
            DB(path)
        return
    with pytest.warns(DamagedDatabaseWarning, match="read-only.*sub-databases"):
        db = DB(path)
    with db:
        assert len(db) == 2_000
        with pytest.raises(DatabaseError, match="read-only: page %d" % main_root):
            db.insert("x", 1)


def test_a_free_list_naming_a_page_far_past_the_file_reads_as_no_list(tmp_path):
    from simhashdb.storage.lmdb.datafile import _free_pages
    at, size = 4096 - 24, 16  # one leaf node: 8-byte key, its list on an overflow page
    page = bytearray(4096)
    struct.pack_into("<QHHHH", page, 0, 2, 0, 0x02, 18, at)  # page 2, a leaf, one node
    struct.pack_into("<H", page, 16, at)
    struct.pack_into("<HHHHQQ", page, at, size, 0, 0x01, 8, 7, 2**60)
    data = tmp_path / "data.mdb"
    data.write_bytes(bytes(8192) + bytes(page))
    with open(data, "rb") as f:
        assert _free_pages(f, 4096, 2, 3) is None


# A full disk: an error that says so, nothing left behind, never SIGBUS

FULL_DISK = r"""
import json, os, sys
import simhashdb
backend, root = sys.argv[1], sys.argv[2]
result = {}

def fill():
    with open(os.path.join(root, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096))
        except OSError:
            pass

def attempt(what, call):
    try:
        call()
        result[what] = "ok"
    except simhashdb.SimhashDBError as exc:
        result[what] = type(exc).__name__

def free():
    os.unlink(os.path.join(root, "filler"))

fill()
attempt("create on a full disk", lambda: simhashdb.DB(root + "/a.db", backend=backend).close())
result["left behind"] = os.path.exists(root + "/a.db")
free()

db = simhashdb.DB(root + "/b.db", backend=backend)
db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1000))
fill()
attempt("a batch on a full disk", lambda: db.insert_many(
    (i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1000, 60000)))
db.close()
free()
with simhashdb.DB(root + "/b.db", backend=backend) as db:
    result["kept"], result["problems"] = len(db), db.check()
    db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1000, 6000))
    result["after freeing"] = len(db)
    db.delete_many(range(1000, 3000))
    fill()
    attempt("compact on a full disk", db.compact)
    free()
    result["after compact failed"] = [len(db), db.check()]

lock = root + "/b.db/lock.mdb"  # a lock file left sparse by a crash
os.truncate(lock, 0)
os.truncate(lock, 262272)
fill()
attempt("open beside a sparse lock file", lambda: simhashdb.DB(root + "/b.db", backend=backend))
free()
attempt("open after freeing", lambda: simhashdb.DB(root + "/b.db", backend=backend).close())
print(json.dumps(result))
"""


def small_disk_run(script, args, size="24m"):
    """Run ``script`` with ``args`` in a private mount namespace where a tmpfs of
    ``size`` is mounted at a fresh directory (its last argument)."""
    mount = "mount -t tmpfs -o size=%s tmpfs \"$0\" && exec \"$@\"" % size
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        if not shutil.which(unshare[0]):
            break
        probe = subprocess.run(unshare + ["sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                               capture_output=True)
        if probe.returncode == 0:
            return subprocess.run(unshare + ["sh", "-c", mount, args[-1], sys.executable,
                                             "-c", script, *args], capture_output=True,
                                  text=True, timeout=300)
    pytest.skip("this machine cannot mount a small filesystem (unshare -m / -rm)")


def test_a_full_disk_is_an_error_that_says_so_and_loses_nothing(tmp_path, backend):
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    run = small_disk_run(FULL_DISK, [backend, str(mountpoint)])
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result == {
        "create on a full disk": "DiskFullError", "left behind": False,
        "a batch on a full disk": "DiskFullError", "kept": 1000, "problems": [],
        "after freeing": 6000,
        "compact on a full disk": "DiskFullError", "after compact failed": [4000, []],
        "open beside a sparse lock file": "DiskFullError", "open after freeing": "ok"}


# LMDB's lock file removed under a writer: no second writer ever commits beside it

WRITER = r"""
import sys, simhashdb
path, name = sys.argv[1], sys.argv[2]
with simhashdb.DB(path) as db:
    for batch in range(10**6):
        try:
            db.insert_many(("%s-%d-%d" % (name, batch, j), (batch * 1000 + j) * 0x9E3779B97F4A7C15
                            % 2**64) for j in range(50))
        except simhashdb.DatabaseError as exc:
            print("refused", exc, flush=True)
            break
        print("ok", batch, flush=True)
"""


def test_a_writer_whose_lock_file_was_replaced_stops_before_it_commits(tmp_path):
    path = str(tmp_path / "db")
    DB(path).close()
    first = subprocess.Popen([sys.executable, "-c", WRITER, path, "first"],
                             stdout=subprocess.PIPE, text=True)
    lines = [first.stdout.readline() for _ in range(20)]
    os.unlink(os.path.join(path, LOCK_FILE))  # a clean-up script
    second = subprocess.Popen([sys.executable, "-c", WRITER, path, "second"],
                              stdout=subprocess.PIPE, text=True)
    # both run until the first has stopped (at its refusal) and the second has
    # committed, 3 s at most: the first cannot commit once it ended
    watchdog = threading.Timer(3, lambda: (first.kill(), second.kill()))
    watchdog.start()
    lines += first.stdout.read().splitlines()
    seconds = []
    while not any(line.startswith("ok") for line in seconds):
        seconds.append(second.stdout.readline())
        if not seconds[-1]:
            break
    watchdog.cancel()
    second.kill()
    first.kill()
    seconds += second.stdout.read().splitlines()
    refusals = [line for line in lines if line.startswith("refused")]
    assert refusals and "lock.mdb was removed or replaced" in refusals[0]
    # a writer killed mid-print may leave "ok" without its batch: not reported as committed
    committed = {("first", int(line.split()[1])) for line in lines
                 if line.startswith("ok") and len(line.split()) == 2}
    committed |= {("second", int(line.split()[1])) for line in seconds
                  if line.startswith("ok") and len(line.split()) == 2}
    assert any(name == "second" for name, _ in committed)
    with DB(path) as db:
        assert db.check() == []
        stored = {tuple(r.key.split("-")[:2]) for r in db}
    assert {(name, str(batch)) for name, batch in committed} <= stored


def test_an_insert_if_new_batch_grows_the_file_as_an_insert_of_it_does(tmp_path, backend):
    """A batch of insert_if_new_many is written by one upsert at its end, on
    both backends: py-lmdb wrote one a document, each adding a run to every
    table and merging, in one transaction whose freed pages LMDB cannot
    reuse (5,000 new documents grew the file by 413 MB)."""
    rng = random.Random(4)
    stored = [(i, rng.getrandbits(64)) for i in range(1000)]
    batch = [("new%d" % i, rng.getrandbits(64)) for i in range(3000)]
    sizes = []
    for how in ("insert_many", "insert_if_new_many"):
        with DB(str(tmp_path / how), distance=3) as db:
            db.insert_many(stored)
            written = getattr(db, how)(batch)
            assert how == "insert_many" or written == [[]] * len(batch)
            assert len(db) == 4000 and db.check() == []
            sizes.append(db.stats()["disk_bytes"])
    assert sizes[1] <= 1.5 * sizes[0], sizes


def test_a_database_is_made_in_a_directory_that_exists_not_in_a_new_tree(tmp_path, backend):
    """A path whose parent is missing (a typo) is an error naming the parent:
    the whole tree was made without a word before."""
    with pytest.raises(DatabaseError, match="no directory %s to make it in" % (tmp_path / "typo")):
        DB(str(tmp_path / "typo" / "crawl.db"))
    assert not (tmp_path / "typo").exists()
    with DB(str(tmp_path / "crawl.db")) as db:  # one level is made, as LMDB's own open does
        db.insert("a", 1)


OPEN_AND_COUNT = """
import sys, simhashdb
with simhashdb.DB(sys.argv[1], readonly=sys.argv[2] == "read") as db:
    print(len(db), db.check() == [], len(db.query(1 * 7919, 2)))
"""


def test_an_index_with_some_of_its_slots_opens_and_gains_the_rest(tmp_path, backend):
    """A database whose fingerprint index has slots 0-5 of 8 (py-lmdb made them
    a commit each, so a creation killed part way left that) opens, read-only
    and writable, where every open spun for ever: a snapshot that saw a slot
    past those open took it for slots another process had added. A writable
    open adds the rest."""
    import lmdb
    path = str(tmp_path / "db")
    with DB(path, distance=3) as db:
        db.insert_many((i, i * 7919) for i in range(1000))
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        assert all(txn.get(lmdb_format.INDEX.name(slot)) is not None for slot in range(1, 8))
        for slot in (6, 7):
            txn.drop(env.open_db(lmdb_format.INDEX.name(slot), txn=txn, create=False), delete=True)
    env.close()
    for mode in ("read", "write", "read"):
        done = subprocess.run([sys.executable, "-c", OPEN_AND_COUNT, path, mode],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.split() == ["1000", "True", "1"], done.stderr
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    with env.begin() as txn:
        assert all(txn.get(lmdb_format.INDEX.name(slot)) is not None for slot in (6, 7))
    env.close()


def test_a_database_the_user_may_only_read_reads_and_refuses_writes_saying_why(tmp_path,
                                                                               backend):
    """A database directory (and files) without write permission: reading
    commands work, a write is one line that says what to do, in words for
    the command line as for the library."""
    path = tmp_path / "ro.db"
    with DB(str(path)) as db:
        db.insert_many([("a", 1), ("b", 2)])
    for item in [path, *path.iterdir()]:
        item.chmod(0o555 if item.is_dir() else 0o444)
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] \
        if os.geteuid() == 0 else []
    if drop and subprocess.run(drop + ["true"]).returncode != 0:
        pytest.skip("root here cannot drop its capabilities")
    cli = drop + [sys.executable, "-m", "simhashdb"]
    try:
        stats = subprocess.run(cli + ["stats", str(path)], capture_output=True, text=True,
                               timeout=60)
        delete = subprocess.run(cli + ["delete", str(path), "a"], capture_output=True, text=True,
                                timeout=60)
    finally:
        path.chmod(0o755)
    assert stats.returncode == 0 and json.loads(stats.stdout)["count"] == 2, stats.stderr
    assert delete.returncode == 1 and delete.stderr == (
        "simhashdb-cli: error: cannot write in %s (Permission denied): fix its permissions, or "
        "open it read-only\n" % path), delete.stderr


CREATE_AND_INSERT = """
import sys, simhashdb
with simhashdb.DB(sys.argv[1]) as db:
    db.insert(sys.argv[2], 7919)
"""


def test_two_processes_making_one_database_at_once_both_open_it(tmp_path, backend):
    """Two processes making the same new database: both open it and write.
    One could find the other's data.mdb made between its look for one and its
    listing of the directory, and refuse 'other files' (1 in 5-25 pairs, both
    backends); py-lmdb also decided a database was new in one transaction
    and made it in another, taking the other's fresh database for a foreign
    LMDB file (15 of 150 pairs)."""
    for trial in range(20):
        path = str(tmp_path / ("db%d" % trial))
        makers = [subprocess.Popen([sys.executable, "-c", CREATE_AND_INSERT, path, key],
                                   stderr=subprocess.PIPE, text=True) for key in ("a", "b")]
        errors = [maker.communicate(timeout=60)[1] for maker in makers]
        assert [maker.returncode for maker in makers] == [0, 0], errors
        with DB(path) as db:
            assert sorted(r.key for r in db) == ["a", "b"] and db.check() == []


def test_an_inspection_a_commit_overlapped_is_made_again_and_a_steady_finding_stands(
        tmp_path, monkeypatch):
    """An open beside other handles inspects a file they may commit to: a
    finding made while the file changed is looked at again, not reported."""
    from simhashdb.storage.lmdb import datafile
    with DB(str(tmp_path / "d.db")) as db:
        db.insert("a", 1)
    data = str(tmp_path / "d.db" / "data.mdb")
    real, calls = datafile.inspect_data_file, []

    def overlapped(path):
        calls.append(path)
        if len(calls) == 1:
            with open(path, "ab") as grown:  # a commit meanwhile
                grown.write(bytes(4096))
            return "its data file ends at byte 1, but pages in use run to byte 2", None
        return real(path)
    monkeypatch.setattr(datafile, "inspect_data_file", overlapped)
    assert datafile.inspect_while_written(data) == (None, None) and len(calls) == 2
    steady = lambda path: calls.append(path) or ("a steady finding", None)  # noqa: E731
    monkeypatch.setattr(datafile, "inspect_data_file", steady)
    del calls[:]
    assert datafile.inspect_while_written(data) == ("a steady finding", None) and len(calls) == 1

    def always_overlapped(path):  # a writer that commits during every look
        with open(path, "ab") as grown:
            grown.write(bytes(4096))
        return steady(path)
    monkeypatch.setattr(datafile, "inspect_data_file", always_overlapped)
    del calls[:]
    assert datafile.inspect_while_written(data) == (None, None)
    assert len(calls) == datafile.INSPECT_TRIES
