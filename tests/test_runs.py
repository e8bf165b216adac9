"""Tables kept as the compressed runs of issue 22 (RUNS.md): searches over
many runs, conversions of 0.3's tables, damage and block directories.
(The prototype's own checks are tools/runs_prototype/checks.py.)"""

import os

import pytest

from conftest import as_in_0_3, storage_of

from simhashdb.db import FORMAT_VERSION
from simhashdb.errors import DatabaseError, MapFullError
from simhashdb.storage.lmdb import format as lmdb_format

np = pytest.importorskip("numpy")

TOP = 2**64 - 1


@pytest.mark.parametrize("directory_entries,threaded", [(0, False), (3000, False),
                                                        (1 << 24, False), (3000, True)])
@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
def test_tables_kept_as_runs_search_exactly_over_many_runs(tmp_path, directory_entries,
                                                           threaded, monkeypatch):
    """The native backend: batches of
    every size leave several runs a table, removals stale entries, returns
    second copies; single and batch searches (the sweep) at and above the
    built distance equal brute force, and a compaction leaves one run a table.
    Runs are read through their block directories, through the B-tree, or
    (3000) some one way and some the other. ``threaded``: every merge that
    follows a batch's commit is cut into three ranges merged on threads."""
    import lmdb
    from conftest import STORAGE_LAYOUT

    from simhashdb import records
    from simhashdb.storage import registry
    rng = np.random.default_rng(11)
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb.storage.lmdb import native
    monkeypatch.setattr(native.NativeStorage, "directory_entries", directory_entries)
    if directory_entries < 1 << 24:  # none, or some, whatever the seeks
        monkeypatch.setattr(native.NativeStorage, "directory_rent", 0)
    if threaded:
        monkeypatch.setattr(native.NativeStorage, "batch_merge", 300)  # merges follow the commit
        monkeypatch.setattr(native.NativeStorage, "threaded_merge", 1)
        monkeypatch.setattr(native, "THREADS", 3)
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    fps = rng.integers(0, 2**64, 30_000, dtype=np.uint64)
    fps[:4000] = np.uint64(0xABCD_0000_0000_0000) + rng.integers(0, 2**20, 4000, dtype=np.uint64)
    fps[4000:4002] = 0, TOP
    live = {}

    def upsert(keys):
        docs = records.encode_documents([(k, int(fps[k])) for k in keys], 511, 0)
        storage.write(lambda txn: txn.upsert(docs))
        live.update((k, int(fps[k])) for k in keys)

    def check():
        keys = np.array(list(live), dtype=np.int64)
        stored = fps[keys]
        near = stored[rng.integers(0, len(stored), 700)]
        flips = np.zeros(700, np.uint64)
        for _ in range(4):
            flips |= np.uint64(1) << rng.integers(0, 64, 700).astype(np.uint64)
        probes = np.concatenate([near, near ^ flips, rng.integers(0, 2**64, 300, dtype=np.uint64)])
        for distance in (3, 4):
            for probe, hits in zip(probes, storage.search(probes, distance)):
                d = np.bitwise_count(stored ^ probe)
                near = np.nonzero(d <= distance)[0]
                want = sorted(zip(keys[near].tolist(), stored[near].tolist(), d[near].tolist()))
                assert sorted((records.unpack(key), fp, dd) for key, fp, dd in hits) == want
        with storage.read() as view:
            assert view.distinct() == len(np.unique(stored))
            assert sorted(view.table_fingerprints(3)) == sorted(np.unique(stored).tolist())
        one = storage.search(probes[:50], 3)
        assert [storage.search(probes[i:i + 1], 3)[0] for i in range(50)] == one

    def runs_per_table():
        storage.close()
        env = lmdb.open(str(tmp_path / "db"), max_dbs=4096, readonly=True, lock=False)
        with env.begin() as txn:
            directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
            runs = [len(txn.get(t.to_bytes(2, "big"), db=directory)) // 13
                    for t in range(len(STORAGE_LAYOUT.prefixes))]
        env.close()
        return runs

    at = 0
    for size in (9000, 1, 2500, 40, 700, 3000, 5, 600, 9000):
        upsert(range(at, at + size))
        at += size
    check()
    assert (storage.statistics()["threaded_merges"] > 10) == threaded
    gone = [k for k in live if k % 5 == 0]
    storage.write(lambda txn: txn.remove([records.encode_key(k) for k in gone]))
    for k in gone:
        del live[k]
    upsert(gone[::4])  # back under their old keys
    check()
    assert min(runs_per_table()) > 1
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    storage.compact()
    check()
    assert runs_per_table() == [1] * len(STORAGE_LAYOUT.prefixes)


