# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi, _codec.pxi,
# _buffers.pxi, _work.pxi, _merges.pxi, _recent.pxi, _upsert.pxi, _txn.pxi.

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strlen
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_del, g_drop, g_get, g_put, g_stat, g_txn_begin, MDB_dbi, MDB_NOTFOUND, MDB_RDONLY,
    MDB_stat, MDB_txn, mdb_txn_abort, mdb_txn_env, mdb_txn_id, MDB_val,
)


# meta's counters (read_counter), named in format.py
cdef bytes distinct_key = lmdb_format.DISTINCT, stale_key = lmdb_format.STALE
cdef bytes rewrite_key = lmdb_format.REWRITE, run_ids_key = lmdb_format.RUN_IDS
cdef bytes removed_key = lmdb_format.REMOVED, next_id_key = lmdb_format.NEXT_ID
cdef const char* DISTINCT = distinct_key  # the distinct fingerprints
cdef const char* STALE = stale_key  # fingerprints removed since the tables were written whole
cdef const char* REWRITE = rewrite_key  # a rewrite of the tables under way (tidy)
cdef const char* RUN_IDS = run_ids_key  # the highest run id a rewrite dropped (see add_run)
cdef const char* REMOVED = removed_key  # documents removed since rewrite_sparse
cdef const char* NEXT_ID = next_id_key  # the id the next new document takes


cdef inline MDB_val meta_key(const char* name) noexcept nogil:
    cdef MDB_val k
    k.mv_size, k.mv_data = strlen(name), <char*>name
    return k


cdef int read_counter(Work* w, const char* name, uint64_t* value) noexcept nogil:
    """A counter in meta (8 bytes big-endian, 0 where absent): ``distinct``,
    the distinct fingerprints, and ``stale``, the fingerprints taken out of
    the index since the tables were last written whole (a bound on their
    stale entries)."""
    cdef uint8_t buf[8]
    cdef MDB_val k = meta_key(name), v
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    if rc == MDB_NOTFOUND:
        value[0] = 0
        return 0
    if rc == 0 and (v.mv_size != 8 or g_copy(buf, v.mv_data, 8)):
        return CORRUPTED
    value[0] = read_be(buf, 8)
    return rc


cdef int write_counter(Work* w, const char* name, uint64_t value) noexcept nogil:
    cdef uint8_t buf[8]
    cdef MDB_val k = meta_key(name), v
    write_be(buf, value, 8)
    v.mv_size, v.mv_data = 8, buf
    return g_put(w.txn, w.meta, &k, &v, 0)


cdef int add_to_counter(Work* w, const char* name, int64_t change) noexcept nogil:
    cdef uint64_t value
    cdef int rc = read_counter(w, name, &value)
    return rc if rc else write_counter(w, name, value + <uint64_t>change)


cdef int note_if_stale(Work* w) noexcept nogil:
    """Note for tidy a rewrite of the tables under way, or due (the stale
    entries may exceed 1/RUN_RATIO of the distinct fingerprints), or one of the
    documents (sparse_due)."""
    cdef uint64_t stale, distinct
    cdef bint sparse
    cdef MDB_val k = meta_key(REWRITE), v
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    if rc == 0:
        w.untidy = True
    if rc != MDB_NOTFOUND:
        return rc
    rc = read_counter(w, STALE, &stale)
    if rc == 0:
        rc = read_counter(w, DISTINCT, &distinct)
    if rc == 0:
        rc = sparse_due(w, &sparse)
    w.untidy = w.untidy or (rc == 0 and (sparse or stale * RUN_RATIO > distinct))
    return rc


cdef int rewrite_run_set(Work* w, Py_ssize_t t, const uint64_t* values, size_t count) noexcept nogil:
    """Write run set ``t`` as one run of the sorted ``values``, dropping its runs
    (their ids noted in meta's ``run ids``: never given again)."""
    cdef uint8_t slots[RUN_SLOTS]
    cdef size_t i, n = w.table_runs[t].n
    cdef uint64_t dropped = 0
    cdef int rc = read_counter(w, RUN_IDS, &dropped) if n else 0
    if rc == 0 and n and w.table_runs[t].id[n - 1] > dropped:
        rc = write_counter(w, RUN_IDS, w.table_runs[t].id[n - 1])
    w.runs_written = True
    for i in range(n):
        slots[i] = w.table_runs[t].slot[i]
    close_runs(&w.table_runs[t])
    for i in range(n):
        if rc == 0:
            rc = g_drop(w.txn, w.run_slots[t * RUN_SLOTS + slots[i]], 0)
    return rc if rc else add_run(w, t, values, count)


