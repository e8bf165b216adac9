"""Format 7's documents as records under ids (storage/lmdb/format.py) in the
native engine: ids given and kept, the key map in one slot per key, a file of
format 6 opened without change and converted by the copy, damage, and SIGKILL
during the key map's merges."""

import random
import signal
import subprocess
import sys
import time

import lmdb
import pytest
from conftest import STORAGE_LAYOUT, documents_as_in_format_6

from simhashdb import DB, DatabaseError, records
from simhashdb.storage import MAX_KEY_BYTES, registry
from simhashdb.storage.lmdb import format

pytest.importorskip("simhashdb._lmdb")
pytestmark = pytest.mark.lmdb_only
ID = format.ID_BYTES
RECORDS, OLD_DOCS, META = format.RECORDS.name(), format.OLD_DOCS.name(), format.META.name()


def open_native(path, readonly=False):
    storage = registry.open_storage(path, readonly=readonly, backend="lmdb")
    storage.open_tables(STORAGE_LAYOUT)
    return storage


def put(storage, pairs):
    storage.write(lambda txn: txn.upsert(records.encode_documents(pairs, MAX_KEY_BYTES, 1000)))


def file_state(path):
    """{sub-database name: [(key, value)]} of what the file holds, read with py-lmdb."""
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            names = [name for name, _ in txn.cursor()]
            state = {}
            for name in names:
                db = env.open_db(name, txn=txn, create=False,
                                 dupsort=name in format.INDEX.names())
                state[name] = list(txn.cursor(db))
            return state
    finally:
        env.close()


def key_map(state):
    """{key: id} of the key map's slots, a key in one slot only."""
    entries = [(k, int.from_bytes(v, "big")) for name in format.KEYS.names()
               for k, v in state.get(name, [])]
    assert len({k for k, _ in entries}) == len(entries), "a key in two slots"
    return dict(entries)


def test_new_keys_take_ids_in_key_order_and_keep_them(tmp_path):
    """A batch's new keys take the next ids in key order, appended; a key
    written again keeps its id (the record replaced, the index moved where
    its fingerprint changed); a removed key's id is never given again."""
    path = str(tmp_path / "db")
    storage = open_native(path)
    put(storage, [("c", 3), ("a", 1), ("b", 2)])
    put(storage, [("b", 20), ("d", 4), ("a", 1)])
    storage.write(lambda txn: txn.remove([records.encode_key("c")]))
    put(storage, [("c", 30)])
    with storage.read() as view:
        assert {records.unpack(k): records.value_fingerprint(v) for k, v in view.documents()} == \
            {"a": 1, "b": 20, "c": 30, "d": 4}
        assert view.keys_of(2) == [] and view.keys_of(20) == [records.encode_key("b")]
    storage.close()
    state = file_state(path)
    ids = {records.unpack(k): i for k, i in key_map(state).items()}
    assert ids == {"a": 0, "b": 1, "c": 4, "d": 3}
    assert [int.from_bytes(k, "big") for k, _ in state[RECORDS]] == [0, 1, 3, 4]
    for id_bytes, record in state[RECORDS]:  # the key's length, the key, the value
        size = int.from_bytes(record[:format.KEY_LENGTH_BYTES], "big")
        key = record[format.KEY_LENGTH_BYTES:format.KEY_LENGTH_BYTES + size]
        assert ids[records.unpack(key)] == int.from_bytes(id_bytes, "big")
    index = sorted((int.from_bytes(k, "big"), int.from_bytes(v, "big"))
                   for name in format.INDEX.names() for k, v in state.get(name, []))
    assert index == [(1, 0), (4, 3), (20, 1), (30, 4)]
    meta = dict(state[META])
    assert int.from_bytes(meta[format.NEXT_ID], "big") == 5


