"""The portable LMDB backend, on py-lmdb: the same files as the native
backend, used where that one was not built (or with ``backend="py-lmdb"``).

A new database keeps its tables as compressed sorted runs (RUNS.md), blocks
coded by ``_ext`` exactly as the native backend codes them; a database whose
tables are in simhashdb 0.3's form (dupsort ``table:NNN``) opens read-only.
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
    block_key,
    directory_key,
    directory_record,
    directory_runs,
    max_dbs,
)

META, DOCS, RUNS = format.META.name(), format.DOCS.name(), format.RUN_DIRECTORY.name()
FINGERPRINTS = format.INDEX.name(0)  # the index's first slot, where new entries go
BAND_TABLES = format.BAND.names()
table_name, index_name, slot_name = format.OLD_TABLE.name, format.INDEX.name, format.TABLE_RUNS.name
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
            try:
                for name in BAND_TABLES:
                    self._dbs[name] = self._open_db(name, dupsort=True, dupfixed=True, txn=txn)
            except DatabaseError:
                if not self.readonly:
                    raise
                for name in BAND_TABLES:  # made before bands were, opened read-only
                    self._dbs.pop(name, None)
        if self._layout is not None:
            self.open_tables(self._layout)

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

    def _copy_to(self, copy):
        """Write the database, compacted, into the new file ``copy``: every
        sub-database appended in order, the tables rebuilt from the index as
        one run each (no stale entries; meta brings the distinct count)."""
        target = lmdb.open(os.fsencode(copy), map_size=self._map_size_to_open(),
                           max_dbs=max_dbs(self._room_for_tables()),
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
                for name in BAND_TABLES if name in self._dbs else ():
                    db = self._open_db(name, dupsort=True, dupfixed=True, env=target, txn=written)
                    self._walked(source, [name], _fill(
                        written.cursor(db), source.cursor(self._dbs[name]).iternext(), True))
                fps = _distinct(_index_items(source, self))
                directory = self._open_db(RUNS, env=target, txn=written)
                run = _counter(source.get(RUN_IDS, db=self._dbs[META]), self.path, RUN_IDS) + 1
                for table in range(self._layout.tables):
                    slots = [self._open_db(slot_name(table, slot), env=target, txn=written)
                             for slot in range(RUN_SLOTS)]
                    if fps:
                        _write_run(written, slots[0], run, self._layout.table_values(fps, table))
                    written.put(directory_key(table), directory_record([(run, 0, len(fps))] if fps
                                                                     else []), db=directory)
                meta = self._open_db(META, env=target, txn=written)
                written.put(STALE, _count_bytes(0), db=meta)
                written.put(REMOVED, _count_bytes(0), db=meta)
                written.delete(REWRITE, db=meta)
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
        found = []
        for fp_bytes, key in _index_items(self._txn, self._storage, prefix + bytes(4)):
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
        """Table ``table``'s live runs, oldest first: [(run id, slot, entries)]."""
        raw = self._txn.get(directory_key(table), db=self._storage._dbs[RUNS])
        if raw is None:
            return []
        runs = directory_runs(raw)
        if runs is None:
            raise _damaged(self._storage.path, "the directory of table %d's runs" % table)
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
        cursor = self._cursor(slot_name(table, slot))
        prefix = block_key(run, 0)[:4]
        counted, at = 0, cursor.set_range(prefix)
        while at and cursor.key()[:4] == prefix:
            counted += block_entries(cursor.value())
            at = cursor.next()
        if counted != entries:
            raise DatabaseError("%s is damaged: a block of table %d is unreadable (its run's "
                                "blocks hold %d entries, not the %d it was written with); "
                                "db.check() lists the damage, and compact() writes the tables "
                                "again from the fingerprint index"
                                % (self._storage.path, table, counted, entries))
        self._storage._whole_runs.add((table, run, entries))

    def _run_range(self, table, run, slot, lo, hi):
        """The values of run ``run`` (in ``slot`` of ``table``) in [lo, hi],
        ascending: from the block that holds ``lo`` on."""
        cursor = self._cursor(slot_name(table, slot))
        key = block_key(run, lo)
        prefix = key[:4]  # the run id
        at = cursor.set_range(key)
        if not at or cursor.key() != key:  # the block before may hold lo
            at = cursor.prev() if at else cursor.last()
            if not at or cursor.key()[:4] != prefix:  # lo comes before the run
                at = cursor.set_range(key)
        values = array("Q")
        while at and cursor.key()[:4] == prefix:
            block = _block(self._storage.path, table, cursor.key(), cursor.value())
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
        documents ``gone`` [(key, fingerprint)], and the band tables whole,
        each emptied and appended in order from snapshot ``last``."""
        dbs, keys = self._storage._dbs, {key for key, _ in gone}
        entries = {(_ext.pack_key(fp), key) for key, fp in gone}
        self._append(last, DOCS, lambda k, v: k not in keys, False)
        for name in self._storage._index:
            if last.stat(dbs[name])["entries"]:
                self._append(last, name, lambda k, v: (k, v) not in entries, True)
        for name in BAND_TABLES if BAND_TABLES[0] in dbs else ():
            self._append(last, name, lambda k, v: True, True)
        self._cursors, self._slots = {}, None  # on emptied sub-databases
        self._set_count(REMOVED, 0)

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
                self._txn.drop(self._storage._dbs[slot_name(table, slot)], delete=False)
            del runs[-3:-1]
        self.untidy = self.untidy or _merges_left(runs)
        self._save_directory(table, runs)
        return merged

    def _put_run(self, table, runs, values):
        """Write ``values`` as a new run of ``table`` (the next id, the first
        free slot) and note it at the end of ``runs``."""
        free = set(range(RUN_SLOTS)) - {s for _, s, _ in runs}
        if not free:  # a directory of more runs than merges leave
            raise _damaged(self._storage.path, "the directory of table %d's runs" % table)
        slot = min(free)
        # never an id given before in the table (the native backend caches
        # block directories by run id): above the live runs' and the dropped
        run = runs[-1][0] + 1 if runs else self._count(RUN_IDS) + 1
        _write_run(self._txn, self._storage._dbs[slot_name(table, slot)], run, values)
        runs.append((run, slot, len(values)))

    def _save_directory(self, table, runs):
        self._txn.put(directory_key(table), directory_record(runs), db=self._storage._dbs[RUNS])

    def tidy(self):
        """One transaction's share of what batches left, as the native backend
        does: the next table of a rewrite of the tables (begun once the stale
        entries may exceed 1/RUN_RATIO of the distinct fingerprints), else the
        deferred merges until they have taken about a table's entries; first,
        where removals left the documents sparse, the documents, the index and
        the band tables written whole. Returns whether there is more."""
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
            if len(marker) != 16:
                raise _damaged(self._storage.path, "meta's 'rewrite'")
            table, began = int.from_bytes(marker[:8], "big"), int.from_bytes(marker[8:], "big")
            if table >= self._storage._layout.tables:
                raise _damaged(self._storage.path, "meta's 'rewrite'")
        elif stale * RUN_RATIO > distinct:
            table, began = 0, stale
        else:
            merged, budget = 0, max(distinct, self._storage.batch_merge)
            for table in range(self._storage._layout.tables):
                if _merges_left(self._directory(table)):
                    if merged >= budget:
                        return True
                    merged += self._add_run(table, None, tidying=True)
            return False
        self._rewrite_table(table)
        if table + 1 == self._storage._layout.tables:  # removals since it began stay counted
            self._txn.delete(REWRITE, db=self._storage._dbs[META])
            self._set_count(STALE, max(stale - began, 0))
        else:
            meta.put(REWRITE, (table + 1).to_bytes(8, "big") + began.to_bytes(8, "big"))
        return True

    def _rewrite_table(self, table):
        """Rewrite ``table`` from the index as its one run (slot 0, an id above
        the dropped runs'), its stale entries gone, as the native backend does."""
        fps = _distinct(_index_items(self._txn, self._storage))
        directory = self._directory(table)
        if directory and directory[-1][0] > self._count(RUN_IDS):
            self._set_count(RUN_IDS, directory[-1][0])
        for _, slot, _ in directory:
            self._txn.drop(self._storage._dbs[slot_name(table, slot)], delete=False)
        runs = []
        if fps:
            self._put_run(table, runs, self._storage._layout.table_values(fps, table))
        self._save_directory(table, runs)

    def convert_table(self, table):
        """Rewrite table ``table`` from 0.3's form (a dupsort ``table:NNN``,
        then dropped) as its one run (id 1, slot 0), as the native backend
        does; table 0 sets meta's counters (distinct: its entries, stale: 0).
        Returns whether it was in that form (else nothing is done)."""
        env, txn = self._storage._env, self._txn
        try:
            old = env.open_db(table_name(table), txn=txn, dupsort=True, dupfixed=True,
                              create=False)
        except lmdb.NotFoundError:
            return False
        directory = env.open_db(RUNS, txn=txn)
        slots = [env.open_db(slot_name(table, slot), txn=txn) for slot in range(RUN_SLOTS)]
        txn.drop(slots[0], delete=False)
        values = array("Q", _old_entries(txn.cursor(old), self._storage.path, table))
        runs = [(1, 0, len(values))] if values else []
        if values:
            _write_run(txn, slots[0], 1, values)
        txn.put(directory_key(table), directory_record(runs), db=directory)
        if table == 0:
            self._set_count(DISTINCT, len(values))
            self._set_count(STALE, 0)
        txn.drop(old, delete=True)
        return True


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


def _note_bands(bands, value, fingerprint, added):
    """Note the band entries of a document value as brought (``added``) or
    taken away: {(band, entry): whether a document brings it}."""
    for band, entry in enumerate(band_entries(value, fingerprint)):
        bands[band, entry] = bands.get((band, entry), False) or added


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


def _old_entries(cursor, path, table):
    """The permuted values of a table in 0.3's form, in order: each a 2-byte
    key and a 6-byte duplicate."""
    for key, value in cursor.iternext():
        if len(key) + len(value) != 8:
            raise _damaged(path, "table %d" % table)
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


def _block(path, table, key, value):
    """The values of the block item (``key``, ``value``) of a run of ``table``."""
    try:
        if len(key) != RUN_KEY_BYTES:
            raise ValueError
        return _ext.decode_block(int.from_bytes(key[4:], "big"), value)
    except ValueError:
        raise _damaged(path, "a block of table %d" % table) from None


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
