# A part of _lmdb.pyx, which includes the parts in order; it builds on _runs.pxi, _codec.pxi,
# _work.pxi, _recent.pxi.

from libc.stdint cimport intptr_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.stdlib cimport posix_memalign
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_get, MDB_cursor, MDB_dbi, MDB_NEXT, MDB_NOTFOUND, MDB_SET_RANGE,
    MDB_txn, MDB_val, pthread_mutex_lock, pthread_mutex_t, pthread_mutex_unlock,
)


# An Env's block directories (BlockDir), one a run slot of each table and band: built
# by a search from a snapshot that holds only committed runs, kept while the
# run is live (set_mapsize moves them with the map, dir_rebase), and
# shared by the Env's threads. A directory is matched by its run's id, slot and
# entries: run ids are never given twice in a table (add_run).
#
# The cache also keeps the last read snapshot's runs (a RunsView: every
# table's runs, each with its directory), so that the searches of later read
# snapshots of the same committed transaction (the same txn id) read no run
# directory from the file and take no directory lock a run.

cdef struct RunsView


cdef enum:
    RUN_SETS = MAX_TABLES + SIGNATURE_BANDS  # what keeps runs: the tables, then the bands


cdef struct DirCache:
    pthread_mutex_t lock
    BlockDir* dirs[RUN_SETS * RUN_SLOTS]
    RunsView* view
    uint64_t sought[RUN_SETS * RUN_SLOTS]      # seeks searches made in the slot's run without a directory
    uint32_t sought_run[RUN_SETS * RUN_SLOTS]  # the run they were made in
    uint64_t built  # directories built
    uint64_t skipped  # ranges searches skipped by a run's prefix filter (added atomically)


cdef void dir_free(BlockDir* d) noexcept nogil:
    free(d.firsts)
    free(d.data)
    free(d.sizes)
    free(d.tops)
    free(d.filter)
    free(d)


cdef inline bint dir_unref(BlockDir* d) noexcept nogil:
    """Drop one reference to ``d`` (the cache's lock held): whether it was the last."""
    d.refs -= 1
    return d.refs == 0


cdef void dir_release(DirCache* cache, BlockDir* d) noexcept nogil:
    """Drop one holder's reference to ``d``; the last frees it."""
    pthread_mutex_lock(&cache.lock)
    cdef bint last = dir_unref(d)
    pthread_mutex_unlock(&cache.lock)
    if last:
        dir_free(d)


cdef BlockDir* dir_acquire(DirCache* cache, size_t at, uint32_t run,
                          uint64_t entries) noexcept nogil:
    """The cached directory of run ``run`` (with ``entries``) in slot ``at``
    (run set * RUN_SLOTS + slot), referenced for the caller, or NULL."""
    pthread_mutex_lock(&cache.lock)
    cdef BlockDir* d = cache.dirs[at]
    if d != NULL and d.run == run and d.entries == entries:
        d.refs += 1
    else:
        d = NULL
    pthread_mutex_unlock(&cache.lock)
    return d


cdef void dir_publish(DirCache* cache, size_t at, BlockDir* d) noexcept nogil:
    """Cache ``d`` (held by the caller) for slot ``at``, in place of the last."""
    pthread_mutex_lock(&cache.lock)
    cdef BlockDir* old = cache.dirs[at]
    cache.dirs[at] = d
    d.refs += 1
    cache.built += 1
    cdef bint last = old != NULL and dir_unref(old)
    pthread_mutex_unlock(&cache.lock)
    if last:
        dir_free(old)


cdef bint dir_rented(DirCache* cache, size_t at, uint32_t run, uint64_t seeks,
                     uint64_t enough) noexcept nogil:
    """Count ``seeks`` made in run ``run`` of slot ``at`` without a directory:
    whether the run's searches have made ``enough`` (0: never), so that its
    directory, read once, costs no more than the seeks made without it."""
    pthread_mutex_lock(&cache.lock)
    if cache.sought_run[at] != run:
        cache.sought_run[at], cache.sought[at] = run, 0
    cache.sought[at] += seeks
    cdef bint paid = enough != 0 and cache.sought[at] >= enough
    pthread_mutex_unlock(&cache.lock)
    return paid


cdef void dir_clear(DirCache* cache, bint last) noexcept nogil:
    """Drop every cached directory and the cached view (their holders keep
    theirs). ``last``: the cache's end, when nothing else holds one, and a fork
    child's lock may have been taken by a thread it does not have: no lock then."""
    cdef BlockDir* d
    cdef size_t at
    if not last:
        pthread_mutex_lock(&cache.lock)
    for at in range(RUN_SETS * RUN_SLOTS):
        d = cache.dirs[at]
        cache.dirs[at] = NULL
        if d != NULL and dir_unref(d):
            dir_free(d)
    view_drop(cache)
    if not last:
        pthread_mutex_unlock(&cache.lock)


