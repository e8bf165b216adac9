"""The py-lmdb backend keeps its tables as runs in the native backend's format
(RUNS.md): the block codec in _ext codes what native codes byte for byte,
each backend searches and extends what the other wrote, and removals past a
quarter rewrite the tables."""

import os
import random
import struct
from array import array

import lmdb
import msgpack
import pytest
from conftest import brute_force, native_built, raw_records, storage_of, stored_id

import simhashdb
from simhashdb import DB, _ext
from simhashdb.errors import DatabaseError
from simhashdb.layout import Layout
from simhashdb.storage.lmdb import format as lmdb_format
from simhashdb.storage.lmdb.format import INDEX_SLOTS, RUN_RATIO, RUN_SLOTS, max_dbs

index_name, slot_name = lmdb_format.INDEX.name, lmdb_format.TABLE_RUNS.name
RECORDS, BLOCKS = lmdb_format.RECORDS.name(), lmdb_format.RECORD_BLOCKS.name()

MAX = 2**64 - 1
LAYOUT = Layout(5, 3)
native = pytest.mark.skipif(not native_built(), reason="the native backend was not built")


def adversarial(rng, n):
    """Distinct sorted uint64 sets: 0, 2**64 - 1, offsets of 1, thousands under one prefix."""
    top = rng.getrandbits(64) & ~((1 << 20) - 1)
    return [[0], [MAX], [0, MAX], list(range(5000)), list(range(MAX - 4999, MAX + 1)),
            sorted({rng.getrandbits(64) for _ in range(n)}),
            sorted({top | rng.getrandbits(20) for _ in range(n)} | {0, MAX})]


def decoded(blocks):
    out = array("Q")
    for first, block in blocks:
        out.extend(_ext.decode_block(first, block))
    return out


def test_a_run_decodes_to_what_was_encoded():
    rng = random.Random(1)
    for values in adversarial(rng, 20_000):
        blocks = _ext.encode_run(array("Q", values))
        assert all(len(block) <= 996 for _, block in blocks)
        assert decoded(blocks) == array("Q", values)
    assert _ext.encode_run(array("Q")) == []
    for bad in ([2, 1], [1, 1]):
        with pytest.raises(ValueError):
            _ext.encode_run(array("Q", bad))
    assert _ext.merge_unique(array("Q", [0, 3, 5, MAX]), array("Q", [3, 4, MAX])) == \
        array("Q", [0, 3, 4, 5, MAX])
    assert _ext.merge_unique(array("Q"), array("Q")) == array("Q")


def test_a_damaged_block_is_a_value_error():
    rng = random.Random(2)
    values = array("Q", sorted({rng.getrandbits(64) for _ in range(500)}))
    first, block = _ext.encode_run(values)[0]
    c = int.from_bytes(block[:2], "little")

    def with_bytes(at, new):
        return block[:at] + new + block[at + len(new):]

    damaged = [block[:-1], block + b"\0", block[:2], b"", bytes(997),
               with_bytes(0, (c + 1).to_bytes(2, "little")),  # more entries than it holds
               with_bytes(0, b"\xff\xff"), with_bytes(2, bytes([block[2] + 1])),
               with_bytes(2, bytes([64])), with_bytes(len(block) - 1, b"\0")]
    for bad in damaged:
        with pytest.raises(ValueError):
            _ext.decode_block(first, bad)
    for _ in range(2000):  # a flipped bit: refused, or still ascending values
        at = rng.randrange(len(block))
        bad = with_bytes(at, bytes([block[at] ^ (1 << rng.randrange(8))]))
        try:
            values = _ext.decode_block(first, bad)
        except ValueError:
            continue
        assert all(a < b for a, b in zip(values, values[1:]))


