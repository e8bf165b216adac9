import gc
import itertools
import os
import random
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from conftest import (as_tuples, brute_force, flip, key_order, storage_of, store_params,
                      stored_id, stored_params)
from hypothesis import example, given
from hypothesis import strategies as st

import simhashdb
from simhashdb import (
    DB,
    DatabaseBusyError,
    DatabaseError,
    FormatVersionError,
    InvalidArgumentError,
    InvalidFingerprintError,
    InvalidKeyError,
    InvalidMetadataError,
    Match,
    ParameterMismatchError,
    Record,
    SimhashDBError,
)
from simhashdb.layout import Layout
from simhashdb.storage.lmdb import format as lmdb_format

MAX = 2**64 - 1
pytestmark = pytest.mark.usefixtures("backend")  # every test here runs on each backend


def test_insert_get_query_delete(db):
    db.insert("a", 0b1011, {"url": "https://a"})
    db.insert(b"b", 0b1000)
    db.insert(7, MAX)
    assert len(db) == 3 and "a" in db and b"b" in db and 7 in db and "zz" not in db
    assert db.get("a")[:3] == Record("a", 0b1011, {"url": "https://a"})[:3]
    assert db.get(b"b")[:3] == (b"b", 0b1000, None)
    assert db.get("missing") is None
    assert db.query(0b1010) == [Match("a", 0b1011, 1), Match(b"b", 0b1000, 1)]
    assert db.query(0b1010, distance=0) == []
    assert db.delete("a") is True and db.delete("a") is False
    assert db.query(0b1010) == [Match(b"b", 0b1000, 1)]
    assert sorted(r.key for r in db if not isinstance(r.key, int)) == [b"b"]
    assert db.check() == []


def test_upsert_replaces_the_document(db):
    db.insert("doc", 100, "v1")
    db.insert("doc", 100, "v2")
    assert db.get("doc")[:3] == ("doc", 100, "v2") and len(db) == 1
    db.insert("doc", 2**40)
    assert db.query(100) == [] and db.query(2**40) == [Match("doc", 2**40, 0)]
    assert db.check() == []


def test_identical_fingerprints_under_many_keys(db):
    db.insert_many([(k, 42) for k in ("x", "y", "z")])
    assert as_tuples(db.query(42)) == [("x", 42, 0), ("y", 42, 0), ("z", 42, 0)]
    db.delete("y")
    assert [m.key for m in db.query(43)] == ["x", "z"]
    db.delete_many(["x", "z"])
    assert db.query(42) == [] and db.check() == []


def test_keys_round_trip_with_their_types(db):
    keys = ["1", b"1", 1, -5, 2**64 - 1, "", b"", "ключ"]
    db.insert_many((k, i) for i, k in enumerate(keys))
    assert len(db) == len(keys)
    for i, k in enumerate(keys):
        got = db.get(k)
        assert got.key == k and type(got.key) is type(k) and got.fingerprint == i


@pytest.mark.parametrize("blocks,distance", [(1, 0), (2, 1), (4, 3), (5, 3), (6, 3), (8, 2),
                                             (8, 7), (10, 4)])
def test_oracle_random_and_adversarial(tmp_path, blocks, distance):
    rng = random.Random(blocks * 100 + distance)
    layout = Layout(blocks, distance)
    with DB(str(tmp_path / "o.db"), distance=distance, blocks=blocks) as db:
        docs = {}
        base = [rng.getrandbits(64) for _ in range(30)] + [0, MAX]
        for i, fp in enumerate(base):
            docs["base%d" % i] = fp
            # k and k+1 flips, spread and packed into one block
            start = 64 - sum(layout.widths[:1 + i % blocks])
            width = layout.widths[i % blocks]
            packed = list(range(start, start + min(width, distance + 1)))
            spread = rng.sample(range(64), distance + 1)
            docs["spread%d" % i] = flip(fp, spread[:distance])
            docs["spread+1_%d" % i] = flip(fp, spread)
            docs["packed%d" % i] = flip(fp, packed[:distance])
            docs["packed+1_%d" % i] = flip(fp, packed)
            docs["dup%d" % i] = fp
        docs.update(("rand%d" % i, rng.getrandbits(64)) for i in range(300))
        db.insert_many(docs.items(), batch_size=97)
        for q in base + [rng.getrandbits(64) for _ in range(30)]:
            for d in range(distance + 1):
                assert as_tuples(db.query(q, d)) == brute_force(docs, q, d)
        assert db.check() == []


@given(st.lists(st.integers(0, MAX), min_size=1, max_size=40),
       st.lists(st.integers(0, 63), max_size=4), st.sampled_from([(4, 3), (5, 2), (7, 3)]))
