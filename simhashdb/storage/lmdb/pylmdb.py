"""The portable LMDB backend, on py-lmdb: the same files as the native
backend, used where that one was not built (or with ``backend="py-lmdb"``).

It keeps the tables and bands as compressed sorted runs (RUNS.md), blocks
coded by ``_ext`` exactly as the native backend codes them. A run set is a
table (numbered from 0) or a band (numbered after the tables). A small
write's new entries wait in ``recent`` until they are many, then go into
every run set at once (:mod:`.format`), as the native backend writes them.
The documents are records under their ids; the key map (by key hash) and the
fingerprint index are each the union of their slots, as native keeps them:
this backend puts new entries into the first slot and leaves merging the
slots to the native one (any slot may hold any entry). A database of format
7 and earlier (the key map by key, or the documents in ``docs``) opens its
meta and documents alone, for the copy that converts it
(:meth:`PyLmdbStorage._copy_to`); nothing else reads it.

Its reads are :class:`.pyview.PyView`, its writes :class:`.pytxn.PyTxn`,
over what :mod:`.pyruns` keeps of the runs' blocks and merges.
"""

import contextlib
import itertools
import os
from array import array

import lmdb

from ... import _ext
from ...errors import DatabaseError
from ...records import value_fingerprint
from .. import BANDS, band_entries
from .files import LmdbStorage
from . import format
from .format import (
    BAND_REWRITE,
    BAND_STALE,
    DISTINCT,
    NEXT_ID,
    PARAMS,
    RECENT,
    REMOVED,
    REWRITE,
    RUN_IDS,
    RUN_SLOTS,
    STALE,
    band_directory_key,
    directory_key,
    directory_record,
    max_dbs,
    new_run_id,
)
from .pyruns import (
    BAND_SLOTS,
    EMPTY_RECENT,
    META,
    OLD_DOCS,
    OLD_KEYS,
    RECENT_WRITES,
    RECORD_BLOCKS,
    RECORDS,
    RUNS,
    Slots,
    band_slot_name,
    count_bytes,
    damaged_error,
    distinct_fingerprints,
    fill_empty,
    id_bytes,
    index_items,
    read_counter,
    record_bytes,
    record_parts,
    slot_items,
    slot_name,
    write_run,
)
from .pyrecords import Records
from .pyview import CHUNK, PyView
from .pytxn import PyTxn

# what marks a file of an earlier format, and what its copy reads the documents from
OLD_SOURCES = ((OLD_DOCS, OLD_DOCS), (OLD_KEYS, RECORDS))
_INHERITED_ENVS = []  # a fork child's copies of its parent's environments, never closed