def read_tables(path, tables):
    """Each table's runs as the file holds them, [(run id, slot, values)],
    checked: the directory's counts, ascending values, blocks exactly as
    encode_run cuts and codes them, and checksummed ids (given without the
    flag). Also meta's (distinct, stale)."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
            counts = [int.from_bytes(txn.get(name, b"\0" * 8, db=meta), "big")
                      for name in (b"distinct", b"stale")]
            result = []
            for table in range(tables):
                raw = txn.get(table.to_bytes(2, "big"), b"", db=directory)
                runs = []
                for i in range(0, len(raw), 13):
                    run, slot = int.from_bytes(raw[i:i + 4], "big"), raw[i + 4]
                    entries = int.from_bytes(raw[i + 5:i + 13], "big")
                    db = env.open_db(slot_name(table, slot), txn=txn, create=False)
                    items = list(txn.cursor(db).iternext())
                    assert all(k[:4] == run.to_bytes(4, "big") for k, _ in items)
                    blocks = [(int.from_bytes(k[4:], "big"), v) for k, v in items]
                    values = decoded(blocks)
                    assert len(values) == entries
                    assert _ext.encode_run(values) == blocks
                    assert lmdb_format.checksummed(run)  # every run written now
                    runs.append((run & ~lmdb_format.CHECKSUMMED, slot, values))
                assert len(runs) <= RUN_SLOTS - 1
                assert [r[0] for r in runs] == sorted({r[0] for r in runs})
                result.append(runs)
    finally:
        env.close()
    return result, counts


def recent_fingerprints(path):
    """The fingerprints the file's recent holds (none where it has no recent)."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            if txn.get(lmdb_format.RECENT_WRITES.name()) is None:
                return set()
            db = env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn, create=False)
            return {fp for _, raw in txn.cursor(db).iternext() for fp in
                    lmdb_format.recent_groups(raw).get(lmdb_format.RECENT_FINGERPRINTS, ())}
    finally:
        env.close()


def check_exact(db, docs, probes):
    for distance in (3, 4):
        found = db.query_many(array("Q", probes), distance=distance)
        for probe, matches in zip(probes, found):
            assert sorted(((m.key, m.fingerprint, m.distance) for m in matches), key=repr) == \
                sorted(brute_force(docs, probe, distance), key=repr), (probe, distance)
    assert len(db) == len(docs)
    assert db.check() == []
    with storage_of(db).read() as view:
        assert view.distinct() == len(set(docs.values()))


