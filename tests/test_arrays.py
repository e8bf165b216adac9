"""Arrays in, arrays out: insert_many(keys=, fingerprints=) stores what the
same (key, fingerprint) tuples store, and query_many(arrays=True) gives what
query_many gives, flat; on every backend."""

import random
from array import array

import pytest

import simhashdb
from simhashdb import InvalidArgumentError, InvalidFingerprintError, InvalidKeyError, records
from conftest import brute_force, flip, stored_keys, stored_value

TOP = 2**64 - 1
NOW = 1_700_000_000


@pytest.fixture
def fixed_now(monkeypatch):
    """Every batch stored at NOW, so that documents compare byte for byte."""
    monkeypatch.setattr(simhashdb.batches, "_now", lambda: NOW)  # tuples and arrays


def corpus(n, seed=7):
    """{key: fingerprint}: keys from 0 to 2**64 - 1, fingerprints 0, 2**64 - 1,
    random ones and near-duplicates of them."""
    rng = random.Random(seed)
    keys = [0, 1, 127, 128, 2**32, 2**63, TOP] + rng.sample(range(2**20), n)
    fps = [0, TOP]
    while len(fps) < len(keys):
        fps.append(flip(rng.choice(fps), rng.sample(range(64), rng.randint(0, 4)))
                   if rng.random() < 0.3 else rng.getrandbits(64))
    rng.shuffle(fps)
    return dict(zip(keys, fps))


def flat(lists):
    """query_many's lists of Matches as (probe indexes, keys, distances) lists."""
    hits = [(i, m.key, m.distance) for i, matches in enumerate(lists) for m in matches]
    return [list(column) for column in zip(*hits)] if hits else [[], [], []]


def test_arrays_store_what_tuples_store_and_query_alike(tmp_path, backend, fixed_now):
    docs = corpus(300)
    keys, fps = array("Q", docs), array("Q", docs.values())
    with simhashdb.DB(str(tmp_path / "tuples"), distance=3, blocks=5) as by_tuples, \
            simhashdb.DB(str(tmp_path / "arrays"), distance=3, blocks=5) as by_arrays:
        assert by_tuples.insert_many(list(docs.items())) == len(docs)
        assert by_arrays.insert_many(keys=keys, fingerprints=fps, batch_size=64) == len(docs)
        assert sorted(stored_keys(by_arrays)) == sorted(stored_keys(by_tuples))
        for key in docs:
            assert stored_value(by_arrays, key) == stored_value(by_tuples, key)
            assert by_arrays.get(key) == by_tuples.get(key) == (key, docs[key], None, NOW)
        probes = array("Q", list(docs.values())[:40] + [flip(fp, [1, 9]) for fp in fps[:40]])
        for d in (0, 3, 5):
            lists = by_arrays.query_many(probes, d)
            assert lists == by_tuples.query_many(probes, d)
            assert [[(m.key, m.fingerprint, m.distance) for m in matches] for matches in lists] \
                == [brute_force(docs, probe, d) for probe in probes]
            found = by_arrays.query_many(probes, d, arrays=True)
            assert [a.typecode for a in found] == ["q", "Q", "B"]
            assert [list(a) for a in found] == flat(lists)


def test_an_array_key_is_the_int_key_one_by_one(db, fixed_now):
    db.insert_many(keys=array("Q", [0, 5, TOP]), fingerprints=array("Q", [1, 2, 3]))
    db.insert(5, 7)  # the same stored key: replaced, not a second document
    db.insert_many([(0, 8)])
    assert len(db) == 3
    assert [db[k].fingerprint for k in (0, 5, TOP)] == [8, 7, 3]
    assert db.query_many([3], 0, arrays=True) == (array("q", [0]), array("Q", [TOP]),
                                                   array("B", [0]))


@pytest.mark.parametrize("typecode", "bBhHiIlLqQ")
def test_keys_of_every_int_width(db, typecode, fixed_now):
    keys = array(typecode, [0, 1, 100, 127])
    assert db.insert_many(keys=keys, fingerprints=[TOP, 0, 2**63, 5]) == 4
    assert [db.get(k) for k in keys] == \
        [(0, TOP, None, NOW), (1, 0, None, NOW), (100, 2**63, None, NOW), (127, 5, None, NOW)]


def test_numpy_arrays(db, fixed_now):
    np = pytest.importorskip("numpy")
    keys = np.arange(1000, dtype=np.int64)
    fps = np.random.default_rng(3).integers(0, 2**64, 1000, dtype=np.uint64)
    db.insert_many(keys=keys, fingerprints=fps)
    probes, found, distances = db.query_many(fps[::-1].copy(), 0, arrays=True)
    assert list(probes) == list(range(1000)) and list(distances) == [0] * 1000
    assert list(found) == list(range(999, -1, -1))
    assert np.asarray(found).dtype == np.uint64


def test_array_documents_read_as_the_tuples_records_make():
    keys, fps = array("Q", [9, 0, 127, 128, 2**32, TOP]), array("Q", [3, TOP, 0, 5, 2**63, 1])
    packed = records.int_arrays(keys, fps)[1](1, 6, NOW)
    expected = records.encode_documents(list(zip(keys[1:], fps[1:])), 512, NOW)
    assert len(packed) == 5 and list(packed) == expected
    assert packed[-1] == expected[-1] and packed[2] == expected[2]
    with pytest.raises(IndexError):
        packed[5]


def test_array_documents_keep_the_fingerprints_they_were_encoded_with():
    """A fingerprint array changed after encoding (another thread, while the
    batch waits for the writer) changes neither a document nor its index entry."""
    fps = array("Q", [1, 2])
    packed = records.int_arrays(array("Q", [5, 6]), fps)[1](0, 2, NOW)
    fps[0] = 2**40
    assert list(packed) == records.encode_documents([(5, 1), (6, 2)], 512, NOW)
    assert list(packed.fingerprints) == [1, 2]


def test_a_repeated_key_keeps_its_last_fingerprint(db):
    db.insert_many(keys=[4, 4, 4], fingerprints=[1, 2, 3])
    assert len(db) == 1 and db[4].fingerprint == 3


def test_empty_arrays(db):
    assert db.insert_many(keys=array("Q"), fingerprints=array("Q")) == 0
    assert len(db) == 0
    assert db.query_many(array("Q"), arrays=True) == (array("q"), array("Q"), array("B"))
    db.insert(1, 5)
    assert db.query_many([TOP], arrays=True) == (array("q"), array("Q"), array("B"))


def test_arrays_of_matches_need_int_keys(db):
    db.insert_many([("text", 5), (b"raw", 6), (-1, 7), ("x" * 600, 8)])
    for fp in (5, 6, 7, 8):
        with pytest.raises(InvalidKeyError, match="without arrays=True"):
            db.query_many([fp], 0, arrays=True)


@pytest.mark.parametrize("keys, fps, error, message", [
    (array("Q", [1, 2]), array("Q", [1]), InvalidArgumentError, "same length"),
    (array("q", [1, -5]), array("Q", [1, 2]), InvalidKeyError, "got -5 at index 1"),
    ([1, -1], [1, 2], InvalidKeyError, "got -1 at index 1"),
    ([2**64], [1], InvalidKeyError, "got 18446744073709551616 at index 0"),
    ([True], [1], InvalidKeyError, "got True"),
    (["a"], [1], InvalidKeyError, "got 'a'"),
    ("ab", [1, 2], InvalidKeyError, "array of ints"),
    (b"ab", [1, 2], InvalidKeyError, "array of ints"),
    (array("d", [1.0]), [1], InvalidKeyError, "format 'd'"),
    (memoryview(array("Q", [1, 2])).cast("B").cast("Q", [1, 2]), [1, 2], InvalidKeyError,
     "1-d"),
    (array("Q", [1]), array("d", [1.0]), InvalidFingerprintError, "unsigned 64-bit"),
    (array("Q", [1]), array("q", [1]), InvalidFingerprintError, "unsigned 64-bit"),
    ([1], [2**64], InvalidFingerprintError, "2\\*\\*64"),
    ([1], [-1], InvalidFingerprintError, "2\\*\\*64"),
    (5, [1], InvalidKeyError, "array of ints"),
])
def test_bad_arrays_raise_and_write_nothing(db, keys, fps, error, message):
    with pytest.raises(error, match=message):  # not even the batches before the bad key
        db.insert_many(keys=keys, fingerprints=fps, batch_size=1)
    assert len(db) == 0


def test_bad_numpy_arrays(db):
    np = pytest.importorskip("numpy")
    with pytest.raises(InvalidKeyError, match="contiguous"):
        db.insert_many(keys=np.arange(10)[::2], fingerprints=np.zeros(5, np.uint64))
    with pytest.raises(InvalidKeyError, match="format '\\?'"):
        db.insert_many(keys=np.ones(2, bool), fingerprints=np.zeros(2, np.uint64))
    with pytest.raises(InvalidFingerprintError):
        db.insert_many(keys=np.arange(2), fingerprints=np.zeros(2, np.float64))


def test_records_and_arrays_do_not_mix(db):
    with pytest.raises(InvalidArgumentError, match="no metadata"):
        db.insert_many([(1, 2, {"meta": 1})], keys=[1], fingerprints=[2])
    with pytest.raises(InvalidArgumentError, match="together"):
        db.insert_many(keys=[1])
    with pytest.raises(InvalidArgumentError, match="records"):
        db.insert_many()
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        db.insert_many(keys=[1], fingerprints=[2], batch_size=0)
    assert len(db) == 0