def test_a_large_batch_shares_its_index_lookups_with_a_thread(tmp_path, monkeypatch):
    """Whether each new fingerprint was indexed before is looked up in the
    earlier slots by the writer and a thread reading the last commit, in
    turns: a batch with half its fingerprints indexed under other keys (some
    in slots merged, some not), and batches that move most documents to
    another's fingerprint or a new one, are noted exactly, the thread taking
    part."""
    from conftest import STORAGE_LAYOUT

    from simhashdb import records
    from simhashdb.storage import registry
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb.storage.lmdb import native
    monkeypatch.setattr(native, "THREADS", 2)
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    rng = np.random.default_rng(9)
    fps = [int(x) for x in rng.integers(0, 2**64, 20_000, dtype=np.uint64)]
    fps[16_000:] = fps[:4000]  # under other keys

    def upsert(start, end):
        docs = records.encode_documents([(k, fps[k]) for k in range(start, end)], 511, 0)
        storage.write(lambda txn: txn.upsert(docs))

    for start in range(0, 12_000, 3000):
        upsert(start, start + 3000)
    assert storage.statistics()["shared_lookups"] == 0  # (batches under THREAD_SHARE)
    upsert(12_000, 20_000)
    assert storage.statistics()["shared_lookups"] == 1
    live = dict(enumerate(fps))
    with storage.read() as view:
        assert view.distinct() == len(set(fps))
        assert sorted(view.table_fingerprints(1)) == sorted(set(fps))
    for turn in (1, 2):  # two keys in three move to another's fingerprint, or a new one
        moved = {k: live[(k + 997 * turn) % 20_000] for k in range(20_000) if k % 3}
        moved.update((k, int(rng.integers(0, 2**64, dtype=np.uint64))) for k in range(1, 20_000, 6))
        storage.write(lambda txn: txn.upsert(records.encode_documents(moved.items(), 511, 0)))
        live.update(moved)
        assert storage.statistics()["shared_lookups"] == 1 + turn
        with storage.read() as view:
            assert view.distinct() == len(set(live.values()))
            assert sorted(view.table_fingerprints(1)) == sorted(set(live.values()))


def test_a_large_batch_after_changes_in_its_transaction_looks_up_what_the_transaction_holds(
        tmp_path, monkeypatch):
    """A removal or a batch earlier in the same transaction changes the slots
    a thread reading the last commit would see: the lookups are the writer's
    then, and the fingerprints the transaction removed or added are noted as
    it holds them (a batch sharing them regardless counts some 800 too few)."""
    from conftest import STORAGE_LAYOUT

    from simhashdb import records
    from simhashdb.storage import registry
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb.storage.lmdb import native
    monkeypatch.setattr(native, "THREADS", 2)
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    rng = np.random.default_rng(1)
    fps = [int(x) for x in rng.integers(0, 2**64, 16_000, dtype=np.uint64)]
    live = {k: fps[k] for k in range(8000)}
    storage.write(lambda txn: txn.upsert(records.encode_documents(live.items(), 511, 0)))
    back = {100_000 + k: fps[k] for k in range(1000)}  # removed below, back under new keys
    back.update((k, fps[k]) for k in range(8000, 12_000))
    more = {200_000 + k: fps[k] for k in range(8000, 8500)}  # the first batch's, again
    more.update((k, fps[k]) for k in range(12_000, 16_000))

    def body(txn):
        txn.remove([records.encode_key(k) for k in range(1000)])
        txn.upsert(records.encode_documents(back.items(), 511, 0))
        txn.upsert(records.encode_documents(more.items(), 511, 0))

    storage.write(body)
    assert storage.statistics()["shared_lookups"] == 0
    for k in range(1000):
        del live[k]
    live.update(back)
    live.update(more)
    with storage.read() as view:
        assert view.distinct() == len(set(live.values()))
        assert sorted(view.table_fingerprints(1)) == sorted(set(live.values()))


def _upsert_then_remove(storage, docs, live, gone):
    """Write ``docs``, then remove the documents at ``gone`` (a slice) of
    ``live``, the documents stored, which is kept in step."""
    from simhashdb import records
    storage.write(lambda txn: txn.upsert(records.encode_documents(docs.items(), 511, 0)))
    live.update(docs)
    removed = list(live)[gone]
    storage.write(lambda txn: txn.remove([records.encode_key(k) for k in removed]))
    for k in removed:
        del live[k]


