"""The portable LMDB backend, on py-lmdb: the same files as the native
backend, used where that one was not built (or with ``backend="py-lmdb"``).
"""

import contextlib
import itertools
import os

import lmdb

from ... import _ext
from ...errors import DatabaseError
from ...layout import MAX_TABLES
from ...records import value_fingerprint
from .. import BANDS, Txn, View, band_entries
from .files import LmdbStorage

META, DOCS, FINGERPRINTS = b"meta", b"docs", b"fingerprints"


_INHERITED_ENVS = []  # a fork child's copies of its parent's environments, never closed


BAND_TABLES = [b"band:%02d" % band for band in range(BANDS)]


def table_name(table):
    """The sub-database name of permutation table ``table``."""
    return b"table:%03d" % table


class PyLmdbStorage(LmdbStorage):
    """An LMDB environment in the directory ``path``, through py-lmdb."""

    backend = "py-lmdb"
    opens_damaged_files = False  # no fault guard: reading past the end of the file is a SIGBUS

    def _open_env(self):
        try:
            self._env = lmdb.open(self.path, map_size=self._map_size_to_open(),
                                  max_dbs=MAX_TABLES + 3 + BANDS, readonly=self.readonly,
                                  max_readers=self.max_readers, subdir=True,
                                  lock=self._dir.locked)
            self._env.reader_check()
        except lmdb.Error as exc:
            raise DatabaseError("cannot open the database at %s: %s" % (self.path, exc)) from None
        if not self.readonly and self._env.stat()["entries"]:
            with self._env.begin() as txn:
                if txn.get(META) is None:
                    raise DatabaseError("%s holds an LMDB database that simhashdb did not make; "
                                        "use another directory" % self.path)
        self._dbs = {name: self._open_db(name) for name in (META, DOCS)}
        self._dbs[FINGERPRINTS] = self._open_db(FINGERPRINTS, dupsort=True)
        try:
            for name in BAND_TABLES:
                self._dbs[name] = self._open_db(name, dupsort=True, dupfixed=True)
        except DatabaseError:
            if not self.readonly:
                raise
            for name in BAND_TABLES:  # made before bands were, opened read-only
                self._dbs.pop(name, None)
        if self._layout is not None:
            self.open_tables(self._layout)

    def _open_db(self, name, dupsort=False, dupfixed=False, env=None, txn=None):
        try:
            return (env or self._env).open_db(name, txn=txn, dupsort=dupsort, dupfixed=dupfixed,
                                              create=not self.readonly)
        except lmdb.NotFoundError:
            raise DatabaseError("%s has no %r sub-database: it is not a simhashdb database"
                                % (self.path, name.decode())) from None
        except lmdb.Error as exc:
            raise DatabaseError("cannot open %s: %s" % (self.path, exc)) from None

    def _close_env(self):
        self._env.close()
        self._env = None

    def _forget_after_fork(self):
        """py-lmdb (3.0 on) refuses a second environment on a path it has open
        in this process, and a fork child inherits that record: close the
        parent's here. LMDB before 0.9.33 frees the reader slots of the process
        that opened the environment when it is closed, the parent's: there the
        child keeps it open, unused, instead."""
        if self._env is not None and os.getpid() != self._pid:
            if lmdb.version() >= (0, 9, 33):
                self._env.close()
            else:
                _INHERITED_ENVS.append(self._env)

    def _reader_check(self):
        self._env.reader_check()

    def _map_size(self):
        return self._env.info()["map_size"]

    def lmdb_version(self):
        return lmdb.version()

    def _live_readers(self):
        return self._env.info()["num_readers"]

    def _set_mapsize(self, map_size):
        self._env.set_mapsize(map_size)

    def open_tables(self, layout):
        self._layout = layout
        for table in range(layout.tables):
            self._dbs[table_name(table)] = self._open_db(table_name(table), dupsort=True,
                                                         dupfixed=True)

    def _begin_read(self):
        with self._errors("read"):
            return self._env.begin()

    def _view(self, txn):
        return PyView(self, txn)

    @contextlib.contextmanager
    def _errors(self, doing):
        try:
            yield
        except (self.map_resized, self.map_full):
            raise
        except lmdb.Error as exc:
            raise DatabaseError("cannot %s %s: %s" % (doing, self.path, exc)) from None

    map_resized, map_full = lmdb.MapResizedError, lmdb.MapFullError

    def _writer(self, txn):
        return PyTxn(self, txn)

    def _abort(self, txn):
        """Abort a failed write transaction. py-lmdb 3 makes an abort wait until no
        other thread is inside LMDB, so readers are held off until it is done."""
        if txn is None:
            return
        if self._gate.held_here():
            txn.abort()
        else:
            with self._gate.exclusive("abort a write"):
                txn.abort()

    def _copy_to(self, copy):
        """Write the database, compacted, into the new file ``copy``: every
        sub-database appended in order, the tables rebuilt from the index."""
        target = lmdb.open(copy, map_size=self._map_size_to_open(), max_dbs=MAX_TABLES + 3,
                           subdir=False, lock=False)
        try:
            with self._env.begin() as source, target.begin(write=True) as written:
                for name, dupsort in ((META, False), (DOCS, False), (FINGERPRINTS, True)):
                    db = self._open_db(name, dupsort=dupsort, env=target, txn=written)
                    items = source.cursor(self._dbs[name]).iternext()
                    _fill(written.cursor(db), items, dupsort)
                for name in BAND_TABLES if name in self._dbs else ():
                    db = self._open_db(name, dupsort=True, dupfixed=True, env=target, txn=written)
                    _fill(written.cursor(db), source.cursor(self._dbs[name]).iternext(), True)
                fps = [_ext.unpack_key(k) for k in
                       source.cursor(self._dbs[FINGERPRINTS]).iternext_nodup(values=False)]
                for table in range(self._layout.tables):
                    db = self._open_db(table_name(table), dupsort=True, dupfixed=True,
                                       env=target, txn=written)
                    _fill(written.cursor(db), self._layout.table_items(fps, table), True)
        finally:
            target.close()