@native
def test_the_backends_write_and_search_each_others_runs(tmp_path):
    """Batches of upserts, removals and returns (a fingerprint back under its
    old key or another), written in turn by each backend, searched by both
    against brute force; the file always holds what native would write."""
    path, rng = str(tmp_path / "both.db"), random.Random(3)
    base = rng.getrandbits(64)
    top = base & ~((1 << 24) - 1)
    pool = [0, MAX, base] + [base ^ (1 << b) ^ (1 << (b + 7) % 64) for b in range(64)] + \
        [top | rng.getrandbits(24) for _ in range(3000)] + \
        [rng.getrandbits(64) for _ in range(3000)]
    docs, removed = {}, []
    for step, backend in enumerate(["lmdb", "py-lmdb", "lmdb", "py-lmdb", "py-lmdb", "lmdb"]):
        with DB(path, distance=3, blocks=5, backend=backend) as db:
            size = rng.choice([5, 900, 3000])
            batch = {"k%d" % rng.randrange(8000): rng.choice(pool) for _ in range(size)}
            db.insert_many(batch.items())
            docs.update(batch)
            gone = rng.sample(sorted(docs), len(docs) // 6)
            assert db.delete_many(gone) == len(gone)
            removed += [docs.pop(k) for k in gone]
            back = {k if i % 2 else "new%d-%d" % (step, i): removed[rng.randrange(len(removed))]
                    for i, k in enumerate(gone[:60])}
            db.insert_many(back.items())
            docs.update(back)
            probes = [0, MAX, base, top, base ^ 0b1011] + rng.sample(pool, 20) + \
                [fp ^ 1 for fp in rng.sample(removed, 10)]
            check_exact(db, docs, probes)
            other = "py-lmdb" if backend == "lmdb" else "lmdb"
        with DB(path, readonly=True, backend=other) as db:
            check_exact(db, docs, probes)
        tables, (distinct, _) = read_tables(path, LAYOUT.tables)
        assert distinct == len(set(docs.values()))
        recent = list(recent_fingerprints(path))
        for table, runs in enumerate(tables):
            union = set().union(*(set(values) for _, _, values in runs))
            union |= set(LAYOUT.table_values(recent, table))
            assert set(LAYOUT.table_values(list(docs.values()), table)) <= union


def read_index(path):
    """The fingerprint index as the file holds it: per slot, its set of
    (fingerprint, key) entries, each id read as its record's key (empty slots
    included, slots not made left out)."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            key_of = {doc: record_parts(raw)[0] for doc, raw in raw_records(env, txn).items()}
            slots = []
            for slot in range(INDEX_SLOTS):
                try:
                    db = env.open_db(index_name(slot), txn=txn, create=False, dupsort=True)
                except lmdb.NotFoundError:
                    break
                slots.append({(_ext.unpack_key(k), key_of[v])
                              for k, v in txn.cursor(db).iternext()})
    finally:
        env.close()
    return slots


def assert_index_holds(path, docs):
    """Each document's (fingerprint, key) is in exactly one slot of the file's index."""
    slots = read_index(path)
    entries = [(fp, msgpack.packb(key)) for key, fp in docs.items()]
    assert sum(len(slot) for slot in slots) == len(entries)
    assert set().union(*slots) == set(entries)
    return slots


def spread_index(path, docs, sizes):
    """Write the index's entries of ``docs`` into its slots anew, ``sizes[i]``
    of them (dealt out at random) into slot i, as another program could."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), lock=False)
    with env.begin(write=True) as txn:
        entries = sorted((fp, stored_id(env, txn, msgpack.packb(key))) for key, fp in docs.items())
        assert sum(sizes) == len(entries)
        slots = [env.open_db(index_name(slot), txn=txn, dupsort=True) for slot in range(INDEX_SLOTS)]
        for db in slots:
            txn.drop(db, delete=False)
        owner = [slot for slot, size in enumerate(sizes) for _ in range(size)]
        random.Random(len(entries)).shuffle(owner)
        for (fp, key), slot in zip(entries, owner):
            txn.put(struct.pack(">Q", fp), key, db=slots[slot])
    env.close()


@native
def test_a_batch_into_an_index_whose_every_slot_holds_entries_merges_two_in_place(tmp_path):
    """A file whose eight index slots all hold entries (spread so by another
    program) leaves a batch no free slot to put into: the writer merges the
    smallest into another in place, and every entry stays, once."""
    path, rng = str(tmp_path / "full.db"), random.Random(3)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(3000)}
    for i in range(0, 3000, 10):  # a few keys a fingerprint
        docs["d%d" % i] = docs["k%d" % i]
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
    spread_index(path, docs, [len(docs) // INDEX_SLOTS + (slot < len(docs) % INDEX_SLOTS)
                              for slot in range(INDEX_SLOTS)])
    assert all(read_index(path))
    batch = {"n%d" % i: rng.getrandbits(64) for i in range(200)}
    batch["n0"] = docs["k1"]
    with DB(path) as db:
        db.insert_many(batch.items())
        docs.update(batch)
        check_exact(db, docs, [docs["k1"] ^ 0b101] + rng.sample(list(docs.values()), 20))
    slots = assert_index_holds(path, docs)
    assert sum(bool(slot) for slot in slots) <= INDEX_SLOTS - 1


@native
def test_a_merge_of_a_slot_merged_earlier_in_the_same_tidy_is_read_by_the_writer(
        tmp_path, monkeypatch):
    """tidy's index merges have a thread read slots as the last commit left
    them; a merge that takes a slot an earlier merge of the same transaction
    wrote (slots of 12k, 12k, 10k and 10k entries: the two of 10k, then the
    rest) is read by the writer, or the 20k entries written would be read as
    the empty slot the commit holds."""
    from simhashdb.storage.lmdb import native as native_storage
    monkeypatch.setattr(native_storage, "THREADS", 2)
    monkeypatch.setattr(native_storage.NativeStorage, "threaded_merge", 1)
    path, rng = str(tmp_path / "chain.db"), random.Random(6)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(44_000)}
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
    spread_index(path, docs, [12_000, 12_000, 10_000, 10_000])
    with DB(path) as db:
        storage_of(db).write(lambda txn: txn.tidy())
        assert storage_of(db).statistics()["fed_merges"] == 1
        check_exact(db, docs, rng.sample(list(docs.values()), 20))
    slots = assert_index_holds(path, docs)
    assert [len(slot) for slot in slots if slot] == [44_000]


