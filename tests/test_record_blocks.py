"""The documents in compressed blocks of records (format 11,
storage/lmdb/format.py), on both LMDB backends: every document kept through
appends, replacements that grow and shrink a block past its room, removals
and returns, one page a call and batches; blocks within their room; the
codec against its own reading; a file of format 10 read and written as it is
and put in blocks by upgrade; a damaged block refused, never a crash."""

import random

import lmdb
import pytest
from conftest import raw_records, records_as_in_format_10
from hypothesis import given, settings
from hypothesis import strategies as st

import simhashdb
from simhashdb import DB
from simhashdb.errors import DamagedError
from simhashdb.storage.lmdb import format

BLOCKS = format.RECORD_BLOCKS.name()

pytestmark = pytest.mark.lmdb_only


def stored_blocks(path):
    """[(key, stored bytes)] of the database at ``path``'s blocks."""
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(int.from_bytes(k, "big"), bytes(v))
                    for k, v in txn.cursor(env.open_db(BLOCKS, txn=txn, create=False))]
    finally:
        env.close()


def contents(db):
    return {r.key: (r.fingerprint, r.meta) for r in db}


@given(st.lists(st.tuples(st.integers(0, 2**63), st.binary(max_size=300)), max_size=40),
       st.integers(0, 2**40))
def test_a_block_body_reads_back_as_written(records_, start):
    ids = sorted({start + step for step, _ in records_})
    written = [(doc, record) for doc, (_, record) in zip(ids, records_)]
    if written:
        assert format.block_records(start, format.block_body(start, written)) == written
        assert format.unpack_block(start, format.pack_block(start, written)) == written


@given(st.binary(max_size=64))
def test_bytes_that_are_not_a_block_read_as_none(raw):
    assert format.unpack_block(0, raw) is None or raw == b""


def test_documents_survive_appends_replacements_and_removals(tmp_path, backend):
    rng = random.Random(5)
    db, oracle = DB(str(tmp_path / "db")), {}

    def meta(size):
        return {"pad": "".join(rng.choice("abcdefgh") for _ in range(size))}

    for step in range(30):
        batch = {}
        for _ in range(rng.choice([1, 1, 3, 200])):  # one page a call, and batches
            key = rng.randrange(2000) if rng.random() < 0.3 and oracle else "k%d" % rng.randrange(10**9)
            batch[key] = (rng.getrandbits(64), meta(rng.choice([0, 10, 80, 3000])))
        db.insert_many([(k, fp, m) for k, (fp, m) in batch.items()])
        oracle.update(batch)
        if step % 4 == 3:
            gone = rng.sample(sorted(oracle, key=str), len(oracle) // 5)
            assert db.delete_many(gone) == len(gone)
            for key in gone:
                del oracle[key]
            back = gone[: len(gone) // 2]  # returns take new ids
            db.insert_many([(k, 7, {"back": 1}) for k in back])
            oracle.update({k: (7, {"back": 1}) for k in back})
        assert contents(db) == oracle
        assert len(db) == len(oracle)
    db.close()
    db = DB(str(tmp_path / "db"))
    assert contents(db) == oracle and db.check() == []
    db.close()
    blocks = stored_blocks(str(tmp_path / "db"))
    for key, raw in blocks:
        held = format.unpack_block(key, raw)
        assert held[0][0] >= key
        assert len(raw) <= format.RECORD_BLOCK_BYTES or len(held) == 1
    keys = [key for key, _ in blocks]
    firsts = [format.unpack_block(key, raw)[-1][0] for key, raw in blocks]
    assert all(last < after for last, after in zip(firsts, keys[1:]))  # ids below the next key


def test_pages_one_a_call_fill_blocks(tmp_path, backend):
    path = str(tmp_path / "db")
    with DB(path) as db:
        for i in range(400):
            db.insert("https://example.com/page/%d" % i, i * 0x9E3779B97F4A7C15 % 2**64,
                      meta={"fetched": 1_780_000_000 + i, "status": 200})
        assert len(db) == 400 and db.get("https://example.com/page/7").meta["status"] == 200
    blocks = stored_blocks(path)
    held = [len(format.unpack_block(key, raw)) for key, raw in blocks]
    assert sum(held) == 400
    # not a block a page: each page joined the last block until it was full (by its room,
    # or by its body's bound: these pages compress to a fifth)
    assert len(blocks) <= 400 // 50


def test_texts_keep_their_signatures_and_bands_in_blocks(tmp_path, backend):
    rng = random.Random(8)
    words = ["w%d" % i for i in range(3000)]
    pages = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(300)]
    with DB(str(tmp_path / "db")) as db:
        db.insert_text_many([("p%d" % i, text) for i, text in enumerate(pages)])
        copy = pages[17].split()
        copy[5:8] = ["new", "words", "here"]
        found = db.query_text(" ".join(copy))
        assert "p17" in [m.key for m in found]
        assert db.check() == []


def test_a_format_10_file_reads_and_writes_as_it_is_until_upgrade(tmp_path, backend):
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many([("k%d" % i, i * 977, {"i": i}) for i in range(500)])
    records_as_in_format_10(path)
    with DB(path) as db:
        assert db.stats()["format"] == 10 and len(db) == 500
        db.insert_many([("k%d" % i, i * 977, {"i": -i}) for i in range(490, 520)])
        db.delete_many(["k3", "k4"])
        expected = contents(db)
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(BLOCKS) is None and len(raw_records(env, txn)) == 518
    env.close()
    simhashdb.upgrade(path)
    with DB(path) as db:
        assert db.stats()["format"] == format_version() and contents(db) == expected
        assert db.check() == []
        assert db.query(10 * 977)[0].key == "k10"
    assert sum(len(format.unpack_block(k, raw)) for k, raw in stored_blocks(path)) == 518


def format_version():
    return simhashdb.db.FORMAT_VERSION


def test_a_damaged_block_is_refused_not_a_crash(tmp_path, backend):
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many([("k%d" % i, i, {"x": "y" * 20}) for i in range(300)])
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        blocks = env.open_db(BLOCKS, txn=txn, create=False)
        key, raw = next(iter(txn.cursor(blocks)))
        damaged = bytearray(raw)
        damaged[len(raw) // 2] ^= 0x10
        txn.put(key, bytes(damaged), db=blocks)
    env.close()
    with DB(path) as db:
        with pytest.raises(DamagedError):
            list(db)
        with pytest.raises(DamagedError):
            [db.get("k%d" % i) for i in range(300)]
        assert db.check() != []


def test_a_document_larger_than_a_block_is_a_block_of_its_own(tmp_path, backend):
    path = str(tmp_path / "db")
    big = {"body": random.Random(3).randbytes(20000).hex()}
    with DB(path) as db:
        db.insert_many([("a", 1), ("b", 2, big), ("c", 3)])
        db.insert("b", 4, meta={"small": 1})
        db.insert("a", 5, meta=big)
        assert db.get("a").meta == big and db.get("b").meta == {"small": 1}
        assert sorted(r.key for r in db) == ["a", "b", "c"]


@pytest.mark.parametrize("pages", [500, 3])  # the last block full, and taken in
def test_a_next_id_behind_the_stored_ids_is_damage_not_overlapping_blocks(tmp_path, backend, pages):
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many([("k%d" % i, i, {"pad": "x" * 300}) for i in range(pages)])
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        meta = env.open_db(format.META.name(), txn=txn, create=False)
        txn.put(format.NEXT_ID, (pages - 2).to_bytes(8, "big"), db=meta)
    env.close()
    with DB(path) as db:
        with pytest.raises(DamagedError):
            db.insert("new", 12345)
        assert len(db) == pages and db.get("k1").fingerprint == 1
    assert len({key for key, _ in stored_blocks(path)}) == len(stored_blocks(path))
