"""The filters of the fingerprint index's and the key map's slots (native
LMDB): a write's lookup skips the slots whose filter rules its key out, and
never misses an entry, across merges, replacements, removals and returns,
failed writes, and another process's writes."""

import random
import subprocess
import sys

import pytest

from conftest import storage_of

from simhashdb import DB
from simhashdb.records import encode_documents, encode_key
from simhashdb.storage.lmdb import format as lmdb_format

pytest.importorskip("simhashdb._lmdb")


def check(db, live, gone):
    """The database holds exactly ``live`` (key -> fingerprint): each key
    once, found by a write's lookups of its key and of its fingerprint."""
    assert len(db) == len(live)
    sample = random.Random(len(live)).sample(sorted(live), min(300, len(live)))
    for key in sample:
        assert db.get(key).fingerprint == live[key]
    for key in gone[:100]:
        assert db.get(key) is None
    # a write's lookups: each stored document finds itself (its key is a
    # candidate like any other) and nothing is written
    decisions = db.insert_if_new_many([(k, live[k]) for k in sample], distance=0)
    assert [d.status for d in decisions] == ["unchanged"] * len(sample)
    assert len(db) == len(live)
    fps = sorted(set(live.values()))
    assert db.stats()["distinct_fingerprints"] == len(fps)
    by_fp = {}
    for key, fp in live.items():
        by_fp.setdefault(fp, set()).add(key)
    for fp, matches in zip(fps, db.query_many(fps, 0)):
        assert {m.key for m in matches} == by_fp[fp]


def test_lookups_through_slot_filters_miss_nothing(tmp_path):
    """Batches of every size (merges of the slots in and after them),
    replacements, shared fingerprints, removals and returns, and writes that
    fail after changing the slots: every lookup finds what is stored."""
    rng = random.Random(7)
    db = DB(str(tmp_path / "db"), backend="lmdb", distance=3)
    live, gone, next_key = {}, [], 0
    for turn in range(45):
        size = rng.choice([1, 3, 40, 300, 1000, 2500])
        batch = []
        for _ in range(size):
            draw = rng.random()
            if draw < 0.12 and live:  # replaced: a new fingerprint under a stored key
                key = rng.choice(list(live))
            elif draw < 0.2 and gone:  # back under a removed key
                key = gone.pop(rng.randrange(len(gone)))
            else:
                key, next_key = "k%d" % next_key, next_key + 1
            fp = rng.choice(list(live.values())) if draw > 0.95 and live else \
                rng.getrandbits(64)
            batch.append((key, fp))
        db.insert_many(batch, batch_size=rng.choice([1000, 5000]))
        live.update(batch)
        if turn % 5 == 4:
            removed = rng.sample(sorted(live), len(live) // 10)
            assert db.delete_many(removed) == len(removed)
            for key in removed:
                del live[key]
            gone += removed
        if turn % 7 == 6:  # a write that removes, adds and merges, then fails: nothing stays
            removed = [encode_key(k) for k in rng.sample(sorted(live), 50)]
            added = encode_documents([("new%d" % i, rng.getrandbits(64)) for i in range(3000)],
                                     storage_of(db).max_key_bytes, 0)

            def body(txn):
                txn.remove(removed)
                txn.upsert(added)
                raise ZeroDivisionError
            with pytest.raises(ZeroDivisionError):
                storage_of(db).write(body)
            back = [k for k in live if encode_key(k) in set(removed)]
            decisions = db.insert_if_new_many([(k, live[k]) for k in back], distance=0)
            assert [d.status for d in decisions] == ["unchanged"] * len(back) and len(back) == 50
        if turn % 9 == 8:
            check(db, live, gone)
    check(db, live, gone)
    assert storage_of(db).statistics()["slot_filter_entries"] > 50_000
    db.close()


def key_slots(path):
    """The entries of each of the key map's slots, read with py-lmdb."""
    import lmdb
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    with env.begin() as txn:
        sizes = [txn.stat(env.open_db(name, txn=txn, create=False))["entries"]
                 for name in lmdb_format.KEYS.names()]
    env.close()
    return sizes


def test_writes_of_another_process_are_found_by_the_next_write(tmp_path):
    """Another process's batches are found by this process's next write,
    its replacements replace: here the other's merges leave 3,000 of its keys
    in the slot where this process's last write saw 11,000 of its own (and
    kept a filter of them)."""
    path = str(tmp_path / "db")
    db = DB(path, backend="lmdb", distance=3)
    rng = random.Random(3)
    live = {}
    for turn in range(12):
        batch = [("a%d" % (1000 * turn + i), rng.getrandbits(64)) for i in range(1000)]
        db.insert_many(batch)
        live.update(batch)
    assert storage_of(db).statistics()["slot_filter_entries"] > 0
    assert key_slots(path)[:2] == [1000, 11_000]
    other = [("b%d" % i, random.Random(i).getrandbits(64)) for i in range(5000)]
    code = ("import random, sys\n"
            "from simhashdb import DB\n"
            "with DB(sys.argv[1], backend='lmdb') as db:\n"
            "    for turn in range(5):\n"
            "        db.insert_many([('b%d' % i, random.Random(i).getrandbits(64))\n"
            "                        for i in range(1000 * turn, 1000 * turn + 1000)])\n")
    subprocess.run([sys.executable, "-c", code, path], check=True)
    assert key_slots(path)[1] == 3000  # (the merges this test is made for)
    live.update(other)
    check(db, live, [])
    replaced = [(key, rng.getrandbits(64)) for key, _ in other]
    db.insert_many(replaced)
    live.update(replaced)
    check(db, live, [])
    db.close()


def test_a_few_writes_read_no_large_slot_for_its_filter(tmp_path):
    """A process that writes a few documents into a large database leaves
    its slots unread (a slot's filter is built once the lookups there would
    have paid for reading it); a stream of batches gets them."""
    path = str(tmp_path / "db")
    rng = random.Random(9)
    with DB(path, backend="lmdb", distance=3) as db:
        db.insert_many([("a%d" % i, rng.getrandbits(64)) for i in range(40_000)])
        db.compact()  # one slot each, of 40,000
    assert key_slots(path) == [40_000] + [0] * 7
    with DB(path, backend="lmdb") as db:
        for i in range(20):
            db.insert("b%d" % i, rng.getrandbits(64))
        assert storage_of(db).statistics()["slot_filter_entries"] < 1000
        for turn in range(3):
            db.insert_many([("c%d_%d" % (turn, i), rng.getrandbits(64)) for i in range(1000)])
        assert storage_of(db).statistics()["slot_filter_entries"] > 80_000
        assert len(db) == 43_020


def test_filters_outlive_a_write_that_changed_nothing_and_not_another_process(tmp_path):
    """The filters stay across this process's writes, also one that changed
    nothing (LMDB gives its transaction id to the next one), and are dropped
    after another process commits: the 40,000-entry slots are read again
    only then."""
    path = str(tmp_path / "db")
    rng = random.Random(4)
    stored = [("a%d" % i, rng.getrandbits(64)) for i in range(40_000)]
    with DB(path, backend="lmdb", distance=3) as db:
        db.insert_many(stored)
        db.compact()
    assert key_slots(path) == [40_000] + [0] * 7
    db = DB(path, backend="lmdb")

    def batch(turn):
        db.insert_many([("c%d_%d" % (turn, i), rng.getrandbits(64)) for i in range(1000)])
        return storage_of(db).statistics()["slot_filter_entries"]

    read = [batch(turn) for turn in range(3)][-1]
    assert read > 80_000  # both 40,000-entry slots
    decisions = db.insert_if_new_many(stored[:5], distance=0)  # a write that changes nothing
    assert [d.status for d in decisions] == ["unchanged"] * 5
    # two batches: more lookups than a slot of 40,000 takes to get a filter
    assert max(batch(3), batch(4)) - read < 40_000
    read = storage_of(db).statistics()["slot_filter_entries"]
    subprocess.run([sys.executable, "-c", "import sys\nfrom simhashdb import DB\n"
                    "with DB(sys.argv[1], backend='lmdb') as db:\n    db.insert('b', 5)\n", path],
                   check=True)
    assert max(batch(5), batch(6)) - read > 80_000
    assert len(db) == 47_001
    db.close()