@native
def test_the_index_is_the_union_of_slots_each_entry_in_one(tmp_path):
    """A transaction puts its new index entries into a slot of its own, merges
    keep few slots in use, and each document's entry is in exactly one slot:
    after a bulk load, batches that add keys to fingerprints held in older
    slots, move keys between fingerprints and delete from every slot, as
    written by native and by py-lmdb in turn; exports page across slots."""
    path, rng = str(tmp_path / "slots.db"), random.Random(8)
    pool = [0, MAX] + [rng.getrandbits(64) for _ in range(400)]
    docs = {"k%d" % i: rng.choice(pool) for i in range(5000)}  # ~12 keys a fingerprint
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
    used = []
    for step in range(40):
        backend = "py-lmdb" if step % 10 == 9 else "lmdb"
        with DB(path, backend=backend) as db:
            batch = {"k%d" % rng.randrange(7000): rng.choice(pool + [rng.getrandbits(64)])
                     for _ in range(rng.choice([1, 20, 150]))}
            db.insert_many(batch.items())
            docs.update(batch)
            gone = rng.sample(sorted(docs), rng.choice([0, 3, 40]))
            assert db.delete_many(gone) == len(gone)
            for key in gone:
                del docs[key]
        slots = assert_index_holds(path, docs)
        used.append(sum(bool(slot) for slot in slots))
        assert used[-1] <= INDEX_SLOTS - 1
    assert max(used) >= 3  # entries were spread over slots
    probes = [0, MAX, pool[5] ^ 0b111] + rng.sample(pool, 30)
    for backend in ("lmdb", "py-lmdb"):
        with DB(path, readonly=True, backend=backend) as db:
            check_exact(db, docs, probes)
            with storage_of(db).read() as view:
                groups = list(view.fingerprint_groups())
            assert [fp for fp, _ in groups] == sorted({fp for fp in docs.values()})
            assert sum(len(keys) for _, keys in groups) == len(docs)
            assert all(keys == sorted(keys) for _, keys in groups)
    with DB(path) as db:
        db.compact()
    assert sum(bool(slot) for slot in read_index(path)) == 1


@native
def test_a_fingerprint_of_thousands_of_keys_in_two_slots_pages_whole(tmp_path):
    """Reads of the index go 4,096 entries at a time; one fingerprint with
    6,000 keys in two slots (one slot's all before the page's end) is read
    whole, in key order, once."""
    path = str(tmp_path / "keys.db")
    shared = 0x0123456789ABCDEF
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many([("a%05d" % i, shared) for i in range(5000)] + [("x", 5), ("y", MAX)])
        db.insert_many([("0%05d" % i, shared) for i in range(1000)] + [("z", 6)])
    assert sum(bool(slot) for slot in read_index(path)) == 2
    for backend in ("lmdb", "py-lmdb"):
        with DB(path, readonly=True, backend=backend) as db, storage_of(db).read() as view:
            groups = list(view.fingerprint_groups())
        assert [fp for fp, _ in groups] == [5, 6, shared, MAX]
        assert groups[2][1] == sorted(msgpack.packb("0%05d" % i) for i in range(1000)) + \
            sorted(msgpack.packb("a%05d" % i) for i in range(5000))
        assert [keys for fp, keys in groups if fp != shared] == [[msgpack.packb(k)] for k in "xzy"]


def read_sub_database(path, name, dupsort=False):
    """A sub-database's entries as the file holds them, and its leaf pages."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            db = env.open_db(name, txn=txn, create=False, dupsort=dupsort)
            return list(txn.cursor(db).iternext()), txn.stat(db)["leaf_pages"]
    finally:
        env.close()


def record_parts(raw):
    """(key, value) of a document's record: its key's length (2 bytes), key, value."""
    end = 2 + int.from_bytes(raw[:2], "big")
    return raw[2:end], raw[end:]


def read_documents(path):
    """The documents as the file's records hold them, (key, value) in id
    order, and the pages of their blocks."""
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            stat = txn.stat(env.open_db(BLOCKS, txn=txn, create=False))
            held = sorted(raw_records(env, txn).items())
    finally:
        env.close()
    return [record_parts(raw) for _, raw in held], stat["leaf_pages"] + stat["overflow_pages"]


def read_removed(path):
    """meta's count of documents removed since they were last written whole."""
    raw = dict(read_sub_database(path, lmdb_format.META.name())[0]).get(b"removed", bytes(8))
    return int.from_bytes(raw, "big")


