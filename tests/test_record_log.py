"""The documents as records under ids, found by the key's hash (format 8,
storage/lmdb/format.py), in the native engine: ids given in key order and
kept, the key map's one entry a document, keys whose hashes collide, files of
format 6 and 7 opened without change and converted by the copy, damage, and
SIGKILL during the key map's merges."""

import random
import signal
import subprocess
import sys
import time

import lmdb
import pytest
from conftest import (STORAGE_LAYOUT, documents_as_in_format_6, documents_as_in_format_7,
                      put_raw_record, raw_records)

from simhashdb import DB, DatabaseError, records
from simhashdb.db import FORMAT_VERSION
from simhashdb.errors import DamagedError
from simhashdb.storage import MAX_KEY_BYTES, registry
from simhashdb.storage.lmdb import format, native

pytest.importorskip("simhashdb._lmdb")
pytestmark = pytest.mark.lmdb_only
ID = format.ID_BYTES
RECORDS, OLD_DOCS, META = format.RECORDS.name(), format.OLD_DOCS.name(), format.META.name()
BLOCKS = format.RECORD_BLOCKS.name()


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
                                 dupsort=name in format.INDEX.names() + format.KEYS.names())
                state[name] = list(txn.cursor(db))
            if BLOCKS in state:  # the records, out of their blocks
                state[RECORDS] = sorted(raw_records(env, txn).items())
            return state
    finally:
        env.close()


def record_key(record):
    """The encoded key a stored record holds."""
    return record[format.KEY_LENGTH_BYTES:format.KEY_LENGTH_BYTES + int.from_bytes(
        record[:format.KEY_LENGTH_BYTES], "big")]


def key_map(state):
    """{key: id} from the key map's slots: one entry a record, in one slot,
    under its key's hash."""
    keys = {int.from_bytes(i, "big"): record_key(record) for i, record in state[RECORDS]}
    entries = [(k, int.from_bytes(v, "big")) for name in format.KEYS.names()
               for k, v in state.get(name, [])]
    assert sorted(i for _, i in entries) == sorted(keys), "not one entry a record"
    assert all(format.key_hash(keys[i]) == k for k, i in entries), "an entry under another hash"
    return {keys[i]: i for _, i in entries}


def in_key_order(keys):
    return sorted(keys, key=lambda key: format.key_order(records.encode_key(key)))


def test_new_keys_take_ids_in_key_order_and_keep_them(tmp_path):
    """A batch's new keys take the next ids in key order (their hashes, then
    the keys), appended; a key written again keeps its id (the record
    replaced, the index moved where its fingerprint changed); a removed key's
    id is never given again."""
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
    first = {key: i for i, key in enumerate(in_key_order("abc"))}
    assert ids == {"a": first["a"], "b": first["b"], "c": 4, "d": 3}
    assert [int.from_bytes(k, "big") for k, _ in state[RECORDS]] == sorted(ids.values())
    index = sorted((int.from_bytes(k, "big"), int.from_bytes(v, "big"))
                   for name in format.INDEX.names() for k, v in state.get(name, []))
    assert index == [(1, ids["a"]), (4, 3), (20, ids["b"]), (30, 4)]
    meta = dict(state[META])
    assert int.from_bytes(meta[format.NEXT_ID], "big") == 5


def test_a_file_of_format_6_opens_unchanged_and_its_copy_is_format_8(tmp_path):
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
    ordered = sorted(key_map(state).items(), key=lambda item: format.key_order(item[0]))
    assert [i for _, i in ordered] == list(range(len(before)))
    assert int.from_bytes(dict(state[META])[format.NEXT_ID], "big") == len(before)
    with DB(path) as db:
        assert db.check() == []


def damaged(path, damage):
    """The native storage at ``path`` of documents "a" and "b", reopened once
    ``damage(env, txn, b's id as bytes)`` wrote to its file with py-lmdb."""
    storage = open_native(path)
    put(storage, [("a", 1), ("b", 2)])
    storage.close()
    b_id = key_map(file_state(path))[records.encode_key("b")].to_bytes(ID, "big")
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        damage(env, txn, b_id)
    env.close()
    return open_native(path)


def test_a_record_whose_key_runs_past_it_is_damage(tmp_path):
    """A record's key length past its end raises DatabaseError on every read
    of it, never a fault or garbage."""
    storage = damaged(str(tmp_path / "db"), lambda env, txn, b_id: put_raw_record(
        env, txn, b_id, b"\x01\xff" + b"b"))
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
    """A writer whose batches make the key map merge (in the batch and in
    tidy), killed at random moments: each committed batch is there whole,
    each record's one key map entry in one slot under its key's hash, and
    check() finds nothing wrong."""
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