class PyView(View):
    """Reads over one py-lmdb transaction."""

    def __init__(self, storage, txn):
        self._storage, self._txn = storage, txn
        self._cursors = {}

    def _cursor(self, name):
        cursor = self._cursors.get(name)
        if cursor is None:
            cursor = self._cursors[name] = self._txn.cursor(self._storage._dbs[name])
        return cursor

    def params(self):
        return self._cursor(META).get(b"params")

    def count(self):
        return self._txn.stat(self._storage._dbs[DOCS])["entries"]

    def distinct(self):
        return self._txn.stat(self._storage._dbs[table_name(0)])["entries"]

    def get(self, key):
        return self._cursor(DOCS).get(key)

    def documents(self, after=None):
        cursor = self._txn.cursor(self._storage._dbs[DOCS])
        if after is None:
            return cursor.iternext() if cursor.first() else iter(())
        if not cursor.set_range(after):
            return iter(())
        if cursor.key() == after and not cursor.next():
            return iter(())
        return cursor.iternext()

    def keys_of(self, fingerprint):
        cursor = self._cursor(FINGERPRINTS)
        if not cursor.set_key(_ext.pack_key(fingerprint)):
            return []
        return list(cursor.iternext_dup())

    def fingerprint_groups(self):
        cursor = self._txn.cursor(self._storage._dbs[FINGERPRINTS])
        if not cursor.first():
            return
        for fp_bytes, entries in itertools.groupby(cursor.iternext(), key=lambda item: item[0]):
            yield _ext.unpack_key(fp_bytes), [key for _, key in entries]

    def search(self, probes, distance):
        layout = self._storage._layout
        cursors = [self._cursor(table_name(t)) for t in range(layout.tables)]

        def scan(table, first, last, perm):
            entries = _scan(cursors[table], _ext.pack_key(first), _ext.pack_key(last))
            return _ext.verify(perm, entries, distance) if entries else ()

        results = []
        for probe in probes:
            found = layout.near(probe, distance, scan)
            results.append([(key, fp, d) for fp, d in found.items()
                            for key in self.keys_of(fp)])
        return results

    def band_search(self, keys):
        dbs = self._storage._dbs
        results = []
        for query in range(len(keys) // BANDS):
            prefixes = set()
            for band in range(BANDS if BAND_TABLES[0] in dbs else 0):
                first = keys[query * BANDS + band] << 32
                entries = _scan(self._cursor(BAND_TABLES[band]), _ext.pack_key(first),
                                _ext.pack_key(first | 0xFFFFFFFF))
                prefixes.update(entries[i + 4:i + 8] for i in range(0, len(entries), 8))
            results.append([found for prefix in sorted(prefixes)
                            for found in self._with_prefix(prefix)])
        return results

    def _with_prefix(self, prefix):
        """(key, fingerprint) of the documents whose fingerprint starts with
        the 4 bytes ``prefix``."""
        index = self._cursor(FINGERPRINTS)
        if not index.set_range(prefix + bytes(4)):
            return []
        found = []
        for fp_bytes, key in index.iternext():
            if fp_bytes[:4] != prefix:
                break
            found.append((key, _ext.unpack_key(fp_bytes)))
        return found

    def band_entries(self, band):
        if BAND_TABLES[band] not in self._storage._dbs:
            return []
        cursor = self._txn.cursor(self._storage._dbs[BAND_TABLES[band]])
        return [_ext.unpack_key(k + v) for k, v in cursor.iternext()] if cursor.first() else []

    def table_fingerprints(self, table):
        layout = self._storage._layout
        cursor = self._txn.cursor(self._storage._dbs[table_name(table)])
        return [layout.unpermute(_ext.unpack_key(k + v), table) for k, v in cursor.iternext()] \
            if cursor.first() else []


class PyTxn(PyView, Txn):
    """Reads and writes over the py-lmdb write transaction."""

    def set_params(self, raw):
        self._cursor(META).put(b"params", raw)

    def upsert(self, documents):
        latest = {key: (fp, value) for key, fp, value in documents}
        touched, bands = {}, {}
        docs, index = self._cursor(DOCS), self._cursor(FINGERPRINTS)
        for key in sorted(latest):
            fp, value = latest[key]
            old = docs.get(key)
            _note_bands(bands, value, fp, True)
            if old is not None:
                old_fp = value_fingerprint(old)
                _note_bands(bands, old, old_fp, False)
                if old_fp == fp:
                    docs.put(key, value)
                    continue
                self._unlink(old_fp, key, touched)
            docs.put(key, value)
            self._touch(fp, touched)
            index.put(_ext.pack_key(fp), key)
        self._update_tables(touched)
        self._update_bands(bands)

    def remove(self, keys):
        touched, bands = {}, {}
        docs = self._cursor(DOCS)
        removed = 0
        for key in sorted(set(keys)):
            old = docs.get(key)
            if old is not None:
                docs.delete()
                _note_bands(bands, old, value_fingerprint(old), False)
                self._unlink(value_fingerprint(old), key, touched)
                removed += 1
        self._update_tables(touched)
        self._update_bands(bands)
        return removed

    def _update_bands(self, bands):
        """Put into the band tables the entries the batch brought ({(band,
        entry): whether a document brought it}); take out those it took away
        that no stored document has any more."""
        if BAND_TABLES[0] not in self._storage._dbs:
            return
        for (band, entry), added in sorted(bands.items()):
            cursor = self._cursor(BAND_TABLES[band])
            key, value = _ext.pack_key(entry)[:2], _ext.pack_key(entry)[2:]
            if added:
                cursor.put(key, value, dupdata=True)
            elif not self._held(band, entry) and cursor.set_key_dup(key, value):
                cursor.delete()

    def _held(self, band, entry):
        """Whether a stored document (as the index is now) has band entry ``entry``."""
        for key, fp in self._with_prefix(_ext.pack_key(entry)[4:]):
            entries = band_entries(self._cursor(DOCS).get(key), fp)
            if entries and entries[band] == entry:
                return True
        return False

    def _touch(self, fp, touched):
        """Note ``fp`` as changed, first with whether the index had it before."""
        if fp not in touched:
            touched[fp] = self._cursor(FINGERPRINTS).set_key(_ext.pack_key(fp))

    def _unlink(self, fp, key, touched):
        self._touch(fp, touched)
        index = self._cursor(FINGERPRINTS)
        if index.set_key_dup(_ext.pack_key(fp), key):
            index.delete()

    def _update_tables(self, touched):
        """Add to every table the fingerprints the index gained; take out those it lost."""
        index = self._cursor(FINGERPRINTS)
        added, removed = [], []
        for fp, had in touched.items():
            now = index.set_key(_ext.pack_key(fp))
            if now and not had:
                added.append(fp)
            elif had and not now:
                removed.append(fp)
        layout = self._storage._layout
        for table in range(layout.tables):
            cursor = self._cursor(table_name(table))
            if added:
                cursor.putmulti(layout.table_items(added, table), dupdata=True)
            for key, value in layout.table_items(removed, table) if removed else ():
                if cursor.set_key_dup(key, value):
                    cursor.delete()


def _note_bands(bands, value, fingerprint, added):
    """Note the band entries of a document value as brought (``added``) or
    taken away: {(band, entry): whether a document brings it}."""
    for band, entry in enumerate(band_entries(value, fingerprint)):
        bands[band, entry] = bands.get((band, entry), False) or added


def _fill(cursor, items, dupsort):
    """Put sorted ``items`` into an empty sub-database, every one of them.
    Appends only where there are no duplicates: py-lmdb before 3.0 appends
    duplicates with MDB_APPEND, which refuses each value after a key's first
    and putmulti counts it as not added instead of failing."""
    consumed, added = cursor.putmulti(items, dupdata=dupsort, append=not dupsort)
    if added != consumed:
        raise DatabaseError("compaction wrote %d of %d entries; the database is unchanged"
                            % (added, consumed))


def _scan(cursor, first, last):
    """The 8-byte entries of a table in [first, last], concatenated."""
    if not cursor.set_range_dup(first[:2], first[2:]):
        following = (int.from_bytes(first[:2], "big") + 1).to_bytes(3, "big")[1:]
        if first[:2] == b"\xff\xff" or first[:2] == last[:2] or not cursor.set_range(following):
            return b""
    found = []
    for key, value in cursor.iternext():
        entry = key + value
        if entry > last:
            break
        found.append(entry)
    return b"".join(found)