def words_text(rng, words):
    return " ".join(rng.choice(words) for _ in range(60))


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_a_large_removal_writes_the_documents_and_index_again_without_them(tmp_path, backend):
    """A batch that removes over a quarter of the documents writes the
    documents and the index's slots again, in order, without them: the
    documents left keep their stored bytes, each index entry is in one slot,
    the band index matches a fresh database's, and the documents' B-tree is as
    small as a fresh one's. A small batch after it removes in place and is
    counted."""
    path, fresh, rng = str(tmp_path / "db"), str(tmp_path / "fresh"), random.Random(12)
    pool = [0, MAX] + [rng.getrandbits(64) for _ in range(2500)]  # fingerprints of several keys
    records = {(i if i % 3 else "k%d" % i): rng.choice(pool) for i in range(8000)}
    words = ["w%d" % i for i in range(300)]
    texts = {"t%d" % i: words_text(rng, words) for i in range(400)}
    with DB(path, distance=3, blocks=5, recipe=simhashdb.RECIPE, backend=backend) as db:
        for batch in range(0, 8000, 700):  # several slots
            db.insert_many(list(records.items())[batch:batch + 700])
        db.insert_text_many(texts.items())
        docs = {r.key: r.fingerprint for r in db}
    stored, _ = read_documents(path)
    gone = rng.sample(sorted(records, key=str), 3000) + rng.sample(sorted(texts), 150)
    gone += ["absent", 10**9]
    with DB(path, backend=backend) as db:
        assert db.delete_many(gone) == len(gone) - 2
    for key in gone[:-2]:
        del docs[key]
    kept = {msgpack.packb(k) for k in docs}
    assert read_documents(path)[0] == [(k, v) for k, v in stored if k in kept]
    slots = read_index(path)
    assert sum(len(slot) for slot in slots) == len(docs)
    assert set().union(*slots) == {(fp, msgpack.packb(k)) for k, fp in docs.items()}
    assert read_removed(path) == 0
    with DB(fresh, distance=3, blocks=5, recipe=simhashdb.RECIPE) as db:
        db.insert_many((k, fp) for k, fp in records.items() if k in docs)
        db.insert_text_many((k, t) for k, t in texts.items() if k in docs)
    for written in (path, fresh):
        with DB(written, readonly=True) as db:
            assert db.check() == []
    assert read_documents(path)[1] <= read_documents(fresh)[1] + 1
    probes = [0, MAX, pool[7] ^ 0b11] + [docs[k] ^ 0b101
                                         for k in rng.sample(sorted(docs, key=str), 40)]
    for reader in ("lmdb", "py-lmdb") if native_built() else ("py-lmdb",):
        with DB(path, readonly=True, backend=reader) as db:
            check_exact(db, docs, probes)
    few = rng.sample(sorted(docs, key=str), 5)
    with DB(path, backend=backend) as db:
        db.delete_many(few)
    for key in few:
        del docs[key]
    assert read_removed(path) == 5
    with DB(path, readonly=True) as db:
        check_exact(db, docs, probes)


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_a_large_removal_after_a_change_in_its_transaction_removes_in_place(tmp_path, backend):
    """The documents are written again from the last commit only by a
    transaction that has changed nothing yet: one that stored documents first
    removes in place and keeps them (the batch's tidy then writes them whole)."""
    from simhashdb.records import encode_documents, encode_key
    path, rng = str(tmp_path / "db"), random.Random(14)
    docs = {i: rng.getrandbits(64) for i in range(4000)}
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        new = {"new%d" % i: rng.getrandbits(64) for i in range(50)}
        gone = rng.sample(sorted(docs), 2000)
        stored = encode_documents(list(new.items()), 1000, 0)
        removed = [encode_key(k) for k in gone]
        storage = storage_of(db)
        assert storage.write(lambda txn: (txn.upsert(stored), txn.remove(removed))[1]) == 2000
        for key in gone:
            del docs[key]
        docs.update(new)
        check_exact(db, docs, [0, MAX] + [fp ^ 0b11 for fp in rng.sample(sorted(new.values()), 20)])
    assert read_removed(path) == 0  # removed in place, then written whole after the commit


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_removals_in_small_batches_are_written_whole_past_a_quarter(tmp_path, backend):
    """Small batches of removals remove in place and are counted; the batch
    that takes the count past a quarter of the documents writes the documents
    and the index again whole, so random removals do not leave the B-trees
    sparse."""
    path, rng = str(tmp_path / "db"), random.Random(13)
    docs = {i: rng.getrandbits(64) for i in range(6000)}
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
    leaves = read_documents(path)[1]
    order = rng.sample(sorted(docs), 1400)
    with DB(path, backend=backend) as db:
        for start in range(0, 1400, 10):
            assert db.delete_many(order[start:start + 10]) == 10
    for key in order:
        del docs[key]
    probes = [0, MAX] + [fp ^ 0b110 for fp in rng.sample(sorted(docs.values()), 40)]
    assert read_removed(path) == 190  # (1,200 + 10) * 4 > 6,000 - 1,200: then written whole
    assert read_documents(path)[1] <= 0.8 * leaves + 1
    with DB(path, backend=backend) as db:  # keys not stored count for nothing
        assert db.delete_many(range(10**6, 10**6 + 1000)) == 0
    assert read_removed(path) == 190
    entries, _ = read_documents(path)
    assert sorted(k for k, _ in entries) == sorted(msgpack.packb(k) for k in docs)
    assert set().union(*read_index(path)) == {(fp, msgpack.packb(k)) for k, fp in docs.items()}
    with DB(path, readonly=True) as db:
        check_exact(db, docs, probes)


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_statistics_are_the_native_engines_counts_and_none_elsewhere(tmp_path, backend):
    """Storage.statistics(), the engine's counts for tuning and tests, starts
    at zero on native LMDB and holds nothing on py-lmdb; DB.stats() shows none
    of it."""
    with DB(str(tmp_path / "db"), backend=backend) as db:
        db.insert("a", 1)
        counts = storage_of(db).statistics()
        assert counts == ({} if backend == "py-lmdb" else
                          {"threaded_merges": 0, "fed_merges": 0, "shared_lookups": 0,
                           "directories_built": 0, "filter_bytes": 0, "ranges_skipped": 0,
                           "slot_filter_entries": 0})
        assert not set(counts) & set(db.stats())


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_a_large_removal_with_every_reader_slot_taken_removes_in_place(tmp_path, backend,
                                                                       monkeypatch):
    """Writing the documents whole reads a snapshot, which takes a reader slot:
    with every slot held by open reads, the batch removes in place and counts
    the removals, and a later batch writes them whole once a slot is free."""
    from simhashdb.storage.lmdb import directory, files
    monkeypatch.setattr(directory, "LOCK_FILE_BYTES", 0)  # LMDB sizes the reader table
    monkeypatch.setattr(files.LmdbStorage, "max_readers", 2)
    path, rng = str(tmp_path / "db"), random.Random(15)
    docs = {i: rng.getrandbits(64) for i in range(4000)}
    gone = rng.sample(sorted(docs), 2000)
    with DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        views = [storage_of(db).read() for _ in range(2)]
        for view in views:
            view.__enter__().count()
        assert db.delete_many(gone) == 2000
        for view in views:
            view.__exit__(None, None, None)
    assert read_removed(path) == 2000
    for key in gone:
        del docs[key]
    probes = [0, MAX] + [fp ^ 0b101 for fp in rng.sample(sorted(docs.values()), 30)]
    with DB(path, backend=backend) as db:
        check_exact(db, docs, probes)
        assert db.delete_many([-1]) == 0  # the next batch's tidy writes them whole
    assert read_removed(path) == 0
    assert sorted(k for k, _ in read_documents(path)[0]) == sorted(
        msgpack.packb(k) for k in docs)
    with DB(path, readonly=True) as db:
        check_exact(db, docs, probes)