class PyLmdbStorage(LmdbStorage):
    """An LMDB environment in the directory ``path``, through py-lmdb.

    ``old_documents``: whether the file keeps its documents as format 7
    (the key map by key) or 6 and earlier (``docs``) did, which only the
    copy of compaction and relayout reads (converting them); its views refuse
    to read documents.
    """

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
        self._whole_runs = set()  # (table, run id, entries) of runs found whole (_check_run)
        self._recent_known = EMPTY_RECENT  # what a transaction last read of recent (pyruns.read_recent)
        # what a new database needs is made in one transaction (whose write lock
        # also orders two processes making it at once): a crash leaves all or none
        with self._making() as txn:
            new = txn is not None and txn.get(META) is None
            if new and txn.cursor().first():
                raise DatabaseError("%s holds an LMDB database that simhashdb did not make; "
                                    "use another directory" % self.path)
            self._dbs = {META: self._open_db(META, txn=txn)}
            self._open_documents(txn)
            self._index = Slots(format.INDEX)
            if not self.old_documents:  # (writable: the slots it lacks made, as natively)
                self._open_slots(self._index, create=True, txn=txn)
                for name in BAND_SLOTS:
                    self._dbs[name] = self._open_db(name, txn=txn)
                self._open_recent(txn)
        if self._layout is not None:
            self.open_tables(self._layout)

    def _open_documents(self, txn):
        """Open the records and the key map's slots (made where writable), or,
        in a database of an earlier format, what the copy converts, making
        nothing: format 7's records, the ``docs`` of format 6 and earlier."""
        with contextlib.ExitStack() as stack:
            reader = txn or stack.enter_context(self._env.begin())
            self._old_source = next((source for marker, source in OLD_SOURCES
                                     if reader.get(marker) is not None), None)
            one_an_id = reader.get(RECORDS) is not None  # (a file of format 7 to 10)
        self.old_documents = self._old_source is not None
        self._keys = Slots(format.KEYS)
        self.record_blocks = not self.old_documents and not one_an_id
        self.old_records = one_an_id and not self.old_documents
        if self.old_documents:
            self._dbs[self._old_source] = self._open_db(self._old_source, txn=txn, create=False)
        else:  # (the records' handle, in blocks or one an id)
            self._dbs[RECORDS] = self._open_db(RECORD_BLOCKS if self.record_blocks else RECORDS,
                                               txn=txn, create=self.record_blocks)
            self._open_slots(self._keys, create=True, txn=txn)

    def _open_recent(self, txn=None):
        """Open recent, made where writable (a database of format 8 has none
        until it is opened writable: read-only, it reads as empty)."""
        if txn is None:
            with self._env.begin() as reader:
                if reader.get(RECENT_WRITES) is None:
                    return
        self._dbs[RECENT_WRITES] = self._open_db(RECENT_WRITES, txn=txn)

    def _open_db(self, name, dupsort=False, env=None, txn=None, create=True):
        try:
            return (env or self._env).open_db(name, txn=txn, dupsort=dupsort,
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
        if self.readonly:  # another process may have added slots or recent (none can beside a writer)
            self._open_slots(self._index, create=False)
            if not self.old_documents:
                self._open_slots(self._keys, create=False)
                self._open_recent()

    def _making(self):
        """The write transaction in which sub-databases are made (none read-only)."""
        return contextlib.nullcontext() if self.readonly else self._env.begin(write=True)

    def _open_slots(self, slots, create, txn=None):
        """Open the ``slots``' sub-databases from the first this handle lacks;
        without ``create``, up to the first the database does not have."""
        for name in slots.kind.names()[len(slots):]:
            made = create or not slots.names  # (the first slot is made in any database)
            if not made and txn is not None and txn.get(name) is None:
                break  # (a write transaction must not meet a failed open)
            try:
                self._dbs[name] = self._open_db(name, dupsort=slots.kind.dupsort, txn=txn,
                                                create=made)
            except DatabaseError:
                if not slots.names:
                    raise
                break
            slots.names.append(name)

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
        """The run sets: the tables, then the bands."""
        return range(self._layout.tables + BANDS)

    def open_tables(self, layout):
        """Open the tables of ``layout``, as runs (made where writable)."""
        self._layout = layout
        if layout.tables > self._room:  # an environment with room for them
            self._close_env()
            self._open_env()
            return
        if self.old_documents:  # only upgrade's copy reads it: its documents alone
            return
        names = [RUNS] + [slot_name(table, slot) for table in range(layout.tables)
                          for slot in range(RUN_SLOTS)]
        # made in one write transaction; a read transaction would close them as it ends
        with self._making() as txn:
            self._dbs.update((name, self._open_db(name, txn=txn)) for name in names)

    def _begin_read(self):
        with self._errors("read"):
            txn = self._env.begin()
        for slots in (self._index, self._keys):
            lacking = slots.kind.name(len(slots)) if 0 < len(slots) < slots.kind.count else None
            if lacking is not None and txn.get(lacking) is not None:
                txn.abort()  # the slots another process added must be read too
                raise lmdb.MapResizedError("%s gained slots of %s"
                                           % (self.path, slots.first.decode()))
        if RECENT_WRITES not in self._dbs and not self.old_documents and txn.get(RECENT_WRITES):
            txn.abort()  # a writer opened a database of format 8: recent must be read too
            raise lmdb.MapResizedError("%s gained recent" % self.path)
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

    def _txn(self, txn):
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

    def _damage_found(self):
        """As the storage's; where it finds damage, this handle refuses to read
        the file from then on: LMDB would abort the process on some damaged
        pages, and py-lmdb has no guard."""
        found = super()._damage_found()
        if found:
            self._unreadable = "%s%s" % ("; ".join(found[:3]), "; and %d more" % (len(found) - 3)
                                         if len(found) > 3 else "")
        return found

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
            raise damaged_error(self.path, "part of %s" % b", ".join(names).decode())

    def _copy_to(self, copy, layout, params):
        """Write the database, compacted, into the new file ``copy``: the
        records in id order (meta keeps the next id), each family of slots
        (the key map, the index) merged into its first slot, every one
        appended in order; the tables rebuilt from the index as one run each
        in ``layout`` (no stale entries; meta brings the distinct count), the
        bands from the records, the parameters ``params`` (None: as they are).
        A database of an earlier format is converted: its documents take ids
        in key order, and the key map and index are built from them."""
        grows = -(-layout.tables // self._layout.tables)  # (more tables: room for them)
        target = lmdb.open(os.fsencode(copy), map_size=grows * self._map_size_to_open(),
                           max_dbs=max_dbs(max(self._room_for_tables(), layout.tables)),
                           subdir=False, lock=False)
        try:
            with self._env.begin() as source, target.begin(write=True) as written:
                def opened(name, dupsort=False):
                    return self._open_db(name, dupsort=dupsort, env=target, txn=written)

                meta = opened(META)
                self._walked(source, [META], fill_empty(
                    written.cursor(meta), source.cursor(self._dbs[META]).iternext(), False))
                records = Records(written, opened(RECORD_BLOCKS), True, copy)
                keys, index = ([opened(name, dupsort=True) for name in family.names()]
                               for family in (format.KEYS, format.INDEX))
                if self.old_documents:
                    converted = self._convert_documents(source, written, records, keys[0], index[0])
                    written.put(NEXT_ID, count_bytes(converted), db=meta)
                else:
                    self._copy_documents(source, written, records, keys[0], index[0])
                records.flush()
                fps = distinct_fingerprints(written.cursor(index[0]).iternext())
                written.put(DISTINCT, count_bytes(len(fps)), db=meta)  # (0.3's files have none)
                held = [set() for _ in range(BANDS)]  # the bands from the records
                for doc, raw in records.items():
                    _, value = record_parts(raw, self.path, doc)
                    for entries, entry in zip(held, band_entries(value, value_fingerprint(value))):
                        entries.add(entry)
                sets = itertools.chain(
                    (layout.table_values(fps, table) for table in range(layout.tables)),
                    (array("Q", sorted(entries)) for entries in held))
                directory = opened(RUNS)
                ids = source.get(RUN_IDS, db=self._dbs[META])
                run = new_run_id(read_counter(ids, self.path, RUN_IDS))
                for table, values in enumerate(sets):
                    slots = [opened(self._set_slot(table, slot, layout.tables))
                             for slot in range(RUN_SLOTS)]
                    if values:
                        write_run(written, slots[0], run, values)
                    written.put(self._set_key(table, layout.tables), directory_record(
                        [(run, 0, len(values))] if values else []), db=directory)
                opened(RECENT_WRITES)  # (empty: its values are in the runs written)
                for counter in (STALE, REMOVED, BAND_STALE, RECENT):
                    written.put(counter, count_bytes(0), db=meta)
                written.delete(REWRITE, db=meta)
                written.delete(BAND_REWRITE, db=meta)
                if params is not None:
                    written.put(PARAMS, params, db=meta)
        finally:
            target.close()

    def _copy_documents(self, source, written, records, keys, index):
        """Copy the records, the key map's slots into ``keys`` and the index's
        into ``index`` (the copy's first slots), each in order."""
        read = Records(source, self._dbs[RECORDS], self.record_blocks, self.path)
        items = read.items()
        for chunk in iter(lambda: list(itertools.islice(items, CHUNK)), []):
            records.append(chunk)
        self._walked(source, [RECORDS], read.walked)
        self._walked(source, self._keys.names, fill_empty(
            written.cursor(keys), slot_items(source, self, self._keys), True))
        self._walked(source, self._index.names, fill_empty(
            written.cursor(index), index_items(source, self), True))

    def _convert_documents(self, source, written, records, keys, index):
        """Write the documents of a file of an earlier format (``docs``, or
        format 7's records) as records, ids given in key order from 0, with
        their key map (into ``keys``) and index (into ``index``); returns how
        many (the next id)."""
        old = self._dbs[self._old_source]
        if self._old_source == OLD_DOCS:  # (key, where its value is)
            located = [(key, key) for key in source.cursor(old).iternext(values=False)]
        else:
            located = [(record_parts(raw, self.path, doc)[0], doc)
                       for doc, raw in source.cursor(old).iternext()]
        self._walked(source, [self._old_source], len(located))
        located.sort(key=lambda pair: format.key_order(pair[0]))
        entries = []  # the index's, as the records are written

        def numbered():
            for number, (key, at) in enumerate(located):
                value = source.get(at, db=old)
                if self._old_source == RECORDS:
                    value = record_parts(value, self.path, at)[1]
                entries.append(_ext.pack_key(value_fingerprint(value)) + id_bytes(number))
                yield id_bytes(number), record_bytes(key, value)

        numbers = numbered()
        for chunk in iter(lambda: list(itertools.islice(numbers, CHUNK)), []):
            records.append(chunk)
        count = len(located)
        fill_empty(written.cursor(keys), ((format.key_hash(key), id_bytes(number))
                                          for number, (key, _) in enumerate(located)), True)
        fill_empty(written.cursor(index), ((entry[:8], entry[8:]) for entry in sorted(entries)), True)
        return count