def test_property_queries_equal_brute_force(tmp_path_factory, fps, bits, params):
    blocks, distance = params
    path = str(tmp_path_factory.mktemp("p") / "db")
    docs = {i: fp for i, fp in enumerate(fps)}
    with DB(path, distance=distance, blocks=blocks) as db:
        db.insert_many(docs.items())
        probe = flip(fps[0], set(bits))
        assert as_tuples(db.query(probe)) == brute_force(docs, probe, distance)


def test_query_many_accepts_buffers(db):
    rng = random.Random(3)
    fps = [rng.getrandbits(64) for _ in range(50)]
    db.insert_many(enumerate(fps))
    probes = np.array([flip(fp, [1, 30]) for fp in fps], dtype=np.uint64)
    results = db.query_many(probes)
    assert [r[0].key for r in results] == list(range(50))
    assert results == db.query_many([int(p) for p in probes])


def test_insert_if_new_is_the_dedupe_step(db):
    assert db.insert_if_new("first", 0b1111) == []
    assert db.insert_if_new("second", 0b0111) == [Match("first", 0b1111, 1)]
    assert "second" not in db
    assert db.insert_if_new("far", 0b1111 << 40) == []
    results = db.insert_if_new_many([("n1", 2**50), ("n2", 2**50 + 1), ("n3", 7 << 60)])
    assert results == [[], [Match("n1", 2**50, 1)], []]
    assert "n1" in db and "n2" not in db and "n3" in db
    assert db.insert_if_new("close", 0b1110, distance=0) == []
    assert db.check() == []


def test_batches_land_whole_or_not_at_all(db):
    db.insert("keep", 1)
    with pytest.raises(InvalidFingerprintError):
        db.insert_many([("a", 2), ("b", -1)])
    with pytest.raises(InvalidMetadataError, match="cannot be stored"):
        db.insert_many([("a", 2), ("b", 3, {1, 2})])
    with pytest.raises(InvalidKeyError):
        db.insert_many([("a", 2), (1.5, 3)])
    assert len(db) == 1 and db.check() == []
    assert db.insert_many([("x%d" % i, i) for i in range(10)], batch_size=3) == 10
    assert len(db) == 11


def test_a_stream_of_batches_commits_in_order_up_to_the_first_failure(db, monkeypatch):
    """The batches of a stream land in order (the last record of a key wins);
    the first batch that fails to encode or to write stops the stream: the
    batches before it are committed, it and the ones after it are not."""
    assert db.insert_many((("k%d" % (i % 4), i) for i in range(10)), batch_size=3) == 10
    assert {r.key: r.fingerprint for r in db} == {"k0": 8, "k1": 9, "k2": 6, "k3": 7}
    with pytest.raises(InvalidFingerprintError):
        db.insert_many((("a%d" % i, -1 if i == 7 else i) for i in range(12)), batch_size=3)
    assert sorted(r.key for r in db if r.key[0] == "a") == ["a%d" % i for i in range(6)]
    writes, write = [], storage_of(db).write

    def failing_second(body, documents=0):
        writes.append(body)
        if len(writes) == 2:
            raise DatabaseError("the disk failed")
        return write(body, documents)

    monkeypatch.setattr(storage_of(db), "write", failing_second)
    with pytest.raises(DatabaseError, match="the disk failed"):
        db.insert_many((("b%d" % i, i) for i in range(12)), batch_size=3)
    assert len(writes) == 2
    assert sorted(r.key for r in db if r.key[0] == "b") == ["b0", "b1", "b2"]


def test_a_bulk_load_settles_its_calls_once_at_its_end(db, monkeypatch):
    """On every backend: the calls in a bulk load store and answer as without
    one; the outermost block settles what they all wrote, once; a block left
    by an exception keeps its committed batches and settles nothing."""
    settled, settle = [], storage_of(db).settle

    def counting(documents):
        settled.append(documents)
        settle(documents)

    monkeypatch.setattr(storage_of(db), "settle", counting)
    with pytest.raises(RuntimeError), db.bulk_load():
        db.insert_many([("a%d" % i, i << 40) for i in range(4)], batch_size=2)
        raise RuntimeError
    assert settled == [] and len(db) == 4
    docs = {"b%d" % i: i * 0x9E3779B97F4A7C15 % 2**64 for i in range(1, 8)}
    with db.bulk_load():
        for key in ("b1", "b2", "b3"):
            db.insert(key, docs[key])
        with db.bulk_load():
            decisions = db.insert_if_new_many([(k, docs[k]) for k in ("b4", "b5", "b6", "b7")],
                                              batch_size=2)
        assert settled == []
    assert settled == [7] and [d.status for d in decisions] == ["stored"] * 4
    docs.update(("a%d" % i, i << 40) for i in range(4))
    assert len(db) == 11 and db.check() == []
    for fp, found in zip(docs.values(), db.query_many(list(docs.values()))):
        assert as_tuples(found) == brute_force(docs, fp, 3)