def sub_database_root(path, name):
    """The page number of sub-database ``name``'s root: from the file's newer
    meta page down the main database's B-tree (LMDB 0.9's 64-bit layout)."""
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        data = f.read()

    def u16(page, at):
        return struct.unpack_from("<H", page, at)[0]

    metas = [data[page * 4096:(page + 1) * 4096] for page in (0, 1)]
    meta = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
    number = struct.unpack_from("<Q", meta, 128)[0]
    while True:
        page = data[number * 4096:(number + 1) * 4096]
        nodes = [u16(page, at) for at in range(16, u16(page, 12), 2)]
        keys = [page[node + 8:node + 8 + u16(page, node + 6)] for node in nodes]
        if not u16(page, 10) & 0x01:  # a leaf: the sub-database's record
            node = nodes[keys.index(name)]
            return struct.unpack_from("<Q", page, node + 8 + len(name) + 40)[0]
        node = nodes[max(i for i, key in enumerate(keys) if i == 0 or key <= name)]
        number = u16(page, node) | u16(page, node + 2) << 16 | u16(page, node + 4) << 32


@pytest.mark.parametrize("backend", ["py-lmdb", pytest.param("lmdb", marks=native)])
def test_a_walk_cut_short_by_damage_is_refused_not_copied(tmp_path, backend):
    """A damaged branch page can end a cursor's walk of the documents early,
    leaving a whole subtree unreached: writing the documents whole (a large
    removal) or compacting then fails as damage, and the file keeps the
    documents it cannot reach, rather than a copy without them."""
    path, rng = str(tmp_path / "db"), random.Random(15)
    docs = {i: rng.getrandbits(64) for i in range(6000)}
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
    root = sub_database_root(path, BLOCKS)
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek(root * 4096)
        page = bytearray(f.read(4096))
        assert struct.unpack_from("<H", page, 10)[0] & 0x01  # a branch page
        struct.pack_into("<H", page, 12, struct.unpack_from("<H", page, 12)[0] - 2)
        f.seek(root * 4096)
        f.write(page)  # its last child is out of reach
    with DB(path, backend=backend) as db:
        with pytest.raises(DatabaseError):
            db.delete_many(range(0, 6000, 2))
        with pytest.raises(DatabaseError):
            db.compact()
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek(root * 4096 + 12)
        f.write(struct.pack("<H", struct.unpack_from("<H", page, 12)[0] + 2))
    with DB(path, readonly=True, backend=backend) as db:
        assert {r.key: r.fingerprint for r in db} == docs
        assert db.check() == []


