import contextlib
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings

# The tests' files (tmp_path, tempfile, their subprocesses') go to Linux's
# tmpfs where it has room and TMPDIR names no other place: LMDB syncs every
# commit to the disk, which no test can observe (a killed process leaves the
# page cache whole) and which took about half the time of test_db_state.py.
# A passing test's files go at its end (pyproject.toml), so memory holds few.
if "TMPDIR" not in os.environ and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        and shutil.disk_usage("/dev/shm").free > 8 << 30:
    os.environ["TMPDIR"] = "/dev/shm"
    tempfile.tempdir = None  # read TMPDIR again

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

import pytest
from memory_backend import MemoryStorage
from redis_cluster import available as redis_available, LocalCluster

import simhashdb
from simhashdb.layout import Layout
from simhashdb.storage import registry
from simhashdb.storage.lmdb import format as lmdb_format
from simhashdb.storage.lmdb.files import LmdbStorage

registry.register("memory", MemoryStorage)  # the toy backend of tests/memory_backend.py

def usable(name):
    """Whether backend ``name`` runs here. CI builds the native backend and
    installs redis-server (make test does), so there every backend is tested
    (and the run fails if one did not build); elsewhere, what is built."""
    if os.environ.get("CI"):
        return True
    if name == "redis" and not redis_available():
        return False
    try:
        registry.backend_class(name)
    except ImportError:
        return False
    return True


# Every DB test runs on each backend that keeps databases across processes (the
# suite starts subprocesses on them); the contract suite (test_storage.py) on
# every registered backend.
BACKENDS = [name for name in registry.names() if name != "memory" and usable(name)]
STORAGE_BACKENDS = [name for name in registry.names() if usable(name)]
# The fixtures a backend's tests need besides a path (a server to hold them).
BACKEND_FIXTURES = {"redis": ("redis_names",)}
REDIS = "redis" in BACKENDS


def native_built():
    try:
        registry.backend_class("lmdb")
    except ImportError:
        return False
    return True


# Both LMDB backends, for tests of their files (the native one where it was built).
LMDB_BACKENDS = ["py-lmdb", pytest.param("lmdb", marks=pytest.mark.skipif(
    not native_built(), reason="the native backend was not built"))]
VOCABULARY = ["w%d" % i for i in range(3000)]


def page(rng, words=90):
    """A page of ``words`` words drawn from VOCABULARY."""
    return " ".join(rng.choice(VOCABULARY) for _ in range(words))


def edited(rng, text, share):
    """``text`` with ``share`` of its words replaced by words it never had."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, int(len(words) * share))):
        words[i] = "new%d" % rng.randrange(10**6)
    return " ".join(words)


def pytest_configure(config):
    config.addinivalue_line("markers", "lmdb_only: tests what only the LMDB backends have "
                            "(files, directories, the map, compaction, one handle per process)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds; "
                            "`pytest -m 'not slow'` leaves it out")


def pytest_collection_modifyitems(config, items):
    """An lmdb_only test runs on the LMDB backends only."""
    other = [item for item in items if item.get_closest_marker("lmdb_only")
             and getattr(item, "callspec", None) and "backend" in item.callspec.params
             and not issubclass(registry.backend_class(item.callspec.params["backend"]),
                                LmdbStorage)]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A 3-primary, 3-replica Redis Cluster on loopback (a LocalCluster),
    started once for the session (in ~6 s) when a test first asks for it."""
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """The backend a test's databases use: also the default of ``DB()`` and of
    subprocesses (``SIMHASHDB_BACKEND``)."""
    monkeypatch.setenv("SIMHASHDB_BACKEND", request.param)
    for fixture in BACKEND_FIXTURES.get(request.param, ()):
        request.getfixturevalue(fixture)
    return request.param


@pytest.fixture
def redis_names(redis_cluster, monkeypatch):
    """A path names a database on the session's cluster ($SIMHASHDB_REDIS_URL)."""
    # a writer killed holding the lock holds it for 1 s (not the default 10)
    monkeypatch.setenv("SIMHASHDB_REDIS_URL", redis_cluster.url + "?lease=1")
    yield redis_cluster
    redis_cluster.flush()  # keeps scans of the cluster short


# The storage layer itself: the contract suite (test_storage.py) and the band
# index (test_bands.py) open a backend's Storage without a DB.

STORAGE_LAYOUT = Layout(5, 3)


@pytest.fixture(params=STORAGE_BACKENDS)
def opener(request, tmp_path):
    """open(readonly=False, create=True, where="db"): the Storage of database
    ``where`` (fresh for each test) on the backend of this run, its tables
    those of STORAGE_LAYOUT."""
    name = request.param
    for fixture in BACKEND_FIXTURES.get(name, ()):
        request.getfixturevalue(fixture)
    opened = []

    def open_(readonly=False, create=True, where="db"):
        storage = registry.open_storage(str(tmp_path / where), readonly=readonly,
                                        create=create, backend=name)
        storage.open_tables(STORAGE_LAYOUT)
        opened.append(storage)
        return storage

    yield open_
    for storage in opened:
        storage.close()


@pytest.fixture
def runs_only(monkeypatch):
    """Every write's run entries go to the runs, none to recent (its limit 0),
    on both LMDB backends: for the tests whose subject is the runs themselves."""
    for name in ("lmdb", "py-lmdb"):
        if name == "py-lmdb" or native_built():
            monkeypatch.setattr(registry.backend_class(name), "recent_limit", 0, raising=False)


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "test.db")


@pytest.fixture
def db(db_path, backend):
    with simhashdb.DB(db_path, distance=3, blocks=5, backend=backend) as database:
        assert database.backend == backend
        yield database


# Below the DB: what a document is stored as (for tests of older formats and
# of what a value holds), and the storage itself for tests of what only it
# shows (its files, transactions, counters, failures injected into it).

def storage_of(db):
    """The :class:`simhashdb.storage.Storage` that ``db`` reads and writes
    through: the one place tests reach below the public API."""
    return db._storage


def stored_value(db, key):
    """The bytes stored for document ``key`` (None if there is none)."""
    with storage_of(db).read() as view:
        return view.get(simhashdb.records.encode_key(key))


def store_values(db, documents):
    """Store (key, fingerprint, value) documents with their values as given (bytes)."""
    encoded = [(simhashdb.records.encode_key(k), fp, value) for k, fp, value in documents]
    storage_of(db).write(lambda txn: txn.upsert(encoded))


def stored_params(db):
    with storage_of(db).read() as view:
        return view.params()


def store_params(db, raw):
    storage_of(db).write(lambda txn: txn.set_params(raw))


def stored_keys(db):
    """The encoded keys of the documents, in the backend's iteration order."""
    with storage_of(db).read() as view:
        return [key for key, _ in view.documents()]


def as_tuples(matches):
    """Matches as (key, fingerprint, distance) tuples, as brute_force gives them."""
    return [(m.key, m.fingerprint, m.distance) for m in matches]


def flip(fp, bits):
    """``fp`` with ``bits`` flipped."""
    for b in bits:
        fp ^= 1 << b
    return fp


def key_order(key):
    """Sort keys of mixed types: ints, then str, then bytes (as the DB does)."""
    return (isinstance(key, bytes), isinstance(key, str), key)


def brute_force(docs, fingerprint, distance):
    """The oracle: every (key, fingerprint, distance) within ``distance``, sorted."""
    hits = [(key, fp, d) for key, fp in docs.items()
            if (d := (fp ^ fingerprint).bit_count()) <= distance]
    return sorted(hits, key=lambda m: (m[2], key_order(m[0])))


@contextlib.contextmanager
def raw_snapshot(path):
    """(env, txn): a py-lmdb read transaction on the file of the database at
    ``path``, taking no lock, to read what it holds raw."""
    import lmdb
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(64), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            yield env, txn
    finally:
        env.close()


def store_format(env, txn, version):
    """Set the format version in an LMDB database's stored parameters, where it has them."""
    import msgpack

    meta = env.open_db(lmdb_format.META.name(), txn=txn)
    raw = txn.get(lmdb_format.PARAMS, db=meta)
    if raw is not None:  # (a storage written without a DB has none)
        txn.put(lmdb_format.PARAMS, msgpack.packb(dict(msgpack.unpackb(raw), format=version)),
                db=meta)


def raw_records(env, txn):
    """{id (8 bytes): record} of an LMDB database's documents, from its blocks
    or (format 10 and before) its records."""
    if txn.get(lmdb_format.RECORDS.name()) is not None:
        records = env.open_db(lmdb_format.RECORDS.name(), txn=txn, create=False)
        return dict(txn.cursor(records).iternext())
    blocks = env.open_db(lmdb_format.RECORD_BLOCKS.name(), txn=txn, create=False)
    held = {}
    for key, raw in txn.cursor(blocks).iternext():
        for doc, record in lmdb_format.unpack_block(int.from_bytes(key, "big"), raw):
            held[doc.to_bytes(8, "big")] = record
    return held


def raw_record(env, txn, doc):
    """The record (bytes as stored) of document id ``doc`` (8 bytes) of an
    LMDB database, or None: from the block that would hold it, or (format 10
    and before) under its id."""
    if txn.get(lmdb_format.RECORDS.name()) is not None:
        return txn.get(doc, db=env.open_db(lmdb_format.RECORDS.name(), txn=txn, create=False))
    cursor = txn.cursor(env.open_db(lmdb_format.RECORD_BLOCKS.name(), txn=txn, create=False))
    if not cursor.set_range(doc):
        if not cursor.last():
            return None
    elif cursor.key() != doc and not cursor.prev():
        return None
    key = int.from_bytes(cursor.key(), "big")
    return dict(lmdb_format.unpack_block(key, cursor.value())).get(int.from_bytes(doc, "big"))


def put_raw_record(env, txn, doc, record):
    """Store ``record`` (bytes as stored) as the record of document id ``doc``
    (8 bytes) of an LMDB database: in the block that holds it, or (format 10
    and before) under its id."""
    if txn.get(lmdb_format.RECORDS.name()) is not None:
        txn.put(doc, record, db=env.open_db(lmdb_format.RECORDS.name(), txn=txn, create=False))
        return
    blocks = env.open_db(lmdb_format.RECORD_BLOCKS.name(), txn=txn, create=False)
    for key, raw in txn.cursor(blocks).iternext():
        held = dict(lmdb_format.unpack_block(int.from_bytes(key, "big"), raw))
        if int.from_bytes(doc, "big") in held:
            held[int.from_bytes(doc, "big")] = record
            txn.put(key, lmdb_format.pack_block(int.from_bytes(key, "big"), sorted(held.items())),
                    db=blocks)
            return
    raise KeyError(doc)


def records_as_in_format_10(path):
    """Rewrite the closed database at ``path``'s documents as format 10 and
    earlier kept them, a record an id in ``records`` (no blocks); format 10
    stored (9 where its signatures have 16-bit bins)."""
    import lmdb
    import msgpack

    env = lmdb.open(path, max_dbs=4096, map_size=1 << 34)
    with env.begin(write=True) as txn:
        held = raw_records(env, txn)
        txn.drop(env.open_db(lmdb_format.RECORD_BLOCKS.name(), txn=txn), delete=True)
        records = env.open_db(lmdb_format.RECORDS.name(), txn=txn)
        txn.cursor(records).putmulti(sorted(held.items()), append=True)
        raw = txn.get(lmdb_format.PARAMS, db=env.open_db(lmdb_format.META.name(), txn=txn))
        if raw is not None:
            store_format(env, txn, 10 if msgpack.unpackb(raw).get("signature_bits") == 8 else 9)
    env.close()


def stored_id(env, txn, key):
    """The document id (8 bytes) of encoded ``key`` in an LMDB database: the
    one under its hash in the key map (in whichever of its slots) whose record
    holds it; or None."""
    for name in lmdb_format.KEYS.names():
        cursor = txn.cursor(env.open_db(name, txn=txn, dupsort=True))
        if cursor.set_key(lmdb_format.key_hash(key)):
            for id_bytes in cursor.iternext_dup():
                record = raw_record(env, txn, id_bytes)
                if record[:lmdb_format.KEY_LENGTH_BYTES + len(key)] == \
                        len(key).to_bytes(lmdb_format.KEY_LENGTH_BYTES, "big") + key:
                    return id_bytes
    return None


def index_in_one_slot(env, txn):
    """Move the fingerprint index into ``fingerprints`` and drop its other slots
    (index:NN), as databases of format 3 and before kept it."""
    first = env.open_db(lmdb_format.INDEX.name(0), txn=txn, dupsort=True)
    for name in lmdb_format.INDEX.names()[1:]:
        db = env.open_db(name, txn=txn, dupsort=True)
        txn.cursor(first).putmulti(list(txn.cursor(db).iternext()), dupdata=True)
        txn.drop(db, delete=True)


def documents_as_in_format_6(path, format=6):
    """Rewrite the closed database at ``path``'s documents as format 6 and
    earlier kept them: ``docs`` (encoded key -> value), the index's values the
    keys, no records, key map or next id; ``format`` stored."""
    import lmdb

    records_as_in_format_10(path)
    env = lmdb.open(path, max_dbs=4096, map_size=1 << 34)
    with env.begin(write=True) as txn:
        records = env.open_db(lmdb_format.RECORDS.name(), txn=txn, create=False)
        docs = env.open_db(lmdb_format.OLD_DOCS.name(), txn=txn)
        key_of = {}
        for id_bytes, raw in txn.cursor(records).iternext():
            size = int.from_bytes(raw[:lmdb_format.KEY_LENGTH_BYTES], "big")
            key_of[id_bytes] = raw[lmdb_format.KEY_LENGTH_BYTES:lmdb_format.KEY_LENGTH_BYTES + size]
            txn.put(key_of[id_bytes], raw[lmdb_format.KEY_LENGTH_BYTES + size:], db=docs)
        for name in lmdb_format.INDEX.names():
            slot = env.open_db(name, txn=txn, dupsort=True)
            entries = [(fp, key_of[id_bytes]) for fp, id_bytes in txn.cursor(slot).iternext()]
            txn.drop(slot, delete=False)
            txn.cursor(slot).putmulti(entries, dupdata=True)
        for name in [lmdb_format.RECORDS.name()] + lmdb_format.KEYS.names():
            txn.drop(env.open_db(name, txn=txn), delete=True)
        txn.delete(lmdb_format.NEXT_ID, db=env.open_db(lmdb_format.META.name(), txn=txn))
        store_format(env, txn, format)
    env.close()


def documents_as_in_format_7(path):
    """Rewrite the closed database at ``path``'s key map as format 7 kept it:
    ``keys`` (encoded key -> id), written by key, and no ``hashes`` slots;
    format 7 stored."""
    import lmdb

    records_as_in_format_10(path)
    env = lmdb.open(path, max_dbs=4096, map_size=1 << 34)
    with env.begin(write=True) as txn:
        records = env.open_db(lmdb_format.RECORDS.name(), txn=txn, create=False)
        keys = env.open_db(lmdb_format.OLD_KEYS.name(), txn=txn)
        size = lmdb_format.KEY_LENGTH_BYTES
        txn.cursor(keys).putmulti(sorted(
            (raw[size:size + int.from_bytes(raw[:size], "big")], id_bytes)
            for id_bytes, raw in txn.cursor(records)))
        for name in lmdb_format.KEYS.names():
            txn.drop(env.open_db(name, txn=txn, dupsort=True), delete=True)
        store_format(env, txn, 7)
    env.close()


def bands_as_in_0_5(path):
    """Rewrite the closed database at ``path``'s bands as simhashdb 0.5 kept
    them: each a dupsort ``band:NN`` (an entry's top 2 bytes as key, the other
    6 as value), no band runs, the documents as format 6 kept them, format 4."""
    import lmdb

    from simhashdb import DB
    with DB(path, readonly=True) as db, storage_of(db).read() as view:
        bands = [view.band_entries(band) for band in range(lmdb_format.BANDS)]
    documents_as_in_format_6(path)
    env = lmdb.open(path, max_dbs=4096, map_size=1 << 34)
    with env.begin(write=True) as txn:
        directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn)
        for band, entries in enumerate(bands):
            old = env.open_db(lmdb_format.OLD_BAND.name(band), txn=txn, dupsort=True, dupfixed=True)
            txn.cursor(old).putmulti([(e.to_bytes(8, "big")[:2], e.to_bytes(8, "big")[2:])
                                      for e in sorted(entries)], dupdata=True)
            for name in lmdb_format.BAND_RUNS.names(band):
                txn.drop(env.open_db(name, txn=txn), delete=True)
            txn.delete(lmdb_format.band_directory_key(band), db=directory)
        txn.delete(lmdb_format.BAND_STALE, db=env.open_db(lmdb_format.META.name(), txn=txn))
        store_format(env, txn, 4)
    env.close()


def as_in_0_3(path):
    """Rewrite the closed database at ``path`` as simhashdb 0.3 kept it: each
    table a dupsort ``table:NNN`` (the permuted value's top 2 bytes as key, the
    other 6 as value), no runs, no counters, the documents and each band as
    0.5 kept them, format 2."""
    import lmdb

    from simhashdb import DB
    with DB(path, readonly=True) as db, storage_of(db).read() as view:
        layout = db._layout
        tables = [view.table_fingerprints(t) for t in range(layout.tables)]
    bands_as_in_0_5(path)
    env = lmdb.open(path, max_dbs=4096, map_size=1 << 34)
    with env.begin(write=True) as txn:
        for t, fps in enumerate(tables):
            table = env.open_db(lmdb_format.OLD_TABLE.name(t), txn=txn, dupsort=True, dupfixed=True)
            txn.cursor(table).putmulti(layout.table_items(list(fps), t), dupdata=True)
            for name in lmdb_format.TABLE_RUNS.names(t):
                txn.drop(env.open_db(name, txn=txn), delete=True)
        txn.drop(env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn), delete=True)
        index_in_one_slot(env, txn)
        meta = env.open_db(lmdb_format.META.name(), txn=txn)
        assert txn.delete(lmdb_format.DISTINCT, db=meta)
        txn.delete(lmdb_format.STALE, db=meta)
        store_format(env, txn, 2)
    env.close()
