"""A call that writes many batches leaves what it wrote as few runs as one
batch would (Storage.settle): one run a table and band, and (natively) one
slot of the index and of the key map, after a bulk load into an empty
database; merges bounded by what the call wrote in a bigger one; answers
exact throughout, on both LMDB backends. A loop of calls in DB.bulk_load()
(and simhashdb-cli import) settles as one call."""

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading

import lmdb
import numpy as np
import pytest
from conftest import LMDB_BACKENDS, edited, page

import simhashdb
from simhashdb import cli
from simhashdb.storage import BANDS
from simhashdb.storage.lmdb import format as lmdb_format


def layout_state(path):
    """(runs a table, runs a band, slots of the index in use, of the key map,
    the values recent holds), read raw."""
    env = lmdb.open(str(path), max_dbs=lmdb_format.max_dbs(64), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)

            def runs(key):
                return lmdb_format.directory_runs(txn.get(key, b"", db=directory))

            tables = [runs(lmdb_format.directory_key(t)) for t in range(1024)
                      if txn.get(lmdb_format.directory_key(t), db=directory) is not None]
            bands = [runs(lmdb_format.band_directory_key(b)) for b in range(BANDS)]
            used = []
            for kind in (lmdb_format.INDEX, lmdb_format.KEYS):
                slots = 0
                for name in kind.names():
                    try:
                        slots += txn.stat(env.open_db(name, txn=txn, create=False))["entries"] > 0
                    except lmdb.NotFoundError:
                        pass
                used.append(slots)
            meta = env.open_db(lmdb_format.META.name(), txn=txn, create=False)
            recent = int.from_bytes(txn.get(lmdb_format.RECENT, bytes(8), db=meta), "big")
    finally:
        env.close()
    return tables, bands, used, recent


def assert_exact(db, docs, rng, count=300):
    """query_many at distances 3 and 4 against brute force over ``docs``."""
    keys = np.array(list(docs), dtype=np.uint64)
    fps = np.array(list(docs.values()), dtype=np.uint64)
    probes = [int(fps[i]) ^ (1 << int(rng.integers(64))) for i in rng.integers(0, len(fps), count)]
    probes += rng.integers(0, 2**64, 50, dtype=np.uint64).tolist() + [0, 2**64 - 1]
    for distance in (3, 4):
        for probe, found in zip(probes, db.query_many(probes, distance=distance)):
            near = np.nonzero(np.bitwise_count(fps ^ np.uint64(probe)) <= distance)[0]
            assert sorted((m.key, m.fingerprint) for m in found) == \
                sorted(zip(keys[near].tolist(), fps[near].tolist()))


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_bulk_load_in_batches_leaves_a_run_a_table_and_answers_exactly(tmp_path, backend):
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2**64, 40_000, dtype=np.uint64)
    fps[:3000] = np.uint64(0x5A5A_0000_0000_0000) + rng.integers(0, 2**16, 3000, dtype=np.uint64)
    fps[3000:3002] = 0, 2**64 - 1
    docs = {i: int(fp) for i, fp in enumerate(fps)}
    with simhashdb.DB(tmp_path / "db", distance=3, backend=backend) as db:
        # 2,500 a batch: some go to recent, the others to runs that merge as batches come
        assert db.insert_many(docs.items(), batch_size=2500) == len(docs)
    tables, _, (index, keys), recent = layout_state(tmp_path / "db")
    assert [len(runs) for runs in tables] == [1] * len(tables)
    distinct = len(set(docs.values()))
    assert all(runs[0][2] + recent == distinct for runs in tables)
    if backend == "lmdb":  # (py-lmdb keeps one slot of each)
        assert (index, keys) == (1, 1)
    with simhashdb.DB(tmp_path / "db", backend=backend) as db:
        assert db.check() == []
        assert_exact(db, docs, rng)
        # from arrays likewise, above a run this call leaves alone (recent kept as it is)
        more = rng.integers(0, 2**64, 12_000, dtype=np.uint64)
        db.insert_many(keys=np.arange(10**6, 10**6 + 12_000, dtype=np.uint64), fingerprints=more,
                       batch_size=1500)
        docs.update(zip(range(10**6, 10**6 + 12_000), more.tolist()))
    after, _, _, held = layout_state(tmp_path / "db")
    assert all(runs[0] == before[0] for runs, before in zip(after, tables))
    assert [[entries for _, _, entries in runs] for runs in after] == \
        [[distinct - recent, 12_000 + recent - held]] * len(tables)
    with simhashdb.DB(tmp_path / "db", backend=backend, readonly=True) as db:
        assert db.check() == []
        assert_exact(db, docs, rng)