def test_removals_past_a_quarter_rewrite_every_table_as_one_run(tmp_path, runs_only):
    path, rng = str(tmp_path / "stale.db"), random.Random(4)
    fps = list({rng.getrandbits(64) for _ in range(2000)} - {0, MAX}) + [0, MAX]
    docs = {}
    db = DB(path, distance=3, blocks=5, backend="py-lmdb")
    for size in (1600, 300, 60):  # each under a quarter of the run before: three runs
        batch = {"k%d" % i: fps[i] for i in range(len(docs), len(docs) + size)}
        db.insert_many(batch.items())
        docs.update(batch)
    probes = [0, MAX] + [fp ^ 0b101 for fp in rng.sample(fps, 30)]
    db.close()
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert [len(runs) for runs in tables] == [3] * LAYOUT.tables and stale == 0
    db = DB(path, backend="py-lmdb")
    first = sorted(docs)[:300]
    db.delete_many(first)  # 300 * 4 <= 1660: counted, not yet rewritten
    for k in first:
        del docs[k]
    check_exact(db, docs, probes + [fps[0], fps[1] ^ 1])
    db.close()
    tables, (distinct, stale) = read_tables(path, LAYOUT.tables)
    assert (distinct, stale) == (1660, 300) and [len(runs) for runs in tables] == [3] * 10
    db = DB(path, backend="py-lmdb")
    more = sorted(docs)[:120]  # 420 * 4 > 1540: every table rewritten
    db.delete_many(more)
    for k in more:
        del docs[k]
    db.insert_many([("back", fps[0])])  # a removed fingerprint returns
    docs["back"] = fps[0]
    check_exact(db, docs, probes)
    db.close()
    tables, counts = read_tables(path, LAYOUT.tables)
    assert counts == [len(docs), 0]
    for table, runs in enumerate(tables):  # the rewrite (ids above the dropped runs 1-3), the return
        assert [(run, len(values)) for run, _, values in runs] == [(4, 1540), (5, 1)]
        assert runs[0][2] == LAYOUT.table_values([fp for k, fp in docs.items() if k != "back"],
                                                 table)
    if native_built():
        with DB(path, readonly=True, backend="lmdb") as db:
            check_exact(db, docs, probes)
    with DB(path, backend="py-lmdb") as db:
        db.compact()
        check_exact(db, docs, probes)
    tables, counts = read_tables(path, LAYOUT.tables)
    assert counts == [len(docs), 0]  # one run, its id above those the rewrite dropped
    assert all([(run, slot) for run, slot, _ in runs] == [(4, 0)] for runs in tables)


