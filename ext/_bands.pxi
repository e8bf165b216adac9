# A part of _lmdb.pyx, which includes the parts in order; it builds on _values.pxi,
# _signature.pxi, _runs.pxi, _buffers.pxi, _work.pxi, _search.pxi, _slotted.pxi, _merges.pxi,
# _recent.pxi.

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset
from bits cimport read_be, write_be
from clmdb cimport g_cursor_get, g_get, MDB_FIRST, MDB_NEXT, MDB_NOTFOUND, MDB_SET_RANGE, MDB_val


# The band index: band b holds an entry (a text's band key b << 32 | its
# fingerprint's top 32 bits) for each stored text document, kept as runs
# exactly as a table keeps its permuted fingerprints (run set tables + b, the
# identity permutation): a run a batch, merges by size. A removal leaves its
# entries in the runs, counted in meta's ``band stale``: a search confirms
# what it finds by the signatures, and once the stale entries could reach
# 1/RUN_RATIO of the bands' entries, the bands are written again from the
# documents, BAND_GROUP bands a transaction (``band rewrite``: the next band
# and the stale count it began with).

cdef bytes band_stale_key = lmdb_format.BAND_STALE, band_rewrite_key = lmdb_format.BAND_REWRITE
cdef const char* BAND_STALE = band_stale_key
cdef const char* BAND_REWRITE = band_rewrite_key

cdef enum:
    BAND_GROUP = 8  # bands a rewrite writes in one transaction (a pass over the documents)

cdef long IDENTITY_SPEC[3]  # a one-block "permutation" that leaves an entry as it is
IDENTITY_SPEC[0], IDENTITY_SPEC[1], IDENTITY_SPEC[2] = 0, 64, 0


cdef int note_bands(Work* w, const uint8_t* value, size_t size, uint64_t fp,
                    bint added) noexcept nogil:
    """Note the band entries of a document value (none for a document without
    a signature) as brought to or taken from the bands."""
    cdef const uint8_t* signature
    cdef size_t signature_bytes = 0
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef int b, rc = 0
    signature = value_signature(value, size, &signature_bytes)
    if signature == NULL or signature_bands(signature, signature_bytes, keys) == 0:
        return 0
    for b in range(SIGNATURE_BANDS):
        rc = u64_push(&w.band_changes[b], ((<uint64_t>keys[b]) << 32) | (fp >> 32))
        if rc == 0:
            rc = u64_push(&w.band_changes[b], added)
        if rc:
            return rc
    return 0


cdef int update_bands(Work* w) noexcept nogil:
    """Add to the call's new run entries (``w.fresh``) the entries the batch's
    documents brought that no document it took away had (those are in the
    runs already), and count as stale the entries it took away that none it
    brought has; outside insert_if_new (which stores them at its end), store
    them (store_fresh)."""
    cdef U64s* changes
    cdef size_t n, i, j
    cdef uint64_t entry, stale = 0
    cdef bint brought, taken
    cdef int b, rc = 0
    for b in range(SIGNATURE_BANDS):
        changes = &w.band_changes[b]
        n = changes.size // 2
        if n:
            rc = sort_records(changes.data, n, 2)
        i = 0
        while rc == 0 and i < n:
            entry, brought, taken, j = changes.data[2 * i], False, False, i
            while j < n and changes.data[2 * j] == entry:
                brought = brought or changes.data[2 * j + 1]
                taken = taken or not changes.data[2 * j + 1]
                j += 1
            if brought and not taken:
                rc = u64_push(&w.fresh.groups[b], entry)
            elif taken and not brought:
                stale += 1
            i = j
        changes.size = 0
        if rc:
            return rc
    if stale:
        rc = add_to_counter(w, BAND_STALE, stale)
    if rc == 0 and w.pending == NULL:
        rc = store_fresh(w, False)
    cdef bint due = False
    if rc == 0:
        rc = band_rewrite_due(w, &due)
    w.untidy = w.untidy or due
    return rc


cdef int band_rewrite_due(Work* w, bint* due) noexcept nogil:
    """Whether a rewrite of the bands is under way, or due: the stale entries
    could exceed 1/RUN_RATIO of the entries of the bands' runs."""
    cdef MDB_val k = meta_key(BAND_REWRITE), v
    cdef uint64_t stale, entries = 0
    cdef Py_ssize_t b
    cdef size_t i
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    due[0] = rc == 0
    if rc != MDB_NOTFOUND:
        return rc
    rc = read_counter(w, BAND_STALE, &stale)
    for b in range(w.layout.tables, run_sets(w)):
        for i in range(w.table_runs[b].n):
            entries += w.table_runs[b].entries[i]
    due[0] = rc == 0 and stale * RUN_RATIO > entries
    return rc