cdef void dir_rebase(DirCache* cache, MDB_txn* txn, const MDB_dbi* slots) noexcept nogil:
    """Move every cached directory with the map (set_mapsize, no transaction
    of this process running), so that none is read again: its first block,
    found in snapshot ``txn`` (in ``slots``, a dbi a run slot), says where its
    blocks are now. One whose block is gone, or not of its size, is dropped,
    and so is the cached view (the next snapshot's search makes one)."""
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef BlockDir* d
    cdef intptr_t moved
    cdef size_t at, i
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key
    pthread_mutex_lock(&cache.lock)
    for at in range(RUN_SETS * RUN_SLOTS):
        d = cache.dirs[at]
        if d == NULL or d.n == 0:
            continue
        write_be(key, d.run, 4)
        write_be(key + 4, d.firsts[0], 8)
        if g_get(txn, slots[at], &k, &v) == 0 and v.mv_size == d.sizes[0] + SUM_BYTES:
            moved = <intptr_t>v.mv_data - <intptr_t>d.data[0]
            for i in range(d.n):
                d.data[i] = <const uint8_t*>(<intptr_t>d.data[i] + moved)
            continue
        cache.dirs[at] = NULL
        if dir_unref(d):
            dir_free(d)
    view_drop(cache)
    pthread_mutex_unlock(&cache.lock)


cdef void view_drop(DirCache* cache) noexcept nogil:
    """Drop the cached view (the cache's lock held, or at the cache's end);
    its holders keep theirs."""
    cdef RunsView* view = cache.view
    cache.view = NULL
    if view != NULL and view_unref(view):
        view_free(view)


cdef inline bint view_unref(RunsView* v) noexcept nogil:
    """Drop one reference to ``v`` (the cache's lock held): whether it was the last."""
    v.refs -= 1
    return v.refs == 0


cdef void view_free(RunsView* v) noexcept nogil:
    """Free ``v`` and its references to directories (the cache's lock held,
    or at the cache's end)."""
    cdef Py_ssize_t t
    cdef size_t i
    for t in range(v.tables):
        for i in range(v.runs[t].n):
            if dir_unref(v.runs[t].dir[i]):
                dir_free(v.runs[t].dir[i])
    free(v.runs)
    if v.recent != NULL:
        recent_free(v.recent)
        free(v.recent)
    free(v)


cdef RunsView* view_acquire(DirCache* cache, size_t txnid) noexcept nogil:
    """The cached view of transaction ``txnid``'s runs, referenced for the caller, or NULL."""
    pthread_mutex_lock(&cache.lock)
    cdef RunsView* v = cache.view
    if v != NULL and v.txnid == txnid:
        v.refs += 1
    else:
        v = NULL
    pthread_mutex_unlock(&cache.lock)
    return v


cdef void view_release(DirCache* cache, RunsView* v) noexcept nogil:
    pthread_mutex_lock(&cache.lock)
    if view_unref(v):
        view_free(v)
    pthread_mutex_unlock(&cache.lock)


cdef void view_offer(DirCache* cache, size_t txnid, TableRuns* runs, Py_ssize_t tables,
                     const Recent* recent) noexcept nogil:
    """Cache a view of ``runs`` and a copy of ``recent`` (a read snapshot's, of
    transaction ``txnid``; recent loaded, or NULL) in place of the last, where
    every run has its directory."""
    cdef Py_ssize_t t
    cdef size_t i
    for t in range(tables):
        for i in range(runs[t].n):
            if runs[t].dir[i] == NULL:
                return
    cdef RunsView* v = <RunsView*>malloc(sizeof(RunsView))
    cdef TableRuns* copy = <TableRuns*>malloc(tables * sizeof(TableRuns) + 1)
    if v == NULL or copy == NULL:
        free(v)
        free(copy)
        return  # no view: searches read the runs as before
    memcpy(copy, runs, tables * sizeof(TableRuns))
    v.txnid, v.refs, v.tables, v.runs = txnid, 1, tables, copy
    v.recent = recent_copy(recent) if recent != NULL else NULL
    if recent != NULL and v.recent == NULL:
        free(v)
        free(copy)
        return
    pthread_mutex_lock(&cache.lock)
    for t in range(tables):
        for i in range(runs[t].n):
            runs[t].dir[i].refs += 1
            copy[t].cursor[i] = NULL  # the snapshot's, closed with it
    cdef RunsView* old = cache.view
    cache.view = v
    if old != NULL and view_unref(old):
        view_free(old)
    pthread_mutex_unlock(&cache.lock)


cdef int dir_grow(BlockDir* d) noexcept nogil:
    """Double the room of a full directory."""
    cdef size_t cap = 2 * d.cap if d.cap else 64
    cdef void* firsts = realloc(d.firsts, cap * sizeof(uint64_t))
    if firsts != NULL:
        d.firsts = <uint64_t*>firsts
    cdef void* data = realloc(d.data, cap * sizeof(uint8_t*)) if firsts != NULL else NULL
    if data != NULL:
        d.data = <const uint8_t**>data
    cdef void* sizes = realloc(d.sizes, cap * sizeof(uint16_t)) if data != NULL else NULL
    if sizes == NULL:
        return NO_MEMORY
    d.sizes, d.cap = <uint16_t*>sizes, cap
    return 0


