# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi, _buffers.pxi,
# _work.pxi, _slotted.pxi, _merges.pxi, _tidy.pxi, _recent.pxi.

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from clmdb cimport pthread_create, pthread_join, pthread_t


# Writes: documents, the fingerprint index and the tables in step

cdef int touch(Work* w, U64s* touched, uint64_t fp) noexcept nogil:
    """Note ``fp`` as changed, with whether the index had it before this batch
    (the first note of a fingerprint is taken before any of its changes)."""
    cdef int had = 0 if w.index_was_empty else index_has(w, fp)
    return had if had < 0 else note_touched(touched, fp, had)


cdef int note_touched(U64s* touched, uint64_t fp, bint had) noexcept nogil:
    """Note ``fp`` as changed, with whether the index ``had`` it before this batch."""
    cdef int rc = u64_push(touched, fp)
    return rc if rc else u64_push(touched, <uint64_t>had)


cdef int update_tables(Work* w, U64s* touched) noexcept nogil:
    """Put the touched fingerprints the index has gained into the call's new
    run entries (``w.fresh``, for recent or every table: store_fresh), or
    insert_if_new's pending ones, and take out those it has lost."""
    cdef size_t n = touched.size // 2, i, added = 0, removed = 0
    cdef uint64_t* pairs = touched.data
    cdef uint64_t* add
    cdef uint64_t* rem
    cdef int rc = 0, now
    cdef bint had
    if n == 0:
        return 0
    rc = sort_records(pairs, n, 2)  # stable: each fingerprint's first note first
    add = <uint64_t*>malloc(n * sizeof(uint64_t))
    rem = <uint64_t*>malloc(n * sizeof(uint64_t))
    if add == NULL or rem == NULL:
        rc = NO_MEMORY
    i = 0
    while rc == 0 and i < n:
        had = pairs[2 * i + 1]
        now = index_has(w, pairs[2 * i]) if w.unlinked else 1
        if now < 0:
            rc = now
        elif now and not had:
            add[added] = pairs[2 * i]
            added += 1
        elif had and not now:
            rem[removed] = pairs[2 * i]
            removed += 1
        i += 1
        while i < n and pairs[2 * i] == pairs[2 * i - 2]:
            i += 1
    for i in range(added):  # removals leave stale entries (see drop_stale)
        if rc == 0:
            rc = u64_push(w.pending if w.pending != NULL else &w.fresh.groups[FINGERPRINTS], add[i])
    if rc == 0 and added != removed:
        rc = add_to_counter(w, DISTINCT, <int64_t>added - <int64_t>removed)
    if rc == 0 and removed:
        rc = add_to_counter(w, STALE, removed)
    if rc == 0 and w.pending == NULL:
        rc = note_if_stale(w)
    free(add)
    free(rem)
    touched.size = 0
    return rc


cdef struct TableSort:  # one table's new run, permuted and sorted (sort_table)
    const uint64_t* fps
    size_t n
    const long* spec
    Py_ssize_t blocks
    uint64_t* perms
    int rc


cdef void* sort_table(void* arg) noexcept nogil:
    cdef TableSort* job = <TableSort*>arg
    cdef size_t i
    for i in range(job.n):
        job.perms[i] = permute_one(job.fps[i], job.spec, job.blocks)
    job.rc = sort_records(job.perms, job.n, 1)
    return NULL


cdef size_t SORT_AHEAD_FROM = 65536  # entries from which a thread sorts the next table


cdef int append_runs(Work* w, const uint64_t* fps, size_t n, uint64_t* perms) noexcept nogil:
    """Append ``fps`` to every table as a new run (add_run); ``perms`` holds
    ``n``. For a large run, another thread permutes and sorts the next table's
    while this one writes a table's (LMDB's writes stay on this thread)."""
    cdef TableSort jobs[2]
    cdef TableSort* cur
    cdef TableSort* nxt
    cdef pthread_t ahead
    cdef bint ahead_started, last, threaded = n >= SORT_AHEAD_FROM and w.layout.tables > 1
    cdef Py_ssize_t t
    cdef int rc = 0
    cdef uint64_t* spare = <uint64_t*>malloc(n * sizeof(uint64_t)) if threaded else NULL
    if threaded and spare == NULL:
        threaded = False
    for t in range(2):
        jobs[t].fps, jobs[t].n, jobs[t].blocks = fps, n, w.layout.blocks
        jobs[t].perms = spare if t == 1 and threaded else perms
    jobs[0].spec = w.layout.spec
    sort_table(&jobs[0])
    rc = jobs[0].rc
    for t in range(w.layout.tables):
        if rc:
            break
        cur, nxt = &jobs[t % 2], &jobs[(t + 1) % 2]
        last = t + 1 == w.layout.tables
        nxt.spec = w.layout.spec + 3 * w.layout.blocks * (t + 1)
        ahead_started = threaded and not last and \
            pthread_create(&ahead, NULL, sort_table, nxt) == 0
        rc = add_run(w, t, cur.perms, n)
        if ahead_started:
            pthread_join(ahead, NULL)
        elif rc == 0 and not last:
            sort_table(nxt)
        if rc == 0 and not last:
            rc = nxt.rc
    free(spare)
    return rc


cdef int flush_pending(Work* w) noexcept nogil:
    """Store the fingerprints insert_if_new added (still in the index) with the
    call's other new run entries (store_fresh)."""
    cdef U64s* p = w.pending
    cdef size_t i
    cdef int rc = sort_records(p.data, p.size, 1)
    for i in range(p.size if rc == 0 else 0):
        if i and p.data[i - 1] == p.data[i]:
            continue
        rc = index_has(w, p.data[i])
        if rc < 0:
            return rc
        if rc:
            rc = u64_push(&w.fresh.groups[FINGERPRINTS], p.data[i])
            if rc:
                return rc
    if rc == 0:
        rc = store_fresh(w, False)
    return rc if rc or p.size == 0 else note_if_stale(w)