@pytest.mark.parametrize("key", [1.5, None, ("t",), True, 2**64, -2**63 - 1, "\ud800"])
def test_bad_keys(db, key):
    with pytest.raises(InvalidKeyError):
        db.insert(key, 1)


def test_bad_arguments(db):
    with pytest.raises(InvalidArgumentError, match="would probe"):
        db.query(1, distance=20)
    with pytest.raises(InvalidArgumentError, match="database's distance"):
        list(db.find_all(distance=4))
    with pytest.raises(InvalidArgumentError, match="record"):
        db.insert_many([("only-key",)])
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        db.insert_many([("a", 1)], batch_size=0)
    with pytest.raises(InvalidFingerprintError):
        db.query("12")
    assert issubclass(DatabaseError, SimhashDBError)


def test_parameters_are_stored_and_checked(tmp_path):
    path = str(tmp_path / "params.db")
    with DB(path, distance=2, blocks=6) as db:
        db.insert("a", 5)
    with DB(path) as db:
        assert (db.distance, db.blocks, len(db)) == (2, 6, 1)
    with pytest.raises(ParameterMismatchError, match="distance=2"):
        DB(path, distance=3)
    with pytest.raises(ParameterMismatchError, match="blocks=6"):
        DB(path, blocks=5)
    with pytest.raises(InvalidArgumentError, match="blocks"):
        DB(str(tmp_path / "bad.db"), distance=3, blocks=3)
    with DB(path, distance=2, blocks=6):
        pass


def test_blocks_are_chosen_from_distance_and_size(tmp_path):
    assert Layout.choose_blocks(3, 10**6) == 5
    assert Layout.choose_blocks(3, 10**9) == 6
    assert Layout.choose_blocks(0, 10**6) == 1
    with DB(str(tmp_path / "auto.db"), distance=3, expected_size=10**6) as db:
        assert db.blocks == 5


@pytest.mark.parametrize("params", [dict(blocks=64, distance=3), dict(blocks=2, distance=3),
                                    dict(blocks=20, distance=10)])
def test_a_database_that_cannot_be_made_leaves_nothing_behind(tmp_path, params):
    path = tmp_path / "no.db"
    with pytest.raises(simhashdb.InvalidArgumentError):
        DB(str(path), **params)
    assert not path.exists()


