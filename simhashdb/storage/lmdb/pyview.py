"""Reads of the py-lmdb backend over one transaction: documents (the key
map by key hash, then the records), the fingerprint index, the tables' runs
and recent's fingerprints searched, and the bands' entries."""

import itertools
from array import array
from bisect import bisect_left, bisect_right


from ... import _ext
from ...records import value_fingerprint
from .. import BANDS, View, band_entries
from . import format
from .format import (
    DISTINCT,
    PARAMS,
    RECENT,
    block_entries,
    block_key,
    checksummed,
    directory_runs,
)
from .pyrecords import Records
from .pyruns import (
    EMPTY_RECENT,
    MAX_VALUE,
    META,
    RECENT_WRITES,
    RECORDS,
    RUNS,
    big_endian,
    damaged_error,
    index_items,
    old_documents_error,
    read_block,
    read_counter,
    read_recent,
    record_parts,
    recent_damaged_error,
    run_damaged_error,
    slot_items,
)

CHUNK = 1024  # documents(): key hashes read from the key map, then their records sorted by id


class PyView(View):
    """Reads over one py-lmdb transaction."""

    def __init__(self, storage, txn):
        self._storage, self._txn = storage, txn
        self._cursors = {}
        self._held_records = None  # the records as this transaction reads them (_records_io)
        self._in_use = {}  # cursors on each family's slots in use (_slot_cursors)
        self._recent_held = None  # what recent holds, once read (_recent)

    def _db(self, name):
        db = self._storage._dbs.get(name)
        # the documents of a file of an earlier format: only the copy reads them
        if db is None or name == RECORDS and self._storage.old_documents:
            raise old_documents_error(self._storage.path)
        return db

    def _cursor(self, name):
        cursor = self._cursors.get(name)
        if cursor is None:
            cursor = self._cursors[name] = self._txn.cursor(self._db(name))
        return cursor

    def params(self):
        return self._cursor(META).get(PARAMS)

    def _records_io(self):
        if self._held_records is None:
            self._held_records = Records(self._txn, self._db(RECORDS), self._storage.record_blocks,
                                         self._storage.path)
        return self._held_records

    def count(self):
        if not self._storage.record_blocks:
            return self._txn.stat(self._db(RECORDS))["entries"]
        return sum(self._txn.stat(self._storage._dbs[name])["entries"]  # (one a document)
                   for name in self._storage._keys.names)

    def distinct(self):
        return self._count(DISTINCT)

    def _count(self, name):
        return read_counter(self._cursor(META).get(name), self._storage.path, name)

    def _slot_cursors(self, slots):
        """Cursors on the slots of family ``slots`` in use, and on its first,
        which takes this backend's puts (the others only lose entries here)."""
        cursors = self._in_use.get(slots.first)
        if cursors is None:
            dbs = self._storage._dbs
            cursors = self._in_use[slots.first] = [
                self._cursor(name) for name in slots.names
                if name == slots.first or self._txn.stat(dbs[name])["entries"]]
        return cursors

    def _ids_under(self, slots, key):
        """The document ids (bytes) that the family ``slots`` holds under ``key``."""
        return [doc for cursor in self._slot_cursors(slots) if cursor.set_key(key)
                for doc in cursor.iternext_dup()]

    def _lookup(self, keys):
        """{key: (its id, its value)} of the stored ones of ``keys`` (a set):
        the ids under their hashes, swept in hash order, then those records
        in id order; the records of other keys of a hash are passed over."""
        hashed = {doc: hash_ for hash_ in sorted({format.key_hash(key) for key in keys})
                  for doc in self._ids_under(self._storage._keys, hash_)}
        return {key: (doc, value) for doc, (key, value) in self._hashed(hashed).items()
                if key in keys}

    def _record(self, doc, hash_=None):
        """(key, value) of document ``doc`` (an id's bytes), which the key map
        (under ``hash_``, where given) or the index names: its record must be
        there, and hold a key of that hash."""
        raw = self._records_io().get(doc)
        parts = None if raw is None else record_parts(raw, self._storage.path, doc)
        if parts is None or hash_ is not None and format.key_hash(parts[0]) != hash_:
            raise damaged_error(self._storage.path, "the record of document id %s" % doc.hex())
        return parts

    def _records(self, docs):
        """{id: (key, value)} of the documents ``docs`` (ids' bytes), read in id order."""
        return {doc: self._record(doc) for doc in sorted(set(docs))}

    def _hashed(self, hashed):
        """{id: (key, value)} of the documents ``hashed`` ({id: key hash} the
        key map gave), read in id order: each record's key must have that hash."""
        return {doc: self._record(doc, hashed[doc]) for doc in sorted(hashed)}

    def _keys(self, indexed):
        """{id: key} of the documents ``indexed`` ((id, fingerprint) pairs the
        index gave), read in id order: each record must hold its fingerprint."""
        found = self._records(doc for doc, _ in indexed)
        if any(value_fingerprint(found[doc][1]) != fp for doc, fp in indexed):
            raise damaged_error(self._storage.path, "a record the index names")
        return {doc: key for doc, (key, _) in found.items()}

    def get(self, key):
        return self.get_many([key])[0]

    def get_many(self, keys):
        found = self._lookup(set(keys))
        return [found[key][1] if key in found else None for key in keys]

    def documents(self, after=None):
        """Every (key, value) in key order (by key hash, then key): the key
        map's slots merged, a chunk of hashes at a time, then their records
        in id order."""
        start = None if after is None else format.key_order(after)
        items = slot_items(self._txn, self._storage, self._storage._keys, start and start[0])
        hashes = ((hash_, [doc for _, doc in entries])
                  for hash_, entries in itertools.groupby(items, key=lambda item: item[0]))
        while chunk := list(itertools.islice(hashes, CHUNK)):
            found = self._hashed({doc: hash_ for hash_, docs in chunk for doc in docs})
            for hash_, docs in chunk:
                for key, value in sorted(found[doc] for doc in docs):
                    if start is None or (hash_, key) > start:
                        yield key, value

    def keys_of(self, fingerprint):
        return self.keys_of_many([fingerprint])[fingerprint]

    def keys_of_many(self, fingerprints):
        """The ids of each fingerprint from the index in fingerprint order,
        then their records in id order."""
        ids = {fp: self._ids_under(self._storage._index, _ext.pack_key(fp))
               for fp in sorted(set(fingerprints))}
        keys = self._keys([(doc, fp) for fp, docs in ids.items() for doc in docs])
        return {fp: sorted(keys[doc] for doc in docs) for fp, docs in ids.items()}

    def _has(self, fp):
        """Whether a slot of the index has ``fp``."""
        fp_bytes = _ext.pack_key(fp)
        return any(cursor.set_key(fp_bytes) for cursor in self._slot_cursors(self._storage._index))

    def fingerprint_groups(self):
        items = index_items(self._txn, self._storage)
        for fp_bytes, entries in itertools.groupby(items, key=lambda item: item[0]):
            found = self._records(doc for _, doc in entries)
            yield _ext.unpack_key(fp_bytes), sorted(key for key, _ in found.values())

    def search(self, probes, distance):
        """Each probe's hits; a fingerprint in two runs is found once (by
        fingerprint), a stale one not at all (the index gives it no document)."""
        layout = self._storage._layout
        directories = [self._whole_directory(t) for t in range(layout.tables)]

        def scan(table, first, last, perm):
            entries = array("Q")
            for run, slot, _ in directories[table]:
                entries.extend(self._run_range(table, run, slot, first, last))
            return _ext.verify(perm, big_endian(entries), distance) if entries else ()

        found = [layout.near(probe, distance, scan) for probe in probes]
        recent = self._recent().fingerprints
        if recent:  # every one compared with each probe
            recent = big_endian(array("Q", recent))
            for probe, near in zip(probes, found):
                near.update(_ext.verify(probe, recent, distance))
        keys = self.keys_of_many({fp for near in found for fp in near})
        return [[(key, fp, d) for fp, d in near.items() for key in keys[fp]] for near in found]

    def band_search(self, keys):
        storage = self._storage
        bands = [(band, self._whole_directory(storage._layout.tables + band))
                 for band in range(BANDS)]
        recent = self._recent().bands
        results = []
        for query in range(len(keys) // BANDS):
            prefixes = set()
            for band, runs in bands:
                first = keys[query * BANDS + band] << 32
                last = first | 0xFFFFFFFF
                for run, slot, _ in runs:
                    prefixes.update(_ext.pack_key(entry)[4:] for entry in self._run_range(
                        storage._layout.tables + band, run, slot, first, last))
                held = recent.get(band, ())
                prefixes.update(_ext.pack_key(entry)[4:] for entry in
                                held[bisect_left(held, first):bisect_right(held, last)])
            hits = [hit for prefix in sorted(prefixes) for hit in self._with_prefix(prefix)]
            named = self._keys(hits)
            results.append([(named[doc], fp) for doc, fp in hits])
        return results

    def _with_prefix(self, prefix):
        """(document id, fingerprint) of the documents whose fingerprint
        starts with the 4 bytes ``prefix``."""
        found = []
        for fp_bytes, doc in index_items(self._txn, self._storage, prefix + bytes(4)):
            if fp_bytes[:4] != prefix:
                break
            found.append((doc, _ext.unpack_key(fp_bytes)))
        return found

    def band_entries(self, band):
        storage = self._storage
        held = array("Q")  # the union of the runs less the stale entries
        for run, slot, _ in self._directory(storage._layout.tables + band):
            held = _ext.merge_unique(held, self._run_range(storage._layout.tables + band, run,
                                                           slot, 0, MAX_VALUE))
        held = _ext.merge_unique(held, self._recent().bands.get(band, array("Q")))
        return [entry for entry in held if self._held(band, entry)]

    def _held(self, band, entry):
        """Whether a stored document (as the index is now) has band entry ``entry``."""
        for doc, fp in self._with_prefix(_ext.pack_key(entry)[4:]):
            entries = band_entries(self._record(doc)[1], fp)
            if entries and entries[band] == entry:
                return True
        return False

    def table_fingerprints(self, table):
        layout = self._storage._layout
        values = array("Q")  # the union of the runs less the stale entries
        for run, slot, _ in self._directory(table):
            values = _ext.merge_unique(values, self._run_range(table, run, slot, 0, MAX_VALUE))
        recent = self._recent().fingerprints
        if recent:
            values = _ext.merge_unique(values, layout.table_values(recent, table))
        fps = (layout.unpermute(value, table) for value in values)
        return [fp for fp in fps if self._has(fp)]

    def _recent(self):
        """What recent holds (none in a file of format 8, which lacks it), read
        once (a write forgets it), its records parsed once in the storage."""
        db = self._storage._dbs.get(RECENT_WRITES)
        if db is None and self._count(RECENT):
            raise recent_damaged_error(self._storage.path, "meta counts values in recent, "
                                       "which it lacks")
        if self._recent_held is None and db is not None:
            self._recent_held = self._storage._recent_known = read_recent(
                self._txn.cursor(db), self._count(RECENT), self._storage.path,
                self._storage._recent_known)
        return self._recent_held or EMPTY_RECENT

    def _directory(self, table):
        """Run set ``table``'s live runs, oldest first: [(run id, slot, entries)].
        Every run of this format has checksums: an id without their flag is damage."""
        raw = self._txn.get(self._storage._set_key(table), db=self._storage._dbs[RUNS])
        if raw is None:
            return []
        runs = directory_runs(raw)
        if runs is None:
            raise damaged_error(self._storage.path, "the directory of %s's runs"
                           % self._storage._set_named(table))
        if not all(checksummed(run) for run, _, _ in runs):
            raise run_damaged_error(self._storage.path, self._storage._set_named(table),
                                    "its run's id lost the flag of their checksums")
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
            raise run_damaged_error(self._storage.path, self._storage._set_named(table),
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
            block = read_block(self._storage, table, cursor.key(), cursor.value())
            if block[0] > hi:
                break
            values.extend(block[bisect_left(block, lo):bisect_right(block, hi)])
            at = block[-1] < hi and cursor.next()
        return values