def test_a_file_of_format_6_opens_unchanged_and_its_copy_is_format_7(tmp_path):
    """A file with ``docs`` opens read-only and writable without gaining
    records or a key map (old_documents says so, and reads of its documents
    are refused, saying to upgrade it); compaction's copy writes
    its documents as records, ids in key order, with the index, tables and
    bands rebuilt: the same documents and searches after."""
    path = str(tmp_path / "db")
    rng = random.Random(5)
    pairs = [("page%d" % i, rng.getrandbits(64)) for i in range(3000)]
    pairs += [("twin%d" % i, pairs[i][1]) for i in range(0, 3000, 100)]
    storage = open_native(path)
    put(storage, pairs)
    storage.write(lambda txn: txn.remove([records.encode_key("page%d" % i) for i in range(1, 3000, 7)]))
    with storage.read() as view:
        before = list(view.documents())
        searched = view.search(__import__("array").array("Q", [fp ^ 5 for _, fp in pairs[:50]]), 3)
    storage.close()
    documents_as_in_format_6(path)
    names = set(file_state(path))
    for readonly in (True, False):
        storage = open_native(path, readonly=readonly)
        assert storage.old_documents
        with storage.read() as view, pytest.raises(DatabaseError, match="upgrade"):
            view.count()
        storage.close()
        assert set(file_state(path)) == names
    storage = open_native(path)
    storage.compact()
    assert not storage.old_documents
    with storage.read() as view:
        assert list(view.documents()) == before
        assert [sorted(hits) for hits in view.search(__import__("array").array(
            "Q", [fp ^ 5 for _, fp in pairs[:50]]), 3)] == [sorted(hits) for hits in searched]
    assert storage.check() == []
    storage.close()
    state = file_state(path)
    assert OLD_DOCS not in state
    ordered = sorted(key_map(state).items())
    assert [i for _, i in ordered] == list(range(len(before)))
    assert int.from_bytes(dict(state[META])[format.NEXT_ID], "big") == len(before)
    with DB(path) as db:
        assert db.check() == []


def test_a_record_whose_key_runs_past_it_is_damage(tmp_path):
    """A record's key length past its end raises DatabaseError on every read
    of it, never a fault or garbage."""
    path = str(tmp_path / "db")
    storage = open_native(path)
    put(storage, [("a", 1), ("b", 2)])
    storage.close()
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        db = env.open_db(RECORDS, txn=txn)
        txn.put((1).to_bytes(ID, "big"), b"\x01\xff" + b"b", db=db)
    env.close()
    storage = open_native(path)
    with storage.read() as view:
        assert view.get(records.encode_key("a")) is not None
        for read in (lambda: view.get(records.encode_key("b")), lambda: list(view.documents()),
                     lambda: view.keys_of(2), lambda: view.search(
                         __import__("array").array("Q", [2]), 0)):
            with pytest.raises(DatabaseError):
                read()
    storage.close()


KEY_WRITER = """
import sys
from simhashdb import DB
from simhashdb.storage.lmdb import native
native.NativeStorage.batch_merge = 3000  # merges of the key map's slots left for tidy
path, start = sys.argv[1], int(sys.argv[2])
with DB(path, distance=3, blocks=5) as db:
    print("open", flush=True)
    for b in range(start, start + 40):
        db.insert_many((("%d-%d-" % (b, i)) + "k" * 150, (b * 7919 + i * 104729) % 2**64)
                       for i in range(1000))
        print(b, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_the_key_maps_merges_keeps_every_batch_whole(tmp_path):
    """A writer whose batches of long keys make the key map merge (in the
    batch and in tidy), killed at random moments: each committed batch is
    there whole, every key in one slot, and check() finds nothing wrong."""
    path, rng, start = str(tmp_path / "db"), random.Random(3), 0
    for _ in range(4):
        child = subprocess.Popen([sys.executable, "-c", KEY_WRITER, path, str(start)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "open"
        time.sleep(rng.uniform(0.2, 1.0))
        child.send_signal(signal.SIGKILL)
        printed = child.communicate()[0].split()
        with DB(path) as db:
            assert len(db) % 1000 == 0, "a batch landed in part"
            start = len(db) // 1000
            assert start >= (int(printed[-1]) + 1 if printed else 0)
            assert db.check() == []
            for b in range(start):
                assert db.get(("%d-%d-" % (b, 999)) + "k" * 150) is not None
        assert len(key_map(file_state(path))) == start * 1000