def test_the_stale_count_triggers_the_rewrite(tmp_path):
    """stale is added to by each batch's removals and zeroed by the rewrite."""
    path, rng = str(tmp_path / "rule.db"), random.Random(5)
    fps = sorted({rng.getrandbits(64) for _ in range(400)})
    with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
        db.insert_many(("k%d" % i, fp) for i, fp in enumerate(fps))
        expected_stale, distinct = 0, len(fps)
        for i in range(0, 120, 10):
            db.delete_many("k%d" % j for j in range(i, i + 10))
            distinct -= 10
            expected_stale += 10
            if expected_stale * RUN_RATIO > distinct:
                expected_stale = 0
            with storage_of(db).read() as view:
                assert view._count(b"stale") == expected_stale
                assert view.distinct() == distinct
                assert len(view._directory(0)) == 1 or expected_stale


def test_a_damaged_block_is_a_database_error(tmp_path, runs_only):
    path = str(tmp_path / "damaged.db")
    with DB(path, distance=3, blocks=5, backend="py-lmdb") as db:
        db.insert_many(("k%d" % i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(3000))
    env = lmdb.open(path, max_dbs=max_dbs(LAYOUT.tables))
    with env.begin(write=True) as txn:
        slot = env.open_db(slot_name(0, 0), txn=txn)
        cursor = txn.cursor(slot)
        assert cursor.first()
        cursor.put(cursor.key(), b"\xff\xff" + cursor.value()[2:])
    env.close()
    with DB(path, readonly=True, backend="py-lmdb") as db:
        with pytest.raises(DatabaseError, match="a block of table 0 is unreadable"):
            db.query_many(array("Q", range(0, 2**64 - 1, 2**58)), distance=3)
        assert any("a block of table 0 is unreadable" in problem for problem in db.check())


def test_a_layout_of_more_than_256_tables_reopens_with_room_for_them(tmp_path):
    path, rng = str(tmp_path / "wide.db"), random.Random(8)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(200)}
    with DB(path, distance=7, blocks=11, backend="py-lmdb") as db:
        assert db.tables > 256
        db.insert_many(docs.items())
        db.delete_many(["k1", "k2"])
        del docs["k1"], docs["k2"]
        check_exact(db, docs, [0, MAX, docs["k3"] ^ 0b1111111])
    for backend in ["py-lmdb"] + (["lmdb"] if native_built() else []):
        with DB(path, readonly=True, backend=backend) as db:
            found = db.query_many(array("Q", [docs["k3"] ^ 0b1111111]), distance=7)[0]
            assert [(m.key, m.fingerprint) for m in found] == \
                [(k, fp) for k, fp, _ in brute_force(docs, docs["k3"] ^ 0b1111111, 7)]


@pytest.mark.parametrize("seed", range(40))
def test_py_lmdb_insert_if_new_decides_as_one_upsert_a_document_would(tmp_path, seed):
    """py-lmdb's insert_if_new keeps a batch's new documents aside (found among
    themselves by a NearIndex of the layout's tables) and writes them with one
    upsert at its end: its answers and what it stores equal the generic
    Txn.insert_if_new, which upserts each document as it goes, for repeated
    keys, keys stored before or earlier in the transaction, near and equal
    fingerprints, at and above the built distance."""
    from simhashdb.records import encode_documents
    from simhashdb.storage import Txn
    from simhashdb.storage.lmdb.pytxn import PyTxn
    rng = random.Random(seed)
    distance = rng.choice([0, 1, 3, 5, 8])
    bases = [0, 0b111, 0xFF, 0xF0F0, 1 << 40, 3 << 40, rng.getrandbits(64)]
    keys = ["k%d" % i for i in range(6)]

    def fp():
        return rng.choice(bases) ^ (1 << rng.randrange(64) if rng.random() < 0.5 else 0)
    stored = [(k, fp()) for k in rng.sample(keys, 3)]
    before = encode_documents([(rng.choice(keys), fp())], 511, 1)
    batch = encode_documents([(rng.choice(keys), fp(), i) for i in range(rng.randrange(1, 12))],
                             511, 1)
    outcomes = []
    for decide in (Txn.insert_if_new, PyTxn.insert_if_new):
        with DB(str(tmp_path / decide.__qualname__), distance=3, backend="py-lmdb") as db:
            db.insert_many(stored)
            found = storage_of(db).write(lambda txn: (txn.upsert(before),
                                                   decide(txn, batch, distance))[1])
            outcomes.append(([sorted(hits) for hits in found],
                             sorted((r.key, r.fingerprint, r.meta) for r in db), db.check()))
    assert outcomes[0] == outcomes[1] and outcomes[1][2] == []