def _fed_index_storage(tmp_path, monkeypatch, **storage_attrs):
    """A native storage whose tidy merges every index slot on a thread."""
    from conftest import STORAGE_LAYOUT

    from simhashdb.storage import registry
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb.storage.lmdb import files, native
    monkeypatch.setattr(native, "THREADS", 2)
    monkeypatch.setattr(native.NativeStorage, "batch_merge", 300)  # the merges left for tidy
    monkeypatch.setattr(native.NativeStorage, "threaded_merge", 1)
    for name, value in storage_attrs.items():
        monkeypatch.setattr(files.LmdbStorage, name, value)
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    return storage


def test_index_merges_of_committed_slots_read_by_a_thread_keep_every_entry(tmp_path, monkeypatch):
    """tidy's index merges read slots as the last commit left them on a thread,
    in chunks the writer appends: every entry lands once, across chunks (long
    keys fill one every few thousand entries), with many keys a fingerprint
    (spread over several slots), removals between batches, and a chain of
    merges taken in one pass."""
    from simhashdb import records
    storage = _fed_index_storage(tmp_path, monkeypatch)
    rng = np.random.default_rng(4)
    shared = [int(x) for x in rng.integers(0, 2**64, 50, dtype=np.uint64)]
    live = {}
    for batch in range(12):
        docs = {}
        for i in range(5000):
            key = ("k%d-%d-" % (batch, i)) + "x" * int(rng.integers(0, 300)) if i % 2 else \
                batch * 10_000 + i
            docs[key] = shared[i % 50] if i % 7 == 0 else int(rng.integers(0, 2**64, dtype=np.uint64))
        _upsert_then_remove(storage, docs, live, slice(batch * 300, batch * 300 + 200))
    assert storage.statistics()["fed_merges"] > 3
    expected = {}
    for k, fp in live.items():
        expected.setdefault(fp, set()).add(k)
    with storage.read() as view:
        assert view.distinct() == len(expected)
        groups = {fp: [records.unpack(k) for k in keys] for fp, keys in view.fingerprint_groups()}
    assert sum(len(keys) for keys in groups.values()) == len(live)
    assert {fp: set(keys) for fp, keys in groups.items()} == expected


def _write_and_check_index(storage, batches, seed, holding=None, live=None, pad=0):
    """Write ``batches`` of 4,000 documents (a tenth of ``live``, the documents
    stored, removed after each), then (after ``holding``, a list of read
    transactions, is aborted) check the index against what was written:
    every (fingerprint, key) once (keys ``pad`` bytes longer). Returns ``live``."""
    from simhashdb import records
    rng = np.random.default_rng(seed)
    live = {} if live is None else live
    for batch in range(batches):
        docs = {"%d-%d-%d%s" % (seed, batch, i, "x" * pad): int(rng.integers(0, 2**64, dtype=np.uint64))
                for i in range(4000)}
        _upsert_then_remove(storage, docs, live, slice(batch * 400, batch * 400 + 400))
    for txn in holding or ():
        txn.abort()
    expected = {}
    for k, fp in live.items():
        expected.setdefault(fp, []).append(k)
    with storage.read() as view:
        groups = {fp: sorted(records.unpack(k) for k in keys) for fp, keys in view.fingerprint_groups()}
    assert groups == {fp: sorted(keys) for fp, keys in expected.items()}
    return live


def test_the_map_filling_while_a_thread_feeds_an_index_merge_loses_nothing(tmp_path, monkeypatch):
    """A map left 4 KB of room before each tidy (and grown by 256 KB at a
    time) fills during tidy's merges, while the thread feeds chunks; the
    thread stops, the merge is undone, the map grows, the merge runs again,
    and the index holds every entry once."""
    import faulthandler

    from simhashdb.storage.lmdb import native
    storage = _fed_index_storage(tmp_path, monkeypatch, initial_map_size=1 << 20)
    fed_in_a_filled_tidy = []
    tidy = native.NativeTxn.tidy

    def watched_tidy(txn):
        fed = storage.statistics()["fed_merges"]
        try:
            return tidy(txn)
        except MapFullError:
            fed_in_a_filled_tidy.append(storage.statistics()["fed_merges"] > fed)
            raise
    monkeypatch.setattr(native.NativeTxn, "tidy", watched_tidy)
    monkeypatch.setattr(storage, "_grow", lambda: storage._resize(storage._map_size() + (1 << 18)))
    tidy_after_batch = storage._tidy
    monkeypatch.setattr(storage, "_tidy", lambda: storage._resize(storage._map_used() + 4096)
                        or tidy_after_batch())
    faulthandler.dump_traceback_later(600, exit=True)  # a thread never told to stop hangs
    try:
        _write_and_check_index(storage, 12, seed=8)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert any(fed_in_a_filled_tidy) and storage.statistics()["fed_merges"] > 3


def test_index_merges_with_the_reader_table_full_are_read_by_the_writer(tmp_path, monkeypatch):
    """With every reader slot held, the thread cannot begin its snapshot: the
    writer reads the merges' slots itself, and loses nothing."""
    from simhashdb import DatabaseError
    storage = _fed_index_storage(tmp_path, monkeypatch)
    holding = []
    try:
        with pytest.raises(DatabaseError, match="too many open snapshots"):
            while len(holding) < 100_000:
                holding.append(storage._env.begin())
        live = _write_and_check_index(storage, 12, seed=9, holding=holding)
        assert len(holding) > 100 and storage.statistics()["fed_merges"] == 0
        _write_and_check_index(storage, 2, seed=10, live=live)  # the same merges, fed again
        assert storage.statistics()["fed_merges"] > 0
    finally:
        for txn in holding:
            txn.abort()
        storage.close()


@pytest.mark.parametrize("threads", [2, 1])
def test_a_damaged_entry_met_by_an_index_merge_undoes_it_with_a_warning(tmp_path, monkeypatch,
                                                                       threads):
    """An index entry whose fingerprint is not 8 bytes, met by tidy's merge of
    the slot that holds it, whether a thread reads the slots (its own error,
    handed to the writer) or the writer does: the merge is undone, the batch
    before it stays stored, and the write warns that the merge failed."""
    import lmdb

    from simhashdb import MaintenanceWarning, records
    storage = _fed_index_storage(tmp_path, monkeypatch)
    first = {"a%d" % i: i * 0x9E3779B97F4A7C15 % 2**64 for i in range(4000)}
    storage.write(lambda txn: txn.upsert(records.encode_documents(first.items(), 511, 0)))
    storage.close()
    env = lmdb.open(str(tmp_path / "db"), max_dbs=4096)
    with env.begin(write=True) as txn:
        damaged = 0
        for name in lmdb_format.INDEX.names():
            slot = env.open_db(name, txn=txn, dupsort=True, create=False)
            if txn.stat(slot)["entries"]:
                txn.put(b"\x00" * 7, records.encode_key("damaged"), db=slot)
                damaged += 1
    env.close()
    assert damaged == 1
    storage = _fed_index_storage(tmp_path, monkeypatch)
    storage._env.merge_threads = threads
    second = {"b%d" % i: i * 0xD1B54A32D192ED03 % 2**64 for i in range(4000)}
    with pytest.warns(MaintenanceWarning, match="merging the tables' runs after it failed"):
        storage.write(lambda txn: txn.upsert(records.encode_documents(second.items(), 511, 0)))
    assert storage.statistics()["fed_merges"] == (threads > 1)
    with storage.read() as view:
        assert view.count() == 8000
        assert [records.unpack(k) for k in view.keys_of(second["b7"])] == ["b7"]
        assert [records.unpack(k) for k in view.keys_of(first["a7"])] == ["a7"]
    storage.close()


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
def test_runs_written_earlier_in_a_transaction_are_never_merged_in_parts(tmp_path, monkeypatch):
    """Merges in parts read their sources from other threads, so only runs
    committed before the transaction qualify: after an upsert in the same
    transaction (whose run is not committed), tidy merges on its own thread."""
    from conftest import STORAGE_LAYOUT

    from simhashdb import records
    from simhashdb.storage import registry
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb.storage.lmdb import native
    monkeypatch.setattr(native.NativeStorage, "batch_merge", 300)
    monkeypatch.setattr(native.NativeStorage, "threaded_merge", 1)
    monkeypatch.setattr(native, "THREADS", 3)
    storage = registry.backend_class("lmdb")(str(tmp_path / "db"))
    storage.open_tables(STORAGE_LAYOUT)
    rng = np.random.default_rng(5)
    fps = [int(x) for x in rng.integers(0, 2**64, 6000, dtype=np.uint64)]

    def documents(start, end):
        return records.encode_documents([(k, fps[k]) for k in range(start, end)], 511, 0)

    for start in range(0, 4000, 500):
        batch = documents(start, start + 500)
        storage.write(lambda txn: txn.upsert(batch))
    assert storage.statistics()["threaded_merges"]
    batch, in_parts = documents(4000, 6000), []

    def upsert_then_tidy(txn):
        txn.upsert(batch)
        before = storage.statistics()["threaded_merges"]
        txn.tidy()
        in_parts.append(storage.statistics()["threaded_merges"] - before)

    storage.write(upsert_then_tidy)
    assert in_parts and not any(in_parts)
    with storage.read() as view:
        assert sorted(view.table_fingerprints(2)) == sorted(set(fps))


