"""Format 8's documents as records under ids, found through a key map by
key hash (storage/lmdb/format.py), in the py-lmdb backend: ids given in key
order (by key hash, then key) and kept by a key written again, a key map
whose entries may sit in any of its slots (as the native engine's merges
leave them), keys of one hash, records damaged past their end or under
another key's hash, the copy that converts a file of format 7 (the key map
by key) or 6 (``docs``), and the files of both backends written from the
same batches (tests/test_record_log.py tests the native engine alone)."""

import itertools
import random
from array import array

import lmdb
import msgpack
import pytest
from conftest import (as_tuples, brute_force, documents_as_in_format_6, documents_as_in_format_7,
                      native_built, put_raw_record, raw_records, storage_of, store_values)
from test_durability import run_and_kill
from test_pylmdb_recent import raw_recent

import simhashdb
from simhashdb import DB, RECIPE, DatabaseError, fingerprint_with_signature
from simhashdb.errors import DamagedError
from simhashdb.layout import Layout
from simhashdb.records import encode_documents, with_signature
from simhashdb.storage import MAX_KEY_BYTES, registry
from simhashdb.storage.lmdb import format as lmdb_format
from simhashdb.storage.lmdb import pyview

LAYOUT = Layout(5, 3)  # DB(distance=3, blocks=5)
RECORDS, OLD_DOCS = lmdb_format.RECORDS.name(), lmdb_format.OLD_DOCS.name()
OLD_KEYS = lmdb_format.OLD_KEYS.name()
BACKEND = "py-lmdb"
native = pytest.mark.skipif(not native_built(), reason="the native backend was not built")


def record_parts(raw):
    """(key, value) of a record: its key's length (2 bytes), the key, the value."""
    end = 2 + int.from_bytes(raw[:2], "big")
    return raw[2:end], raw[end:]


def read_file(path):
    """What the file holds: {name: [(key, value)]} of its sub-databases of
    documents (records, the key map's slots, the index's slots, docs), and
    meta's next id."""
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            names = {name for name, _ in txn.cursor()}
            families = [RECORDS, OLD_DOCS, OLD_KEYS] + lmdb_format.KEYS.names() + \
                lmdb_format.INDEX.names()
            dupsort = lmdb_format.KEYS.names() + lmdb_format.INDEX.names()
            held = {name: list(txn.cursor(env.open_db(name, txn=txn, create=False,
                                                      dupsort=name in dupsort)).iternext())
                    for name in families if name in names}
            if lmdb_format.RECORD_BLOCKS.name() in names:  # the records, out of their blocks
                held[RECORDS] = sorted(raw_records(env, txn).items())
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            next_id = txn.get(lmdb_format.NEXT_ID, db=meta)
    finally:
        env.close()
    return held, None if next_id is None else int.from_bytes(next_id, "big")


def ids_of(path):
    """{key: id} of the records."""
    held, _ = read_file(path)
    return {msgpack.unpackb(record_parts(raw)[0]): int.from_bytes(doc, "big")
            for doc, raw in held[RECORDS]}


def key_map(path):
    """The key map's entries, slot by slot: [{(key hash, id)}]."""
    held, _ = read_file(path)
    return [{(k, int.from_bytes(v, "big")) for k, v in held.get(name, [])}
            for name in lmdb_format.KEYS.names()]


def order(key):
    """The key order of (unencoded) key ``key``: by its hash, then itself."""
    return lmdb_format.key_order(msgpack.packb(key))


def hashed(ids):
    """The key map's entries of {key: id}: {(key hash, id)}."""
    return {(order(key)[0], doc) for key, doc in ids.items()}


def check_exact(db, docs, probes):
    for probe in probes:
        assert [tuple(m) for m in db.query(probe, 3)] == brute_force(docs, probe, 3)


