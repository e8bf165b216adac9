"""A batch being planned under the write lock of a Redis database: its reads
see the committed data and the batch's own changes, and its plan is what the
write protocol lands."""

import heapq
from array import array

from ... import _redis
from ..._ext import SIGNATURE_BYTES, WIDE_SIGNATURE_BYTES, bands
from ...layout import NearIndex
from ...records import signature, value_fingerprint
from .. import BANDS, Txn
from .view import RedisView



class RedisTxn(RedisView, Txn):
    """A batch being planned under the write lock: reads see the committed
    data and this batch's own changes; :meth:`plan` says what to write."""

    def __init__(self, db, count, distinct, epoch):
        super().__init__(db)
        self._count_before, self._distinct_before, self._epoch = count, distinct, epoch
        self._docs = {}       # key -> value (None: removed) set by this batch
        self._rewritten = set()  # keys upserted: written with their index entries even unchanged
        self._committed = {}  # key -> committed value (None: absent), for keys read
        self._fps = {}        # fp -> its keys (sorted) after this batch, for fps read
        self._fps_committed = {}
        self._new_params = None
        self._near = None  # a NearIndex of the fps this batch gave keys, once searched
        self._own_bands = None  # an _OwnBands of the documents it stored, once band-searched

    def _read(self, read):
        return self._db.retrying(read)  # under the lock, no batch lands meanwhile

    def _load(self, keys, fps):
        """Read the committed values of ``keys`` and keys of ``fps`` (and of the
        fingerprints those values hold) not read yet."""
        db = self._db
        if not self._count_before:  # an empty database: nothing to read
            self._committed.update(dict.fromkeys(keys))
            _redis.add_absent(fps, self._fps, self._fps_committed)
            return
        keys = _redis.unread(keys, self._committed)
        values = self._read(lambda: db.hash_fields(b"d", keys, False)) if keys else {}
        self._committed.update(values)
        fps = list(fps) + [value_fingerprint(v) for v in values.values() if v is not None]
        fps = _redis.unread(fps, self._fps)
        if fps:
            for fp, keys_of in self._read(lambda: db.keys_of(fps)).items():
                self._fps[fp] = keys_of
                self._fps_committed[fp] = tuple(keys_of)
        for key, value in values.items():  # the batch's changes rely on it
            if value is not None and key not in self._fps_committed[value_fingerprint(value)]:
                raise db.contradiction("document %r is missing from the fingerprint index"
                                       % key)

    def _value(self, key):
        return self._docs[key] if key in self._docs else self._committed[key]

    def _put(self, documents):
        """Store the (key, fp, value) ``documents`` in this batch (their keys
        and fingerprints read)."""
        moved = _redis.put_documents(documents, self._docs, self._committed, self._fps,
                                   value_fingerprint)
        if self._near is not None:
            for fp in moved:
                self._near.add(fp)
        if self._own_bands is not None:
            for key, fp, value in documents:
                self._own_bands.set(key, fp, value)

    # Reads with this batch's changes

    def params(self):
        if self._new_params is not None:
            return self._new_params
        return self._read(lambda: self._db.stored_params(self._epoch))

    def count(self):
        return self._count_before + _redis.planned_documents(self._docs, self._committed)[1]

    def distinct(self):
        return self._distinct_before + _redis.planned_fingerprints(self._fps,
                                                                 self._fps_committed)[3]

    def get_many(self, keys):
        rest = [key for key in keys if key not in self._docs]
        committed = iter(super().get_many(rest) if rest else ())
        return [self._docs[key] if key in self._docs else next(committed) for key in keys]

    def keys_of(self, fingerprint):
        self._load([], [fingerprint])
        return list(self._fps[fingerprint])

    def keys_of_many(self, fingerprints):
        self._load([], fingerprints)
        return {fp: list(self._fps[fp]) for fp in fingerprints}

    def documents(self, after=None):
        """The committed documents streamed with this batch's changes merged in."""
        shard_of = self._db.keys.doc_shard
        start = None if after is None else (shard_of(after), after)
        own = sorted((shard_of(key), key, value)
                     for key, value in self._docs.items() if value is not None)
        own = [doc for doc in own if start is None or doc[:2] > start]
        committed = (doc for doc in self._db.documents(after, False) if doc[1] not in self._docs)
        return (doc[1:] for doc in heapq.merge(committed, own))

    def fingerprint_groups(self):
        """The committed groups streamed with this batch's changes merged in."""
        own = sorted((fp, keys) for fp, keys in self._fps.items() if keys)
        committed = (group for group in self._db.fingerprint_groups(False)
                     if group[0] not in self._fps)
        return heapq.merge(committed, own)

    def table_fingerprints(self, table):
        present = set(self._read(lambda: self._db.table_fingerprints(table, self._epoch)))
        present |= {fp for fp, keys in self._fps.items() if keys}
        present -= {fp for fp, keys in self._fps.items() if not keys}
        layout = self._db.layout
        return [layout.unpermute(p, table)
                for p in layout.table_values(array("Q", sorted(present)), table)]

    def _changed(self):
        """The (key, value or None) documents this batch writes, and how many
        it adds (less those it removes): those it changed, and those it
        upserted as they were (whose index entries an upsert writes all the
        same: a database of simhashdb 0.2 gains its band index so)."""
        changed, added = _redis.planned_documents(self._docs, self._committed)
        listed = {key for key, _ in changed}
        return changed + [(key, self._docs[key]) for key in self._rewritten
                          if key not in listed and self._docs.get(key) is not None], added

    def band_entries(self, band):
        changed = self._changed()[0]
        present = set(self._read(lambda: self._db.band_entries(band, self._epoch)))
        present.update(band_entries_of([value for _, value in changed])[band])
        deletes = self._band_deletes(changed)
        return sorted(present - set(deletes[band] if deletes else ()))

    def band_search(self, keys):
        """The committed documents of :meth:`RedisView.band_search` that this
        batch did not change, and those it stored that share a band."""
        queries = len(keys) // BANDS
        committed = (self._read(lambda: self._db.band_search_committed(keys))
                     if self._count_before else [[] for _ in range(queries)])
        if self._own_bands is None:
            self._own_bands = _OwnBands()
            for key, value in self._docs.items():
                if value is not None:
                    self._own_bands.set(key, value_fingerprint(value), value)
        return [[hit for hit in hits if hit[0] not in self._docs]
                + self._own_bands.search(keys[q * BANDS:(q + 1) * BANDS])
                for q, hits in enumerate(committed)]

    def _band_deletes(self, changed):
        """Per band, the entries (sorted) of the committed values of the
        ``changed`` (key, new value or None) documents that no document has
        after this batch: neither the new values nor a document it leaves
        as it is that shares their fingerprint's top 32 bits (found through
        the index, by prefix); None where there are none."""
        old = [self._committed[key] for key, _ in changed]
        old_signatures, old_fps = _signatures(old)
        if not old_signatures:  # nothing taken away: new documents, or no texts
            return None
        others = [(key, fp) for found in self._read(lambda: self._db.prefix_groups(
            {fp >> 32 for fp in old_fps})).values() for fp, keys in found for key in keys]
        changed_keys = {key for key, _ in changed}
        others = [key for key, _ in others if key not in changed_keys]
        values = {key: self._committed[key] for key in others if key in self._committed}
        unread = [key for key in others if key not in values]
        if unread:
            values.update(self._read(lambda: self._db.hash_fields(b"d", unread, False)))
        kept = band_entries_of([value for _, value in changed] + list(values.values()))
        deletes = _redis.sorted_band_entries(old_signatures, old_fps, kept)
        return deletes if any(deletes) else None

    def search(self, probes, distance):
        committed = self._read(lambda: self._db.search_committed(probes, distance))
        return [[hit for hit in hits if hit[0] not in self._docs]
                + self._own_hits(fp, distance) for fp, hits in zip(probes, committed)]

    def _own_hits(self, fp, distance):
        """Hits among the documents this batch stored."""
        if self._near is None:
            self._near = NearIndex(self._db.layout)
            for other, keys in self._fps.items():
                if any(key in self._docs for key in keys):
                    self._near.add(other)
        return [(key, other, bits) for other, bits in self._near.search(fp, distance)
                for key in self._fps[other] if key in self._docs]

    # Writes

    def set_params(self, raw):
        self._new_params = raw

    def upsert(self, documents):
        documents = list(documents)  # also of records.PackedDocuments (its tuples)
        self._load([d[0] for d in documents], [d[1] for d in documents])
        self._put(documents)
        self._rewritten.update(d[0] for d in documents)

    def remove(self, keys):
        self._load(keys, [])
        removed = 0
        for key in keys:
            old = self._value(key)
            if old is not None:
                self._docs[key] = None
                self._fps[value_fingerprint(old)].remove(key)
                if self._own_bands is not None:
                    self._own_bands.set(key, None, None)
                removed += 1
        return removed

    def insert_if_new(self, documents, distance):
        self._load([d[0] for d in documents], [d[1] for d in documents])
        probes = array("Q", [d[1] for d in documents])
        committed = self._read(lambda: self._db.search_committed(probes, distance))
        found = []
        for (key, fp, value), hits in zip(documents, committed):
            hits = [hit for hit in hits if hit[0] not in self._docs] + \
                self._own_hits(fp, distance)
            if not hits:
                self._put([(key, fp, value)])
            found.append(hits)
        return found

    def plan(self):
        """What this batch writes (final values, so that writing it twice
        is writing it once), or None if nothing: the changed documents
        (``docs``), fingerprint index entries (``fps``), the fingerprints
        the tables gain and lose (``add``, ``del``) and, per band, the
        entries the band index loses (``bdel``, where there are any; those it
        gains are the new documents' own, :func:`band_entries_of` them)."""
        docs, added = self._changed()
        fps, adds, deletes, distinct = _redis.planned_fingerprints(self._fps, self._fps_committed)
        if not docs and not fps and self._new_params is None:
            return None
        plan = {"docs": docs, "fps": fps, "count": self._count_before + added,
                "distinct": self._distinct_before + distinct, "params": self._new_params,
                "add": adds.tobytes(), "del": deletes.tobytes()}
        band_deletes = self._band_deletes(docs)
        if band_deletes:
            plan["bdel"] = [entries.tobytes() for entries in band_deletes]
        return plan


