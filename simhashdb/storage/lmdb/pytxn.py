"""Writes of the py-lmdb backend: upsert, insert-if-new and remove over the
write transaction, the runs of the tables and bands each batch adds and
merges, and tidy's rewrites."""

import collections
import contextlib
import functools
import itertools
from array import array

import lmdb

from ... import _ext
from ...layout import NearIndex
from ...records import value_fingerprint
from .. import BANDS, Txn, band_entries
from . import format
from .format import (
    BAND_DIRECTORY,
    BAND_REWRITE,
    BAND_STALE,
    DISTINCT,
    NEXT_ID,
    PARAMS,
    RECENT,
    RECENT_FINGERPRINTS,
    REMOVED,
    REWRITE,
    RUN_IDS,
    RUN_RATIO,
    RUN_SLOTS,
    STALE,
    directory_record,
    new_run_id,
    recent_record,
)
from .pyruns import (
    BAND_GROUP,
    BROUGHT,
    MAX_VALUE,
    META,
    RECENT_WRITES,
    RECORDS,
    RUNS,
    TAKEN,
    count_bytes,
    damaged_error,
    distinct_fingerprints,
    fill_empty,
    id_bytes,
    index_items,
    merge_due,
    merge_width,
    merges_left,
    note_bands,
    record_bytes,
    record_parts,
    settle_due,
    write_run,
)
from .pyrecords import Records
from .pyview import CHUNK, PyView