@pytest.mark.parametrize("layout", [{}, {"blocks": 2, "table_distance": 1}])  # 10 tables; 2
@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_texts_in_batches_leave_a_run_a_band_and_decide_as_one_batch(tmp_path, backend, layout):
    rng = random.Random(5)
    pages = {"https://example.org/%d" % i: page(rng) for i in range(400)}
    texts = list(pages.values())
    probes = [edited(rng, texts[i], 0.03) for i in range(0, 400, 20)] + [page(rng)]
    answers = []
    for name, size in (("batches", 60), ("one", 400)):
        with simhashdb.DB(tmp_path / name, backend=backend, distance=3, **layout) as db:
            db.insert_text_many(pages.items(), batch_size=size)
            answers.append([sorted(m.key for m in found) for found in db.query_text_many(probes)])
        _, bands, _, _ = layout_state(tmp_path / name)
        assert [len(runs) for runs in bands] == [1] * BANDS
    assert answers[0] == answers[1]
    assert sum(map(len, answers[0])) >= 20


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_one_batch_settles_nothing(tmp_path, backend, monkeypatch):
    from simhashdb.storage.lmdb import files
    settled = []
    monkeypatch.setattr(files.LmdbStorage, "settle", lambda self, n: settled.append(n))
    with simhashdb.DB(tmp_path / "db", distance=3, backend=backend) as db:
        db.insert_many([(i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(300)], batch_size=300)
        db.insert_if_new_many([(i, i * 0x9E37 % 2**64) for i in range(1000, 1300)], batch_size=100)
        db.insert_many(keys=np.arange(50, dtype=np.uint64), fingerprints=np.arange(50, dtype=np.uint64),
                       batch_size=50)
    assert settled == [300]


KILLED = """
import sys, numpy as np, simhashdb
from simhashdb.storage.lmdb import files
n, size = int(sys.argv[2]), int(sys.argv[3])
settle = files.LmdbStorage.settle


def announced(self, documents):
    print("settling", flush=True)
    settle(self, documents)
    print("settled", flush=True)


files.LmdbStorage.settle = announced
fps = np.random.default_rng(1).integers(0, 2**64, n, dtype=np.uint64)
with simhashdb.DB(sys.argv[1], distance=3, backend=sys.argv[4]) as db:
    db.insert_many(keys=np.arange(n, dtype=np.uint64), fingerprints=fps, batch_size=size)
"""


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_sigkill_while_settling_keeps_every_batch_and_answers_exactly(tmp_path, backend):
    """Killed while it settles (five batches leave two runs a table to merge),
    at three moments: every batch is whole and searched exactly; the next
    write settles or merges on."""
    rng = np.random.default_rng(7)
    size = 20_000 if backend == "lmdb" else 9000  # each batch past recent's limit: a run
    fps = np.random.default_rng(1).integers(0, 2**64, 5 * size, dtype=np.uint64)
    inside = 0
    for moment, delay in enumerate((0.0, 0.005, 0.02)):
        path = tmp_path / ("db%d" % moment)
        child = subprocess.Popen([sys.executable, "-c", KILLED, str(path), str(5 * size),
                                  str(size), backend], stdout=subprocess.PIPE,
                                 env=dict(os.environ))
        assert child.stdout.readline() == b"settling\n"
        try:
            child.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait()
        inside += b"settled" not in child.stdout.read()
        with simhashdb.DB(path, backend=backend) as db:
            assert len(db) == 5 * size  # every batch had committed before it settled
            assert db.check() == []
            assert_exact(db, {i: int(fp) for i, fp in enumerate(fps)}, rng, count=100)
            db.insert_many([(10**7, 12345)])
            assert db.get(10**7).fingerprint == 12345
    assert inside >= 2


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_settling_makes_no_run_over_its_bound(tmp_path, backend, monkeypatch):
    """Runs past SETTLE_MOST entries stay as the batches' merges left them."""
    from simhashdb.storage.lmdb import files
    fps = np.random.default_rng(9).integers(0, 2**64, 45_000, dtype=np.uint64)
    states = []
    for name, most in (("bounded", 12_000), ("unsettled", None)):
        if most is None:
            monkeypatch.setattr(files.LmdbStorage, "settle", lambda self, n: None)
        else:
            monkeypatch.setattr(files, "SETTLE_MOST", most)
        with simhashdb.DB(tmp_path / name, distance=3, backend=backend) as db:
            db.insert_many(keys=np.arange(45_000, dtype=np.uint64), fingerprints=fps,
                           batch_size=9000)  # runs of 36,000 and 9,000: 45,000 over the bound
        states.append([[entries for _, _, entries in runs]
                       for runs in layout_state(tmp_path / name)[0]])
    assert states[0] == states[1] == [[36_000, 9000]] * len(states[0])


def settles(monkeypatch):
    """The documents of each Storage.settle call made from now on (settling as before)."""
    from simhashdb.storage.lmdb import files
    counted, settle = [], files.LmdbStorage.settle

    def counting(self, documents):
        counted.append(documents)
        settle(self, documents)

    monkeypatch.setattr(files.LmdbStorage, "settle", counting)
    return counted


def load_in_calls(db, calls, size, seed=11):
    """``calls`` calls of one batch of ``size`` new documents each, the storing
    calls of fingerprints in turn; returns {key: fingerprint} of what they stored."""
    rng, stored = np.random.default_rng(seed), {}
    for call in range(calls):
        keys = np.arange(call * size, (call + 1) * size, dtype=np.uint64)
        fps = rng.integers(0, 2**64, size, dtype=np.uint64)
        records = list(zip(keys.tolist(), fps.tolist()))
        if call % 4 == 0:
            db.insert_many(records, batch_size=size)
        elif call % 4 == 1:
            db.insert_many(keys=keys, fingerprints=fps, batch_size=size)
        elif call % 4 == 2:
            decisions = db.insert_if_new_many(records, batch_size=size)
            records = [r for r, found in zip(records, decisions) if found.status == "stored"]
        else:
            db.import_records(records, batch_size=size)
        stored.update(records)
    return stored


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_loop_of_calls_in_bulk_load_settles_once_into_a_run_a_table(tmp_path, backend,
                                                                      runs_only, monkeypatch):
    """Seven calls of one batch each: in a bulk load, one run a table and one
    slot, exact; the same loop outside one keeps its runs."""
    settled = settles(monkeypatch)
    for name in ("bulk", "loop"):
        with simhashdb.DB(tmp_path / name, distance=3, backend=backend) as db:
            with db.bulk_load() if name == "bulk" else contextlib.nullcontext():
                docs = load_in_calls(db, 7, 1500)
            assert_exact(db, docs, np.random.default_rng(2), count=150)
        tables, _, (index, keys), _ = layout_state(tmp_path / name)
        if name == "bulk":
            assert settled == [7 * 1500]
            assert [len(runs) for runs in tables] == [1] * len(tables)
            assert {runs[0][2] for runs in tables} == {len(set(docs.values()))}
            if backend == "lmdb":  # (py-lmdb keeps one slot of each)
                assert (index, keys) == (1, 1)
        else:
            assert settled == [7 * 1500]  # (none more)
            assert all(len(runs) > 1 for runs in tables)
    with simhashdb.DB(tmp_path / "bulk", backend=backend, readonly=True) as db:
        assert db.check() == []


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_text_decisions_in_a_bulk_load_leave_a_run_a_band_and_decide_alike(tmp_path, backend,
                                                                           runs_only):
    rng = random.Random(8)
    pages = [("https://example.org/%d" % i, page(rng)) for i in range(250)]
    pages[200:210] = [(key, edited(rng, pages[i][1], 0.02)) for i, (key, _) in
                      zip(range(0, 100, 10), pages[200:210])]
    decided = {}
    for name in ("bulk", "loop"):
        with simhashdb.DB(tmp_path / name, distance=3, backend=backend) as db:
            with db.bulk_load() if name == "bulk" else contextlib.nullcontext():
                decided[name] = [found.status for start in range(0, 250, 50) for found in
                                 db.insert_text_if_new_many(pages[start:start + 50])]
        bands = layout_state(tmp_path / name)[1]
        assert all((len(runs) == 1) == (name == "bulk") for runs in bands)
    assert decided["bulk"] == decided["loop"]
    assert decided["bulk"].count("duplicate") == 10


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_nested_bulk_loads_settle_once_what_all_their_calls_wrote(tmp_path, backend, runs_only,
                                                                  monkeypatch):
    """Calls of many batches and inner blocks (one ended by an exception
    caught inside the outer) leave the settling to the outermost block."""
    settled = settles(monkeypatch)
    with simhashdb.DB(tmp_path / "db", distance=3, backend=backend,
                      recipe=simhashdb.RECIPE) as db:
        with db.bulk_load():
            db.insert_many(keys=np.arange(3000, dtype=np.uint64),
                           fingerprints=np.arange(3000, dtype=np.uint64) * 0x9E3779B97F4A7C15,
                           batch_size=1000)
            with db.bulk_load():
                db.insert_many([(i, i * 0x5851F42D4C957F2D % 2**64) for i in range(3000, 4000)])
                with pytest.raises(RuntimeError), db.bulk_load():
                    db.insert(4000, 12345)
                    raise RuntimeError
            assert settled == []
            db.insert_text_many([("page", "a text of several words to store")], batch_size=1)
        assert settled == [4002]
        assert len(db) == 4002 and db.check() == []
    tables, bands, _, _ = layout_state(tmp_path / "db")
    assert [len(runs) for runs in tables] == [1] * len(tables)
    assert [len(runs) for runs in bands] == [1] * BANDS


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_an_exception_in_a_bulk_load_keeps_the_committed_batches_unsettled(tmp_path, backend,
                                                                          runs_only, monkeypatch):
    settled = settles(monkeypatch)
    with simhashdb.DB(tmp_path / "db", distance=3, backend=backend) as db:
        with pytest.raises(KeyboardInterrupt), db.bulk_load():
            docs = load_in_calls(db, 5, 1000)
            raise KeyboardInterrupt
        assert settled == []
        assert len(db) == 5000 and db.check() == []
        assert_exact(db, docs, np.random.default_rng(4), count=100)
    tables, _, _, _ = layout_state(tmp_path / "db")
    assert all(len(runs) > 1 for runs in tables)


@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_a_bulk_load_counts_the_calls_of_its_own_thread(tmp_path, backend, monkeypatch):
    settled = settles(monkeypatch)
    with simhashdb.DB(tmp_path / "db", distance=3, backend=backend) as db:
        other = threading.Thread(target=db.insert_many, args=(
            [(i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(500)],), kwargs={"batch_size": 100})
        with db.bulk_load():
            db.insert_many([(10**6, 1), (10**6 + 1, 2)])
            other.start()
            other.join()
            db.insert(10**6 + 2, 3)
            assert settled == [500]  # the other thread's call settled its own batches
        assert settled == [500, 3]


@pytest.mark.parametrize("if_new", [False, True])
@pytest.mark.parametrize("backend", LMDB_BACKENDS)
def test_an_import_of_many_batches_ends_settled(tmp_path, backend, if_new, runs_only,
                                                monkeypatch, capsys):
    """simhashdb-cli import of five batches: one run a table, exact."""
    fps = np.random.default_rng(6).integers(1, 2**64, 5000, dtype=np.uint64).tolist()
    lines = "".join("%d\n" % fp for fp in fps).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    monkeypatch.setenv("SIMHASHDB_BACKEND", backend)
    assert cli.main(["import", str(tmp_path / "db"), "--format", "dec", "--batch-size", "1000",
                     "--quiet"] + ["--if-new"] * if_new) == 0
    imported = json.loads(capsys.readouterr().out.splitlines()[-1])["imported"]
    tables, _, (index, keys), _ = layout_state(tmp_path / "db")
    assert [len(runs) for runs in tables] == [1] * len(tables)
    if backend == "lmdb":
        assert (index, keys) == (1, 1)
    with simhashdb.DB(tmp_path / "db", readonly=True) as db:
        docs = {record.key: record.fingerprint for record in db}
        assert len(docs) == imported >= 4990 and set(docs.values()) <= set(fps)
        assert_exact(db, docs, np.random.default_rng(8), count=100)