def _signature(value):
    """The signature a document value (None: absent) holds, or None (also
    for one damaged: neither 128 nor 256 bytes, as the native LMDB backend reads it)."""
    theirs = None if value is None else signature(value)
    return theirs if isinstance(theirs, bytes) and \
        len(theirs) in (SIGNATURE_BYTES, WIDE_SIGNATURE_BYTES) else None


def _signatures(values):
    """(signatures, their fingerprints as an array) of the ``values`` (None:
    absent) that hold one."""
    signatures, fps = [], array("Q")
    for value in values:
        theirs = _signature(value)
        if theirs:
            signatures.append(theirs)
            fps.append(value_fingerprint(value))
    return signatures, fps


def band_entries_of(values):
    """Per band, the entries of document ``values`` (None: absent), sorted,
    each once: what the band index holds for them."""
    return _redis.sorted_band_entries(*_signatures(values))


class _OwnBands:
    """The band keys of the text documents a batch stored, in memory."""

    def __init__(self):
        self._by_key = {}  # band << 32 | band key -> {document key: fingerprint}
        self._of = {}  # document key -> its band keys

    def set(self, key, fp, value):
        """Document ``key`` is now ``value`` of ``fp`` (None: removed)."""
        for band, band_key in enumerate(self._of.pop(key, ())):
            holders = self._by_key[band << 32 | band_key]
            del holders[key]
            if not holders:
                del self._by_key[band << 32 | band_key]
        theirs = _signature(value)
        keys = bands(theirs) if theirs else ()
        if keys:
            self._of[key] = keys
            for band, band_key in enumerate(keys):
                self._by_key.setdefault(band << 32 | band_key, {})[key] = fp

    def search(self, keys):
        """(key, fingerprint) of each document that shares a band with the
        query of band keys ``keys``."""
        found = {}
        for band in range(BANDS):
            found.update(self._by_key.get(band << 32 | keys[band], ()))
        return list(found.items())
