"""The run entries of small writes kept together in ``recent`` (format 9), on
both LMDB backends: a write of a few documents appends one record there and
writes no run; searches, band searches and decisions find what it holds as
they find what the runs hold; once it would pass RECENT_LIMIT, or before a
rewrite, a compaction or a copy, it is written out as runs and emptied; the
backends read each other's; a format-8 file (none) reads as it is. The
oracles: brute-force Hamming search, and the same stream written in one batch."""

import random

import lmdb
import pytest
from conftest import LMDB_BACKENDS, brute_force, edited, native_built, page, store_format

import simhashdb
from simhashdb.db import FORMAT_VERSION
from simhashdb.errors import DamagedError
from simhashdb.storage import BANDS
from simhashdb.storage.lmdb import format as lmdb_format



def raw_state(path):
    """(recent's records {sequence: groups}, meta's recent counter, each run
    set's directory [(run id, slot, entries)] by its key), read raw."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            counter = int.from_bytes(txn.get(lmdb_format.RECENT, b"", db=meta), "big")
            try:
                recent = env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn, create=False)
            except lmdb.NotFoundError:
                records = None
            else:
                records = {int.from_bytes(k, "big"): lmdb_format.recent_groups(v)
                           for k, v in txn.cursor(recent)}
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
            runs = {k: lmdb_format.directory_runs(v) for k, v in txn.cursor(directory)}
    finally:
        env.close()
    return records, counter, runs


def held(records):
    """The number of values ``records`` hold."""
    return sum(len(values) for groups in records.values() for values in groups.values())


def fingerprints(seed, n, extremes=True):
    """``n`` distinct random fingerprints, with planted neighbours (2 bits away)
    and, where ``extremes``, 0 and 2^64 - 1."""
    rng = random.Random(seed)
    fps = dict.fromkeys([0, 2**64 - 1] if extremes else [])
    while len(fps) < n:
        base, a = rng.getrandbits(64), rng.randrange(64)
        fps.update(dict.fromkeys([base, base ^ (1 << a) ^ (1 << (a + 1 + rng.randrange(63)) % 64)]))
    return list(fps)[:n]


def assert_exact(db, docs, seed):
    """Every probe's matches (stored, flipped and random) equal brute force at 0 to 4 bits."""
    rng = random.Random(seed)
    probes = list(docs.values())[:40] + [rng.getrandbits(64) for _ in range(10)]
    probes += [fp ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64))
               for fp in list(docs.values())[:20]]
    for distance in (0, 3, 4):
        got = db.query_many(probes, distance=distance)
        for probe, matches in zip(probes, got):
            assert [(m.key, m.fingerprint, m.distance) for m in matches] == \
                brute_force(docs, probe, distance), (hex(probe), distance)


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_small_writes_append_to_recent_and_are_found(tmp_path, backend):
    path = str(tmp_path / "db")
    first = fingerprints(1, lmdb_format.RECENT_LIMIT + 1)
    docs = dict(enumerate(first))
    with simhashdb.DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(list(docs.items()))  # past the limit: as runs
    records, counter, runs = raw_state(path)
    assert records == {} and counter == 0
    with simhashdb.DB(path, backend=backend) as db:
        for i, fp in enumerate(fingerprints(2, 60, extremes=False), start=10**6):
            db.insert(i, fp)
            docs[i] = fp
        assert_exact(db, docs, 3)
    records, counter, runs_after = raw_state(path)
    assert runs_after == runs  # no run written by the single inserts
    assert sorted(records) == list(range(60))
    assert all(set(groups) == {lmdb_format.RECENT_FINGERPRINTS} for groups in records.values())
    assert counter == held(records) == 60
    with simhashdb.DB(path, backend=backend, readonly=True) as db:  # read-only too
        assert_exact(db, docs, 4)


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_write_past_the_limit_writes_recent_out_as_runs(tmp_path, backend):
    path = str(tmp_path / "db")
    docs = {}
    fps = fingerprints(5, lmdb_format.RECENT_LIMIT + 300)
    at, records, counter = 0, {}, 0
    while True:
        batch = fps[at:at + 500]
        with simhashdb.DB(path, distance=3, blocks=5, backend=backend) as db:
            db.insert_many([(at + i, fp) for i, fp in enumerate(batch)])
        docs.update((at + i, fp) for i, fp in enumerate(batch))
        at += len(batch)
        before = len(records)
        records, now, runs = raw_state(path)
        if counter + len(batch) > lmdb_format.RECENT_LIMIT:
            break
        assert now == counter + len(batch) == held(records) and len(records) == before + 1
        counter = now
    assert records == {} and now == 0
    for table in range(5 * 4 * 3 // 6):  # C(5, 3) tables of the layout (5 blocks, distance 3)
        assert sum(e for _, _, e in runs[lmdb_format.directory_key(table)]) == len(set(fps[:at]))
    with simhashdb.DB(path, backend=backend) as db:
        assert db.tables == 10
        assert_exact(db, docs, 6)


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_removals_and_returns_of_recent_documents(tmp_path, backend):
    path = str(tmp_path / "db")
    fps = fingerprints(7, 400)
    docs = dict(enumerate(fps))
    with simhashdb.DB(path, distance=3, blocks=5, backend=backend) as db:
        for i in range(0, 400, 20):  # 20 small writes, all in recent
            db.insert_many([(j, fps[j]) for j in range(i, i + 20)])
        for key in range(0, 400, 3):
            db.delete(key)
            del docs[key]
        assert_exact(db, docs, 8)
        for key in range(0, 90, 3):  # back, some under their own fingerprint, some another
            docs[key] = fps[key] if key % 2 else fps[key] ^ 0b101
            db.insert(key, docs[key])
        db.insert(10**6, fps[1])  # a fingerprint two documents now share
        docs[10**6] = fps[1]
        assert_exact(db, docs, 9)
        assert db.check() == []
    assert raw_state(path)[1] > 0
    with simhashdb.DB(path, backend=backend) as db:
        db.compact()
    assert raw_state(path)[:2] == ({}, 0)
    with simhashdb.DB(path, backend=backend) as db:
        assert_exact(db, docs, 10)
        assert db.check() == []


def texts(seed, n, copies):
    """``n`` pages keyed by URL, then ``copies`` lightly edited copies of some of them."""
    rng = random.Random(seed)
    pages = [("https://site%d.example/p/%d" % (i % 7, i), page(rng)) for i in range(n)]
    for i in range(copies):
        pages.append(("https://mirror.example/%d" % i, edited(rng, pages[i * 3 % n][1], 0.02)))
    rng.shuffle(pages)
    return pages


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_texts_one_page_a_call_decide_as_one_batch(tmp_path, backend):
    pages = texts(11, 150, 40)
    with simhashdb.DB(str(tmp_path / "batch"), backend=backend) as db:
        batch = [(d.key, d.status, sorted(m.key for m in d))
                 for d in db.insert_text_if_new_many(pages)]
    path = str(tmp_path / "single")
    with simhashdb.DB(path, backend=backend) as db:
        single = [(key, d.status, sorted(m.key for m in d))
                  for key, text in pages for d in [db.insert_text_if_new(key, text)]]
        queried = db.query_text_many([text for _, text in pages[:30]])
    records, counter, _ = raw_state(path)
    assert records and counter == held(records)
    bands = {lmdb_format.BAND_DIRECTORY + b for b in range(BANDS)}
    assert any(bands <= set(groups) for groups in records.values())
    assert single == batch
    assert sum(status == "duplicate" for _, status, _ in single) >= 30
    for (key, status, duplicated), found in zip(single, queried):  # itself, or what it copied
        assert set(duplicated if status == "duplicate" else [key]) <= {m.key for m in found}


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_rewrite_writes_recent_out_first(tmp_path, backend):
    """Removals enough for the tables and bands to be written again, with
    recent holding entries: every answer stays the oracle's, nothing twice."""
    path = str(tmp_path / "db")
    rng = random.Random(13)
    pages = {"u%d" % i: page(rng, 60) for i in range(300)}
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many(list(pages.items()))
        for key in list(pages)[:150]:
            db.delete(key)
            del pages[key]
        for i in range(20):
            pages["v%d" % i] = page(rng, 60)
            db.insert_text("v%d" % i, pages["v%d" % i])
        db.compact()
        for key, text in list(pages.items())[::7]:
            assert [m.key for m in db.query_text(text)][:1] == [key]
    assert raw_state(path)[:2] == ({}, 0)
    with simhashdb.DB(str(tmp_path / "fresh"), backend=backend) as fresh:
        fresh.insert_text_many(list(pages.items()))
        probe = [text for text in list(pages.values())[::5]]
        assert [[m.key for m in found] for found in db_answers(path, backend, probe)] == \
            [[m.key for m in found] for found in fresh.query_text_many(probe)]


def db_answers(path, backend, probe):
    with simhashdb.DB(path, backend=backend, readonly=True) as db:
        return db.query_text_many(probe)


@pytest.mark.skipif(not native_built(), reason="the native backend was not built")
def test_each_backend_reads_the_others_recent(tmp_path):
    pages = texts(17, 60, 20)
    for writer, reader in (("lmdb", "py-lmdb"), ("py-lmdb", "lmdb")):
        path = str(tmp_path / writer)
        with simhashdb.DB(path, backend=writer) as db:
            for key, text in pages[:40]:
                db.insert_text(key, text)
            written = db.query_text_many([text for _, text in pages])
        assert raw_state(path)[1] > 0
        with simhashdb.DB(path, backend=reader) as db:
            assert [[m.key for m in f] for f in db.query_text_many([t for _, t in pages])] == \
                [[m.key for m in f] for f in written]
            for key, text in pages[40:]:  # and writes after the other's
                db.insert_text(key, text)
        with simhashdb.DB(path, backend=writer) as db:
            found = db.query_text_many([text for _, text in pages])
            assert all(any(m.key == key for m in f) for (key, _), f in zip(pages, found))


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_format_8_file_reads_as_it_is(tmp_path, backend):
    path = str(tmp_path / "db")
    docs = dict(enumerate(fingerprints(19, lmdb_format.RECENT_LIMIT + 1)))
    with simhashdb.DB(path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(list(docs.items()))
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64))
    with env.begin(write=True) as txn:  # as 0.9 wrote it: no recent, format 8
        txn.drop(env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn), delete=True)
        txn.delete(lmdb_format.RECENT, db=env.open_db(lmdb_format.META.name(), txn=txn))
        store_format(env, txn, 8)
    env.close()
    with simhashdb.DB(path, backend=backend, readonly=True) as db:
        assert db.stats()["format"] == 8
        assert_exact(db, docs, 20)
    assert raw_state(path)[0] is None  # a read-only open created nothing
    with simhashdb.DB(path, backend=backend) as db:
        assert db.stats()["format"] == FORMAT_VERSION
        db.insert(-1, 12345)
        docs[-1] = 12345
        assert_exact(db, docs, 21)
    records, counter, _ = raw_state(path)
    assert len(records) == 1 and counter == 1


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
@pytest.mark.parametrize("damage", ["cut", "order", "counter", "missing", "last key"])
def test_a_damaged_recent_is_reported(tmp_path, backend, damage):
    path = str(tmp_path / "db")
    with simhashdb.DB(path, distance=3, blocks=5, backend=backend) as db:
        for i, fp in enumerate(fingerprints(23, 10)):
            db.insert(i, fp)
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64))
    with env.begin(write=True) as txn:
        recent = env.open_db(lmdb_format.RECENT_WRITES.name(), txn=txn)
        records = list(txn.cursor(recent))
        if damage == "counter":
            meta = env.open_db(lmdb_format.META.name(), txn=txn)
            txn.put(lmdb_format.RECENT, (3).to_bytes(8, "big"), db=meta)
        elif damage == "missing":  # the records gone, meta still counting them
            txn.drop(recent, delete=True)
        elif damage == "last key":  # no key can follow it
            txn.delete(records[-1][0], db=recent)
            txn.put(b"\xff" * 8, records[-1][1], db=recent)
        else:
            key, value = records[0]
            groups = {lmdb_format.RECENT_FINGERPRINTS: [5, 9]}
            txn.put(key, value[:-3] if damage == "cut" else
                    lmdb_format.recent_record(groups)[:6] + (9).to_bytes(8, "big")
                    + (5).to_bytes(8, "big"), db=recent)
    env.close()
    with pytest.raises(DamagedError):
        with simhashdb.DB(path, backend=backend, readonly=damage == "missing") as db:
            if damage == "counter":  # reported by check, or raised
                problems = db.check()
                assert problems
                raise DamagedError(problems[0])
            if damage == "last key":
                db.insert(-1, 99)
            db.query_many(fingerprints(23, 10))


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_one_page_a_call_writes_few_pages(tmp_path, backend):
    """The disk bytes a one-document write costs do not count the tables and
    bands (each of 42 run sets a page and its merges before format 9)."""
    path = str(tmp_path / "db")
    rng = random.Random(29)
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many([("https://a.example/%d" % i, page(rng)) for i in range(2000)])

        def written():
            with open("/proc/self/io") as f:
                return int(next(line for line in f if line.startswith("wchar")).split()[1])

        before = written()
        for i in range(100):
            db.insert_text("https://b.example/%d" % i, page(rng))
        per_page = (written() - before) / 100
    assert per_page < 80_000, per_page