def test_a_file_of_format_7_is_refused_until_upgrade_converts_it(tmp_path):
    """A file whose key map is by key (format 7) opens read-only and writable
    without change, DB refuses it saying to upgrade, and upgrade() writes it
    in format 8: ids anew in key order, the same documents, queries and text
    decisions."""
    import simhashdb
    rng = random.Random(7)
    words = ["w%d" % i for i in range(2000)]
    texts = {"t%d" % i: " ".join(rng.choice(words) for _ in range(80)) for i in range(150)}
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_text_many(texts.items())
        db.insert_many(("f%d" % i, rng.getrandbits(64)) for i in range(2000))
        db.delete_many(["f%d" % i for i in range(0, 2000, 9)] + ["t3", "t4"])
        probes = [fp ^ 3 for fp in rng.sample([r.fingerprint for r in db], 100)]
        before = (sorted((r.key, r.fingerprint) for r in db), [sorted(db.query(p)) for p in probes],
                  [sorted(m.key for m in found)
                   for found in db.query_text_many(list(texts.values()))])
    documents_as_in_format_7(path)
    names = set(file_state(path))
    for readonly in (True, False):
        with pytest.raises(DatabaseError, match="0.8 and earlier.*simhashdb-cli upgrade"):
            DB(path, readonly=readonly)
        assert set(file_state(path)) == names
    simhashdb.upgrade(path)
    with DB(path) as db:
        assert db.stats()["format"] == FORMAT_VERSION and db.check() == []
        assert (sorted((r.key, r.fingerprint) for r in db), [sorted(db.query(p)) for p in probes],
                [sorted(m.key for m in found) for found in db.query_text_many(list(texts.values()))]
                ) == before
    state = file_state(path)
    assert format.OLD_KEYS.name() not in state
    ordered = sorted(key_map(state).items(), key=lambda item: format.key_order(item[0]))
    assert [i for _, i in ordered] == list(range(len(before[0])))


MASK = 2**64 - 1
C1, C2 = 0x87c37b91114253d5, 0x4cf5ad432745937f  # fast_hash's word mixing (ext/_hash.pxi)


def rotl(x, r):
    return (x << r | x >> (64 - r)) & MASK


def mix(word):
    return rotl(word * C1 & MASK, 31) * C2 & MASK


def unmix(mixed):
    return rotl(mixed * pow(C2, -1, 2**64) & MASK, 33) * pow(C1, -1, 2**64) & MASK


def after_first_word(encoded):
    """fast_hash's state after the first 8 bytes of ``encoded``."""
    h = 0x9E3779B97F4A7C15 ^ (len(encoded) * 0xC2B2AE3D27D4EB4F & MASK)
    h ^= mix(int.from_bytes(encoded[:8], "little"))
    return (rotl(h, 27) * 5 + 0x52dce729) & MASK


def colliding_keys(count):
    """``count`` bytes keys whose encoded forms (msgpack bin 8 of 16 bytes)
    share their fast_hash: the second word of each is chosen (the mixing is
    invertible) so that the states after it agree; the rest is the same."""
    tail, second = b"zz", 0x0123456789ABCDEF
    keys = [b"first:" + second.to_bytes(8, "little") + tail]
    target = after_first_word(records.encode_key(keys[0])) ^ mix(second)
    for i in range(1, count):
        head = b"key%03d" % i
        state = after_first_word(records.encode_key(head + bytes(10)))
        keys.append(head + unmix(target ^ state).to_bytes(8, "little") + tail)
    return keys


def test_keys_whose_hashes_collide_are_each_found_written_and_removed(tmp_path, monkeypatch):
    """Keys sharing their 64-bit hash (real collisions of fast_hash) among
    others: get, get_many, upsert, remove (in place and by writing the key
    map again) and documents (in chunks of 2, from keys stored or not) keep
    to a dict, the key map holding each document once under the hash."""
    monkeypatch.setattr(native, "ITEMS_PER_READ", 2)
    colliding = colliding_keys(5)
    assert len({format.key_hash(records.encode_key(k)) for k in colliding}) == 1
    path, rng = str(tmp_path / "db"), random.Random(9)
    storage = open_native(path)
    expected = {}

    def store(pairs):
        put(storage, pairs)
        expected.update(pairs)

    def gone(keys):
        assert storage.write(lambda txn: txn.remove([records.encode_key(k) for k in keys])) == \
            len([k for k in keys if expected.pop(k, None) is not None])

    store([(colliding[0], 1), (colliding[2], 2), ("x", 3)])
    store([(colliding[1], 4), (colliding[3], 5), (colliding[2], 6)] +
          [("k%d" % i, rng.getrandbits(64)) for i in range(12)])
    gone([colliding[2], "k1", "absent"])
    store([(colliding[4], 7), (colliding[0], 8)])
    gone([colliding[1]] + ["k%d" % i for i in range(2, 10)])  # most of it: written again
    order = in_key_order(expected)
    with storage.read() as view:
        assert [view.get(records.encode_key(k)) is not None for k in colliding] == \
            [k in expected for k in colliding]
        values = view.get_many([records.encode_key(k) for k in colliding + ["x", "nope"]])
        assert [v and records.value_fingerprint(v) for v in values] == \
            [expected.get(k) for k in colliding + ["x", "nope"]]
        assert [records.unpack(k) for k, _ in view.documents()] == order
        for after in order + [colliding[1], colliding[2], "nope"]:
            encoded = records.encode_key(after)
            assert [records.unpack(k) for k, _ in view.documents(encoded)] == \
                [k for k in order
                 if format.key_order(records.encode_key(k)) > format.key_order(encoded)]
    assert storage.check() == []
    storage.close()
    assert sorted(key_map(file_state(path))) == sorted(records.encode_key(k) for k in expected)


def test_a_record_under_another_keys_hash_is_damage(tmp_path):
    """A key map entry naming a record whose key has another hash: reads of
    that hash (get, documents) and writes of its key raise DamagedError."""
    storage = damaged(str(tmp_path / "db"), lambda env, txn, b_id: txn.put(
        format.key_hash(records.encode_key("c")), b_id,
        db=env.open_db(format.KEYS.name(0), txn=txn, dupsort=True)))
    with storage.read() as view:
        assert records.value_fingerprint(view.get(records.encode_key("a"))) == 1
        for read in (lambda: view.get(records.encode_key("c")), lambda: list(view.documents())):
            with pytest.raises(DamagedError):
                read()
    with pytest.raises(DamagedError):
        put(storage, [("c", 3)])
    storage.close()
