# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi,
# _signature.pxi, _runs.pxi, _codec.pxi, _buffers.pxi, _work.pxi, _search.pxi, _slotted.pxi, _writes.pxi, _tidy.pxi, _recent.pxi, _upsert.pxi, _env.pxi.
#
# A transaction: the calls the backend makes.

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, g_dbi_open, g_drop, g_get, g_put, g_stat,
    g_txn_commit, g_txn_written, MDB_APPEND, MDB_APPENDDUP, MDB_CREATE, MDB_cursor,
    mdb_cursor_close, MDB_dbi,
    MDB_DUPFIXED, MDB_DUPSORT, MDB_FIRST, MDB_KEYEXIST, MDB_NEXT, MDB_NEXT_DUP, MDB_NEXT_NODUP,
    MDB_NOTFOUND, MDB_SET, MDB_SET_RANGE, MDB_stat, MDB_txn, mdb_txn_abort, mdb_txn_id,
    mdb_txn_reset, MDB_val,
)


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
    int PyGC_Disable()
    int PyGC_Enable()


cdef class Txn:
    """One LMDB transaction over an Env's sub-databases."""

    cdef Env env
    cdef MDB_txn* txn
    cdef bint write
    cdef readonly bint untidy  # a batch left merges or a rewrite of the tables for tidy()
    cdef bint runs_written     # a batch wrote runs: its searches take no block directories
    cdef int index_put_slot    # the index slot this transaction puts into (-1: none yet)
    cdef int key_put_slot      # the key map's slot it puts into (-1: none yet)
    cdef bint changed          # a batch call has changed its documents or index
    cdef uint64_t ticket       # a write transaction's place among the Env's (Env.filters_end)

    def __dealloc__(self):
        if self.txn != NULL and not self.env.broken:
            mdb_txn_abort(self.txn)
        if self.txn != NULL and self.write:
            self.env.filters_end(self.ticket, False, 0)

    cdef int check(self) except -1:
        if self.txn == NULL:
            raise DatabaseError("the transaction is finished")
        self.env.check()
        return 0

    cdef int check_records(self) except -1:
        """check, and refuse a file whose documents are in the form of format 6
        or 7 (only copy_into reads them)."""
        self.check()
        if self.env.old_documents:
            raise DatabaseError("%s keeps its documents as simhashdb 0.8 and earlier did; "
                                "run `simhashdb-cli upgrade` on it" % self.env.path.decode())
        return 0

    cdef Work work(self):
        cdef Work w
        w.txn = self.txn
        w.meta = self.env.meta
        memset(&w.rec, 0, sizeof(Records))
        w.rec.dbi, w.rec.blocks, w.rec.ratio = self.env.records, self.env.record_blocks, 1.0
        memset(&w.index, 0, sizeof(Slotted))
        memset(&w.keys, 0, sizeof(Slotted))
        w.index.dbis, w.index.slots, w.index.put_slot = self.env.index, self.env.index_slots, \
            self.index_put_slot
        w.keys.dbis, w.keys.slots, w.keys.put_slot = self.env.keys, self.env.key_slots, \
            self.key_put_slot
        if self.write:
            w.index.filters, w.keys.filters = &self.env.slot_filters[0], &self.env.slot_filters[1]
        w.run_dir, w.run_slots = self.env.run_dir, self.env.run_slots
        w.table_runs, w.pending = NULL, NULL
        w.recent_dbi, w.recent, w.fresh = self.env.recent, NULL, NULL
        w.recent_limit = self.env.recent_limit
        w.band_changes = NULL
        w.layout = &self.env.layout
        w.merge_limit, w.merged, w.untidy, w.settle = self.env.batch_merge, 0, False, 0
        w.dirs, w.runs_written, w.index_committed = NULL, self.runs_written, False
        w.snapshot, w.view = not self.write, NULL
        w.directory_entries = self.env.directory_entries
        w.directory_rent = self.env.directory_rent
        w.filter_bits = self.env.filter_bits
        # runs below written_from are committed only if no earlier call of the
        # transaction wrote runs: only then may merges read them from other threads
        w.merge_threads = 1 if self.runs_written else self.env.merge_threads
        w.threaded_merge = self.env.threaded_merge
        w.threaded_merges = &self.env.threaded_merges
        w.shared_lookups = &self.env.shared_lookups
        w.fed_merges = &self.env.fed_merges
        return w

    def abort(self):
        """End the transaction; a read one is kept for Env.begin to renew."""
        if self.txn != NULL and not self.env.broken:
            if not self.write and self.env.env != NULL and self.env.spares < SPARE_READS:
                mdb_txn_reset(self.txn)
                self.env.spare[self.env.spares] = self.txn
                self.env.spares += 1
            else:
                mdb_txn_abort(self.txn)
            if self.write:
                self.env.filters_end(self.ticket, False, 0)
        self.txn = NULL

    def commit(self):
        self.check()
        cdef int rc
        cdef uint64_t txnid = mdb_txn_id(self.txn)
        cdef bint written = self.write and g_txn_written(self.txn)
        with nogil:
            rc = g_txn_commit(self.txn)
        self.txn = NULL
        if self.write:
            self.env.filters_end(self.ticket, rc == 0, txnid if written else txnid - 1)
        if rc:
            raise self.env.fail(rc, "cannot commit to %s" % self.env.path.decode())

    def get(self, bytes key, bint meta=False):
        """The value of document ``key`` (of ``key`` in meta), or None."""
        self.check()
        cdef MDB_val k, v
        k.mv_size, k.mv_data = len(key), <char*>key
        if not meta:
            return self.get_many([key])[0]
        cdef int rc = g_get(self.txn, self.env.meta, &k, &v)
        if rc == MDB_NOTFOUND:
            return None
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return self._copy(&v)

    def get_many(self, list keys):
        """The value of each of ``keys`` (bytes), or None, as a list: the ids
        under their hashes looked up in key order, then those records read in
        id order (a record of another key of the hash passed over)."""
        cdef Job job = self.job(keys, False)
        cdef U64s found  # (id, index in keys) under each key's hash
        found.data, found.size, found.cap = NULL, 0, 0
        cdef uint8_t hash[8]
        cdef uint64_t id
        cdef MDB_val k, v, value
        cdef list values = [None] * job.n
        cdef size_t i
        cdef int rc = 0
        try:
            with nogil:
                qsort(job.docs, job.n, sizeof(Doc), cmp_doc_key)
                for i in range(job.n):
                    write_be(hash, job.docs[i].hash, 8)
                    k.mv_size, k.mv_data = 8, hash
                    rc = slotted_get(&job.w, &job.w.keys, &k, &v, MDB_SET)
                    while rc == 0:
                        rc = read_id(&v, &id)
                        if rc == 0:
                            rc = u64_push(&found, id)
                        if rc == 0:
                            rc = u64_push(&found, i)
                        if rc == 0:
                            rc = slotted_get(&job.w, &job.w.keys, &k, &v, MDB_NEXT_DUP)
                    if rc != MDB_NOTFOUND:
                        break
                    rc = 0
                if rc == 0:
                    rc = open_records(&job.w)
                if rc == 0:
                    rc = sort_records(found.data, found.size // 2, 2)
            for i in range(found.size // 2 if rc == 0 else 0):
                rc = read_hashed(&job.w.rec, found.data[2 * i],
                                 &job.docs[found.data[2 * i + 1]], &value, NULL)
                if rc == 1:
                    values[job.docs[found.data[2 * i + 1]].seq] = self._copy(&value)
                elif rc:
                    break
                rc = 0
        finally:
            free(found.data)
        self.done(rc, "read")
        return values

    def documents(self, bytes after=None, Py_ssize_t limit=4096):
        """Documents (key, value) in key order (the keys' hashes, then the
        keys) from the first after ``after`` in it (from the first: None):
        the key map's entries from ``after``'s hash on, ``limit`` past it and
        the rest of the last hash's (its keys are ordered once read), their
        records read in id order. Entries out of order, a record under
        another key's hash or a key twice are a damaged file (a walk in
        chunks would go round them for ever)."""
        cdef Job job = self.job()
        cdef MDB_val k, v, key, value
        cdef U64s found  # (id, hash, index in the chunk) of each entry
        found.data, found.size, found.cap = NULL, 0, 0
        cdef uint8_t start[8]
        cdef uint64_t hash, id, after_hash = 0, last_hash = 0, last_id = 0
        cdef Py_ssize_t counted = 0
        cdef size_t i, n = 0
        cdef list chunk
        cdef bint from_first = after is None
        cdef int rc = 0
        if after is not None:
            after_hash = hash_bytes(<uint8_t*>PyBytes_AS_STRING(after), len(after))
        write_be(start, after_hash, 8)
        k.mv_size, k.mv_data = 8, start
        try:
            with nogil:
                rc = slotted_get(&job.w, &job.w.keys, &k, &v,
                                 MDB_FIRST if from_first else MDB_SET_RANGE)
                while rc == 0:
                    rc = CORRUPTED if k.mv_size != 8 else read_id(&v, &id)
                    hash = read_be(<uint8_t*>k.mv_data, 8) if rc == 0 else 0
                    if rc == 0 and n and (hash < last_hash or
                                          (hash == last_hash and id <= last_id)):
                        rc = CORRUPTED
                    if rc or (counted >= limit and hash != last_hash):
                        break
                    rc = u64_push(&found, id)
                    if rc == 0:
                        rc = u64_push(&found, hash)
                    if rc == 0:
                        rc = u64_push(&found, n)
                    n += 1
                    counted += from_first or hash != after_hash
                    last_hash, last_id = hash, id
                    if rc == 0:
                        rc = slotted_get(&job.w, &job.w.keys, &k, &v, MDB_NEXT)
                rc = 0 if rc == MDB_NOTFOUND else rc
                if rc == 0:
                    rc = open_records(&job.w)
                if rc == 0:
                    rc = sort_records(found.data, n, 3)
            chunk = [None] * n
            for i in range(n if rc == 0 else 0):
                rc = read_record(&job.w.rec, found.data[3 * i], &key, &value)
                if rc:
                    rc = CORRUPTED if rc == MDB_NOTFOUND else rc
                    break
                key_bytes = self._copy(&key)
                hash = found.data[3 * i + 1]
                if hash_bytes(<uint8_t*>PyBytes_AS_STRING(key_bytes), len(key_bytes)) != hash:
                    rc = CORRUPTED
                    break
                if after is None or hash != after_hash or key_bytes > after:
                    chunk[found.data[3 * i + 2]] = (hash, key_bytes, self._copy(&value))
        finally:
            free(found.data)
        self.done(rc, "read")
        chunk = [document for document in chunk if document is not None]
        chunk.sort()  # (in order but where two keys share a hash)
        for i in range(1, len(chunk)):
            if chunk[i][:2] == chunk[i - 1][:2]:
                self.done(CORRUPTED, "read")
        return [(key_bytes, value_bytes) for _, key_bytes, value_bytes in chunk]

    cdef bytes _copy(self, MDB_val* v):
        if v.mv_size >> 32:  # LMDB stores an item's size in 32 bits: a damaged page
            raise self.env.fail(CORRUPTED, "cannot read %s" % self.env.path.decode())
        out = PyBytes_FromStringAndSize(NULL, v.mv_size)
        cdef int rc = g_copy(PyBytes_AS_STRING(out), v.mv_data, v.mv_size)
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return out

    def put_meta(self, bytes key, bytes value):
        self.check()
        cdef MDB_val k, v
        k.mv_size, k.mv_data = len(key), <char*>key
        v.mv_size, v.mv_data = len(value), <char*>value
        cdef int rc = g_put(self.txn, self.env.meta, &k, &v, 0)
        if rc:
            raise self.env.fail(rc, "cannot write to %s" % self.env.path.decode())

    def distinct(self):
        """The number of distinct fingerprints (meta's counter)."""
        raw = self.get(DISTINCT, True)
        return int.from_bytes(raw, "big") if raw else 0

    def count(self):
        """The documents stored."""
        cdef Job job = self.job()
        cdef uint64_t n = 0
        cdef int rc = count_records(&job.w, &n)
        self.done(rc, "read")
        return n

    def index_items(self, bytes after=None, Py_ssize_t limit=4096):
        """Up to ``limit`` (fingerprint, id) entries of the index, 8 bytes
        big-endian each, in order, starting after the entry ``after`` (both,
        joined; from the first: None). Entries out of order are a damaged
        file (a walk in chunks would go round them for ever)."""
        self.check()
        cdef MDB_val k, v, after_k, after_v, last_k, last_v
        cdef bint have_last = after is not None
        cdef Work w = self.work()
        cdef int rc = 0
        out = []
        try:
            if after is None:
                rc = slotted_get(&w, &w.index, &k, &v, MDB_FIRST)
            else:  # the first entry past (fingerprint, key)
                after_k.mv_size, after_k.mv_data = 8, <char*>after
                after_v.mv_size, after_v.mv_data = len(after) - 8, <char*>after + 8
                k, v, last_k, last_v = after_k, after_v, after_k, after_v
                rc = index_seek(&w, &k, &v)
                if rc == 0 and cmp_entry(&k, &v, &after_k, &after_v) == 0:
                    rc = slotted_get(&w, &w.index, &k, &v, MDB_NEXT)
            while rc == 0 and len(out) < limit:
                if have_last and cmp_entry(&k, &v, &last_k, &last_v) <= 0:
                    rc = CORRUPTED
                    break
                last_k, last_v, have_last = k, v, True
                out.append((self._copy(&k), self._copy(&v)))
                rc = slotted_get(&w, &w.index, &k, &v, MDB_NEXT)
        finally:
            slotted_close(&w.index)
        if rc and rc != MDB_NOTFOUND:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return out

    def keys_of(self, uint64_t fp):
        """The keys of the documents indexed under ``fp``, in order."""
        return sorted(self.keys_of_ids(self.ids_of(fp)))

    def ids_of(self, uint64_t fp):
        """The ids indexed under ``fp``, in order."""
        cdef Job job = self.job()
        cdef MDB_val k, v
        cdef uint8_t fp_bytes[8]
        cdef uint64_t id
        cdef int rc
        write_be(fp_bytes, fp, 8)
        k.mv_size, k.mv_data = 8, fp_bytes
        out = []
        rc = slotted_get(&job.w, &job.w.index, &k, &v, MDB_SET)
        while rc == 0:
            rc = read_id(&v, &id)
            if rc == 0:
                out.append(id)
                rc = slotted_get(&job.w, &job.w.index, &k, &v, MDB_NEXT_DUP)
        self.done(0 if rc == MDB_NOTFOUND else rc, "read")
        return out

    def keys_of_ids(self, list ids):
        """The keys of the records ``ids`` (in order: as a sweep reads them best)."""
        cdef Job job = self.job()
        cdef MDB_val key, value
        cdef int rc = open_records(&job.w)
        out = []
        for id in ids if rc == 0 else ():
            rc = read_record(&job.w.rec, id, &key, &value)
            if rc:
                rc = CORRUPTED if rc == MDB_NOTFOUND else rc  # the index names no record
                break
            out.append(self._copy(&key))
        self.done(rc, "read")
        return out

    def table_values(self, Py_ssize_t table):
        """Every fingerprint in permutation table ``table`` (unpermuted), in table order."""
        return self.run_values(table)

    def band_values(self, Py_ssize_t band):
        """Every entry (band key << 32 | a fingerprint's top 32 bits) of band
        ``band`` that a stored document has, in order."""
        return self.run_values(self.env.layout.tables + band)

    cdef object run_values(self, Py_ssize_t table):
        """The fingerprints of a table kept as runs: the union of its runs and
        recent's, less the stale entries (not in the index), unpermuted, in table order;
        or, for a run set after the tables, the entries of that band a
        stored document has (entry_held)."""
        from array import array
        cdef Job job = self.job()
        cdef U64s values
        values.data, values.size, values.cap = NULL, 0, 0
        cdef TableRuns* r
        cdef RunIter it
        cdef uint64_t x
        cdef size_t i, kept = 0
        cdef Py_ssize_t tables = self.env.layout.tables
        cdef bint band = table >= tables
        cdef const long* spec = &IDENTITY_SPEC[0] if band else \
            self.env.layout.spec + 3 * self.env.layout.blocks * table
        cdef Py_ssize_t blocks = 1 if band else self.env.layout.blocks
        cdef int rc
        try:
            with nogil:
                rc = open_cursors(&job.w)
                r = &job.w.table_runs[table]
                for i in range(r.n if rc == 0 else 0):
                    it.cursor, it.dir, it.run = r.cursor[i], r.dir[i], r.id[i]
                    rc = iter_seek(&it, 0)
                    while rc == 0:
                        rc = iter_next(&it, &x)
                        if rc == 0:
                            rc = u64_push(&values, x)
                    rc = 0 if rc == MDB_NOTFOUND else rc
                    if rc:
                        break
                if rc == 0:
                    rc = recent_values(&job.w, table, &values)
                if rc == 0:
                    rc = sort_records(values.data, values.size, 1)
                for i in range(values.size if rc == 0 else 0):
                    if kept and values.data[kept - 1] == values.data[i]:
                        continue
                    x = unpermute_one(values.data[i], spec, blocks)
                    rc = entry_held(&job.w, table - tables, x) if band else index_has(&job.w, x)
                    if rc < 0:
                        break
                    if rc:
                        values.data[kept] = values.data[i]
                        kept += 1
                    rc = 0
                for i in range(kept):
                    values.data[i] = unpermute_one(values.data[i], spec, blocks)
            self.done(rc, "read")
            out = array("Q")
            out.frombytes((<char*>values.data)[:kept * 8] if kept else b"")
            return out
        finally:
            free(values.data)

    cdef Job job(self, object items=None, bint with_values=False):
        """The working state of one batch call, freed with it (``items``: a
        list, or for upsert records.PackedDocuments)."""
        self.check_records()
        cdef Job job = Job.__new__(Job)
        job.w = self.work()
        job.w.band_changes = job.band_changes
        job.w.recent, job.w.fresh = &job.recent, &job.fresh
        if items is not None:
            job.n = len(items)
            job.docs = load_docs(items, with_values) if isinstance(items, list) \
                else load_packed(items)
        return job

    cdef int done(self, int rc, str doing, Job job=None) except -1:
        if job is not None:
            self.index_put_slot, self.key_put_slot = job.w.index.put_slot, job.w.keys.put_slot
            self.untidy = self.untidy or job.w.untidy
            self.runs_written = self.runs_written or job.w.runs_written
        if rc:
            raise self.env.fail(rc, "cannot %s %s" % (doing, self.env.path.decode()))
        return 0

    @property
    def snapshot(self):
        """The id of the commit this transaction reads (or, writing, follows)."""
        self.check()
        return mdb_txn_id(self.txn)

    def search(self, const uint64_t[::1] probes, int distance, int flips):
        """For each probe, [(key, fingerprint, distance)] of every document within
        ``distance``, probing prefixes within ``flips`` bits of the probe's."""
        cdef Job job = self.job()
        cdef Py_ssize_t n = probes.shape[0]
        cdef int rc
        job.w.dirs = self.env.dirs
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0 and n:
                rc = search_many(&job.w, &probes[0], n, distance, flips, &job.hits)
        self.done(rc, "search")
        return self.hits_with_keys(job, n)

    def band_search(self, const uint32_t[::1] bands):
        """For each query (SIGNATURE_BANDS band keys in ``bands``, query after
        query), [(key, fingerprint)] of every document whose fingerprint's top
        32 bits an entry of one of its band keys names: every text document
        that shares a band with it, and any other of those fingerprints."""
        cdef Job job = self.job()
        cdef Py_ssize_t n = bands.shape[0] // SIGNATURE_BANDS
        cdef list results = [[] for _ in range(n)]
        cdef size_t h
        cdef int rc = 0
        if n == 0:
            return results
        job.w.dirs = self.env.dirs
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                rc = band_sweep(&job.w, &bands[0], n, &job.hits)
            if rc == 0:
                for h in range(job.hits.size):  # an entry's fingerprint prefix, once a query
                    job.hits.data[h].fp = (job.hits.data[h].fp & 0xFFFFFFFFULL) << 32
                rc = dedupe_hits(&job.hits)
        self.done(rc, "search")
        self.add_prefix_keys(job, results)
        return results

    cdef int add_prefix_keys(self, Job job, list results) except -1:
        """Append to ``results`` (a list per probe) the (key, fingerprint) of
        every document whose fingerprint starts with a hit's top 32 bits."""
        cdef size_t i
        cdef MDB_val k, v, key, value
        cdef uint64_t id
        cdef uint8_t start[8]
        cdef uint64_t fp
        cdef int rc = 0
        for i in range(job.hits.size):
            found = results[job.hits.data[i].probe]
            write_be(start, job.hits.data[i].fp, 8)
            k.mv_size, k.mv_data = 8, start
            rc = slotted_get(&job.w, &job.w.index, &k, &v, MDB_SET_RANGE)
            while rc == 0 and k.mv_size == 8:
                fp = read_be(<uint8_t*>k.mv_data, 8)
                if (fp >> 32) != (job.hits.data[i].fp >> 32):
                    break
                rc = read_id(&v, &id)
                if rc == 0:
                    rc = read_indexed(&job.w.rec, id, fp, &key, &value)
                if rc:
                    break
                found.append((self._copy(&key), fp))
                rc = slotted_get(&job.w, &job.w.index, &k, &v, MDB_NEXT)
            self.done(0 if rc == MDB_NOTFOUND else rc, "search")
        return 0

    cdef list hits_with_keys(self, Job job, Py_ssize_t n):
        cdef list results = [[] for _ in range(n)]
        self.add_keys(job, results)
        return results

    cdef int add_keys(self, Job job, list results) except -1:
        """Append to ``results`` (a list per probe) one (key, fingerprint,
        distance) for each document that has a hit's fingerprint now."""
        cdef size_t i
        cdef Hit* hit
        cdef Keyed* keyed
        cdef int rc
        with nogil:
            rc = read_keys(&job.w, &job.hits, &job.keyed)
        self.done(rc, "search")
        cdef int collecting = PyGC_Disable()  # lists of new tuples: nothing for it to collect
        try:
            for i in range(job.keyed.size):
                keyed = &job.keyed.data[i]
                hit = &job.hits.data[keyed.hit]
                found = (PyBytes_FromStringAndSize(<char*>job.keyed.bytes + keyed.at, keyed.size),
                         hit.fp, hit.distance)
                PyObject_GC_UnTrack(found)  # of bytes and ints: no cycle to collect
                results[hit.probe].append(found)
        finally:
            if collecting:
                PyGC_Enable()
        return 0

    def upsert(self, documents):
        """Store (key, fingerprint, value) documents (a list, or
        records.PackedDocuments), replacing existing keys."""
        cdef Job job = self.job(documents, True)
        cdef int rc
        job.w.index_committed = not self.changed
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                job.n = sort_unique(job.docs, job.n)
                rc = upsert(&job.w, job.docs, job.n, &job.touched)
            if rc == 0:
                rc = merges(&job.w, job.w.merge_limit, False)
        self.done(rc, "write to", job)

    def remove(self, list keys):
        """Remove the documents ``keys``; returns how many were stored."""
        cdef Job job = self.job(keys, False)
        cdef size_t count = 0
        cdef int rc
        cdef bint unchanged = not self.changed
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                job.n = sort_unique(job.docs, job.n)
                rc = remove(&job.w, job.docs, job.n, &job.touched, &count, unchanged)
        self.done(rc, "write to", job)
        return count

    def insert_if_new(self, list documents, int distance, int flips):
        """For each (key, fingerprint, value) in order: the documents within
        ``distance`` (as search), storing it when there are none."""
        cdef Job job = self.job(documents, True)
        cdef list results = [[] for _ in range(job.n)]
        self.changed = True
        cdef size_t i, j = 0
        cdef int rc
        cdef bint replaced = False
        cdef uint64_t* fps = <uint64_t*>malloc((job.n + 1) * sizeof(uint64_t))
        cdef Hits stored
        stored.data, stored.size, stored.cap = NULL, 0, 0
        if fps == NULL:
            raise MemoryError()
        job.w.pending = &job.pending  # one run a table at the end, not one a stored document
        job.w.dirs = self.env.dirs
        with nogil:
            rc = open_cursors(&job.w)
            for i in range(job.n):
                fps[i] = job.docs[i].fp
            if rc == 0:  # the stored documents near each, for all at once (sweeps)
                rc = search_many(&job.w, fps, job.n, distance, flips, &stored)
            if rc == 0:
                rc = drop_stale(&job.w, &stored)
            i = 0
            while rc == 0 and i < job.n:
                job.hits.size = 0  # the stored ones still there, and the ones this call stored
                while rc == 0 and j < stored.size and stored.data[j].probe == i:
                    rc = hit_push(&job.hits, i, stored.data[j].fp, stored.data[j].distance)
                    j += 1
                if rc == 0:
                    rc = search_pending(&job.w, job.docs[i].fp, distance, i, replaced,
                                        &job.hits)
                if rc == 0 and job.hits.size == 0:
                    rc = upsert(&job.w, &job.docs[i], 1, &job.touched)
                    replaced = replaced or job.w.unlinked
                elif rc == 0:  # the keys as they are now: a later document may move one
                    with gil:
                        self.add_keys(job, results)
                i += 1
            if rc == 0:
                rc = flush_pending(&job.w)
            if rc == 0:
                rc = merges(&job.w, job.w.merge_limit, False)
        free(fps)
        free(stored.data)
        self.done(rc, "write to", job)
        return results

    def tidy(self):
        """One transaction's share of the work batches left (see tidy); returns
        whether there is more."""
        cdef Job job = self.job()
        cdef bint more = False, unchanged = not self.changed
        cdef int rc
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0 and unchanged:  # a rewrite of what removals left sparse, else
                rc = rewrite_sparse(&job.w, &more)  # the index's merges and the tables' share
            if rc == 0 and not more:
                rc = merges(&job.w, 0, unchanged)
            if rc == 0 and not more:
                rc = tidy(&job.w, &more)
        self.runs_written = self.runs_written or job.w.runs_written
        self.index_put_slot, self.key_put_slot = job.w.index.put_slot, job.w.keys.put_slot
        self.done(rc, "write to")
        return more

    def settle(self, uint64_t entries):
        """One transaction's share of settling after a call that wrote
        ``entries`` documents in many batches (see settle); returns whether
        there is more."""
        cdef Job job = self.job()
        cdef bint more = False, unchanged = not self.changed
        cdef int rc
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                rc = settle(&job.w, entries, unchanged, &more)
        self.runs_written = self.runs_written or job.w.runs_written
        self.index_put_slot, self.key_put_slot = job.w.index.put_slot, job.w.keys.put_slot
        self.done(rc, "write to")
        return more

    def copy_into(self, Txn target):
        """Write this snapshot into ``target``'s empty sub-databases in order
        (appending): meta, the records (ids and ``next id`` kept; the
        documents of a database of format 6 or 7 take ids in key order), the
        key map and the index each into its first slot; then the tables and
        the bands as one run each (the bands from the records)."""
        self.check()
        target.check()
        target.changed = True
        cdef int rc, which
        cdef Work source = self.work()
        cdef Work w = target.work()
        cdef bint old = self.env.old_documents
        slot_unsure(&w.keys, 0)  # (what it copies goes there)
        slot_unsure(&w.index, 0)
        try:
            with nogil:
                rc = copy_dbi(self.txn, self.env.meta, target.txn, target.env.meta, False)
                if rc == 0 and old:
                    rc = copy_old_documents(self.txn, self.env.records if self.env.keyed_by_key
                                            else self.env.docs, self.env.keyed_by_key, &w)
                if rc == 0 and not old:
                    rc = open_records(&source)
                if rc == 0 and not old:
                    rc = copy_records(&source.rec, &w, NULL, 0)
                if rc == 0 and not old:
                    rc = slotted_copy(&source, &source.keys, target.txn, target.env.keys[0])
                if rc == 0 and not old:
                    rc = slotted_copy(&source, &source.index, target.txn, target.env.index[0])
                close_cursors(&source)
            if rc:
                raise self.env.fail(rc, "cannot compact %s" % self.env.path.decode())
            with nogil:
                rc = open_cursors(&w)
                if rc == 0:  # one run a table (meta brought the distinct count)
                    rc = rewrite_tables(&w, 0, w.layout.tables)
                if rc == 0:
                    rc = end_rewrite(&w, REWRITE, STALE, 0)
                which = 0
                while rc == 0 and which < SIGNATURE_BANDS:
                    # one run a band, from the documents (meta brought the counters)
                    rc = rewrite_bands(&w, which, min(which + BAND_GROUP, SIGNATURE_BANDS))
                    which += BAND_GROUP
                if rc == 0:
                    rc = end_rewrite(&w, BAND_REWRITE, BAND_STALE, 0)
                if rc == 0:
                    rc = write_counter(&w, REMOVED, 0)
                if rc == 0:  # (the tables and bands hold what recent held)
                    rc = write_counter(&w, RECENT, 0)
            target.runs_written = True
            if rc:
                raise target.env.fail(rc, "cannot write the compacted copy")
        finally:
            close_cursors(&w)


cdef int copy_old_documents(MDB_txn* source, MDB_dbi dbi, bint records, Work* w) noexcept nogil:
    """Write the documents of a database of format 6 (``dbi``: docs, key ->
    value) or 7 (``records``: ``dbi`` its records) into ``w``'s empty records,
    key map and index (their first slots), the ids given in key order; ``next
    id`` follows the last."""
    cdef MDB_cursor* reader = NULL
    cdef MDB_cursor* keys = NULL
    cdef MDB_cursor* index = NULL
    cdef MDB_val k, v, key, value
    cdef Doc* docs = NULL  # each document, pointing into the source's snapshot
    cdef size_t n = 0, room = 0, i
    cdef U64s entries  # (fingerprint, id) of each document
    entries.data, entries.size, entries.cap = NULL, 0, 0
    cdef uint8_t raw[16]
    cdef uint8_t last[8]
    cdef bint have_last = False
    cdef int rc = g_cursor_open(source, dbi, &reader)
    if rc == 0:
        rc = g_cursor_get(reader, &k, &v, MDB_FIRST)
    while rc == 0:
        key, value = k, v
        rc = record_parts(&v, &key, &value) if records else 0
        if rc == 0:
            rc = make_room(<void**>&docs, &room, n, sizeof(Doc))
        if rc == 0:
            docs[n].key, docs[n].key_size = <const uint8_t*>key.mv_data, key.mv_size
            docs[n].value, docs[n].value_size = <const uint8_t*>value.mv_data, value.mv_size
            docs[n].hash, docs[n].seq = hash_bytes(docs[n].key, key.mv_size), n
            rc = CORRUPTED if value_fingerprint(&value, &docs[n].fp) else 0
            n += 1
        if rc == 0:
            rc = g_cursor_get(reader, &k, &v, MDB_NEXT)
    if rc == MDB_NOTFOUND:
        rc = walked_whole(source, dbi, n)
    if rc == 0:
        qsort(docs, n, sizeof(Doc), cmp_doc_key)
        rc = open_records(w)
    if rc == 0:
        rc = g_cursor_open(w.txn, w.keys.dbis[0], &keys)
    for i in range(n if rc == 0 else 0):
        rc = CORRUPTED if i and cmp_key_order(&docs[i - 1], &docs[i]) == 0 else put_record(
            w, i, docs[i].key, docs[i].key_size, docs[i].value, docs[i].value_size, MDB_APPEND)
        write_be(raw, docs[i].hash, 8)
        write_be(raw + 8, i, ID_BYTES)
        k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, raw, ID_BYTES, raw + 8
        if rc == 0:
            rc = append_entry(keys, &k, &v, last, &have_last)
        if rc == 0:
            rc = u64_push(&entries, docs[i].fp)
        if rc == 0:
            rc = u64_push(&entries, i)
        if rc:
            break
    if rc == 0:  # the index's entries by fingerprint (stable: the ids come in order)
        rc = sort_records(entries.data, n, 2)
    if rc == 0:
        rc = g_cursor_open(w.txn, w.index.dbis[0], &index)
    have_last = False
    for i in range(n if rc == 0 else 0):
        write_be(raw, entries.data[2 * i], 8)
        write_be(raw + 8, entries.data[2 * i + 1], ID_BYTES)
        k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, raw, ID_BYTES, raw + 8
        rc = append_entry(index, &k, &v, last, &have_last)
        if rc:
            break
    if rc == 0:
        rc = flush_records(w)
    if rc == 0:
        rc = write_counter(w, NEXT_ID, n)
    close_two(reader, keys)
    if index != NULL:
        mdb_cursor_close(index)
    free(docs)
    free(entries.data)
    return rc


cdef int distinct_fingerprints(Work* w, U64s* out) noexcept nogil:
    cdef MDB_val k, v
    cdef int rc = slotted_get(w, &w.index, &k, &v, MDB_FIRST)
    while rc == 0:
        if k.mv_size != 8:
            return -30796
        rc = u64_push(out, read_be(<uint8_t*>k.mv_data, 8))
        if rc == 0:
            rc = slotted_get(w, &w.index, &k, &v, MDB_NEXT_NODUP)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int copy_dbi(MDB_txn* source, MDB_dbi from_dbi, MDB_txn* target, MDB_dbi to_dbi,
                  bint dupsort) noexcept nogil:
    """Append every entry of one sub-database to an empty one."""
    cdef MDB_cursor* reader
    cdef MDB_cursor* writer
    cdef MDB_val k, v
    cdef int rc = g_cursor_open(source, from_dbi, &reader)
    if rc:
        return rc
    rc = g_cursor_open(target, to_dbi, &writer)
    if rc:
        mdb_cursor_close(reader)
        return rc
    cdef int op_rc
    cdef size_t walked = 0
    rc = g_cursor_get(reader, &k, &v, MDB_FIRST)
    while rc == 0:
        op_rc = g_cursor_put(writer, &k, &v, MDB_APPEND)
        if op_rc == MDB_KEYEXIST and dupsort:
            op_rc = g_cursor_put(writer, &k, &v, MDB_APPENDDUP)
        if op_rc:
            rc = op_rc
            break
        walked += 1
        rc = g_cursor_get(reader, &k, &v, MDB_NEXT)
    mdb_cursor_close(reader)
    mdb_cursor_close(writer)
    return walked_whole(source, from_dbi, walked) if rc == MDB_NOTFOUND else rc