cdef int rewrite_bands(Work* w, int first, int end) noexcept nogil:
    """Write bands ``first`` to ``end`` again from the documents' signatures,
    each as one run (its stale entries gone): one pass over the records."""
    cdef U64s entries[BAND_GROUP]
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef const uint8_t* signature
    cdef size_t signature_bytes = 0
    cdef uint64_t fp, id
    cdef MDB_val k, v
    cdef int b, rc = 0
    memset(entries, 0, sizeof(entries))
    if end - first > BAND_GROUP:
        return CORRUPTED
    rc = flush_records(w)
    if rc == 0:
        rc = record_next(&w.rec, True, &id, &k, &v)
    while rc == 0:
        if value_fingerprint(&v, &fp) != 0:
            rc = CORRUPTED
            break
        signature = value_signature(<const uint8_t*>v.mv_data, v.mv_size, &signature_bytes)
        if signature != NULL and signature_bands(signature, signature_bytes, keys):
            for b in range(first, end):
                if rc == 0:
                    rc = u64_push(&entries[b - first], ((<uint64_t>keys[b]) << 32) | (fp >> 32))
        if rc == 0:
            rc = record_next(&w.rec, False, &id, &k, &v)
    rc = 0 if rc == MDB_NOTFOUND else rc
    for b in range(first, end):
        if rc == 0:
            rc = sort_records(entries[b - first].data, entries[b - first].size, 1)
        if rc == 0:
            rc = rewrite_run_set(w, w.layout.tables + b, entries[b - first].data,
                                 entries[b - first].size)
    for b in range(end - first):
        free(entries[b].data)
    return rc


cdef int tidy_bands(Work* w, bint* did) noexcept nogil:
    """The next BAND_GROUP bands of a rewrite of the bands, under way or due
    (band_rewrite_due); ``did``: whether there was one."""
    cdef uint64_t stale, next_band = 0, began
    cdef bint found
    did[0] = False
    cdef int rc = band_rewrite_due(w, did)
    if rc or not did[0]:
        return rc
    rc = read_counter(w, BAND_STALE, &stale)
    began = stale
    if rc == 0:
        rc = read_marker(w, BAND_REWRITE, SIGNATURE_BANDS, &found, &next_band, &began)
    if rc == 0:
        rc = flush_recent(w)
    if rc == 0:
        rc = rewrite_bands(w, next_band, min(next_band + BAND_GROUP, SIGNATURE_BANDS))
    if rc == 0:  # removals since the rewrite began stay counted
        rc = step_rewrite(w, BAND_REWRITE, BAND_STALE, next_band + BAND_GROUP, SIGNATURE_BANDS,
                          began, stale)
    return rc


cdef int band_sweep(Work* w, const uint32_t* keys, size_t n, Hits* out) noexcept nogil:
    """For each of ``n`` queries (SIGNATURE_BANDS band keys each), a hit
    (query, entry) for every entry of the bands' runs and recent under one of
    its keys: each band's ranges sorted and swept over its runs once."""
    cdef U64s ranges
    cdef uint64_t first
    cdef size_t i
    cdef int b, rc = 0
    ranges.data, ranges.size, ranges.cap = NULL, 0, 0
    for b in range(SIGNATURE_BANDS):
        ranges.size = 0
        for i in range(n):
            first = (<uint64_t>keys[i * SIGNATURE_BANDS + b]) << 32
            if rc == 0:
                rc = u64_push(&ranges, first)
            if rc == 0:
                rc = u64_push(&ranges, first | 0xFFFFFFFFULL)
            if rc == 0:
                rc = u64_push(&ranges, 0)
            if rc == 0:
                rc = u64_push(&ranges, i)
        if rc == 0:
            rc = sort_records(ranges.data, n, 4)
        if rc == 0:
            rc = sweep_runs(&w.table_runs[w.layout.tables + b], ranges.data, n, 64,
                            IDENTITY_SPEC, 1, out)
        if rc == 0:
            rc = recent_band_hits(w, b, ranges.data, n, out)
        if rc:
            break
    free(ranges.data)
    return rc


cdef int entry_held(Work* w, int band, uint64_t entry) noexcept nogil:
    """1 if a stored document (as the index is now) has band entry ``entry`` in
    band ``band``, 0 if none, or an LMDB error."""
    cdef uint8_t start[8]
    cdef MDB_val k, v, key, value
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef const uint8_t* signature
    cdef size_t signature_bytes = 0
    cdef uint64_t id
    cdef int rc
    write_be(start, (entry & 0xFFFFFFFFULL) << 32, 8)
    k.mv_size, k.mv_data = 8, start
    rc = slotted_get(w, &w.index, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 8:
            return CORRUPTED
        if (read_be(<uint8_t*>k.mv_data, 8) >> 32) != (entry & 0xFFFFFFFFULL):
            return 0
        rc = read_id(&v, &id)
        if rc == 0:
            rc = read_record(&w.rec, id, &key, &value)
        if rc == 0:
            signature = value_signature(<uint8_t*>value.mv_data, value.mv_size,
                                        &signature_bytes)
            if signature != NULL and signature_bands(signature, signature_bytes, keys) and \
                    keys[band] == (entry >> 32):
                return 1
        elif rc != MDB_NOTFOUND:
            return rc
        rc = slotted_get(w, &w.index, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc
