"""The portable LMDB backend, on py-lmdb: the same files as the native
backend, used where that one was not built (or with ``backend="py-lmdb"``).

A new database keeps its tables and bands as compressed sorted runs
(RUNS.md), blocks coded by ``_ext`` exactly as the native backend codes them;
a database whose tables are in simhashdb 0.3's form (dupsort ``table:NNN``)
or whose bands are in 0.5's (dupsort ``band:NN``) opens read-only. A run set
is a table (numbered from 0) or a band (numbered after the tables).
The fingerprint index is the union of its slots, as native keeps them; this
backend puts new entries into ``fingerprints`` and leaves merging the slots
to the native one (any slot may hold any entry).
"""

import collections
import contextlib
import heapq
import itertools
import os
import sys
from array import array
from bisect import bisect_left, bisect_right

import lmdb

from ... import _ext
from ...errors import DatabaseError
from ...layout import NearIndex
from ...records import value_fingerprint
from .. import BANDS, Txn, View, band_entries
from . import format
from .files import LmdbStorage, old_tables_error
from .format import (
    BAND_REWRITE,
    BAND_STALE,
    DISTINCT,
    INDEX_SLOTS,
    PARAMS,
    REMOVED,
    REWRITE,
    RUN_IDS,
    RUN_KEY_BYTES,
    RUN_RATIO,
    RUN_SLOTS,
    STALE,
    block_entries,
    band_directory_key,
    block_key,
    checksummed,
    directory_key,
    directory_record,
    directory_runs,
    max_dbs,
    new_run_id,
)

META, DOCS, RUNS = format.META.name(), format.DOCS.name(), format.RUN_DIRECTORY.name()
FINGERPRINTS = format.INDEX.name(0)  # the index's first slot, where new entries go
OLD_BANDS = format.OLD_BAND.names()
BAND_SLOTS = [name for band in range(BANDS) for name in format.BAND_RUNS.names(band)]
table_name, index_name, slot_name = format.OLD_TABLE.name, format.INDEX.name, format.TABLE_RUNS.name
band_slot_name = format.BAND_RUNS.name
BAND_GROUP = 8  # bands a rewrite writes in one transaction (a pass over the documents)
MAX_VALUE = (1 << 64) - 1


_INHERITED_ENVS = []  # a fork child's copies of its parent's environments, never closed


VERIFY_TRIES = 3  # walks of the data file check() makes while other processes commit


class PyLmdbStorage(LmdbStorage):
    """An LMDB environment in the directory ``path``, through py-lmdb."""

    backend = "py-lmdb"
    opens_damaged_files = False  # no fault guard: reading past the end of the file is a SIGBUS

    def _open_env(self, map_size=0):
        self._room = self._room_for_tables()  # the most tables it can open
        try:
            self._env = lmdb.open(os.fsencode(self.path), map_size=map_size or self._map_size_to_open(),
                                  max_dbs=max_dbs(self._room), readonly=self.readonly,
                                  max_readers=self.max_readers, subdir=True,
                                  lock=self._dir.locked)
            self._env.reader_check()
        except lmdb.Error as exc:
            raise DatabaseError("cannot open the database at %s: %s" % (self.path, exc)) from None
        self._runs = False  # whether the tables are kept as runs (known once they are open)
        self._whole_runs = set()  # (table, run id, entries) of runs found whole (_check_run)
        # what a new database needs is made in one transaction (whose write lock
        # also orders two processes making it at once): a crash leaves all or none
        with self._making() as txn:
            new = txn is not None and txn.get(META) is None
            if new and txn.cursor().first():
                raise DatabaseError("%s holds an LMDB database that simhashdb did not make; "
                                    "use another directory" % self.path)
            self._dbs = {name: self._open_db(name, txn=txn) for name in (META, DOCS)}
            self._index = []  # the index's slots (one where a database made before them is read)
            self._open_index_slots(create=new, txn=txn)
            self._open_bands(new, txn)
        if self._layout is not None:
            self.open_tables(self._layout)

    def _open_bands(self, new, txn):
        """Open the bands: as runs (made where writable: in a database of
        simhashdb 0.2, a rewrite of the bands begun), or in 0.5's form
        (``_old_bands``: how many are), or none (a database made before
        bands were, opened read-only)."""
        with contextlib.ExitStack() as stack:
            reader = txn or stack.enter_context(self._env.begin())
            old = [name for name in OLD_BANDS if reader.get(name) is not None]
            unbanded = reader.get(BAND_SLOTS[0]) is None
        self._old_bands = len(old)
        runs = not old and (not self.readonly or not unbanded)
        if runs and unbanded and not new:  # made in one of 0.2's: written from its documents
            txn.put(BAND_REWRITE, bytes(16), db=self._dbs[META])
        self._band_runs = runs
        for name in BAND_SLOTS if runs else old:
            self._dbs[name] = self._open_db(name, dupsort=not runs, dupfixed=not runs, txn=txn,
                                            create=runs)

    def _open_db(self, name, dupsort=False, dupfixed=False, env=None, txn=None, create=True):
        try:
            return (env or self._env).open_db(name, txn=txn, dupsort=dupsort, dupfixed=dupfixed,
                                              create=create and not self.readonly)
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

    def _map_used(self):
        return (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]

    def lmdb_version(self):
        return lmdb.version()

    def _set_mapsize(self, map_size):
        with self._errors("grow the map of"):
            self._env.set_mapsize(map_size)
        if self.readonly:  # another process may have added slots (none can beside a writer)
            self._open_index_slots(create=False)

    def _making(self):
        """The write transaction in which sub-databases are made (none read-only)."""
        return contextlib.nullcontext() if self.readonly else self._env.begin(write=True)

    def _open_index_slots(self, create, txn=None):
        """Open the index's slots from the first this handle lacks; without
        ``create``, up to the first the database does not have."""
        for name in map(index_name, range(len(self._index), INDEX_SLOTS)):
            made = create or not self._index  # (the first slot is made in any database)
            if not made and txn is not None and txn.get(name) is None:
                break  # (a write transaction must not meet a failed open)
            try:
                self._dbs[name] = self._open_db(name, dupsort=True, txn=txn, create=made)
            except DatabaseError:
                if not self._index:
                    raise
                break
            self._index.append(name)

    def _index_slots(self):
        return len(self._index)

    def _add_index_slots(self):
        with self._making() as txn:
            self._open_index_slots(create=True, txn=txn)

    def _set_slot(self, table, slot, tables=None):
        """The name of slot ``slot`` of run set ``table`` (a table, or a band
        after the ``tables``: by default, the layout's)."""
        tables = tables or self._layout.tables
        return slot_name(table, slot) if table < tables else band_slot_name(table - tables, slot)

    def _set_key(self, table, tables=None):
        """The key of run set ``table``'s directory (``tables``: as _set_slot)."""
        tables = tables or self._layout.tables
        return directory_key(table) if table < tables else band_directory_key(table - tables)

    def _set_named(self, table):
        tables = self._layout.tables
        return "table %d" % table if table < tables else "band %d" % (table - tables)

    def _run_sets(self):
        """The run sets: the tables, then the bands where they are kept as runs."""
        return range(self._layout.tables + (BANDS if self._band_runs else 0))

    def open_tables(self, layout):
        """Open the tables of ``layout``: runs (made in a new database), or
        tables in 0.3's form, which open read-only and all in that form only."""
        self._layout = layout
        if layout.tables > self._room:  # an environment with room for them
            self._close_env()
            self._open_env()
            return
        with self._env.begin() as txn:
            old = sum(txn.get(table_name(t)) is not None for t in range(layout.tables))
        if old and (not self.readonly or old < layout.tables):
            raise old_tables_error(self.path, converting=old < layout.tables)
        if self._old_bands and (not self.readonly or self._old_bands < BANDS):
            raise old_tables_error(self.path, converting=self._old_bands < BANDS, bands=True)
        self._runs = not old
        if self._runs:
            names = [RUNS] + [slot_name(table, slot) for table in range(layout.tables)
                              for slot in range(RUN_SLOTS)]
            flags = {}
        else:
            names = [table_name(table) for table in range(layout.tables)]
            flags = {"dupsort": True, "dupfixed": True}
        # made in one write transaction; a read transaction would close them as it ends
        with self._making() as txn:
            self._dbs.update((name, self._open_db(name, txn=txn, **flags)) for name in names)

    def _begin_read(self):
        with self._errors("read"):
            txn = self._env.begin()
        if len(self._index) < INDEX_SLOTS and txn.get(index_name(len(self._index))) is not None:
            txn.abort()  # the slots another process added must be read too
            raise lmdb.MapResizedError("the fingerprint index of %s gained slots" % self.path)
        return txn

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
        except SystemError as exc:  # py-lmdb's cursor.delete() on a damaged page
            if not isinstance(exc.__context__, lmdb.Error):
                raise
            raise DatabaseError("cannot %s %s: %s" % (doing, self.path, exc.__context__)) from None

    map_resized, map_full = lmdb.MapResizedError, lmdb.MapFullError

    def _writer(self, txn):
        used = self._map_used()
        if used > self._used_when_readers_checked:  # a dead reader's snapshot may be why
            self._reader_check()
            self._used_when_readers_checked = used
        return PyTxn(self, txn)

    _used_when_readers_checked = 0  # the file's size when the writer last cleared dead readers

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

    def check(self):
        """The directory's problems, and those py-lmdb's own verifier finds in
        the data file (py-lmdb 3 and later), read without LMDB, which would
        abort the process on some damaged pages: once it finds any in a file
        no commit changed while it read, this handle refuses to read it."""
        try:
            from lmdb.verify import VerifyError, verify
        except ImportError:  # an earlier py-lmdb
            return super().check()
        if self._env is None:  # closed: the check of the contents says so
            return super().check()
        for _ in range(VERIFY_TRIES):
            before = self._file_state()
            try:
                found = verify(self._dir.data)
            except (VerifyError, OSError) as exc:
                found = [str(exc)]
            if not found or self._file_state() == before:
                break
        else:  # a writer committed while each walk read the file: what it found may be that
            return super().check() + ["%s changed while it was verified (another process "
                                      "writes to it): check it again" % self._dir.data]
        if found:
            self._unreadable = "%s%s" % ("; ".join(found[:3]), "; and %d more" % (len(found) - 3)
                                         if len(found) > 3 else "")
        return super().check() + ["%s is damaged: %s" % (self._dir.data, why) for why in found]

    def _file_state(self):
        """The last commit's id and the data file's size."""
        return self._env.info()["last_txnid"], os.path.getsize(self._dir.data)

    def _check_usable(self):
        super()._check_usable()
        if self._unreadable:
            raise DatabaseError("%s is damaged (%s): py-lmdb could crash reading it; open it "
                                "with the native backend to check and export what is readable, "
                                "or restore it from a backup" % (self._dir.data, self._unreadable))

    _unreadable = None  # what check() found damaged in the data file

    def _walked(self, txn, names, walked):
        """Refuse a copy whose walk of sub-databases ``names`` met fewer
        entries than LMDB counts in them: a damaged branch page can end a walk
        early, and a copy must not drop what it did not reach."""
        if walked != sum(txn.stat(self._dbs[name])["entries"] for name in names):
            raise _damaged(self.path, "part of %s" % b", ".join(names).decode())

    def _copy_to(self, copy, layout, params):
        """Write the database, compacted, into the new file ``copy``: every
        sub-database appended in order, the tables rebuilt from the index as
        one run each in ``layout`` (no stale entries; meta brings the distinct
        count), the bands from the documents, the parameters ``params`` (None:
        as they are)."""
        grows = -(-layout.tables // self._layout.tables)  # (more tables: room for them)
        target = lmdb.open(os.fsencode(copy), map_size=grows * self._map_size_to_open(),
                           max_dbs=max_dbs(max(self._room_for_tables(), layout.tables)),
                           subdir=False, lock=False)
        try:
            with self._env.begin() as source, target.begin(write=True) as written:
                for name in (META, DOCS):
                    db = self._open_db(name, env=target, txn=written)
                    self._walked(source, [name], _fill(
                        written.cursor(db), source.cursor(self._dbs[name]).iternext(), False))
                for name in map(index_name, range(INDEX_SLOTS)):  # the index as one run
                    db = self._open_db(name, dupsort=True, env=target, txn=written)
                    if name == FINGERPRINTS:
                        self._walked(source, self._index, _fill(
                            written.cursor(db), _index_items(source, self), True))
                fps = _distinct(_index_items(source, self))
                sets = [layout.table_values(fps, table) for table in range(layout.tables)]
                if self._band_runs:  # the bands from the documents
                    held = [set() for _ in range(BANDS)]
                    for _, value in source.cursor(self._dbs[DOCS]).iternext():
                        for entries, entry in zip(held, band_entries(value,
                                                                     value_fingerprint(value))):
                            entries.add(entry)
                    sets += [array("Q", sorted(entries)) for entries in held]
                directory = self._open_db(RUNS, env=target, txn=written)
                run = new_run_id(_counter(source.get(RUN_IDS, db=self._dbs[META]), self.path, RUN_IDS))
                for table, values in enumerate(sets):
                    slots = [self._open_db(self._set_slot(table, slot, layout.tables),
                                           env=target, txn=written) for slot in range(RUN_SLOTS)]
                    if values:
                        _write_run(written, slots[0], run, values)
                    written.put(self._set_key(table, layout.tables), directory_record(
                        [(run, 0, len(values))] if values else []), db=directory)
                meta = self._open_db(META, env=target, txn=written)
                for counter in (STALE, REMOVED, BAND_STALE):
                    written.put(counter, _count_bytes(0), db=meta)
                written.delete(REWRITE, db=meta)
                written.delete(BAND_REWRITE, db=meta)
                if params is not None:
                    written.put(PARAMS, params, db=meta)
        finally:
            target.close()


class PyView(View):
    """Reads over one py-lmdb transaction."""

    def __init__(self, storage, txn):
        self._storage, self._txn = storage, txn
        self._cursors = {}
        self._slots = None  # cursors on the index's slots in use (_index_cursors)

    def _cursor(self, name):
        cursor = self._cursors.get(name)
        if cursor is None:
            cursor = self._cursors[name] = self._txn.cursor(self._storage._dbs[name])
        return cursor

    def params(self):
        return self._cursor(META).get(PARAMS)

    def count(self):
        return self._txn.stat(self._storage._dbs[DOCS])["entries"]

    def distinct(self):
        if self._storage._runs:
            return self._count(DISTINCT)
        return self._txn.stat(self._storage._dbs[table_name(0)])["entries"]

    def _count(self, name):
        return _counter(self._cursor(META).get(name), self._storage.path, name)

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
        fp_bytes = _ext.pack_key(fingerprint)
        return sorted(key for cursor in self._index_cursors() if cursor.set_key(fp_bytes)
                      for key in cursor.iternext_dup())

    def _has(self, fp):
        """Whether a slot of the index has ``fp``."""
        fp_bytes = _ext.pack_key(fp)
        for cursor in self._index_cursors():
            if cursor.set_key(fp_bytes):
                return True
        return False

    def _index_cursors(self):
        """Cursors on the index's slots in use, and on ``fingerprints``, which
        takes this backend's puts (the others only lose entries here)."""
        if self._slots is None:
            dbs = self._storage._dbs
            self._slots = [self._cursor(name) for name in self._storage._index
                           if name == FINGERPRINTS or self._txn.stat(dbs[name])["entries"]]
        return self._slots

    def fingerprint_groups(self):
        items = _index_items(self._txn, self._storage)
        for fp_bytes, entries in itertools.groupby(items, key=lambda item: item[0]):
            yield _ext.unpack_key(fp_bytes), [key for _, key in entries]

    def search(self, probes, distance):
        """Each probe's hits; a fingerprint in two runs is found once (by
        fingerprint), a stale one not at all (keys_of gives it no key)."""
        layout = self._storage._layout
        if self._storage._runs:
            directories = [self._whole_directory(t) for t in range(layout.tables)]

            def scan(table, first, last, perm):
                entries = array("Q")
                for run, slot, _ in directories[table]:
                    entries.extend(self._run_range(table, run, slot, first, last))
                return _ext.verify(perm, _big_endian(entries), distance) if entries else ()
        else:
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
        storage = self._storage
        bands = [(band, self._whole_directory(storage._layout.tables + band))
                 for band in range(BANDS)] if storage._band_runs else []
        results = []
        for query in range(len(keys) // BANDS):
            prefixes = set()
            for band in range(BANDS if storage._old_bands else 0):  # 0.5's form
                first = keys[query * BANDS + band] << 32
                entries = _scan(self._cursor(OLD_BANDS[band]), _ext.pack_key(first),
                                _ext.pack_key(first | 0xFFFFFFFF))
                prefixes.update(entries[i + 4:i + 8] for i in range(0, len(entries), 8))
            for band, runs in bands:
                first = keys[query * BANDS + band] << 32
                for run, slot, _ in runs:
                    prefixes.update(_ext.pack_key(entry)[4:] for entry in self._run_range(
                        storage._layout.tables + band, run, slot, first, first | 0xFFFFFFFF))
            results.append([found for prefix in sorted(prefixes)
                            for found in self._with_prefix(prefix)])
        return results

    def _with_prefix(self, prefix):
        """(key, fingerprint) of the documents whose fingerprint starts with
        the 4 bytes ``prefix``."""
        found = []
        for fp_bytes, key in _index_items(self._txn, self._storage, prefix + bytes(4)):
            if fp_bytes[:4] != prefix:
                break
            found.append((key, _ext.unpack_key(fp_bytes)))
        return found

    def band_entries(self, band):
        storage = self._storage
        if storage._old_bands:
            cursor = self._txn.cursor(storage._dbs[OLD_BANDS[band]])
            return [_ext.unpack_key(k + v) for k, v in cursor.iternext()] if cursor.first() else []
        if not storage._band_runs:
            return []
        held = array("Q")  # the union of the runs less the stale entries
        for run, slot, _ in self._directory(storage._layout.tables + band):
            held = _ext.merge_unique(held, self._run_range(storage._layout.tables + band, run,
                                                           slot, 0, MAX_VALUE))
        return [entry for entry in held if self._held(band, entry)]

    def _held(self, band, entry):
        """Whether a stored document (as the index is now) has band entry ``entry``."""
        for key, fp in self._with_prefix(_ext.pack_key(entry)[4:]):
            entries = band_entries(self._cursor(DOCS).get(key), fp)
            if entries and entries[band] == entry:
                return True
        return False

    def table_fingerprints(self, table):
        layout = self._storage._layout
        if self._storage._runs:  # the union of the runs less the stale entries
            values = array("Q")
            for run, slot, _ in self._directory(table):
                values = _ext.merge_unique(values, self._run_range(table, run, slot, 0, MAX_VALUE))
            fps = (layout.unpermute(value, table) for value in values)
            return [fp for fp in fps if self._has(fp)]
        cursor = self._txn.cursor(self._storage._dbs[table_name(table)])
        return [layout.unpermute(_ext.unpack_key(k + v), table) for k, v in cursor.iternext()] \
            if cursor.first() else []

    def _directory(self, table):
        """Run set ``table``'s live runs, oldest first: [(run id, slot, entries)]."""
        raw = self._txn.get(self._storage._set_key(table), db=self._storage._dbs[RUNS])
        if raw is None:
            return []
        runs = directory_runs(raw)
        if runs is None:
            raise _damaged(self._storage.path, "the directory of %s's runs"
                           % self._storage._set_named(table))
        return runs

    def _whole_directory(self, table):
        """The directory of ``table``'s runs, each run refused if its blocks
        hold other than its entries (a block lost from it, or miscounted): a
        search must not answer without them. A run found whole is not read
        again (run ids are never given twice in a table)."""
        runs = self._directory(table)
        for run, slot, entries in runs:
            if (table, run, entries) not in self._storage._whole_runs:
                self._check_run(table, run, slot, entries)
        return runs

    def _check_run(self, table, run, slot, entries):
        """Count the entries of run ``run``'s blocks against ``entries``."""
        cursor = self._cursor(self._storage._set_slot(table, slot))
        prefix = block_key(run, 0)[:4]
        counted, at = 0, cursor.set_range(prefix)
        while at and cursor.key()[:4] == prefix:
            counted += block_entries(cursor.value())
            at = cursor.next()
        if counted != entries:
            raise _run_damaged(self._storage.path, self._storage._set_named(table),
                               "its run's blocks hold %d entries, not the %d it was written with"
                               % (counted, entries))
        self._storage._whole_runs.add((table, run, entries))

    def _run_range(self, table, run, slot, lo, hi):
        """The values of run ``run`` (in ``slot`` of run set ``table``) in [lo,
        hi], ascending: from the block that holds ``lo`` on."""
        cursor = self._cursor(self._storage._set_slot(table, slot))
        key = block_key(run, lo)
        prefix = key[:4]  # the run id
        at = cursor.set_range(key)
        if not at or cursor.key() != key:  # the block before may hold lo
            at = cursor.prev() if at else cursor.last()
            if not at or cursor.key()[:4] != prefix:  # lo comes before the run
                at = cursor.set_range(key)
        values = array("Q")
        while at and cursor.key()[:4] == prefix:
            block = _block(self._storage, table, cursor.key(), cursor.value())
            if block[0] > hi:
                break
            values.extend(block[bisect_left(block, lo):bisect_right(block, hi)])
            at = block[-1] < hi and cursor.next()
        return values


class PyTxn(PyView, Txn):
    """Reads and writes over the py-lmdb write transaction."""

    untidy = False  # a batch left merges or a rewrite of the tables for tidy()
    changed = False  # a batch call has changed its documents or index

    def set_params(self, raw):
        self._cursor(META).put(PARAMS, raw)

    def upsert(self, documents):
        self.changed = True
        latest = {key: (fp, value) for key, fp, value in documents}
        touched, bands = {}, {}
        docs, index = self._cursor(DOCS), self._cursor(FINGERPRINTS)  # new entries: slot 0
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

    def insert_if_new(self, documents, distance):
        """As :meth:`Txn.insert_if_new`, with one upsert for the call: the
        documents it stores are kept aside (their keys' stored versions left
        out of the hits) and written together at its end, as the native
        backend does (an upsert a document added runs and merges each time)."""
        stored = self.search(array("Q", [fp for _, fp, _ in documents]), distance)
        kept, keys_of, near, found = {}, collections.defaultdict(set), NearIndex(
            self._storage._layout), []
        for (key, fp, value), hits in zip(documents, stored):
            hits = [hit for hit in hits if hit[0] not in kept] + [
                (other, theirs, bits) for theirs, bits in near.search(fp, distance)
                for other in keys_of[theirs]]
            if not hits:
                if key in kept:
                    keys_of[kept[key][0]].discard(key)
                kept[key] = (fp, value)
                keys_of[fp].add(key)
                near.add(fp)
            found.append(hits)
        if kept:
            self.upsert([(key, fp, value) for key, (fp, value) in kept.items()])
        return found

    def remove(self, keys):
        """Remove in place, or, as the native backend does, by writing the
        documents and the index whole without them where the batch takes the
        documents removed since they were last written whole past 1/RUN_RATIO
        of them and the transaction changed nothing before."""
        touched, bands, gone = {}, {}, []
        docs = self._cursor(DOCS)
        keys = sorted(set(keys))
        last, removed = None, self._count(REMOVED)
        if (not self.changed and (removed + len(keys)) * RUN_RATIO > self.count()
                and (removed + sum(docs.set_key(k) for k in keys)) * RUN_RATIO > self.count()):
            last = self._snapshot()
        self.changed = True
        with last or contextlib.nullcontext():
            for key in keys:
                old = docs.get(key)
                if old is not None:
                    fp = value_fingerprint(old)
                    _note_bands(bands, old, fp, False)
                    gone.append((key, fp))
                    if last is None:
                        docs.delete()
                        self._unlink(fp, key, touched)
                    else:
                        self._touch(fp, touched)
            if last is not None:
                self._write_whole(last, gone)
            elif gone:
                self._set_count(REMOVED, self._count(REMOVED) + len(gone))
        self._update_tables(touched)
        self._update_bands(bands)
        return len(gone)

    def _append(self, last, name, keep, dupsort):
        """Empty sub-database ``name`` and put into it, in order, its entries
        in snapshot ``last`` that ``keep(key, value)``."""
        db = self._storage._dbs[name]
        self._txn.drop(db, delete=False)
        walked = itertools.count()
        kept = ((k, v) for (k, v), _ in zip(last.cursor(db).iternext(), walked) if keep(k, v))
        _fill(self._txn.cursor(db), kept, dupsort)
        self._storage._walked(last, [name], next(walked))

    def _snapshot(self):
        """A read transaction of the last commit, where it holds what this one
        does (always, under the write lock), else None (also where no reader
        slot is free: removals then stay in place)."""
        try:
            last = self._storage._env.begin()
        except lmdb.ReadersFullError:
            return None
        if last.id() + 1 == self._txn.id():
            return last
        last.abort()
        return None

    def _write_whole(self, last, gone=()):
        """Write the documents and the index's slots again without the
        documents ``gone`` [(key, fingerprint)], each emptied and appended in
        order from snapshot ``last``."""
        dbs, keys = self._storage._dbs, {key for key, _ in gone}
        entries = {(_ext.pack_key(fp), key) for key, fp in gone}
        self._append(last, DOCS, lambda k, v: k not in keys, False)
        for name in self._storage._index:
            if last.stat(dbs[name])["entries"]:
                self._append(last, name, lambda k, v: (k, v) not in entries, True)
        self._cursors, self._slots = {}, None  # on emptied sub-databases
        self._set_count(REMOVED, 0)

    def _update_bands(self, bands):
        """Append to each band as a run the entries the batch brought that no
        document it took away had ({(band, entry): BROUGHT | TAKEN}), and count
        as stale those it took away that none it brought has, as the native
        backend does."""
        if not self._storage._band_runs:
            return
        brought = collections.defaultdict(list)
        stale = 0
        for (band, entry), how in sorted(bands.items()):
            if how == BROUGHT:
                brought[band].append(entry)
            stale += how == TAKEN
        tables = self._storage._layout.tables
        for band, entries in brought.items():
            self._add_run(tables + band, array("Q", entries))
        if stale:
            self._set_count(BAND_STALE, self._count(BAND_STALE) + stale)
        self.untidy = self.untidy or self._band_rewrite_due()

    def _band_rewrite_due(self):
        """Whether a rewrite of the bands is under way, or due: the stale
        entries could exceed 1/RUN_RATIO of the entries of the bands' runs."""
        if self._cursor(META).get(BAND_REWRITE) is not None:
            return True
        tables = self._storage._layout.tables
        entries = sum(run[2] for band in range(BANDS) for run in self._directory(tables + band))
        return self._count(BAND_STALE) * RUN_RATIO > entries

    def _touch(self, fp, touched):
        """Note ``fp`` as changed, first with whether the index had it before."""
        if fp not in touched:
            touched[fp] = self._has(fp)

    def _unlink(self, fp, key, touched):
        self._touch(fp, touched)
        fp_bytes = _ext.pack_key(fp)
        for cursor in self._index_cursors():  # the slot that holds the entry
            if cursor.set_key_dup(fp_bytes, key):
                cursor.delete()
                break

    def _update_tables(self, touched):
        """Append to every table as a run the fingerprints the index gained; count
        those it lost as stale (their entries stay in the runs until a rewrite)."""
        if not touched:  # as native: a batch that changed no fingerprint checks nothing
            return
        added, removed = [], []
        for fp, had in touched.items():
            now = self._has(fp)
            if now and not had:
                added.append(fp)
            elif had and not now:
                removed.append(fp)
        layout = self._storage._layout
        for table in range(layout.tables if added else 0):
            self._add_run(table, layout.table_values(added, table))
        distinct = self._count(DISTINCT) + len(added) - len(removed)
        stale = self._count(STALE) + len(removed)
        if len(added) != len(removed):
            self._set_count(DISTINCT, distinct)
        if removed:
            self._set_count(STALE, stale)
        self.untidy = (self.untidy or stale * RUN_RATIO > distinct or self._sparse()
                       or self._cursor(META).get(REWRITE) is not None)

    def _sparse(self):
        """Whether the documents removed since they were last written whole
        are over 1/RUN_RATIO of the documents (see tidy)."""
        return self._count(REMOVED) * RUN_RATIO > self.count()

    def _set_count(self, name, value):
        if value < 0:  # counted down past what was counted up: the file was damaged
            raise _damaged(self._storage.path, "meta's %r" % name.decode())
        self._cursor(META).put(name, _count_bytes(value))

    def _add_run(self, table, values, tidying=False):
        """Append sorted ``values`` (if any) to table ``table`` as a new run, then
        merge the two newest runs while the newest is over 1/RUN_RATIO of the one
        before and they hold at most the storage's ``batch_merge`` entries (or
        the slots run short; ``tidying``: while any merge is left), as the
        native backend does; returns the entries merged."""
        runs = self._directory(table)
        limit = None if tidying or not self._storage.batch_merge else self._storage.batch_merge
        if values is not None:
            self._put_run(table, runs, values)
        merged = 0
        while _merge_due(runs, limit):
            older, newer = runs[-2:]
            merged += older[2] + newer[2]
            values = _ext.merge_unique(*(self._run_range(table, run, slot, 0, MAX_VALUE)
                                         for run, slot, _ in (older, newer)))
            self._put_run(table, runs, values)
            for _, slot, _ in (older, newer):
                self._txn.drop(self._storage._dbs[self._storage._set_slot(table, slot)],
                               delete=False)
            del runs[-3:-1]
        self.untidy = self.untidy or _merges_left(runs)
        self._save_directory(table, runs)
        return merged

    def _put_run(self, table, runs, values):
        """Write ``values`` as a new run of ``table`` (the next id, the first
        free slot) and note it at the end of ``runs``."""
        free = set(range(RUN_SLOTS)) - {s for _, s, _ in runs}
        if not free:  # a directory of more runs than merges leave
            raise _damaged(self._storage.path, "the directory of %s's runs"
                           % self._storage._set_named(table))
        slot = min(free)
        # never an id given before in the table (the native backend caches
        # block directories by run id): above the live runs' and the dropped
        run = new_run_id(runs[-1][0] if runs else self._count(RUN_IDS))
        _write_run(self._txn, self._storage._dbs[self._storage._set_slot(table, slot)], run,
                   values)
        runs.append((run, slot, len(values)))

    def _save_directory(self, table, runs):
        self._txn.put(self._storage._set_key(table), directory_record(runs),
                      db=self._storage._dbs[RUNS])

    def tidy(self):
        """One transaction's share of what batches left, as the native backend
        does: the next table of a rewrite of the tables (begun once the stale
        entries may exceed 1/RUN_RATIO of the distinct fingerprints), else the
        next bands of a rewrite of the bands (begun once their stale entries
        may exceed 1/RUN_RATIO of their entries), else the deferred merges
        until they have taken about a table's entries; first, where removals
        left the documents sparse, the documents and the index written whole.
        Returns whether there is more."""
        last = self._snapshot() if not self.changed and self._sparse() else None
        self.changed = True
        if last is not None:
            with last:
                self._write_whole(last)
            return True
        meta = self._cursor(META)
        marker = meta.get(REWRITE)
        stale, distinct = self._count(STALE), self._count(DISTINCT)
        if marker is not None:
            table, began = self._marker(REWRITE, marker, self._storage._layout.tables)
        elif stale * RUN_RATIO > distinct:
            table, began = 0, stale
        elif self._storage._band_runs and self._band_rewrite_due():
            self._tidy_bands()
            return True
        else:
            merged, budget = 0, max(distinct, self._storage.batch_merge)
            for table in self._storage._run_sets():
                if _merges_left(self._directory(table)):
                    if merged >= budget:
                        return True
                    merged += self._add_run(table, None, tidying=True)
            return False
        fps = _distinct(_index_items(self._txn, self._storage))
        self._rewrite_run_set(table, self._storage._layout.table_values(fps, table))
        if table + 1 == self._storage._layout.tables:  # removals since it began stay counted
            self._txn.delete(REWRITE, db=self._storage._dbs[META])
            self._set_count(STALE, max(stale - began, 0))
        else:
            meta.put(REWRITE, (table + 1).to_bytes(8, "big") + began.to_bytes(8, "big"))
        return True

    def _marker(self, name, marker, end):
        """(the next table or band, the stale count it began with) of a rewrite's marker."""
        number = int.from_bytes(marker[:8], "big")
        if len(marker) != 16 or number >= end:
            raise _damaged(self._storage.path, "meta's %r" % name.decode())
        return number, int.from_bytes(marker[8:], "big")

    def _tidy_bands(self):
        """The next BAND_GROUP bands of a rewrite of the bands (under way or due)."""
        stale, marker = self._count(BAND_STALE), self._cursor(META).get(BAND_REWRITE)
        first, began = self._marker(BAND_REWRITE, marker, BANDS) if marker else (0, stale)
        self._rewrite_bands(first, min(first + BAND_GROUP, BANDS))
        if first + BAND_GROUP >= BANDS:  # removals since it began stay counted
            self._txn.delete(BAND_REWRITE, db=self._storage._dbs[META])
            self._set_count(BAND_STALE, max(stale - began, 0))
        else:
            self._cursor(META).put(BAND_REWRITE, (first + BAND_GROUP).to_bytes(8, "big")
                                   + began.to_bytes(8, "big"))

    def _rewrite_bands(self, first, end):
        """Write bands ``first`` to ``end`` again from the documents' signatures,
        each as one run (its stale entries gone): one pass over the documents."""
        entries = [set() for _ in range(first, end)]
        for _, value in self.documents():
            for held, entry in zip(entries, band_entries(value, value_fingerprint(value))[first:end]):
                held.add(entry)
        for band, held in zip(range(first, end), entries):
            self._rewrite_run_set(self._storage._layout.tables + band, array("Q", sorted(held)))

    def _rewrite_run_set(self, table, values):
        """Write run set ``table`` as one run of the sorted ``values`` (slot 0,
        an id above the dropped runs'), as the native backend does."""
        directory = self._directory(table)
        if directory and directory[-1][0] > self._count(RUN_IDS):
            self._set_count(RUN_IDS, directory[-1][0])
        for _, slot, _ in directory:
            self._txn.drop(self._storage._dbs[self._storage._set_slot(table, slot)], delete=False)
        runs = []
        if values:
            self._put_run(table, runs, values)
        self._save_directory(table, runs)

    def convert_table(self, table):
        """Rewrite table ``table`` from 0.3's form (a dupsort ``table:NNN``,
        then dropped) as its one run (slot 0), as the native backend
        does; table 0 sets meta's counters (distinct: its entries, stale: 0).
        Returns whether it was in that form (else nothing is done)."""
        values = self._convert(table_name(table), [slot_name(table, s) for s in range(RUN_SLOTS)],
                               directory_key(table), "table %d" % table)
        if values is not None and table == 0:
            self._set_count(DISTINCT, len(values))
            self._set_count(STALE, 0)
        return values is not None

    def convert_band(self, band):
        """Rewrite band ``band`` from 0.5's form (a dupsort ``band:NN``, then
        dropped) as its one run (slot 0), as the native backend does;
        band 0 sets meta's ``band stale`` to 0. Returns whether it was in that
        form (else nothing is done)."""
        values = self._convert(OLD_BANDS[band], format.BAND_RUNS.names(band),
                               band_directory_key(band), "band %d" % band)
        if values is not None and band == 0:
            self._set_count(BAND_STALE, 0)
        return values is not None

    def _convert(self, name, slot_names, key, what):
        """Write the dupsort sub-database ``name`` (in order) as its first run in the
        first of ``slot_names`` under directory ``key``, then drop it; its
        values, or None where there is no such sub-database."""
        env, txn = self._storage._env, self._txn
        try:
            old = env.open_db(name, txn=txn, dupsort=True, dupfixed=True, create=False)
        except lmdb.NotFoundError:
            return None
        directory = env.open_db(RUNS, txn=txn)
        slots = [env.open_db(slot, txn=txn) for slot in slot_names]
        txn.drop(slots[0], delete=False)
        values = array("Q", _old_entries(txn.cursor(old), self._storage.path, what))
        run = new_run_id(0)
        if values:
            _write_run(txn, slots[0], run, values)
        txn.put(key, directory_record([(run, 0, len(values))] if values else []), db=directory)
        txn.drop(old, delete=True)
        return values


def _merge_due(runs, limit):
    """Whether to merge the two newest runs now: within ``limit`` entries, the
    newest is over 1/RUN_RATIO of the one before (or the slots run short); with
    no limit, while any merges are left."""
    if len(runs) < 2 or limit is None:
        return _merges_left(runs)
    return len(runs) >= RUN_SLOTS - 1 or (runs[-1][2] * RUN_RATIO > runs[-2][2]
                                           and runs[-1][2] + runs[-2][2] <= limit)


def _merges_left(runs):
    """Whether a run is over 1/RUN_RATIO of the one before it, or the slots run
    short: merges a batch left for tidy."""
    return len(runs) >= RUN_SLOTS - 1 or any(
        newer[2] * RUN_RATIO > older[2] for older, newer in zip(runs, runs[1:]))


BROUGHT, TAKEN = 1, 2  # what a batch did with a band entry (_note_bands)


def _note_bands(bands, value, fingerprint, added):
    """Note the band entries of a document value as brought (``added``) or
    taken away: {(band, entry): BROUGHT, TAKEN or both}."""
    for band, entry in enumerate(band_entries(value, fingerprint)):
        bands[band, entry] = bands.get((band, entry), 0) | (BROUGHT if added else TAKEN)


def _index_items(txn, storage, start=None):
    """(fingerprint bytes, key) of every entry of the index's slots from
    ``start`` (8 bytes) on, in order: the union of the slots."""
    slots = []
    for name in storage._index:
        cursor = txn.cursor(storage._dbs[name])
        if cursor.set_range(start) if start is not None else cursor.first():
            slots.append(cursor.iternext())
    return heapq.merge(*slots)


def _distinct(items):
    """The distinct fingerprints of sorted index ``items``."""
    return [_ext.unpack_key(fp_bytes) for fp_bytes, _ in itertools.groupby(items,
                                                                          key=lambda i: i[0])]


def _fill(cursor, items, dupsort):
    """Put sorted ``items`` into an empty sub-database, every one of them;
    returns how many. Appends only where there are no duplicates: py-lmdb
    before 3.0 appends duplicates with MDB_APPEND, which refuses each value
    after a key's first and putmulti counts it as not added instead of
    failing."""
    consumed, added = cursor.putmulti(items, dupdata=dupsort, append=not dupsort)
    if added != consumed:
        raise DatabaseError("a copy wrote %d of %d entries; the database is unchanged"
                            % (added, consumed))
    return consumed


def _old_entries(cursor, path, what):
    """The values of a table in 0.3's form or a band in 0.5's, in order: each
    a 2-byte key and a 6-byte duplicate."""
    for key, value in cursor.iternext():
        if len(key) + len(value) != 8:
            raise _damaged(path, what)
        yield int.from_bytes(key + value, "big")


def _counter(raw, path, name):
    """A counter in meta, read (u64 big-endian; 0 where absent)."""
    if raw is not None and len(raw) != 8:
        raise _damaged(path, "meta's %r" % name.decode())
    return int.from_bytes(raw, "big") if raw else 0


def _count_bytes(value):
    return value.to_bytes(8, "big")


def _write_run(txn, db, run, values):
    """Write ascending ``values`` into the empty slot ``db`` as run ``run``: a
    block an item, keyed by the run id and the block's first value."""
    try:
        blocks = _ext.encode_run(values)
    except ValueError:
        raise DatabaseError("a run's values out of order: the database is damaged; "
                            "restore it from a backup") from None
    items = [(block_key(run, first), block) for first, block in blocks]
    if txn.cursor(db).putmulti(items, append=True)[1] != len(items):
        raise DatabaseError("a slot for a new run was not empty: the database is damaged; "
                            "restore it from a backup")


def _block(storage, table, key, value):
    """The values of the block item (``key``, ``value``) of a run of run set ``table``."""
    try:
        if len(key) != RUN_KEY_BYTES:
            raise ValueError
        return _ext.decode_block(int.from_bytes(key[4:], "big"), value,
                                 checksummed(int.from_bytes(key[:4], "big")))
    except ValueError as exc:
        raise _run_damaged(storage.path, storage._set_named(table), str(exc)) from None


def _run_damaged(path, named, why):
    """The error for a block of a run of ``named`` (a table or band) that is
    damaged, ``why``: compact() writes every run again."""
    return DatabaseError("%s is damaged: a block of %s is unreadable (%s); db.check() lists "
                         "the damage, and compact() writes the tables again from the "
                         "fingerprint index and the bands from the documents" % (path, named, why))


def _damaged(path, what):
    return DatabaseError("%s is damaged (%s is unreadable): restore it from a backup"
                         % (path, what))


def _big_endian(values):
    """A uint64 array as concatenated 8-byte big-endian values."""
    if sys.byteorder == "little":
        values.byteswap()
    return values.tobytes()


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