@pytest.mark.parametrize("url", ["redis:/localhost/x", "Redis://h:1/x", "rediss:h:1/x"])
def test_a_path_like_a_mistyped_url_is_refused_not_made_a_directory(tmp_path, monkeypatch,
                                                                   url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(simhashdb.InvalidArgumentError, match="not a redis URL"):
        DB(url)
    assert os.listdir(tmp_path) == []


def test_newer_format_is_refused(db_path):
    with DB(db_path) as db:
        db.insert("a", 1)
        params = msgpack.unpackb(stored_params(db))
        params["format"] = 99
        store_params(db, msgpack.packb(params))
    with pytest.raises(FormatVersionError, match="upgrade"):
        DB(db_path)


@pytest.mark.lmdb_only
def test_paths_that_are_not_databases(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(DatabaseError, match="is a file"):
        DB(str(not_a_dir))
    with pytest.raises(DatabaseError, match="read-only"):
        DB(str(tmp_path / "missing"), readonly=True)


def test_readonly_and_closed(db_path):
    with DB(db_path) as db:
        db.insert("a", 1)
    with DB(db_path, readonly=True) as db:
        assert db.query(1) == [Match("a", 1, 0)]
        with pytest.raises(DatabaseError, match="read-only"):
            db.insert("b", 2)
    with pytest.raises(DatabaseError, match="closed"):
        db.query(1)
    assert any("closed" in problem for problem in db.check())


@pytest.mark.lmdb_only
def test_compact_reclaims_space_and_keeps_every_record(db):
    rng = random.Random(5)
    docs = {i: rng.getrandbits(64) for i in range(20000)}
    db.insert_many(docs.items())
    db.delete_many(range(0, 20000, 2))
    before = db.stats()["disk_bytes"]
    db.compact()
    assert db.stats()["disk_bytes"] < before
    kept = {k: v for k, v in docs.items() if k % 2}
    assert len(db) == len(kept) and db.check() == []
    probe = kept[1] ^ 0b111
    assert as_tuples(db.query(probe)) == brute_force(kept, probe, 3)


@pytest.mark.lmdb_only
def test_compact_refuses_while_another_process_has_it_open(db):
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, simhashdb; db = simhashdb.DB(sys.argv[1]); print('open', flush=True);"
        "sys.stdin.read()"), db.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(DatabaseBusyError, match="another process"):
            db.compact()
    finally:
        child.communicate("")
    db.compact()


@pytest.mark.lmdb_only
def test_map_grows_by_itself(db_path, monkeypatch):
    monkeypatch.setattr("simhashdb.storage.lmdb.files.LmdbStorage.initial_map_size", 1 << 20)
    with DB(db_path, distance=3, blocks=6) as db:
        rng = random.Random(9)
        db.insert_many((i, rng.getrandbits(64), "m" * 50) for i in range(30000))
        assert len(db) == 30000 and db.stats()["map_size"] > 1 << 20
        assert db.check() == []


@pytest.mark.lmdb_only
@pytest.mark.parametrize("arrays", [False, True])
def test_a_batch_too_large_for_the_map_is_written_once(db_path, monkeypatch, arrays):
    """The map grows before a batch that would not fit in it, so its
    transaction runs once: filling the map would undo it and run it again."""
    monkeypatch.setattr("simhashdb.storage.lmdb.files.LmdbStorage.initial_map_size", 1 << 20)
    rng = np.random.default_rng(3)
    keys, fps = np.arange(40000, dtype=np.uint64), rng.integers(0, 2**64, 40000, dtype=np.uint64)
    with DB(db_path, distance=3, blocks=6) as db:
        runs, write = [], storage_of(db).write

        def counted(body, documents=0):
            return write(lambda txn: (runs.append(documents), body(txn))[1], documents)
        monkeypatch.setattr(storage_of(db), "write", counted)
        if arrays:
            db.insert_many(keys=keys, fingerprints=fps, batch_size=keys.size)
        else:
            db.insert_many(zip(keys.tolist(), fps.tolist()), batch_size=keys.size)
        assert runs == [40000] and db.stats()["map_size"] >= 4 << 20
        assert db.check() == [] and len(db) == 40000
        assert db.get(39999).fingerprint == int(fps[-1])


def test_stats(db):
    db.insert_many([("a", 1), ("b", 1), ("c", 2)])
    stats = db.stats()
    assert stats["count"] == 3 and stats["distinct_fingerprints"] == 2
    assert stats["tables"] == 10 and stats["blocks"] == 5 and stats["distance"] == 3
    if db.backend == "redis":  # the RAM of its keys: documents, index, 10 tables, parameters
        assert "disk_bytes" not in stats
        assert stats["keys"] >= 3 + 10 + 1 and 50 < stats["memory_bytes"] / stats["keys"] < 300
        size = stats["memory_bytes"]
    else:
        assert "memory_bytes" not in stats
        assert stats["disk_bytes"] >= os.path.getsize(os.path.join(db.path, "data.mdb")) > 0
        size = stats["disk_bytes"]
    assert stats["bytes_per_fingerprint_per_table"] == size / (2 * 10)


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.lmdb_only
def test_check_reports_a_damaged_table(db):
    db.insert_many([("a", 1), ("b", 2)])
    import lmdb
    db.close()
    env = lmdb.open(db.path, max_dbs=4096)
    with env.begin(write=True) as txn:  # table 3's run (one block) lost
        slot = env.open_db(lmdb_format.TABLE_RUNS.name(3, 0), txn=txn)
        assert txn.drop(slot, delete=False) is None
    env.close()
    db = DB(db.path)
    problems = db.check()
    assert len(problems) == 1 and "table 3" in problems[0] and "2 missing" in problems[0]


def test_check_reads_the_keys_of_a_fingerprint_many_documents_share_once(db, monkeypatch):
    """Documents are checked a chunk at a time against the index: the keys of a
    fingerprint of more documents than a chunk are read once, not once a chunk
    (25k documents of one fingerprint took 9 s, 100k 175 s), and a document
    missing from such a fingerprint's entries is still named."""
    import contextlib

    import simhashdb.check
    monkeypatch.setattr(simhashdb.check, "CHUNK", 100)
    db.insert_many([(i, 12345) for i in range(3000)] + [(-i, i * 7919) for i in range(1, 500)])
    read, real = [], storage_of(db).read

    @contextlib.contextmanager
    def counted():
        with real() as view:
            keys_of_many = view.keys_of_many
            view.keys_of_many = lambda fps: read.append(keys_of_many(fps)) or read[-1]
            yield view
    monkeypatch.setattr(storage_of(db), "read", counted)
    assert db.check() == []
    assert sum(len(keys) for found in read for keys in found.values()) == 3499
    if db.backend in ("lmdb", "py-lmdb"):  # one entry of the shared fingerprint lost
        import lmdb
        db.close()
        env = lmdb.open(db.path, max_dbs=4096)
        with env.begin(write=True) as txn:
            id_ = stored_id(env, txn, msgpack.packb(1717))
            for name in lmdb_format.INDEX.names():
                txn.delete((12345).to_bytes(8, "big"), id_,
                           db=env.open_db(name, txn=txn, dupsort=True))
        env.close()
        with DB(db.path) as reopened:
            problems = reopened.check()
        assert [p for p in problems if "document 1717 " in p and "missing from the fingerprint "
                "index" in p] and "3498 entries for 3499 documents" in " ".join(problems), problems


def test_use_after_fork_is_refused(db):
    pid = os.fork()
    if pid == 0:
        try:
            db.query(1)
            code = 1
        except DatabaseError:
            code = 0
        os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def brute_force_pairs(docs, distance):
    out = []
    for a, b in itertools.combinations(docs, 2):
        d = bin(docs[a] ^ docs[b]).count("1")
        if d <= distance:
            out.append(tuple(sorted((a, b), key=key_order)) + (d,))
    return sorted(out, key=pair_order)


def pair_order(pair):
    return key_order(pair[0]), key_order(pair[1])


def cluster_order(cluster):
    return [key_order(k) for k in cluster]


def brute_force_clusters(docs, distance):
    group = {k: {k} for k in docs}
    for a, b in itertools.combinations(docs, 2):
        if bin(docs[a] ^ docs[b]).count("1") <= distance and group[a] is not group[b]:
            merged = group[a] | group[b]
            for k in merged:
                group[k] = merged
    return sorted((sorted(g, key=key_order) for g in {id(g): g for g in group.values()}.values()
                   if len(g) > 1), key=cluster_order)


@given(st.lists(st.integers(0, 40), min_size=1, max_size=40), st.integers(0, 3),
       st.randoms(use_true_random=False))
def test_db_find_all_and_clusters_equal_brute_force(tmp_path_factory, shape, distance, rnd):
    bases = [rnd.getrandbits(64) for _ in range(4)] + [0, MAX]
    docs = {}
    for i, s in enumerate(shape):
        fp = bases[s % len(bases)]
        for bit in rnd.sample(range(64), s % 5):
            fp ^= 1 << bit
        docs["k%d" % i if i % 3 else i] = fp
    with DB(str(tmp_path_factory.mktemp("fa") / "db"), distance=3, blocks=5) as db:
        db.insert_many(docs.items())
        assert sorted(db.find_all(distance), key=pair_order) == brute_force_pairs(docs, distance)
        assert sorted(db.clusters(distance), key=cluster_order) == \
            brute_force_clusters(docs, distance)


WRITER = """
import sys, simhashdb
db = simhashdb.DB(sys.argv[1])
x, y, probe = "x" * int(sys.argv[3]), "y" * int(sys.argv[3]), int(sys.argv[4])
for i in range(int(sys.argv[2])):  # one document near the probe, under two keys in turn
    db.insert((x, y)[i % 2], probe ^ (i % 2))
    db.delete((y, x)[i % 2])
"""


@pytest.mark.parametrize("key_size", [1, 600])
def test_a_large_query_many_answers_from_one_snapshot(db, db_path, key_size):
    """A batch split over the cores reads one commit in every part, and keys
    kept as digests (over 511 bytes) are named in the commit their hits came from."""
    probe = 0x0123456789ABCDEF
    db.insert("y" * key_size, probe ^ 1)  # a document near the probe from the start
    writer = subprocess.Popen([sys.executable, "-c", WRITER, db_path, "300", str(key_size),
                               str(probe)])
    calls = mixed = 0
    while writer.poll() is None or calls == 0:
        answers = {tuple(sorted(m.key for m in found))
                   for found in db.query_many([probe] * 8192)}
        mixed += len(answers) > 1 or () in answers  # parts of two commits, or a hit lost
        calls += 1
    assert writer.wait() == 0
    assert mixed == 0, "%d of %d calls mixed snapshots" % (mixed, calls)


@pytest.mark.parametrize("ask", ["query_many", "query_text_many"])
def test_hits_are_named_from_the_state_they_were_found_in(db, db_path, monkeypatch, ask):
    """A batch landing between a query's search and the reads that name its
    hits (long keys' documents, texts' signatures) changes neither."""
    text = "the crawler keeps every page it has seen " * 20
    db.insert_text("y" * 600, text)
    fp = db["y" * 600].fingerprint
    names, landed = simhashdb.results.names, []

    def names_after_a_batch(view, found):
        if not landed:  # another handle moves the document to another long key
            with simhashdb.DB(db_path) as other:
                other.insert_text("x" * 600, text)
                other.delete("y" * 600)
            landed.append(True)
        return names(view, found)
    monkeypatch.setattr(simhashdb.results, "names", names_after_a_batch)
    found = db.query_many([fp]) if ask == "query_many" else db.query_text_many([text])
    assert landed and [m.key for m in found[0]] in (["x" * 600], ["y" * 600])


def test_a_batch_pauses_the_collector_and_leaves_it_as_it_was(db, monkeypatch):
    """Python's cyclic GC is off while a batch's transaction runs, on again
    after it (also after a failed one) with its young generations collected;
    a caller's own gc.disable() is kept."""
    inside = []

    def failing(*args):
        inside.append(gc.isenabled())
        garbage = [[] for _ in range(50_000)]  # tracked objects the collector counts
        for a, b in zip(garbage, garbage[1:]):
            a.append(b)
        raise ZeroDivisionError
    monkeypatch.setattr(simhashdb.rule, "decide", failing)
    with pytest.raises(ZeroDivisionError):
        db.insert_text_if_new_many([("a", "a page of a few words")])
    assert inside == [False] and gc.isenabled()
    assert gc.get_count()[0] <= gc.get_threshold()[0]
    monkeypatch.undo()
    gc.disable()
    try:
        db.insert_text_if_new_many([("a", "a page of a few words")])
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert "a" in db


def test_find_all_reads_one_snapshot_and_blocks_no_writer(db):
    db.insert_many([("a", 1), ("b", 3), ("c", 7 << 40)])
    pairs = db.find_all()
    first = next(pairs)
    db.insert("d", 1)  # a write while the iteration holds its snapshot
    assert [first] + list(pairs) == [("a", "b", 1)]
    assert ("a", "d", 0) in list(db.find_all())


def test_recipes_are_stored_and_never_mixed(tmp_path):
    path = str(tmp_path / "r.db")
    with DB(path, recipe="recipe-a") as db:
        db.insert("x", 1)
        assert db.recipe == "recipe-a" and db.stats()["recipe"] == "recipe-a"
    with DB(path) as db:
        assert db.recipe == "recipe-a"
    with pytest.raises(ParameterMismatchError, match="recipe-a"):
        DB(path, recipe="recipe-b")
    empty = str(tmp_path / "empty.db")
    with DB(empty):
        pass
    with DB(empty, recipe="recipe-b") as db:  # an empty database takes a recipe
        assert db.recipe == "recipe-b"
    unnamed = str(tmp_path / "unnamed.db")
    with DB(unnamed) as db:
        db.insert("x", 1)
    with pytest.raises(ParameterMismatchError, match="unnamed recipe"):
        DB(unnamed, recipe=simhashdb.RECIPE)


def test_a_recipe_of_simhashdb_is_named_by_its_first_part_and_an_unknown_one_refused(tmp_path):
    short = simhashdb.RECIPE.split("/")[0]
    with DB(str(tmp_path / "s.db"), recipe=short) as db:
        assert db.recipe == simhashdb.RECIPE
        db.insert_text("a", "the same words in the same order")
        assert [m.key for m in db.query_text("the same words in the same order")] == ["a"]
    with pytest.raises(simhashdb.InvalidArgumentError, match="does not start with 'simhashdb-'"):
        DB(str(tmp_path / "n.db"), recipe="simhashdb-99")
    assert not (tmp_path / "n.db").exists()


@given(st.lists(st.tuples(
    st.one_of(st.integers(-2**63, 2**64 - 1), st.binary(max_size=600),
              st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)),
    st.integers(0, 2**64 - 1)), max_size=20), st.integers(0, 2**64 - 1))