def test_new_keys_take_the_next_ids_in_key_order_and_a_key_written_again_keeps_its_own(
        tmp_path):
    """A batch's new keys take consecutive ids in key order from meta's next
    id; a key written again (its fingerprint or its value's size changed, or
    neither) keeps its id; a removed key's id is never given again, not even
    to the key itself; compaction keeps every id and the next id."""
    path, rng = str(tmp_path / "db"), random.Random(21)
    first = {"k%03d" % i: rng.getrandbits(64) for i in rng.sample(range(500), 200)}
    with DB(path, distance=3, blocks=5, backend=BACKEND) as db:
        db.insert_many(first.items())
    expected = {key: n for n, key in enumerate(sorted(first, key=order))}
    assert ids_of(path) == expected
    again = {key: first[key] ^ (n % 2) for n, key in enumerate(sorted(first)[::7])}
    new = {"k%03d" % i: rng.getrandbits(64) for i in range(500, 530)}
    gone = sorted(first)[1::9]
    with DB(path, backend=BACKEND) as db:
        db.insert_many([(key, fp, {"meta": "x" * (n % 40)})
                        for n, (key, fp) in enumerate({**again, **new}.items())])
        assert db.delete_many(gone) == len(gone)
        db.insert_many([(gone[0], 5)])
    docs = {**first, **again, **new, gone[0]: 5}
    expected.update((key, 200 + n) for n, key in enumerate(sorted(new, key=order)))
    for key in gone[1:]:
        del docs[key], expected[key]
    expected[gone[0]] = 230
    assert ids_of(path) == expected and read_file(path)[1] == 231
    with DB(path, backend=BACKEND) as db:
        assert {r.key: r.fingerprint for r in db} == docs
        assert db.get(sorted(again)[3]).meta == {"meta": "x" * 3}
        check_exact(db, docs, [docs[k] ^ 0b101 for k in rng.sample(sorted(docs), 30)] + [5])
        db.compact()
        check_exact(db, docs, [docs[k] ^ 0b11 for k in rng.sample(sorted(docs), 30)])
    assert ids_of(path) == expected and read_file(path)[1] == 231


def spread_key_map(path, rng):
    """Deal the key map's entries out over its slots at random, as the native
    engine's merges may leave them."""
    env = lmdb.open(path, max_dbs=4096, lock=False)
    with env.begin(write=True) as txn:
        slots = [env.open_db(name, txn=txn, dupsort=True) for name in lmdb_format.KEYS.names()]
        entries = list(txn.cursor(slots[0]).iternext())
        txn.drop(slots[0], delete=False)
        for key, doc in entries:
            txn.put(key, doc, db=slots[rng.choice([0, 1, 3, 6])])
    env.close()


def test_py_lmdb_reads_and_writes_keys_in_any_slot_of_the_key_map(tmp_path):
    """Entries spread over the key map's slots: py-lmdb reads the union (get,
    documents from a key on, queries), replaces and removes a key in the
    slot that holds its entry (its id kept; never a second entry), puts new
    entries in the first slot, and compaction merges every slot into the
    first."""
    path, rng = str(tmp_path / "db"), random.Random(22)
    docs = {"k%03d" % i: rng.getrandbits(64) for i in range(400)}
    with DB(path, distance=3, blocks=5, backend=BACKEND) as db:
        db.insert_many(docs.items())
    ids = ids_of(path)
    spread_key_map(path, rng)
    assert sum(bool(slot) for slot in key_map(path)) == 4
    with DB(path, backend=BACKEND) as db:
        ordered = sorted(docs, key=order)
        assert [r.key for r in db] == ordered
        with storage_of(db).read() as view:
            after = itertools.islice(view.documents(msgpack.packb(ordered[199])), 2)
            assert [key for key, _ in after] == [msgpack.packb(k) for k in ordered[200:202]]
        assert [db.get(k).fingerprint for k in ("k000", "k399")] == [docs["k000"], docs["k399"]]
        changed = {key: docs[key] ^ 0b1 if n % 2 else docs[key]
                   for n, key in enumerate(rng.sample(sorted(docs), 60))}
        db.insert_many(list(changed.items()) + [("n%d" % i, i) for i in range(20)])
        gone = rng.sample(sorted(set(docs) - set(changed)), 30)
        db.delete_many(gone)
        docs.update(changed)
        docs.update(("n%d" % i, i) for i in range(20))
        for key in gone:
            del docs[key]
        check_exact(db, docs, [docs[k] ^ 0b110 for k in rng.sample(sorted(docs), 40)])
    slots = key_map(path)
    assert sum(len(slot) for slot in slots) == len(docs)
    assert set().union(*slots) == hashed(ids_of(path))
    assert all(ids_of(path)[key] == ids[key] for key in changed)
    assert hashed({key: ids_of(path)[key] for key in ("n%d" % i for i in range(20))}) <= slots[0]
    with DB(path, backend=BACKEND) as db:
        db.compact()
        assert {r.key: r.fingerprint for r in db} == docs
    assert [len(slot) for slot in key_map(path)] == [len(docs)] + [0] * 7


def fifty_documents(path):
    """Make a database of documents 0 to 49 at ``path``; returns document 7's id (bytes)."""
    with DB(path, distance=3, blocks=5, backend=BACKEND) as db:
        db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(50))
    return ids_of(path)[7].to_bytes(8, "big")


def test_a_record_whose_key_runs_past_its_end_is_a_database_error(tmp_path):
    """A record whose key's length runs past the record is damage: reading
    the document, iterating, replacing and removing it raise DatabaseError."""
    path = str(tmp_path / "db")
    doc = fifty_documents(path)
    env = lmdb.open(path, max_dbs=4096, lock=False)
    with env.begin(write=True) as txn:
        put_raw_record(env, txn, doc, b"\x01\x00" + msgpack.packb(7))
    env.close()
    with DB(path, backend=BACKEND) as db:
        for call in (lambda: db.get(7), lambda: list(db), lambda: db.insert(7, 1),
                     lambda: db.delete(7), lambda: db.query(7 * 0x9E3779B97F4A7C15 % 2**64)):
            with pytest.raises(DatabaseError, match="damaged"):
                call()
        assert db.get(8).fingerprint == 8 * 0x9E3779B97F4A7C15 % 2**64


REAL_HASH = lmdb_format.key_hash


def colliding_hash(key):
    """A key hash of four values, so that many keys share each."""
    return bytes(7) + bytes([REAL_HASH(key)[-1] & 3])


@pytest.mark.parametrize("hashes", ["real", "colliding"])
def test_documents_by_key_hash_then_key_from_any_key_and_keys_sharing_a_hash(
        tmp_path, monkeypatch, hashes):
    """Documents are listed by (key hash, key), from any key on, stored or
    not, across chunks of hashes; ids go in that order; get, upsert (a key
    written again keeps its id), remove, queries and compaction answer as a
    dict does, also where many keys share a hash (``colliding``: the test
    replaces format.key_hash, which the backend calls, by one of four
    values): their records are read and the others' keys passed over."""
    if hashes == "colliding":
        monkeypatch.setattr(lmdb_format, "key_hash", colliding_hash)
    monkeypatch.setattr(pyview, "CHUNK", 3)  # (hashes a chunk of documents() reads)
    path, rng = str(tmp_path / "db"), random.Random(27)
    docs = {"k%03d" % i: rng.getrandbits(64) for i in range(0, 300, 2)}
    with DB(path, distance=3, blocks=5, backend=BACKEND) as db:
        db.insert_many(docs.items())
    ids = ids_of(path)
    assert ids == {key: n for n, key in enumerate(sorted(docs, key=order))}
    assert set().union(*key_map(path)) == hashed(ids)
    again = {key: docs[key] ^ (n % 2) for n, key in enumerate(rng.sample(sorted(docs), 40))}
    new = {"k%03d" % i: rng.getrandbits(64) for i in range(1, 60, 2)}
    gone = rng.sample(sorted(set(docs) - set(again)), 30)
    with DB(path, backend=BACKEND) as db:
        db.insert_many(list(again.items()) + list(new.items()))
        assert db.delete_many(gone + ["k999", 5]) == len(gone)
        docs.update(again)
        docs.update(new)
        for key in gone:
            del docs[key]
        ordered = sorted(docs, key=order)
        for compacted in (False, True):
            assert [r.key for r in db] == ordered
            assert [db.get(key) and db.get(key).fingerprint for key in ("k998", 5, *ordered)] \
                == [None, None] + [docs[key] for key in ordered]
            with storage_of(db).read() as view:
                for after in ordered[::17] + ["k%03d" % i for i in range(61, 300, 23)] + [5]:
                    assert [msgpack.unpackb(key) for key, _ in view.documents(
                        msgpack.packb(after))] == [k for k in ordered if order(k) > order(after)]
            check_exact(db, docs, [docs[k] ^ 0b1101 for k in rng.sample(ordered, 30)])
            assert db.check() == []
            db.compact()
    assert {key: ids_of(path)[key] for key in again} == {key: ids[key] for key in again}
    assert sorted(ids_of(path).values())[-len(new):] == list(range(150, 150 + len(new)))
    assert [ids_of(path)[key] for key in sorted(new, key=order)] == list(range(150, 180))
    assert set().union(*key_map(path)) == hashed(ids_of(path))