cdef int dir_build(MDB_cursor* cursor, uint32_t run, uint64_t entries, int shift,
                   uint64_t filter_bits, BlockDir** out) noexcept nogil:
    """Read run ``run``'s directory with ``cursor`` (on its slot): each block's
    first value, and where its coded bytes lie in the map (its blocks'
    checksums are checked here, once: BLOCK_DAMAGED, and their readers
    through the directory leave the checksum out). A run whose blocks hold
    other than its ``entries`` is RUN_DAMAGED (a block lost or misplaced).
    With ``filter_bits`` (bits an entry) and a ``shift`` of 1 to 63, also the
    filter of the entries' prefixes (entry >> shift), from every entry as its
    block is read. (A filter is built only for a run that fills at most a
    quarter of its prefixes, where it can rule ranges out; one that finds no
    memory is left out: searches then seek every range.)"""
    cdef BlockDir* d = <BlockDir*>calloc(1, sizeof(BlockDir))
    cdef uint64_t* values = NULL  # a block's entries, decoded for the filter
    cdef int rc = NO_MEMORY if d == NULL else 0
    out[0] = d
    if rc == 0 and filter_bits and 0 < shift < 64 and 0 < entries <= (1ULL << (64 - shift)) // 4:
        d.shift = shift
        d.filter_words = min(max(1, (entries * min(filter_bits, 64) + 63) // 64), 1ULL << 32)
        d.filter = <uint64_t*>calloc(d.filter_words, sizeof(uint64_t))
        values = <uint64_t*>malloc(MOST * sizeof(uint64_t)) if d.filter != NULL else NULL
        if values == NULL:
            free(d.filter)
            d.filter = NULL
    if rc == 0:
        rc = dir_read(cursor, run, entries, d, values)
    free(values)
    return rc


cdef int filter_add(BlockDir* d, Block* block, uint64_t first, size_t coded,
                    uint64_t* values) noexcept nogil:
    """Set the filter's bits of the entries of ``block`` (copied out, checked)."""
    cdef uint64_t bits = 0, last = 0
    cdef size_t i
    cdef int rc = block_header(block, first, coded, False)
    if rc == 0:
        rc = decode_entries(block, values)
    if rc:
        return rc
    for i in range(block.c + 1):
        if bits == 0 or (values[i] >> d.shift) != last:  # (a prefix's entries are together)
            last, bits = values[i] >> d.shift, filter_bits_of(d, values[i])
        filter_word(d, values[i])[0] |= bits
    return 0


cdef int dir_read(MDB_cursor* cursor, uint32_t run, uint64_t entries, BlockDir* d,
                  uint64_t* values) noexcept nogil:
    """dir_build's reading of the blocks (``values``: room for a block's
    entries, where they fill the filter; or NULL)."""
    cdef Block block  # a block, copied out to check its checksum (and decode it for the filter)
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef size_t coded
    cdef MDB_val k, v
    cdef uint64_t first, counted = 0
    cdef int rc = 0
    d.run, d.entries, d.refs = run, entries, 1
    write_be(key, run, 4)
    memset(key + 4, 0, 8)
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key
    rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
    while rc == 0 and in_run(&k, run):
        first = read_be(<const uint8_t*>k.mv_data + 4, 8)
        if v.mv_size < 3 + SUM_BYTES or v.mv_size > BLOCK_BYTES \
                or (d.n and first <= d.firsts[d.n - 1]):
            rc = CORRUPTED
            break
        if d.n == d.cap:
            rc = dir_grow(d)
            if rc:
                break
        coded = v.mv_size - SUM_BYTES
        if g_copy(block.buf, v.mv_data, v.mv_size):
            rc = CORRUPTED
            break
        if block_sum(first, block.buf, coded) != load_le32(block.buf + coded):
            rc = BLOCK_DAMAGED
            break
        if values != NULL:
            rc = filter_add(d, &block, first, coded, values)
            if rc:
                break
        counted += 1 + (block.buf[0] | (<uint64_t>block.buf[1] << 8))
        d.firsts[d.n], d.data[d.n], d.sizes[d.n] = first, <const uint8_t*>v.mv_data, coded
        d.n += 1
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    if rc and rc != MDB_NOTFOUND:  # (an item of another run ends this one, as for a cursor)
        return rc
    if counted != entries:
        return RUN_DAMAGED
    cdef size_t j
    cdef void* lines = NULL  # firsts again, a stretch of DIR_STRIDE to a cache line
    if posix_memalign(&lines, 64, d.n * sizeof(uint64_t) + 1):
        return NO_MEMORY
    memcpy(lines, d.firsts, d.n * sizeof(uint64_t))
    free(d.firsts)
    d.firsts, d.cap = <uint64_t*>lines, d.n
    d.tops = <uint64_t*>malloc(((d.n + DIR_STRIDE - 1) // DIR_STRIDE + 1) * sizeof(uint64_t))
    if d.tops == NULL:
        return NO_MEMORY
    for j in range((d.n + DIR_STRIDE - 1) // DIR_STRIDE):
        d.tops[j] = d.firsts[j * DIR_STRIDE]
    return 0