def test_plain_records_are_encoded_natively_exactly_as_msgpack_does(records, stored_at):
    """The native encoder of plain records gives msgpack's bytes, or declines
    (None) where a key is too long, so that the general path stores its digest."""
    from simhashdb.records import MAX_KEY_BYTES, encode_documents
    native = simhashdb._records.encode_plain_documents(list(records), MAX_KEY_BYTES, stored_at)
    expected = [(msgpack.packb(k), fp, msgpack.packb([fp, None, stored_at])) for k, fp in records]
    if all(len(key) <= MAX_KEY_BYTES for key, _, _ in expected):
        assert native == expected
        assert encode_documents(iter(records), MAX_KEY_BYTES, stored_at) == expected
    else:
        assert native is None


@given(st.lists(st.one_of(st.integers(-2**65, 2**65), st.none(), st.binary(max_size=3),
                          st.booleans()), max_size=5), st.binary(max_size=3), st.binary(max_size=2))
@example([2**64 - 1, None, 0], b"\x00", b"\x00")
@example([127, None, 128], b"\x00", b"")
@example([128, None, 2**32], b"\x00" * 3, b"\xc0")
def test_document_values_read_natively_as_msgpack_reads_them_or_are_damaged(items, cut, tail):
    """A document value's items: the native reading of a plain one ([unsigned
    int, nil, unsigned int]) gives what msgpack gives, and every value, cut
    short or with bytes after it too, is that or a DatabaseError, never
    another exception (what simhashdb writes is read back: the next test)."""
    from simhashdb.records import document_items
    try:
        value = msgpack.packb(items)
    except OverflowError:
        return
    for raw in (value, value[:-len(cut) or None], value + tail):
        plain = simhashdb._records.plain_items(raw)
        if plain is not None:
            assert raw == value and plain == items and items[1] is None
        try:
            read = document_items(raw)
        except DatabaseError:
            continue
        assert read == msgpack.unpackb(raw) and 2 <= len(read) <= 5


@given(st.integers(0, 2**64 - 1), st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) |
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5) | st.integers(-5, 5), inner, max_size=3), max_leaves=8),
    st.integers(0, 2**64 - 1), st.one_of(st.none(), st.binary(min_size=256, max_size=256)),
    st.text(min_size=0, max_size=600))
def test_every_document_value_simhashdb_writes_reads_back(fp, meta, stored_at, sign, key):
    """Values as encode_documents, with_signature and restamped write them (any
    metadata msgpack writes, long keys' digests, a text's signature) read
    back through document_items and decode, none taken for damage."""
    from simhashdb.records import (
        decode, decode_key, document_items, encode_documents, restamped, with_signature)
    [(stored_key, _, value)] = encode_documents([(key, fp, meta, stored_at)], 511, 0)
    for value in [value] + ([with_signature(value, sign)] if sign else []):
        for value in (value, restamped(value, 7)):
            items = document_items(value)
            assert items[0] == fp and items == msgpack.unpackb(value, strict_map_key=False)
            record = decode(decode_key(stored_key, value), value)
            assert (record.key, record.fingerprint) == (key, fp)


def test_records_pack_as_msgpack_does_after_errors_nested_packs_and_huge_records():
    """encode_documents packs with one Packer a thread: what it packs after a
    failed record, inside a dict subclass that packs while it is packed, and
    after a record too large to keep its buffer is what msgpack.packb packs."""
    from simhashdb.records import KEPT_PACKER_BYTES, encode_documents

    class Packing(dict):
        def items(self):
            encode_documents([("inner", 5, {"x": 1})], 511, 0)
            return super().items()

    with pytest.raises(simhashdb.InvalidMetadataError):
        encode_documents([("k", 1, {"bad": {1, 2}})], 511, 0)
    for meta in (Packing(a=1), "x" * (KEPT_PACKER_BYTES + 1), {"small": 1}):
        [(key, fp, value)] = encode_documents([("k", 1, meta, 7)], 511, 0)
        assert (key, value) == (msgpack.packb("k"), msgpack.packb([1, meta, 7]))