class PyTxn(PyView, Txn):
    """Reads and writes over the py-lmdb write transaction."""

    untidy = False  # a batch left merges or a rewrite of the tables for tidy()
    changed = False  # a batch call has changed its documents or index

    def set_params(self, raw):
        self._cursor(META).put(PARAMS, raw)

    def upsert(self, documents):
        """Store the documents: a stored key's record replaced under its id,
        the new keys' appended under the next ids in key order."""
        self.changed = True
        latest = {key: (fp, value) for key, fp, value in documents}
        touched, bands, appended, mapped = {}, {}, [], []
        storage = self._storage
        records = self._records_io()
        keys, index = self._cursor(storage._keys.first), self._cursor(storage._index.first)
        next_id = self._count(NEXT_ID)
        if next_id > 2**64 - 1 - len(latest):  # (ids run to 2^64: only damage comes near)
            raise damaged_error(storage.path, "meta's %r" % NEXT_ID.decode())
        stored = self._lookup(latest.keys())
        for hash_, key in sorted(map(format.key_order, latest)):  # (new entries: the first slots)
            fp, value = latest[key]
            note_bands(bands, value, fp, True)
            if key not in stored:
                doc = id_bytes(next_id)
                next_id += 1
                appended.append((doc, record_bytes(key, value)))
                mapped.append((hash_, doc))
            else:
                doc, old = stored[key]
                old_fp = value_fingerprint(old)
                note_bands(bands, old, old_fp, False)
                records.replace(doc, record_bytes(key, value))
                if old_fp == fp:
                    continue
                self._unlink(old_fp, doc, touched)
            self._touch(fp, touched)
            index.put(_ext.pack_key(fp), doc)
        if appended:
            records.append(appended)
            self._set_count(NEXT_ID, next_id)
            # in full pages where the new hashes sort after the slot's (a first batch), each
            # once (py-lmdb before 3.0 refuses a duplicate appended)
            after = (not keys.last() or keys.key() < mapped[0][0]) and all(
                older[0] < newer[0] for older, newer in zip(mapped, mapped[1:]))
            if keys.putmulti(mapped, dupdata=True, append=after)[1] != len(mapped):
                raise damaged_error(storage.path, "the key map")
        records.flush()
        self._update(touched, bands)

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
        records, the key map and the index whole without them where the
        batch takes the documents removed since they were last written whole
        past 1/RUN_RATIO of them and the transaction changed nothing before."""
        touched, bands, gone = {}, {}, []
        stored = self._lookup(set(keys))
        last = None
        if not self.changed and (self._count(REMOVED) + len(stored)) * RUN_RATIO > self.count():
            last = self._snapshot()
        self.changed = True
        with last or contextlib.nullcontext():
            for hash_, key in sorted(map(format.key_order, stored)):
                doc, old = stored[key]
                fp = value_fingerprint(old)
                note_bands(bands, old, fp, False)
                gone.append((hash_, doc, fp))
                if last is None:
                    self._records_io().delete(doc)
                    self._delete_entry(self._storage._keys, hash_, doc)
                    self._unlink(fp, doc, touched)
                else:
                    self._touch(fp, touched)
            if last is not None:
                self._write_whole(last, gone)
            elif gone:
                self._set_count(REMOVED, self._count(REMOVED) + len(gone))
                self._records_io().flush()
        self._update(touched, bands)
        return len(gone)

    def _append(self, last, name, keep, dupsort):
        """Empty sub-database ``name`` and put into it, in order, its entries
        in snapshot ``last`` that ``keep(key, value)``."""
        db = self._storage._dbs[name]
        self._txn.drop(db, delete=False)
        walked = itertools.count()
        kept = ((k, v) for (k, v), _ in zip(last.cursor(db).iternext(), walked) if keep(k, v))
        fill_empty(self._txn.cursor(db), kept, dupsort)
        self._storage._walked(last, [name], next(walked))

    def _records_without(self, last, docs):
        """Empty the records and append, in blocks, those of snapshot ``last``
        but the ids ``docs``."""
        storage = self._storage
        self._txn.drop(storage._dbs[RECORDS], delete=False)
        self._held_records = None
        source = Records(last, storage._dbs[RECORDS], True, storage.path)
        records, kept = self._records_io(), []
        for doc, record in source.items():
            if doc not in docs:
                kept.append((doc, record))
            if len(kept) >= CHUNK:
                records.append(kept)
                kept = []
        storage._walked(last, [RECORDS], source.walked)
        records.append(kept)
        records.flush()

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
        """Write the records, the key map's slots and the index's again
        without the documents ``gone`` [(key hash, id, fingerprint)], each
        emptied and appended in order from snapshot ``last``."""
        storage = self._storage
        docs = {doc for _, doc, _ in gone}
        if storage.record_blocks:
            self._records_without(last, docs)
        else:
            self._append(last, RECORDS, lambda k, v: k not in docs, False)
        for slots, entries in ((storage._keys, {(hash_, doc) for hash_, doc, _ in gone}),
                               (storage._index, {(_ext.pack_key(fp), doc) for _, doc, fp in gone})):
            for name in slots.names:
                if last.stat(storage._dbs[name])["entries"]:
                    self._append(last, name, lambda k, v: (k, v) not in entries,
                                 slots.kind.dupsort)
        self._cursors, self._in_use, self._held_records = {}, {}, None  # on emptied sub-databases
        self._set_count(REMOVED, 0)

    def _update(self, touched, bands):
        """Store what the index gained in the tables and what the batch brought
        the bands (:meth:`_store`), and count what they lost as stale."""
        added = self._update_tables(touched)
        brought = self._update_bands(bands)
        self._store(added, brought)
        self.untidy = self.untidy or self._band_rewrite_due()

    def _update_bands(self, bands):
        """The entries of each band the batch brought that no document it took
        away had ({(band, entry): BROUGHT | TAKEN}): {band: ascending entries};
        those it took away that none it brought has counted as stale, as the
        native backend does."""
        brought = collections.defaultdict(list)
        stale = 0
        for (band, entry), how in sorted(bands.items()):
            if how == BROUGHT:
                brought[band].append(entry)
            stale += how == TAKEN
        if stale:
            self._set_count(BAND_STALE, self._count(BAND_STALE) + stale)
        return brought

    def _store(self, added, brought):
        """Keep the fingerprints ``added`` to the tables and the band entries
        ``brought`` ({band: ascending entries}) in recent as one record while
        recent's values and these stay within the storage's ``recent_limit``;
        else write them with recent's as one run of each table and band
        (:meth:`_flush`)."""
        values = len(added) + sum(map(len, brought.values()))
        if not values:
            return
        db = self._storage._dbs.get(RECENT_WRITES)
        held = self._count(RECENT)
        if db is None or held + values > self._storage.recent_limit:
            self._flush(added, brought)
            return
        cursor = self._txn.cursor(db)
        number = int.from_bytes(cursor.key(), "big") + 1 if cursor.last() else 0
        if number > MAX_VALUE:  # (numbers run to 2^64: only damage comes near)
            raise damaged_error(self._storage.path, "recent's last record")
        groups = {BAND_DIRECTORY + band: entries for band, entries in brought.items()}
        groups[RECENT_FINGERPRINTS] = sorted(added)
        if not cursor.put(id_bytes(number), recent_record(groups), append=True):
            raise damaged_error(self._storage.path, "recent's last record")
        self._set_count(RECENT, held + values)
        self._recent_held = None

    def _flush(self, added=(), brought=None):
        """Write recent's values, and the fingerprints ``added`` and band entries
        ``brought`` (as :meth:`_store`), as one run of each table and band that
        takes any (merged as a batch's runs are), and empty recent."""
        recent, brought = self._recent(), brought or {}
        layout = self._storage._layout
        fps = _ext.merge_unique(recent.fingerprints, array("Q", sorted(added)))
        for table in range(layout.tables if fps else 0):
            self._add_run(table, layout.table_values(fps, table))
        for band in range(BANDS):
            entries = _ext.merge_unique(recent.bands.get(band, ()), brought.get(band, ()))
            if entries:
                self._add_run(layout.tables + band, entries)
        if recent.values:
            self._txn.drop(self._storage._dbs[RECENT_WRITES], delete=False)
            self._set_count(RECENT, 0)
            self._recent_held = None

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

    def _unlink(self, fp, doc, touched):
        """Delete document ``doc``'s entry of ``fp`` from the index."""
        self._touch(fp, touched)
        self._delete_entry(self._storage._index, _ext.pack_key(fp), doc)

    def _delete_entry(self, slots, key, value):
        """Delete the entry (``key``, ``value``) from the slot of family
        ``slots`` that holds it."""
        for cursor in self._slot_cursors(slots):
            if cursor.set_key_dup(key, value):
                cursor.delete()
                return

    def _update_tables(self, touched):
        """The fingerprints the index gained; those it lost counted as stale
        (their entries stay in the runs and recent until a rewrite)."""
        if not touched:  # as native: a batch that changed no fingerprint checks nothing
            return []
        added, removed = [], []
        for fp, had in touched.items():
            now = self._has(fp)
            if now and not had:
                added.append(fp)
            elif had and not now:
                removed.append(fp)
        distinct = self._count(DISTINCT) + len(added) - len(removed)
        stale = self._count(STALE) + len(removed)
        if len(added) != len(removed):
            self._set_count(DISTINCT, distinct)
        if removed:
            self._set_count(STALE, stale)
        self.untidy = (self.untidy or stale * RUN_RATIO > distinct or self._sparse()
                       or self._cursor(META).get(REWRITE) is not None)
        return added

    def _sparse(self):
        """Whether the documents removed since they were last written whole
        are over 1/RUN_RATIO of the documents (see tidy)."""
        return self._count(REMOVED) * RUN_RATIO > self.count()

    def _set_count(self, name, value):
        if value < 0:  # counted down past what was counted up: the file was damaged
            raise damaged_error(self._storage.path, "meta's %r" % name.decode())
        self._cursor(META).put(name, count_bytes(value))

    def _add_run(self, table, values, tidying=False, settle=0):
        """Append sorted ``values`` (if any) to run set ``table`` as a new run,
        then merge the newest runs while merge_due within the storage's
        ``batch_merge`` entries (``tidying``: while any merge is left;
        ``settle``: the two newest while they hold at most that many entries,
        and no merge takes more), as the native backend does; returns the
        entries merged."""
        runs = self._directory(table)
        tables = self._storage._layout.tables
        band = table - tables if table >= tables else None
        limit = settle or (None if tidying or not self._storage.batch_merge
                           else self._storage.batch_merge)
        if values is not None:
            self._put_run(table, runs, values)
        merged = 0
        while (settling := settle_due(runs, settle)) or merge_due(runs, limit, band):
            width = 2 if settling or band is None else merge_width(runs, band)
            sources = runs[-width:]
            merged += sum(size for _, _, size in sources)
            self._put_run(table, runs, functools.reduce(_ext.merge_unique, (
                self._run_range(table, run, slot, 0, MAX_VALUE) for run, slot, _ in sources)))
            for _, slot, _ in sources:
                self._txn.drop(self._storage._dbs[self._storage._set_slot(table, slot)],
                               delete=False)
            del runs[-width - 1:-1]
        self.untidy = self.untidy or merges_left(runs, band is not None)
        self._save_directory(table, runs)
        return merged

    def _put_run(self, table, runs, values):
        """Write ``values`` as a new run of ``table`` (the next id, the first
        free slot) and note it at the end of ``runs``."""
        free = set(range(RUN_SLOTS)) - {s for _, s, _ in runs}
        if not free:  # a directory of more runs than merges leave
            raise damaged_error(self._storage.path, "the directory of %s's runs"
                           % self._storage._set_named(table))
        slot = min(free)
        # never an id given before in the table (the native backend caches
        # block directories by run id): above the live runs' and the dropped
        run = new_run_id(runs[-1][0] if runs else self._count(RUN_IDS))
        write_run(self._txn, self._storage._dbs[self._storage._set_slot(table, slot)], run,
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
        elif self._band_rewrite_due():
            self._tidy_bands()
            return True
        else:
            return self._merge_run_sets(max(distinct, self._storage.batch_merge))
        self._flush()  # (a value of recent is in the runs a rewrite writes, never in both)
        fps = distinct_fingerprints(index_items(self._txn, self._storage))
        self._rewrite_run_set(table, self._storage._layout.table_values(fps, table))
        if table + 1 == self._storage._layout.tables:  # removals since it began stay counted
            self._txn.delete(REWRITE, db=self._storage._dbs[META])
            self._set_count(STALE, max(stale - began, 0))
        else:
            meta.put(REWRITE, (table + 1).to_bytes(8, "big") + began.to_bytes(8, "big"))
        return True

    def settle(self, documents):
        """One transaction's share of settling after a call that wrote
        ``documents`` in many batches, as the native backend does: in every
        run set the two newest runs merged while they hold at most
        ``documents`` together, until the merges have taken about a table's
        entries (this backend keeps one slot of the index and of the key map;
        recent stays as it is). Returns whether there is more."""
        self.changed = True
        return self._merge_run_sets(max(self._count(DISTINCT), documents), documents)

    def _merge_run_sets(self, budget, settle=0):
        """The merges due in every run set (``settle``: settle_due within that
        many entries; else merges_left), until they have taken ``budget``
        entries; returns whether some are left."""
        merged = 0
        for table in self._storage._run_sets():
            runs = self._directory(table)
            if settle_due(runs, settle) if settle else merges_left(
                    runs, table >= self._storage._layout.tables):
                if merged >= budget:
                    return True
                merged += self._add_run(table, None, tidying=not settle, settle=settle)
        return False

    def _marker(self, name, marker, end):
        """(the next table or band, the stale count it began with) of a rewrite's marker."""
        number = int.from_bytes(marker[:8], "big")
        if len(marker) != 16 or number >= end:
            raise damaged_error(self._storage.path, "meta's %r" % name.decode())
        return number, int.from_bytes(marker[8:], "big")

    def _tidy_bands(self):
        """The next BAND_GROUP bands of a rewrite of the bands (under way or due)."""
        self._flush()  # (as before a table's rewrite)
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
        records = self._records_io()
        records.flush()
        for doc, raw in records.items():
            _, value = record_parts(raw, self._storage.path, doc)
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
