"""The two LMDB backends share one file format: each reads, queries and
extends what the other wrote, also while the other has it open."""

import json
import os
import random
import subprocess
import sys

import pytest
from conftest import BACKENDS, as_tuples, brute_force, native_built, storage_of
from test_multiprobe import adversarial_docs, probes_near

from simhashdb import DB
from simhashdb.layout import Layout
from simhashdb.storage.lmdb import format as lmdb_format
from simhashdb.storage.registry import default_backend

both = pytest.mark.skipif("lmdb" not in BACKENDS, reason="the native backend was not built")


def test_the_native_backend_is_the_default_where_built():
    """CI builds the native backend, so there this fails if it did not build."""
    if not (native_built() or os.environ.get("CI")):
        pytest.skip("the native backend was not built here (CI requires it)")
    import simhashdb._lmdb  # noqa: F401
    assert default_backend() == "lmdb"


@both
def test_the_backends_read_and_write_each_others_files(tmp_path):
    """What one backend wrote (bulk loads, upserts, deletes, compaction) the
    other reads, queries and extends, and back."""
    layout = Layout(5, 3)
    bases, docs = adversarial_docs(layout, 23, crowd=500)
    path = str(tmp_path / "both.db")
    items = list(docs.items())
    probes = probes_near(layout, bases, 5)
    writers = ["lmdb", "py-lmdb", "lmdb", "py-lmdb"]
    expected = {}
    for step, writer in enumerate(writers):
        with DB(path, distance=3, blocks=5, backend=writer) as db:
            assert db.backend == writer
            chunk = items[step::len(writers)]
            db.insert_many(chunk)
            expected.update(chunk)
            gone = [k for k, _ in chunk[::7]]
            db.delete_many(gone)
            for key in gone:
                del expected[key]
            moved = [(k, fp ^ 0b1001) for k, fp in chunk[1::5]]
            db.insert_many(moved)
            expected.update(moved)
            if step >= 2:
                db.compact()
        reader = writers[(step + 1) % len(writers)]
        with DB(path, backend=reader) as db:
            assert db.backend == reader
            assert db.check() == []
            assert {r.key: r.fingerprint for r in db} == expected
            for k2 in (3, 5):
                assert [as_tuples(m) for m in db.query_many(probes, distance=k2)] == \
                    [brute_force(expected, p, k2) for p in probes]


READER = """
import json, sys, simhashdb
db = simhashdb.DB(sys.argv[1], readonly=True, backend=sys.argv[2])
assert db.backend == sys.argv[2]
for line in sys.stdin:
    probe = int(line)
    print(json.dumps([len(db), db.check(),
                      [[m.key, m.fingerprint, m.distance] for m in db.query(probe, distance=4)]]),
          flush=True)
"""


@both
@pytest.mark.parametrize("writer,reader", [("lmdb", "py-lmdb"), ("py-lmdb", "lmdb")])
def test_a_reader_of_one_backend_beside_a_writer_of_the_other(tmp_path, monkeypatch, writer,
                                                              reader):
    """One lock file, one map: the reader sees each committed batch whole,
    also after the writer grew the map."""
    monkeypatch.setattr("simhashdb.storage.lmdb.files.LmdbStorage.initial_map_size", 1 << 20)
    path = str(tmp_path / "shared.db")
    rng = random.Random(1)
    docs = {}
    with DB(path, distance=3, blocks=5, backend=writer) as db:
        db.insert("seed", 0)
        docs["seed"] = 0
        child = subprocess.Popen([sys.executable, "-c", READER, path, reader],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            for batch in range(6):
                records = [("b%d-%d" % (batch, j), rng.getrandbits(64), "m" * 100)
                           for j in range(3000)]
                db.insert_many(records)
                docs.update((key, fp) for key, fp, _ in records)
                probe = records[0][1] ^ 0b1111
                child.stdin.write("%d\n" % probe)
                child.stdin.flush()
                count, problems, matches = json.loads(child.stdout.readline())
                assert (count, problems) == (len(docs), [])
                assert [tuple(m) for m in matches] == brute_force(docs, probe, 4)
            assert db.stats()["map_size"] > 1 << 20
        finally:
            child.stdin.close()
            child.wait(timeout=60)
        assert child.returncode == 0


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_documents_start_after_any_key_alike_on_each_backend(tmp_path, backend_name, request):
    """View.documents(after): what expire() walks in batches, in the order
    of the backend (LMDB: by the key's hash, then the key; Redis: shard, then key)."""
    import msgpack
    if backend_name == "redis":
        request.getfixturevalue("redis_names")
    with DB(str(tmp_path / "d.db"), backend=backend_name) as db:
        stored = [1, 5, 9, "a", "c"]
        db.insert_many([(k, i) for i, k in enumerate(stored)])
        if backend_name == "redis":
            def position(key):
                return storage_of(db).keys.doc_shard(key), key
        else:
            position = lmdb_format.key_order
        with storage_of(db).read() as view:
            keys = [k for k, _ in view.documents()]
            assert sorted(keys) == sorted(msgpack.packb(k) for k in stored)
            assert keys == sorted(keys, key=position)
            for after in keys + [msgpack.packb(6), msgpack.packb("b"), b"\xff" * 10]:
                assert [k for k, _ in view.documents(after)] == \
                    [k for k in keys if position(k) > position(after)], after