@pytest.mark.parametrize("record", [("k", 1, {"m": 1}), (True, 1), ("\ud800", 1), ("k", 2**64),
                                    ("k", True), ["k", 1], (2**64, 1)])
def test_records_that_are_not_plain_take_the_general_path(record):
    assert simhashdb._records.encode_plain_documents([("a", 1), record], 511, 0) is None


def test_insert_if_new_treats_the_stored_version_of_a_key_as_any_other_document(db):
    """Unchanged or a little changed: found, nothing written; far: replaced, and said so."""
    far = [0xFFFF << s for s in (48, 32, 16, 4)]  # 16+ bits from each other and from 0b1111
    db.insert("page", 0b1111, {"v": 1})
    found = db.insert_if_new("page", 0b1111, {"v": 2})
    assert found == [Match("page", 0b1111, 0)] and found.replaced is None
    found = db.insert_if_new("page", 0b0011, {"v": 3})
    assert found == [Match("page", 0b1111, 2)] and db.get("page").meta == {"v": 1}
    found = db.insert_if_new("page", far[0], {"v": 4})
    assert found == [] and found.replaced[:3] == ("page", 0b1111, {"v": 1})
    assert db.get("page")[:3] == ("page", far[0], {"v": 4}) and db.query(0b1111) == []
    new = db.insert_if_new("other", far[1])
    assert new == [] and new.replaced is None
    # in one batch, a later record of a key replaces the earlier one stored
    results = db.insert_if_new_many([("k", far[2]), ("k", far[3], "second"), ("k", far[3] ^ 1)])
    assert [r.replaced and r.replaced[:3] for r in results] == [None, ("k", far[2], None), None]
    assert results[2] == [Match("k", far[3], 1)] and db.get("k").meta == "second"
    assert len(db) == 3 and db.check() == []


def test_db_reads_like_a_mapping(db):
    db.insert_many([("a", 1, {"m": 1}), (2, 3)])
    assert db["a"][:3] == ("a", 1, {"m": 1}) and db[2].fingerprint == 3
    assert "a" in db and 2 in db and "2" not in db
    with pytest.raises(KeyError) as missing:
        db["zz"]
    assert isinstance(missing.value, simhashdb.KeyNotFoundError)
    assert isinstance(missing.value, simhashdb.SimhashDBError)
    assert str(missing.value) == "no document with key 'zz'"
    with pytest.raises(simhashdb.InvalidKeyError):
        db[1.5]
    keys = [r.key for r in db]  # iteration gives Records, documented; on LMDB by key hash
    assert (keys if db.backend != "redis" else sorted(keys, key=str)) == [2, "a"]