cdef int rewrite_table(Work* w, Py_ssize_t t, const U64s* fps, uint64_t* perms) noexcept nogil:
    """Write table ``t`` as one run of the index's fingerprints ``fps``, dropping
    its runs; ``perms`` has room for them."""
    cdef size_t i
    cdef int rc = 0
    for i in range(fps.size):
        perms[i] = permute_one(fps.data[i], w.layout.spec + 3 * w.layout.blocks * t,
                               w.layout.blocks)
    if fps.size:
        rc = sort_records(perms, fps.size, 1)
    return rc if rc else rewrite_run_set(w, t, perms, fps.size)


cdef int rewrite_tables(Work* w, Py_ssize_t first, Py_ssize_t end) noexcept nogil:
    """Rewrite tables ``first`` to ``end`` (rewrite_table) from the index."""
    cdef U64s fps
    fps.data, fps.size, fps.cap = NULL, 0, 0
    cdef uint64_t* perms = NULL
    cdef Py_ssize_t t
    cdef int rc = distinct_fingerprints(w, &fps)
    if rc == 0:  # (a copy of a file without the count, such as one of 0.3, gets it)
        rc = write_counter(w, DISTINCT, fps.size)
    if rc == 0:
        perms = <uint64_t*>malloc((fps.size + 1) * sizeof(uint64_t))
        if perms == NULL:
            rc = NO_MEMORY
    for t in range(first, end):
        if rc == 0:
            rc = rewrite_table(w, t, &fps, perms)
    free(fps.data)
    free(perms)
    return rc


cdef int read_marker(Work* w, const char* name, uint64_t end, bint* found, uint64_t* next,
                     uint64_t* began) noexcept nogil:
    """The marker ``name`` of a rewrite under way in meta (16 bytes: the next
    table or band, below ``end``, and the stale count the rewrite began with),
    where ``found``; ``next`` and ``began`` are left as they are where not."""
    cdef uint8_t marker[16]
    cdef MDB_val k = meta_key(name), v
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    found[0] = rc == 0
    if rc:
        return 0 if rc == MDB_NOTFOUND else rc
    if v.mv_size != 16 or g_copy(marker, v.mv_data, 16):
        return CORRUPTED
    next[0], began[0] = read_be(marker, 8), read_be(marker + 8, 8)
    return CORRUPTED if next[0] >= end else 0


cdef int step_rewrite(Work* w, const char* name, const char* counter, uint64_t next,
                      uint64_t end, uint64_t began, uint64_t stale) noexcept nogil:
    """Move the marker ``name`` of a rewrite on to ``next``; where that reaches
    ``end``, end the rewrite with the removals since it began (``stale`` less
    ``began``) left in the counter ``counter``."""
    cdef uint8_t marker[16]
    cdef MDB_val k = meta_key(name), v
    if next >= end:
        return end_rewrite(w, name, counter, stale - began if stale > began else 0)
    write_be(marker, next, 8)
    write_be(marker + 8, began, 8)
    v.mv_size, v.mv_data = 16, marker
    return g_put(w.txn, w.meta, &k, &v, 0)


cdef int end_rewrite(Work* w, const char* name, const char* counter, uint64_t stale) noexcept nogil:
    """Note a rewrite done: no marker ``name`` under way, ``stale`` left in ``counter``."""
    cdef MDB_val k = meta_key(name)
    cdef int rc = g_del(w.txn, w.meta, &k, NULL)
    return write_counter(w, counter, stale) if rc == 0 or rc == MDB_NOTFOUND else rc


cdef int sparse_due(Work* w, bint* due) noexcept nogil:
    """Whether the documents removed since rewrite_sparse (meta ``removed``)
    are over 1/RUN_RATIO of the documents."""
    cdef uint64_t removed, records = 0
    cdef int rc = read_counter(w, REMOVED, &removed)
    if rc == 0:
        rc = count_records(w, &records)
    due[0] = rc == 0 and removed * RUN_RATIO > records
    return rc


cdef int rewrite_sparse(Work* w, bint* done) noexcept nogil:
    """Once the documents removed reach 1/RUN_RATIO of the documents (sparse_due),
    write the records and the key map's and index's slots again, each emptied and appended in order from a snapshot of the last commit. LMDB
    merges a leaf only below a quarter full, so removals at random leave those
    B-trees' leaves sparse, and new documents made the file grow round after
    round. Only as a write transaction's first change, when it holds what that
    snapshot holds (tidy's). ``done``: whether it rewrote them."""
    cdef MDB_txn* last = NULL
    cdef bint due
    cdef int rc = sparse_due(w, &due)
    done[0] = False
    if rc or not due or g_txn_begin(mdb_txn_env(w.txn), NULL, MDB_RDONLY, &last):
        return rc  # (no reader slot for the snapshot: the next tidy tries again)
    if mdb_txn_id(last) + 1 == mdb_txn_id(w.txn):  # (always: the write lock is held)
        rc = write_without(w, last, NULL, NULL, 0)
        done[0] = rc == 0
    mdb_txn_abort(last)
    return rc


cdef int tidy(Work* w, bint* more) noexcept nogil:
    """One transaction's share of what batches left: the next table of a rewrite
    of the tables (begun once the stale entries may exceed 1/RUN_RATIO of the
    distinct fingerprints; meta ``rewrite`` holds the next table and the stale
    count it began with), else the next bands of a rewrite of the bands
    (tidy_bands), else the tables' and bands' deferred merges until they have taken
    about a table's entries, so the file needs room for the tables and about one
    more, not two copies of them all. ``more``: whether to call again."""
    cdef uint64_t stale, distinct, next_table = 0, began = 0
    cdef Py_ssize_t t
    cdef bint rewriting = False
    more[0] = False
    cdef int rc = read_marker(w, REWRITE, w.layout.tables, &rewriting, &next_table, &began)
    if rc:
        return rc
    rc = read_counter(w, STALE, &stale)
    if rc == 0:
        rc = read_counter(w, DISTINCT, &distinct)
    if rc == 0 and not rewriting and stale * RUN_RATIO > distinct:
        rewriting, began = True, stale
    more[0] = rewriting
    if rc or rewriting:
        if rc == 0:  # (a value both in recent and in the index's run would be there twice)
            rc = flush_recent(w)
        if rc == 0:
            rc = rewrite_tables(w, next_table, next_table + 1)
        if rc == 0:  # removals since the rewrite began stay counted
            rc = step_rewrite(w, REWRITE, STALE, next_table + 1, w.layout.tables, began, stale)
        return rc
    cdef bint banded = False
    rc = tidy_bands(w, &banded)
    if rc or banded:
        more[0] = True
        return rc
    cdef uint64_t budget = distinct if distinct > w.merge_limit else w.merge_limit
    w.merge_limit = 0
    return merge_run_sets(w, budget, more)


cdef int merge_run_sets(Work* w, uint64_t budget, bint* more) noexcept nogil:
    """The merges due in every run set (settling: settle_due; else
    merges_left), until this transaction's merges have taken ``budget``
    entries (``more``: some are left)."""
    cdef Py_ssize_t t
    cdef TableRuns* r
    cdef int rc = 0
    for t in range(run_sets(w)):
        r = &w.table_runs[t]
        if settle_due(r, w.settle) if w.settle else merges_left(r, t >= w.layout.tables):
            if w.merged >= budget:
                more[0] = True
                break
            rc = add_run(w, t, NULL, 0)
            if rc:
                break
    return rc


cdef int settle(Work* w, uint64_t entries, bint committed, bint* more) noexcept nogil:
    """One transaction's share of settling after a call that wrote ``entries``
    documents in many batches: the smallest slots of the index merged while
    they hold at most ``entries`` together, then (in a transaction of its own,
    so that the file needs room for one copy more of one of them) the key
    map's likewise; then in every run set the two newest runs merged while
    they hold at most ``entries`` together, until the merges have taken about
    a table's entries (``more``: whether to call again; ``committed``: as for
    merges). No merge takes more than ``entries``; recent stays as it is.
    What a bulk load leaves is then about a run a table."""
    cdef uint64_t distinct
    more[0] = False
    cdef int rc = read_counter(w, DISTINCT, &distinct)
    w.settle, w.merge_limit = entries, entries
    if rc == 0:
        rc = slotted_merges(w, &w.index, entries, committed)
    if rc == 0 and w.merged == 0:
        rc = slotted_merges(w, &w.keys, entries, committed)
    more[0] = w.merged != 0
    if rc == 0 and w.merged == 0:
        rc = merge_run_sets(w, max(distinct, entries), more)
    w.settle = 0
    return rc
