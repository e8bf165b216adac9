"""Every block of a run ends in a checksum of its first value and bytes: a
bit flipped inside a block's coded values (which its count and its run's
count cannot see) is a DatabaseError naming check() and compact(), never a
wrong answer, on both LMDB backends, whichever of them wrote the file. A run
without the checksum flag in its id is damage too."""

import random
from array import array

import lmdb
import pytest
from conftest import brute_force, native_built

from simhashdb import DB, DatabaseError, _ext
from simhashdb.errors import DamagedError
from simhashdb.storage import BANDS
from simhashdb.storage.lmdb import format as lmdb_format

pytestmark = pytest.mark.lmdb_only

LMDB_BACKENDS = ["py-lmdb"] + (["lmdb"] if native_built() else [])
# the readers: the native backend also through the B-tree alone, without the
# block directories (whose building checks every block once)
READERS = LMDB_BACKENDS + (["lmdb, no directories"] if native_built() else [])
DOCUMENTS = 5_000
SUM = lmdb_format.SUM_BYTES


def test_every_bit_of_a_block_and_its_first_value_is_checked():
    rng = random.Random(45)
    values = array("Q", sorted(rng.sample(range(1 << 40), 3000)))
    blocks = _ext.encode_run(values)
    assert len(blocks) > 2 and all(len(block) <= 996 for _, block in blocks)
    first, block = blocks[1]
    decoded = _ext.decode_block(first, block)
    assert decoded[0] == first and list(decoded) == sorted(set(decoded))
    for bit in range(8 * len(block)):
        flipped = bytearray(block)
        flipped[bit // 8] ^= 1 << bit % 8
        with pytest.raises(ValueError, match="damaged block"):
            _ext.decode_block(first, bytes(flipped))
    for bit in range(64):
        with pytest.raises(ValueError, match="checksum"):
            _ext.decode_block(first ^ 1 << bit, block)
    with pytest.raises(ValueError):  # a block without its checksum
        _ext.decode_block(first, block[:-SUM])


def run_sets(tables):
    """Each run set's directory key and its slots' names: the tables, then the bands."""
    for table in range(tables):
        yield lmdb_format.directory_key(table), lambda slot, t=table: lmdb_format.TABLE_RUNS.name(t, slot)
    for band in range(BANDS):
        yield lmdb_format.band_directory_key(band), lambda slot, b=band: lmdb_format.BAND_RUNS.name(b, slot)


def rewrite_file(path, tables, change):
    """Apply ``change(run set number, run, [(key, value)])`` -> (new run id,
    [(key, value)]) to every run in the file, as raw LMDB writes."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(tables))
    try:
        with env.begin(write=True) as txn:
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
            for number, (key, slot_name) in enumerate(run_sets(tables)):
                raw = txn.get(key, db=directory)
                if not raw:
                    continue
                runs = []
                for run, slot, entries in lmdb_format.directory_runs(raw):
                    db = env.open_db(slot_name(slot), txn=txn, create=False)
                    items = list(txn.cursor(db).iternext())
                    new_run, new_items = change(number, run, items)
                    if new_items != items:
                        txn.drop(db, delete=False)
                        for item in new_items:
                            txn.put(*item, db=db)
                    runs.append((new_run, slot, entries))
                txn.put(key, lmdb_format.directory_record(runs), db=directory)
    finally:
        env.close()


def flip_a_bit(where, number=0):
    """A change (rewrite_file) that flips one bit of the middle block of run
    set ``number``: in its low bits, its high bits, or its checksum."""
    def change(at, run, items):
        if at != number:
            return run, items
        key, value = items[len(items) // 2]
        assert lmdb_format.checksummed(run) and len(value) > 40
        byte = {"low bits": 4, "high bits": len(value) - SUM - 3, "checksum": len(value) - 2}[where]
        value = value[:byte] + bytes([value[byte] ^ 0x10]) + value[byte + 1:]
        return run, [(key, value) if k == key else (k, v) for k, v in items]
    return change


def run_ids(path, tables):
    """Every run's id, table 0's first (rewrite_file, changing nothing)."""
    ids = []
    rewrite_file(path, tables, lambda number, run, items: (ids.append(run), (run, items))[1])
    return ids


def exact(db, docs, probes, distance=3):
    return [{(m.key, m.fingerprint, m.distance) for m in hits}
            for hits in db.query_many(probes, distance=distance)] \
        == [set(brute_force(docs, probe, distance)) for probe in probes]


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("writer", LMDB_BACKENDS)
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("where", ["low bits", "high bits", "checksum"])
def test_a_flipped_bit_in_a_block_raises_and_compact_mends_it(tmp_path, monkeypatch, writer,
                                                              reader, where):
    if reader.endswith("no directories"):
        from simhashdb.storage.lmdb.native import NativeStorage
        monkeypatch.setattr(NativeStorage, "directory_entries", 0)
        monkeypatch.setattr(NativeStorage, "directory_rent", 0)
        reader = "lmdb"
    rng = random.Random(4502)
    docs = {key: rng.getrandbits(64) for key in range(DOCUMENTS)}
    path = str(tmp_path / "db")
    with DB(path, distance=3, backend=writer) as db:
        db.insert_many(docs.items())
        tables = db.tables
    rewrite_file(path, tables, flip_a_bit(where))
    probes = list(docs.values())  # every block of every table is read
    with DB(path, readonly=True, backend=reader) as db:
        with pytest.raises(DatabaseError, match=r"check\(\).*compact\(\)"):
            db.query_many(probes)
        problems = db.check()
        assert problems and "checksum" in " ".join(problems)
    with DB(path, backend=reader) as db:
        db.compact()
        assert db.check() == []
        assert exact(db, docs, probes[:500] + [rng.getrandbits(64) for _ in range(500)])


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_flipped_bit_in_a_band_block_raises_and_compact_mends_it(tmp_path, backend):
    rng = random.Random(4503)
    words = ["w%d" % i for i in range(3000)]
    texts = {"t%d" % i: " ".join(rng.choice(words) for _ in range(200)) for i in range(300)}
    path = str(tmp_path / "db")
    with DB(path, backend=backend) as db:
        db.insert_text_many(texts.items())
        tables = db.tables
        before = [sorted(m.key for m in found) for found in db.query_text_many(list(texts.values()))]
    rewrite_file(path, tables, flip_a_bit("low bits", number=tables))  # band 0
    with DB(path, readonly=True, backend=backend) as db:
        with pytest.raises(DatabaseError, match="compact"):
            db.query_text_many(list(texts.values()))
        assert db.check()
    with DB(path, backend=backend) as db:
        db.compact()
        assert db.check() == []
        assert [sorted(m.key for m in found)
                for found in db.query_text_many(list(texts.values()))] == before


def checksum_bit_cleared(where):
    """A change (rewrite_file) that clears the checksum bit of every run's id:
    in its directory's record alone, or in the whole run (its blocks' keys too,
    their checksums cut off: a run as written before checksums)."""
    def change(number, run, items):
        cleared = run & ~lmdb_format.CHECKSUMMED
        if where == "directory":
            return cleared, items
        return cleared, [(cleared.to_bytes(4, "big") + key[4:], value[:-SUM]) for key, value in items]
    return change


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("where", ["directory", "whole run"])
def test_a_live_run_without_the_checksum_bit_is_damage(tmp_path, monkeypatch, reader, where):
    """Every run of this format has its blocks summed (upgrade writes the runs of
    an older database again): a live run whose id lacks the checksum bit is a
    flipped bit, so it raises DamagedError rather than be read unverified;
    check() lists it, and compact() mends it."""
    if reader.endswith("no directories"):
        from simhashdb.storage.lmdb.native import NativeStorage
        monkeypatch.setattr(NativeStorage, "directory_entries", 0)
        monkeypatch.setattr(NativeStorage, "directory_rent", 0)
        reader = "lmdb"
    rng = random.Random(4504)
    docs = {key: rng.getrandbits(64) for key in range(2000)}
    path = str(tmp_path / "db")
    with DB(path, distance=3, backend=reader) as db:
        db.insert_many(docs.items())
        tables = db.tables
    rewrite_file(path, tables, checksum_bit_cleared(where))
    probes = list(docs.values())[::10]
    with DB(path, readonly=True, backend=reader) as db:
        with pytest.raises(DamagedError):
            db.query_many(probes)
        assert db.check()
    with DB(path, backend=reader) as db:
        db.compact()
        assert db.check() == []
        assert exact(db, docs, probes + [rng.getrandbits(64) for _ in range(200)])
    assert all(map(lmdb_format.checksummed, run_ids(path, tables)))