def test_version_and_type_information_ship_with_the_package():
    import importlib.metadata
    import importlib.resources
    import re as regex
    assert simhashdb.__version__ == importlib.metadata.version("simhashdb")
    package = importlib.resources.files("simhashdb")
    assert package.joinpath("py.typed").is_file()
    init = package.joinpath("__init__.py").read_text()
    for module in ("_ext", "_text"):
        stub = package.joinpath(module + ".pyi").read_text()
        imported = regex.search(r"from \.%s import \(([^)]*)\)" % module, init).group(1).split(",")
        for name in filter(None, (n.strip() for n in imported)):
            assert regex.search(r"^def %s\(" % name, stub, regex.M), name


def test_insert_if_new_keeps_the_match_a_later_record_of_the_batch_moves(db):
    """A record's matches are those it met, even where a later record of its
    batch replaces the document it matched (a later version of the same key)."""
    db.insert("page", 12345)
    found = db.insert_if_new_many([("page", 12345), ("page", 2**63), ("other", 12345)],
                                  distance=0)
    assert [[m.key for m in matches] for matches in found] == [["page"], [], []]
    assert db["page"].fingerprint == 2**63 and db["other"].fingerprint == 12345


def test_keys_of_any_length_are_stored_and_given_back_whole(db):
    """A key longer than a backend stores (a long URL, a path) is kept under its
    digest with the whole key in its document: every way out gives the key."""
    url = "https://example.org/" + "a/" * 400  # 820 bytes
    blob, other = b"\x00" * 1000, "https://example.org/" + "a/" * 399 + "b"
    db.insert_many([(url, 0b1111, {"m": 1}), (blob, 0b0111), (other, 1 << 40), ("short", 0b1110)])
    assert db.get(url) == Record(url, 0b1111, {"m": 1}, db.get(url).stored_at)
    assert db[blob].key == blob and db.get(url + "x") is None
    assert [m.key for m in db.query(0b1111)] == [url, "short", blob]  # str keys before bytes
    assert {r.key for r in db} == {url, blob, other, "short"}
    pairs = {(p.key_a, p.key_b) for p in db.find_all()}
    assert pairs == {(url, "short"), (url, blob), ("short", blob)}
    assert list(db.clusters()) == [[url, "short", blob]]
    found = db.insert_if_new(url + "/copy", 0b1111)
    assert [m.key for m in found] == [url, "short", blob] and db.get(url + "/copy") is None
    assert db.insert_if_new(other, 0xFFFF << 44).replaced.key == other
    assert db.delete(url) and not db.delete(url) and db.get(url) is None
    assert [m.key for m in db.query(0b1111)] == ["short", blob]
    assert db.check() == []


def test_a_batch_of_85_000_lands_whole_in_every_table_and_the_index(db):
    """One batch with more than 65,536 new fingerprints (the native backend
    sorts the next table's run on a second thread while it writes one, and
    carries keys of up to 8 bytes inside the index's sorted entries): keys
    short and long, exact and near duplicates; every table agrees with the
    documents, and queries match brute force."""
    rng = random.Random(5)
    fps = [rng.getrandbits(64) for _ in range(70_000)] + [0, 2**64 - 1]
    fps += [flip(rng.choice(fps), [rng.randrange(64)]) for _ in range(10_000)] + fps[:5_000]
    docs = {(i if i % 2 else "https://example.org/page/%d" % i): fp for i, fp in enumerate(fps)}
    assert db.insert_many(docs.items(), batch_size=len(docs)) == len(docs)
    assert len(db) == len(docs) and db.check() == []
    for probe in [0, 2**64 - 1, flip(fps[1], [0, 63])] + rng.sample(fps, 40):
        assert as_tuples(db.query(probe, 3)) == brute_force(docs, probe, 3)


@pytest.mark.lmdb_only
def test_a_path_as_bytes_or_a_name_that_is_not_utf8_opens_and_compacts(tmp_path, backend):
    for path in (os.fsencode(str(tmp_path / "bytes.db")), str(tmp_path / "name_\udcff.db")):
        with DB(path, backend=backend) as db:
            db.insert_many([(i, i * 7919) for i in range(500)])
        with DB(path, backend=backend) as db:
            db.compact()
            assert len(db) == 500 and db.query(7919) == [Match(1, 7919, 0)] and db.check() == []
    for path in (5, None, str(tmp_path / "nul\0.db")):
        with pytest.raises(simhashdb.InvalidArgumentError, match="path"):
            DB(path, backend=backend)