def test_a_database_of_0_3_is_refused_until_upgrade_copies_it_into_this_format(tmp_path):
    """Tables in 0.3's form, with the documents of format 6 and before: every
    open says how to convert; upgrade() copies the database into this format
    and it then answers as before, takes writes, and is left as it is by a
    second upgrade."""
    pytest.importorskip("simhashdb._lmdb")
    import simhashdb
    from simhashdb import DB
    rng = np.random.default_rng(3)
    fps = [int(x) for x in rng.integers(0, 2**64, size=3000, dtype=np.uint64)] + [0, TOP]
    fps += [fp ^ (1 << int(b)) for fp, b in zip(fps[:500], rng.integers(0, 64, size=500))]
    path = str(tmp_path / "db")
    with DB(path, distance=3) as db:
        db.insert_many((i, fp) for i, fp in enumerate(fps))
        probes = fps[:300] + [fp ^ 0b111 for fp in fps[300:600]]
        before = [sorted(db.query(p)) for p in probes]
    assert all(before)
    as_in_0_3(path)
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="simhashdb 0.8 and earlier.*simhashdb-cli upgrade"):
            DB(path, readonly=readonly)
    seen = []
    simhashdb.upgrade(path, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 1)]
    with DB(path) as db:
        assert db.stats()["format"] == FORMAT_VERSION and db.check() == []
        assert [sorted(db.query(p)) for p in probes] == before
        db.delete_many(range(100))
        assert db.check() == []
    simhashdb.upgrade(path)  # a database of this format is left as it is
    with DB(path, readonly=True) as db:
        assert len(db) == len(fps) - 100


def test_churn_keeps_the_tables_bounded_and_exact(tmp_path):
    """Ten rounds of removing a tenth of the documents and adding as many new
    ones: the stale entries removals leave never pass a quarter of the tables
    (then every table is written again without them), the documents' B-tree
    stays within 1.4 times a fresh one's (written whole once removals pass a
    quarter of it), searches stay exact, and the file stops growing."""
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb import DB
    rng = np.random.default_rng(10)
    n = 20_000
    live = {i: int(fp) for i, fp in enumerate(rng.integers(0, 2**64, size=n, dtype=np.uint64))}
    sizes = []
    with DB(str(tmp_path / "db"), distance=3) as db:
        db.insert_many(live.items())
        for round_ in range(10):
            gone = [int(k) for k in rng.choice(sorted(live), size=n // 10, replace=False)]
            db.delete_many(gone)
            for key in gone:
                del live[key]
            new = {n * (round_ + 1) + i: int(fp) ^ 1 for i, fp in
                   enumerate(rng.integers(0, 2**64, size=n // 10, dtype=np.uint64))}
            db.insert_many(new.items())
            live.update(new)
            with storage_of(db).read() as view:
                stale = view._txn.get(b"stale", True)
                assert int.from_bytes(stale or bytes(8), "big") * 4 <= view.distinct() == len(live)
                assert all(len(view.table_fingerprints(t)) == len(live) for t in (0, db.tables - 1))
            sizes.append(db.stats()["disk_bytes"])
            probes = [live[k] ^ 0b101 for k in rng.choice(sorted(live), size=200)] + gone[:50]
            stored = np.array(list(live.values()), dtype=np.uint64)
            for probe, found in zip(probes, db.query_many(probes)):
                distances = np.bitwise_count(stored ^ np.uint64(probe))
                assert sorted(m.fingerprint for m in found) == sorted(
                    int(x) for x in stored[distances <= 3])
    assert max(sizes[5:]) <= 1.25 * max(sizes[:5]), sizes
    with DB(str(tmp_path / "fresh"), distance=3) as db:
        db.insert_many(sorted(live.items()))
    leaves = [documents_leaf_pages(str(tmp_path / name)) for name in ("db", "fresh")]
    assert leaves[0] <= 1.4 * leaves[1], leaves


def documents_leaf_pages(path):
    import lmdb
    env = lmdb.open(path, max_dbs=4096, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            docs = env.open_db(lmdb_format.RECORD_BLOCKS.name(), txn=txn, create=False)
            return txn.stat(docs)["leaf_pages"] + txn.stat(docs)["overflow_pages"]
    finally:
        env.close()


def test_the_cli_says_how_to_convert_and_converts(tmp_path, capsys):
    pytest.importorskip("simhashdb._lmdb")
    import json

    from simhashdb import DB, cli
    path = str(tmp_path / "db")
    with DB(path) as db:
        db.insert_many([("a", 1), ("b", 3)])
    as_in_0_3(path)
    assert cli.main(["delete", path, "a"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "simhashdb-cli upgrade %s" % path in err
    assert cli.main(["upgrade", path]) == 0
    assert json.loads(capsys.readouterr().out) == {"format": FORMAT_VERSION,
                                                   "tables": DB(path, readonly=True).tables}
    assert cli.main(["delete", path, "a"]) == 0
    assert [m.key for m in DB(path, readonly=True).query(1, 2)] == ["b"]


def test_a_layout_of_many_tables_opens_with_room_for_their_runs(tmp_path):
    """495 tables (distance 8, 12 blocks), past the room an environment opens
    with: reopened with room for them, written, compacted and searched."""
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb import DB
    rng = np.random.default_rng(8)
    fps = [int(x) for x in rng.integers(0, 2**64, size=300, dtype=np.uint64)]
    path = str(tmp_path / "db")
    with DB(path, distance=8, blocks=12) as db:
        assert db.tables == 495
        db.insert_many(enumerate(fps))
        db.compact()
        db.delete_many(range(10))
    with DB(path) as db:
        probe = fps[20] ^ 0xFF
        assert [m.key for m in db.query(probe)] == [20] and db.check() == []


def test_an_item_of_another_run_in_a_slot_ends_the_run_as_for_a_cursor(tmp_path, monkeypatch):
    """A slot that holds, after its run's blocks, an item keyed by another
    run (damage): searches read the run up to that item, through the block
    directory as through the B-tree, and never fault."""
    import lmdb
    pytest.importorskip("simhashdb._lmdb")
    from simhashdb import DB
    from simhashdb.storage.lmdb.native import NativeStorage
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 30_000, dtype=np.uint64)  # ~160 blocks a run
    path = str(tmp_path / "db")
    with DB(path, distance=3) as db:
        db.insert_many((i, int(fp)) for i, fp in enumerate(fps))
    env = lmdb.open(path, max_dbs=4096)
    with env.begin(write=True) as txn:
        directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
        raw = txn.get(lmdb_format.directory_key(0), db=directory)
        run, slot = int.from_bytes(raw[:4], "big"), raw[4]
        txn.put((run + 1).to_bytes(4, "big") + bytes(8), bytes(3),
                db=env.open_db(lmdb_format.TABLE_RUNS.name(0, slot), txn=txn, create=False))
    env.close()
    probes = [int(fp) ^ 0b101 for fp in fps[:300]]
    answers, built = [], []
    for entries in (0, 1 << 24):
        monkeypatch.setattr(NativeStorage, "directory_entries", entries)
        monkeypatch.setattr(NativeStorage, "directory_rent", 256 if entries else 0)
        with DB(path, readonly=True) as db:
            answers.append([sorted(m.key for m in found) for found in db.query_many(probes)])
            answers.append([sorted(m.key for m in db.query(probe)) for probe in probes[:50]])
            built.append(storage_of(db).statistics()["directories_built"])
    assert built[0] == 0 < built[1]  # the B-tree alone, then the directories
    assert answers[0] == answers[2] and answers[1] == answers[3]
    assert all(i in keys for i, keys in enumerate(answers[2]))


def test_band_searches_read_the_block_directories_as_the_b_tree(tmp_path, monkeypatch):
    """The native band search over bands of several runs, each thousands of
    entries: through block directories (reads, and a write transaction before
    it writes), through the B-tree (directories off, and a transaction after
    its own writes), the same candidates."""
    pytest.importorskip("simhashdb._lmdb")
    import itertools
    from array import array

    import simhashdb
    from simhashdb.rule import bands
    from simhashdb.storage.lmdb.native import NativeStorage
    rng = np.random.default_rng(3)
    words = ["w%d" % i for i in range(3000)]

    def text():
        return " ".join(rng.choice(words, int(rng.integers(20, 80))).tolist())

    texts = [text() for _ in range(6000)]
    path = str(tmp_path / "db")
    with simhashdb.DB(path, distance=3) as db:
        for start in range(0, len(texts), 700):  # runs of several sizes in every band
            db.insert_text_many((i, texts[i]) for i in range(start, min(start + 700, len(texts))))
    probes = [texts[i] for i in rng.integers(0, len(texts), 300)] + [text() for _ in range(100)]
    keys = array("I", itertools.chain.from_iterable(
        bands(simhashdb.fingerprint_with_signature(t)[1]) for t in probes))
    answers = []
    for entries, filter_bits in ((1 << 24, 8), (1 << 24, 1), (0, 8)):
        monkeypatch.setattr(NativeStorage, "directory_entries", entries)
        monkeypatch.setattr(NativeStorage, "directory_rent", 256 if entries else 0)
        monkeypatch.setattr(NativeStorage, "filter_bits", filter_bits)
        with simhashdb.DB(path) as db:
            storage = db._storage
            with storage.read() as view:
                answers.append(view.band_search(keys))
            answers.append(storage.write(lambda txn: txn.band_search(keys)))
            counts = storage.statistics()
            assert (counts["filter_bytes"] > 0) == bool(entries)
            assert (counts["ranges_skipped"] > 0) == bool(entries)
    answers = [[sorted(found) for found in answer] for answer in answers]
    assert all(answer == answers[0] for answer in answers)
    assert sum(map(len, answers[0])) >= 300  # each stored probe finds itself


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("blocks,table_distance", [(5, 3), (2, 1)])
def test_a_runs_prefix_filter_rules_out_only_ranges_it_holds_nothing_in(tmp_path, monkeypatch,
                                                                        blocks, table_distance):
    """Each run's directory holds a filter of its entries' prefixes, and
    searches skip the ranges it rules out: with filters of 8 bits an entry,
    of 1 (mostly ruling nothing out) and none, single queries and batches at
    the built distance and above find exactly what brute force finds, over
    runs of several sizes, thousands of fingerprints under one prefix, every
    flip of one block, fingerprints exactly k and k + 1 bits away, 0 and
    2^64 - 1."""
    pytest.importorskip("simhashdb._lmdb")
    import simhashdb
    from simhashdb.storage.lmdb.native import NativeStorage
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 9000, dtype=np.uint64)
    fps[:3000] = np.uint64(0x5A5A_0000_0000_0000) + rng.integers(0, 2**20, 3000, dtype=np.uint64)
    fps[3000:3002] = 0, TOP
    base = int(fps[4000])
    fps[3002:3018] = [base ^ (1 << bit) for bit in range(16)]  # every flip of the top block
    fps[3018:3020] = base ^ 0b111, base ^ 0b1111  # exactly 3 and 4 bits away
    probes = np.concatenate([fps[rng.integers(0, len(fps), 300)] ^ (
        np.uint64(1) << rng.integers(0, 64, 300, dtype=np.uint64)),
        rng.integers(0, 2**64, 100, dtype=np.uint64), np.array([base, 0, TOP], dtype=np.uint64)])
    path = str(tmp_path / "db")
    with simhashdb.DB(path, distance=3, blocks=blocks, table_distance=table_distance) as db:
        for start in (0, 5000, 7000, 8000, 8500):  # runs of several sizes in every table
            end = {0: 5000, 5000: 7000, 7000: 8000, 8000: 8500}.get(start, len(fps))
            db.insert_many(keys=np.arange(start, end, dtype=np.uint64), fingerprints=fps[start:end])
        tables = db.tables

    def truth(probe, distance):
        return {i for i in np.nonzero(np.bitwise_count(fps ^ probe) <= distance)[0].tolist()}

    for filter_bits in (8, 1, 0):
        monkeypatch.setattr(NativeStorage, "filter_bits", filter_bits)
        with simhashdb.DB(path) as db:
            for distance in (3, 4):
                answers = db.query_many(probes.tolist(), distance=distance)
                assert [{m.key for m in found} for found in answers] == \
                    [truth(p, distance) for p in probes]
            skipped = db._storage.statistics()["ranges_skipped"]
            for probe in probes[-60:].tolist():
                assert {m.key for m in db.query(probe)} == truth(probe, 3)
            counts = db._storage.statistics()
            assert (counts["filter_bytes"] > 0) == bool(filter_bits)
            if filter_bits == 8:  # most random probes' ranges hold nothing in a table's run
                assert counts["ranges_skipped"] - skipped > 57 * tables // 2
            assert (counts["ranges_skipped"] == 0) == (filter_bits == 0)


def _crowded(rng, n, prefix, bits, probes):
    """``n`` random fingerprints, a third of them under ``prefix`` (their low
    ``bits`` random), with 0 and 2^64 - 1; and ``probes`` of them with one
    random bit flipped."""
    fps = rng.integers(0, 2**64, n, dtype=np.uint64)
    fps[:n // 3] = np.uint64(prefix) + rng.integers(0, 2**bits, n // 3, dtype=np.uint64)
    fps[n // 3:n // 3 + 2] = 0, TOP
    return fps, fps[rng.integers(0, n, probes)] ^ (
        np.uint64(1) << rng.integers(0, 64, probes, dtype=np.uint64))


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
@pytest.mark.parametrize("blocks,table_distance", [(5, 3), (2, 1)])
def test_a_run_too_big_for_a_directory_at_once_gets_one_after_its_searches_sought_it(
        tmp_path, monkeypatch, blocks, table_distance):
    """A run over ``directory_entries`` is searched through the B-tree until
    its searches have sought it entries / ``directory_rent`` times; then the
    next search builds its directory. Single queries (one range a table, or
    33 of a multi-index layout) and batches stay exact throughout; with no
    rent, no directory is ever built."""
    pytest.importorskip("simhashdb._lmdb")
    import simhashdb
    from simhashdb.storage.lmdb.native import NativeStorage
    fps, probes = _crowded(np.random.default_rng(7), 3000, 0xABCD_0000_0000_0000, 16, 400)
    path = str(tmp_path / "db")
    with simhashdb.DB(path, distance=3, blocks=blocks, table_distance=table_distance) as db:
        db.insert_many(keys=np.arange(len(fps), dtype=np.uint64), fingerprints=fps)
        tables = db.tables

    def truth(probe):
        return {i for i in np.nonzero(np.bitwise_count(fps ^ probe) <= 3)[0].tolist()}

    monkeypatch.setattr(NativeStorage, "directory_entries", 100)
    for rent in (0, 10):
        monkeypatch.setattr(NativeStorage, "directory_rent", rent)
        with simhashdb.DB(path) as db:
            db.query_many([0])  # a first search builds nothing
            assert db._storage.statistics()["directories_built"] == 0
            seeks_due = len(fps) // 10 + 1  # a run of len(fps) entries, one a table
            per_query = 1 if table_distance == 3 else 33
            built = []
            for probe in probes[:seeks_due // per_query + 2].tolist():
                assert {m.key for m in db.query(probe)} == truth(probe)
                built.append(db._storage.statistics()["directories_built"])
            answers = db.query_many(probes.tolist())
            assert [{m.key for m in found} for found in answers] == [truth(p) for p in probes]
            if rent:
                assert built[0] == 0 and built[-1] == tables  # each run's, once
                assert built[-1] == db._storage.statistics()["directories_built"]
            else:
                assert built[-1] == 0 == db._storage.statistics()["directories_built"]


def _map_address(path):
    """Where the data file of database ``path`` is mapped in this process
    (/proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return {int(line.split("-")[0], 16) for line in maps
                if line.rstrip().endswith(os.path.join(os.path.realpath(path), "data.mdb"))}


@pytest.mark.usefixtures("runs_only")  # the runs themselves: none in recent
def test_the_block_directories_follow_the_map_when_it_grows(tmp_path):
    """Growing the map moves it in the address space; the runs' block
    directories (pointers into it), the tables' and the bands', move with it
    instead of being read again, and every search stays exact."""
    pytest.importorskip("simhashdb._lmdb")
    import itertools
    from array import array

    import simhashdb
    from simhashdb.rule import bands
    rng = np.random.default_rng(11)
    fps, probes = _crowded(rng, 6000, 0x1234_0000_0000_0000, 20, 300)
    words = ["w%d" % i for i in range(3000)]
    texts = [" ".join(rng.choice(words, 50).tolist()) for _ in range(3000)]
    keys = array("I", itertools.chain.from_iterable(
        bands(simhashdb.fingerprint_with_signature(t)[1]) for t in texts[::10]))

    def truth(probe):
        return {i for i in np.nonzero(np.bitwise_count(fps ^ probe) <= 3)[0].tolist()}

    def searched(db, texts):
        if texts:
            with db._storage.read() as view:
                return [sorted(found) for found in view.band_search(keys)]
        assert {m.key for m in db.query(int(probes[0]))} == truth(probes[0])
        return [{m.key for m in found} for found in db.query_many(probes.tolist())]

    addresses = []
    for kind in ("fingerprints", "texts"):
        with simhashdb.DB(str(tmp_path / kind), distance=3) as db:
            for start in range(0, 3000, 750):
                if kind == "texts":
                    db.insert_text_many((i, texts[i]) for i in range(start, start + 750))
                else:
                    db.insert_many(keys=np.arange(2 * start, 2 * start + 1500, dtype=np.uint64),
                                   fingerprints=fps[2 * start:2 * start + 1500])
            storage = db._storage.shared
            found = searched(db, kind == "texts")
            assert all(found) if kind == "texts" else found == [truth(p) for p in probes]
            built = storage.statistics()["directories_built"]
            assert built >= (32 if kind == "texts" else db.tables)
            for _ in range(5):
                storage._resize(storage._map_size() * 2)
                addresses.append(_map_address(storage.path))
                assert searched(db, kind == "texts") == found
            assert storage.statistics()["directories_built"] == built
    assert len(set(map(frozenset, addresses))) > 2  # the maps did move