def test_a_record_under_another_keys_hash_is_damage(tmp_path):
    """The key map naming a document under a hash its key does not have
    (its entry moved under another key's hash): every call that reads that
    hash's documents raises DamagedError, never another key's document."""
    path = str(tmp_path / "db")
    doc = fifty_documents(path)
    env = lmdb.open(path, max_dbs=4096, lock=False)
    with env.begin(write=True) as txn:
        first = env.open_db(lmdb_format.KEYS.name(0), txn=txn, dupsort=True)
        assert txn.delete(order(7)[0], doc, db=first)
        txn.put(order(8)[0], doc, db=first)
    env.close()
    with DB(path, backend=BACKEND) as db:
        for call in (lambda: db.get(8), lambda: list(db), lambda: db.insert(8, 1),
                     lambda: db.delete(8), lambda: db.insert_many([(9, 2), (8, 3)])):
            with pytest.raises(DamagedError, match="damaged"):
                call()
        assert db.get(9).fingerprint == 9 * 0x9E3779B97F4A7C15 % 2**64


AS_IN = {6: documents_as_in_format_6, 7: documents_as_in_format_7}


def old_documents(held):
    """The (key, value) documents of a file of format 6 (``docs``) or 7 (its records)."""
    return held[OLD_DOCS] if OLD_DOCS in held else [record_parts(raw) for _, raw in held[RECORDS]]


@pytest.mark.parametrize("old_format", sorted(AS_IN))
def test_a_database_of_an_earlier_format_opens_as_it_is_and_its_copy_converts_it(
        tmp_path, old_format):
    """A file that keeps its documents in ``docs`` (format 6) or its key map
    by key (``keys``, format 7) opens read-only and writable without gaining
    a sub-database (``old_documents``; its documents are not read: that says
    to upgrade); compaction's copy writes it in format 8: ids in key order,
    the next id after them, every key map and index entry in the first
    slot, the tables and bands rebuilt, and every read as before."""
    path, rng = str(tmp_path / "db"), random.Random(23)
    docs = {i * 7: rng.getrandbits(64) for i in range(300)}
    words = ["w%d" % i for i in range(80)]
    texts = {"t%d" % i: " ".join(rng.choice(words) for _ in range(40)) for i in range(30)}
    with DB(path, distance=3, blocks=5, recipe=RECIPE, backend=BACKEND) as db:
        db.insert_many(list(docs.items())[:150])
        db.insert_text_many(texts.items())
        db.insert_many(list(docs.items())[150:])
        db.delete_many(range(0, 700, 21))
        fps = {r.key: r.fingerprint for r in db}
        with storage_of(db).read() as view:
            bands = [sorted(view.band_entries(band)) for band in range(lmdb_format.BANDS)]
    AS_IN[old_format](path)
    before = read_file(path)
    documents = sorted(old_documents(before[0]), key=lambda doc: lmdb_format.key_order(doc[0]))
    for readonly in (True, False):
        storage = registry.open_storage(path, readonly=readonly, backend=BACKEND)
        try:
            storage.open_tables(LAYOUT)
            assert storage.shared.old_documents
            with storage.read() as view, pytest.raises(DatabaseError, match="upgrade"):
                view.count()
        finally:
            storage.close()
        assert read_file(path) == before
    probes = [fp ^ 0b1001 for fp in rng.sample(sorted(fps.values()), 40)]
    storage = registry.open_storage(path, backend=BACKEND)
    try:
        storage.open_tables(LAYOUT)
        storage.compact()
        assert not storage.shared.old_documents
        with storage.read() as view:
            assert list(view.documents()) == documents and view.count() == len(documents)
            assert [sorted(view.band_entries(band)) for band in range(lmdb_format.BANDS)] == bands
            for probe, found in zip(probes, view.search(array("Q", probes), 3)):
                assert sorted((msgpack.unpackb(key), fp, d) for key, fp, d in found) == \
                    sorted(brute_force(fps, probe, 3))
    finally:
        storage.close()
    held, next_id = read_file(path)
    numbered = [(n.to_bytes(8, "big"), key) for n, (key, _) in enumerate(documents)]
    assert OLD_DOCS not in held and OLD_KEYS not in held and next_id == len(documents)
    assert [(doc, record_parts(raw)[0]) for doc, raw in held[RECORDS]] == numbered
    assert held[lmdb_format.KEYS.name(0)] == [(lmdb_format.key_hash(key), doc)
                                              for doc, key in numbered]
    assert held[lmdb_format.INDEX.name(0)] == sorted(
        (fps[msgpack.unpackb(key)].to_bytes(8, "big"), doc) for doc, key in numbered)
    others = lmdb_format.KEYS.names()[1:] + lmdb_format.INDEX.names()[1:]
    assert not any(held[name] for name in others)


def test_a_database_of_format_7_is_refused_until_upgraded_then_answers_as_before(tmp_path):
    """A file of format 7 (0.8): DB refuses it, saying to upgrade it;
    upgrade converts it, and every document, query and text query answers
    as before."""
    path, rng = str(tmp_path / "db"), random.Random(26)
    words = ["w%d" % i for i in range(200)]
    texts = {"https://example.org/%d" % i: " ".join(rng.choice(words) for _ in range(60))
             for i in range(120)}
    text_probes = [text.replace("w1 ", "w2 ") for text in rng.sample(sorted(texts.values()), 20)]
    with DB(path, distance=3, recipe=RECIPE, backend=BACKEND) as db:
        db.insert_text_many(texts.items())
        db.insert_many([(i, rng.getrandbits(64), {"n": i}) for i in range(400)])
        db.delete_many(range(0, 400, 9))

        def answers(db):
            records = {r.key: (r.fingerprint, r.meta) for r in db}
            near = [sorted(as_tuples(db.query(fp ^ 0b101, 4)))
                    for fp, _ in list(records.values())[::7]]
            text = [sorted((m.key, m.fingerprint, round(m.resemblance, 9)) for m in found)
                    for found in db.query_text_many(text_probes)]
            return records, near, text

        before = answers(db)
    assert any(before[2])
    documents_as_in_format_7(path)
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="format 7.*simhashdb-cli upgrade"):
            DB(path, readonly=readonly, backend=BACKEND)
    simhashdb.upgrade(path, backend=BACKEND)
    with DB(path, backend=BACKEND) as db:
        assert answers(db) == before
        assert db.check() == []
    assert ids_of(path) == {key: n for n, key in enumerate(sorted(before[0], key=order))}


KILLED_WRITER = """
import sys
from simhashdb import DB
path, start = sys.argv[1], int(sys.argv[2])
def key(b, i):
    return "https://example.org/%d/%d/" % (b, i) + "k" * 80
with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
    db.delete_many(key(start - 2, i) for i in range(0, 400, 2))  # (a killed writer's may not have landed)
    print("open", flush=True)
    for b in range(start, start + 1000):
        db.insert_many((key(b, i), (b * 7919 + i * 104729) % 2**64) for i in range(400))
        db.delete_many(key(b - 1, i) for i in range(0, 400, 2))
        print(b, flush=True)
"""


@pytest.mark.slow
def test_sigkill_while_the_key_map_is_written_keeps_every_batch_whole(tmp_path):
    """A py-lmdb writer whose removals write the records, key map and index
    whole again every few batches (past a quarter of the documents), killed
    at random moments: each batch there whole (or its removals whole), the
    key map one entry a record under its key's hash, check() clean."""
    path, rng, start = str(tmp_path / "db"), random.Random(28), 0

    def key(b, i):
        return "https://example.org/%d/%d/" % (b, i) + "k" * 80

    for _ in range(3):
        printed = run_and_kill(KILLED_WRITER, [path, str(start)], 1, rng.uniform(0.3, 1.0))
        assert printed[0] == "open"
        with DB(path, backend=BACKEND) as db:
            start = next(b for b in itertools.count() if key(b, 1) not in db)
            assert start >= (int(printed[-1]) + 1 if printed[1:] else 0)
            evens = [b for b in range(start) if key(b, 0) in db]
            assert evens in ([start - 1], [start - 2, start - 1]) or not start, \
                "removals landed in part"
            assert {r.key for r in db} == {key(b, i) for b in range(start) for i in range(400)
                                           if i % 2 or b in evens}
            assert db.check() == []
        assert set().union(*key_map(path)) == hashed(ids_of(path))


def same_steps(rng):
    """Batches for each backend to write alike: documents new and written
    again (other fingerprints, other metadata), removals within a quarter
    and past it, and texts (values with their signatures), all stored at
    fixed times."""
    keys = ["https://example.org/%05d" % i for i in range(3000)]
    words = ["w%d" % i for i in range(300)]
    steps = []
    for step in range(12):
        if step % 3 == 0:
            steps.append(("insert", [(key, rng.getrandbits(64), {"step": step} if n % 3 else None,
                                      10**9 + step) for n, key in
                                     enumerate(rng.sample(keys, rng.choice([10, 400, 1500])))]))
        elif step % 3 == 1:
            steps.append(("delete", rng.sample(keys, rng.choice([5, 300, 900]))))
        else:
            texts = [(key, " ".join(rng.choice(words) for _ in range(50)))
                     for key in rng.sample(keys, 60)]
            plain = encode_documents([(key, fingerprint_with_signature(text)[0])
                                      for key, text in texts], MAX_KEY_BYTES, 10**9 + step)
            steps.append(("texts", [(key, fp, with_signature(value, fingerprint_with_signature(
                text)[1])) for (_, fp, value), (key, text) in zip(plain, texts)]))
    return steps


@native
def test_each_backend_reads_and_writes_the_file_the_other_wrote_from_the_same_batches(tmp_path):
    """The same batches written by each backend into a file of its own: the
    records are the same bytes under the same ids, meta's next id the same,
    the key map and the index hold the same entries (their slots may
    differ), recent the same records (appended, and written out as runs
    before rewrites) and counter, and each backend reads the other's file
    (recent not empty) as the writer does, then writes a batch more into it."""
    steps, paths = same_steps(random.Random(24)), {}
    for backend in ("lmdb", "py-lmdb"):
        paths[backend] = path = str(tmp_path / backend)
        with DB(path, distance=3, blocks=5, recipe=RECIPE, backend=backend) as db:
            for kind, batch in steps:
                if kind == "insert":
                    db.insert_many(batch)
                elif kind == "delete":
                    db.delete_many(batch)
                else:
                    store_values(db, batch)
            fps = {r.key: r.fingerprint for r in db}
            with storage_of(db).read() as view:
                bands = [sorted(view.band_entries(band)) for band in range(lmdb_format.BANDS)]
    (native, native_id), (python, python_id) = (read_file(paths[b]) for b in ("lmdb", "py-lmdb"))
    assert native[RECORDS] == python[RECORDS] and native_id == python_id
    assert raw_recent(paths["lmdb"]) == raw_recent(paths["py-lmdb"]) and \
        raw_recent(paths["lmdb"])[0]
    for family in (lmdb_format.KEYS, lmdb_format.INDEX):
        assert sorted(e for name in family.names() for e in native.get(name, [])) == \
            sorted(e for name in family.names() for e in python.get(name, []))
    rng = random.Random(25)
    probes = [fp ^ 0b1011 for fp in rng.sample(sorted(fps.values()), 40)]
    for writer, reader in (("lmdb", "py-lmdb"), ("py-lmdb", "lmdb")):
        with DB(paths[writer], backend=reader) as db:
            assert {r.key: r.fingerprint for r in db} == fps
            check_exact(db, fps, probes)
            with storage_of(db).read() as view:
                assert [sorted(view.band_entries(b)) for b in range(lmdb_format.BANDS)] == bands
            db.insert_many([("https://example.org/new", 7), (sorted(fps)[0], 8)])
            assert db.check() == []
            check_exact(db, {**fps, "https://example.org/new": 7, sorted(fps)[0]: 8}, [7, 8])
