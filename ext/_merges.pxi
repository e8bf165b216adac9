# A part of _lmdb.pyx, which includes the parts in order; it builds on _runs.pxi, _codec.pxi,
# _dirs.pxi, _work.pxi, _tidy.pxi.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_open, g_cursor_put, g_drop, g_get, g_put, GUARD_FAULT, MDB_APPEND, MDB_cursor,
    mdb_cursor_close, MDB_dbi, MDB_NOTFOUND, MDB_val, pthread_create, pthread_join, pthread_t,
)


# Tables kept as runs (RUNS.md): per table a directory of live runs, each run
# in a slot sub-database of its own; a batch appends a run, merges keep few;
# removals leave stale entries, which hits drop by the fingerprint index

cdef int load_runs(Work* w, Py_ssize_t t) noexcept nogil:
    """Read run set ``t``'s directory ((id u32, slot u8, entries u64) a run,
    big-endian, oldest first) and open a cursor on each live run's slot. Every
    run of this format has checksums: an id without their bit is RUN_DAMAGED."""
    cdef TableRuns* r = &w.table_runs[t]
    cdef uint8_t buf[RUN_RECORD_BYTES * RUN_SLOTS]
    cdef uint8_t key[TABLE_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t i, j, at
    cdef int rc
    close_runs(r)
    write_be(key, directory_number(w, t), TABLE_KEY_BYTES)
    k.mv_size, k.mv_data = TABLE_KEY_BYTES, key
    rc = g_get(w.txn, w.run_dir, &k, &v)
    if rc == MDB_NOTFOUND:
        return 0
    if rc == 0 and (v.mv_size % RUN_RECORD_BYTES or v.mv_size > RUN_RECORD_BYTES * RUN_SLOTS):
        rc = CORRUPTED
    if rc == 0 and g_copy(buf, v.mv_data, v.mv_size):
        rc = CORRUPTED
    r.cache, r.at = NULL if w.runs_written else w.dirs, t * RUN_SLOTS
    for i in range(v.mv_size // RUN_RECORD_BYTES if rc == 0 else 0):
        r.id[i], r.slot[i] = read_be(buf + RUN_RECORD_BYTES * i, 4), buf[RUN_RECORD_BYTES * i + 4]
        r.entries[i] = read_be(buf + RUN_RECORD_BYTES * i + 5, 8)
        if r.slot[i] >= RUN_SLOTS:
            return CORRUPTED
        if not summed(r.id[i]):
            return RUN_DAMAGED
        for j in range(i):  # a slot named twice (a merge drops its sources' slots)
            if r.slot[j] == r.slot[i]:
                return CORRUPTED
        r.n = i + 1
        r.cursor[i], r.dir[i], r.sought[i] = NULL, NULL, 0
        at = r.at + r.slot[i]  # the slot's place among the Env's (the cache's, the sub-databases')
        if r.cache != NULL:
            r.dir[i] = dir_acquire(r.cache, at, r.id[i], r.entries[i])
        if r.dir[i] != NULL:
            continue
        rc = g_cursor_open(w.txn, w.run_slots[at], &r.cursor[i])
        if rc == 0 and r.cache != NULL and (r.entries[i] <= w.directory_entries or dir_rented(
                r.cache, at, r.id[i], 0,
                r.entries[i] // w.directory_rent + 1 if w.directory_rent else 0)):
            rc = dir_build(r.cursor[i], r.id[i], r.entries[i], prefix_shift(w, t), w.filter_bits,
                           &r.dir[i])
            if rc == 0:
                dir_publish(r.cache, at, r.dir[i])
            else:  # a damaged block: the cursor finds it if a search goes there
                if r.dir[i] != NULL:
                    dir_free(r.dir[i])
                    r.dir[i] = NULL
                rc = rc if rc in (GUARD_FAULT, NO_MEMORY, RUN_DAMAGED, BLOCK_DAMAGED) else 0
        if rc:
            break
    return rc


cdef void close_runs(TableRuns* r) noexcept nogil:
    cdef size_t i
    for i in range(r.n):
        if r.sought[i] and r.cache != NULL:
            dir_rented(r.cache, r.at + r.slot[i], r.id[i], r.sought[i], 0)
        if r.cursor[i] != NULL:
            mdb_cursor_close(r.cursor[i])
            r.cursor[i] = NULL
        if r.dir[i] != NULL:
            dir_release(r.cache, r.dir[i])
            r.dir[i] = NULL
    r.n = 0


cdef int save_runs(Work* w, Py_ssize_t t, TableRuns* r) noexcept nogil:
    """Write ``r`` as run set ``t``'s directory, then load it back (with cursors)."""
    cdef uint8_t buf[RUN_RECORD_BYTES * RUN_SLOTS]
    cdef uint8_t key[TABLE_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t i
    for i in range(r.n):
        write_be(buf + RUN_RECORD_BYTES * i, r.id[i], 4)
        buf[RUN_RECORD_BYTES * i + 4] = r.slot[i]
        write_be(buf + RUN_RECORD_BYTES * i + 5, r.entries[i], 8)
    write_be(key, directory_number(w, t), TABLE_KEY_BYTES)
    k.mv_size, k.mv_data = TABLE_KEY_BYTES, key
    v.mv_size, v.mv_data = RUN_RECORD_BYTES * r.n, buf
    w.runs_written = True
    cdef int rc = g_put(w.txn, w.run_dir, &k, &v, 0)
    return rc if rc else load_runs(w, t)


cdef int free_slot(TableRuns* r) noexcept nogil:
    """A slot no live run holds (one is free while r.n < RUN_SLOTS)."""
    cdef int s
    cdef size_t i
    cdef bint held
    for s in range(RUN_SLOTS):
        held = False
        for i in range(r.n):
            held = held or r.slot[i] == s
        if not held:
            return s
    return -1


cdef size_t merge_width(const TableRuns* r, int band) noexcept nogil:
    """How many of the newest runs the merge policy takes into one next (0:
    none). A table's (``band`` -1; the ratio rule): the two newest, where the
    newest is over 1/RUN_RATIO of the one before. Band ``band``'s (a band
    search asks each run's filter, so runs cost it little): none until it
    has RUN_SLOTS - 2 runs, then the newest j (two at least) while together
    they are over 1/F of the run before them, F = BAND_RATIO + band /
    BAND_RATIO_SPREAD. Either merges once the slots run short (RUN_SLOTS - 1
    runs: a merge needs a free slot)."""
    cdef uint64_t merged
    cdef size_t j = 2
    if r.n < 2:
        return 0
    if band < 0:
        return 2 if (r.n >= RUN_SLOTS - 1
                     or r.entries[r.n - 1] * RUN_RATIO > r.entries[r.n - 2]) else 0
    if r.n < RUN_SLOTS - 2:
        return 0
    merged = r.entries[r.n - 1] + r.entries[r.n - 2]
    while j < r.n and merged * (BAND_RATIO * BAND_RATIO_SPREAD + band) > \
            r.entries[r.n - 1 - j] * BAND_RATIO_SPREAD:
        merged += r.entries[r.n - 1 - j]
        j += 1
    return j


cdef uint64_t newest_entries(const TableRuns* r, size_t m) noexcept nogil:
    """The entries of the ``m`` newest runs."""
    cdef uint64_t total = 0
    cdef size_t i
    for i in range(r.n - m, r.n):
        total += r.entries[i]
    return total


cdef bint merge_due(const TableRuns* r, uint64_t limit, int band) noexcept nogil:
    """Whether a batch merges now (merge_width; ``band`` -1 for a table)
    within ``limit`` entries, or whatever their size where the slots run
    short: a run set never keeps more runs than the next batch leaves room for."""
    cdef size_t m = merge_width(r, band)
    return m != 0 and (r.n >= RUN_SLOTS - 1 or newest_entries(r, m) <= limit)


cdef bint merges_left(const TableRuns* r, bint lazy) noexcept nogil:
    """Whether some merge is due (for tidy, which merges the newest runs
    until there is none): a table's run over 1/RUN_RATIO of the one before
    it, or the slots running short; a band's RUN_SLOTS - 2 runs."""
    cdef size_t i
    if lazy:
        return r.n >= RUN_SLOTS - 2
    for i in range(1, r.n):
        if r.entries[i] * RUN_RATIO > r.entries[i - 1]:
            return True
    return r.n >= RUN_SLOTS - 1


# A large merge of committed runs in parts: ranges of values, each merged on a
# thread of its own from the runs' block directories (the pages of a committed
# run stay put in the map while the transaction lasts: LMDB writes its new pages
# elsewhere, and frees the run's only when the transaction commits), the first
# put as it goes, the others kept in memory and appended after it

cdef enum:
    MAX_PARTS = 16


cdef struct Part:
    const BlockDir** dirs   # the runs merged
    size_t m
    uint64_t lo, hi         # the part's values: from lo, below hi if bounded
    bint bounded
    uint32_t run
    MDB_cursor* cursor      # where the first part puts its blocks (NULL: into sink)
    Blocks sink
    size_t blocks, entries
    int rc


cdef int merge_part(Part* p) noexcept nogil:
    """Merge the part's values of its runs into a run's blocks."""
    cdef Source* src = <Source*>calloc(p.m + 1, sizeof(Source))
    cdef RunWriter wr
    cdef size_t s
    cdef const BlockDir* d
    cdef int rc = NO_MEMORY if src == NULL else 0
    memset(&wr, 0, sizeof(RunWriter))
    wr.run, wr.guess, wr.cursor, wr.sink = p.run, 2, p.cursor, &p.sink
    for s in range(p.m if rc == 0 else 0):
        d = p.dirs[s]
        src[s].dir, src[s].run, src[s].lo, src[s].hi, src[s].bounded = d, d.run, p.lo, p.hi, p.bounded
        src[s].at = dir_seek(d, p.lo) if d.n else 0
        src[s].end = upper_bound(d.firsts, d.n, p.hi - 1) if p.bounded else d.n
        src[s].buf = <uint64_t*>malloc(MOST * sizeof(uint64_t))
        src[s].vals = src[s].buf
        rc = NO_MEMORY if src[s].buf == NULL else source_next_block(&src[s])
        if rc:
            break
    if rc == 0:
        rc = merge_sources(src, p.m + 1, &wr)
    for s in range(p.m if src != NULL else 0):
        free(src[s].buf)
    free(src)
    p.blocks, p.entries = wr.blocks, wr.entries
    return rc


cdef void* merge_part_thread(void* part) noexcept nogil:
    (<Part*>part).rc = merge_part(<Part*>part)
    return NULL


cdef int merge_in_parts(Work* w, const MDB_dbi* dbis, const uint32_t* runs,
                        const uint64_t* entries, size_t m, MDB_dbi out, uint32_t run,
                        size_t* blocks, size_t* written) noexcept nogil:
    """merge_runs of the ``m`` committed runs ``runs`` (no extra values, none
    dropped), cut into up to ``w.merge_threads`` parts of about equal size."""
    cdef BlockDir* dirs[RUN_SLOTS]
    cdef Part parts[MAX_PARTS]
    cdef pthread_t threads[MAX_PARTS]
    cdef bint started[MAX_PARTS]
    cdef MDB_cursor* cursor = NULL
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t s, i, at, largest = 0, n = min(w.merge_threads, <size_t>MAX_PARTS)
    cdef uint64_t first
    cdef uint16_t size
    cdef int rc = 0
    memset(dirs, 0, sizeof(dirs))
    memset(parts, 0, sizeof(parts))
    memset(started, 0, sizeof(started))
    for s in range(m):
        rc = g_cursor_open(w.txn, dbis[s], &cursor)
        if rc == 0:
            rc = dir_build(cursor, runs[s], entries[s], 0, 0, &dirs[s])
        if cursor != NULL:
            mdb_cursor_close(cursor)
            cursor = NULL
        if rc:
            break
        if dirs[s].n > dirs[largest].n:
            largest = s
    if rc == 0:  # the parts' bounds: blocks of the largest run, evenly spaced
        n = max(1, min(n, dirs[largest].n))
        for i in range(n):
            parts[i].dirs, parts[i].m, parts[i].run = <const BlockDir**>dirs, m, run
            parts[i].lo = dirs[largest].firsts[dirs[largest].n * i // n] if i else 0
            if i:
                parts[i - 1].hi, parts[i - 1].bounded = parts[i].lo, True
        rc = g_cursor_open(w.txn, out, &parts[0].cursor)
    for i in range(1, n if rc == 0 else 0):
        started[i] = pthread_create(&threads[i], NULL, merge_part_thread, &parts[i]) == 0
    if rc == 0:
        rc = merge_part(&parts[0])
    for i in range(1, n):
        if started[i]:
            pthread_join(threads[i], NULL)
        elif rc == 0:
            parts[i].rc = merge_part(&parts[i])
        rc = rc if rc else parts[i].rc
    blocks[0] = written[0] = 0
    for i in range(n):
        blocks[0] += parts[i].blocks
        written[0] += parts[i].entries
        at = 0
        while rc == 0 and i and at < parts[i].sink.size:
            memcpy(&first, parts[i].sink.data + at, 8)
            memcpy(&size, parts[i].sink.data + at + 8, 2)
            write_be(key, run, 4)
            write_be(key + 4, first, 8)
            k.mv_size, k.mv_data = RUN_KEY_BYTES, key
            v.mv_size, v.mv_data = size, parts[i].sink.data + at + 10
            rc = g_cursor_put(parts[0].cursor, &k, &v, MDB_APPEND)
            at += 10 + size
        free(parts[i].sink.data)
    if parts[0].cursor != NULL:
        mdb_cursor_close(parts[0].cursor)
    for s in range(m):
        if dirs[s] != NULL:
            dir_free(dirs[s])
    if rc == 0 and n > 1:
        w.threaded_merges[0] += 1
    return rc


cdef bint settle_due(const TableRuns* r, uint64_t settle) noexcept nogil:
    """Whether settling (``settle`` entries; 0: not) merges the two newest runs:
    they hold at most that many together."""
    return settle != 0 and r.n >= 2 and r.entries[r.n - 1] + r.entries[r.n - 2] <= settle


cdef size_t cascade(const TableRuns* r, uint64_t settle) noexcept nogil:
    """How many of the newest runs (two at least) merging the two newest while
    merges_left would make one (settling: while the slots run short or
    settle_due), the sizes taken as sums."""
    cdef uint64_t merged = r.entries[r.n - 1]
    cdef size_t i, k = r.n
    cdef bint left = True
    while left and k >= 2:
        merged += r.entries[k - 2]
        k -= 1
        if settle:
            left = k >= RUN_SLOTS - 1 or (k >= 2 and merged + r.entries[k - 2] <= settle)
            continue
        left = k >= RUN_SLOTS - 1 or (k >= 2 and merged * RUN_RATIO > r.entries[k - 2])
        for i in range(1, k - 1):
            left = left or r.entries[i] * RUN_RATIO > r.entries[i - 1]
    return r.n - k + 1


cdef int add_run(Work* w, Py_ssize_t t, const uint64_t* perms, size_t n) noexcept nogil:
    """Append sorted ``perms`` (if ``n``) to run set ``t`` (a table, or a band
    after the tables) as a new run, then merge the newest runs while
    merge_due within ``w.merge_limit``, so a table keeps about
    log_RATIO(N / batch) runs; bigger merges are noted for tidy. Where the
    runs a table's merges would take are committed and hold
    ``w.threaded_merge`` entries or more, they are merged at once, in parts;
    so is a band's merge of that many."""
    cdef TableRuns r = w.table_runs[t]
    cdef uint32_t ids[RUN_SLOTS]
    cdef MDB_dbi dbis[RUN_SLOTS]
    cdef MDB_dbi out
    cdef size_t blocks, entries, i, m
    cdef uint32_t id
    cdef uint64_t dropped = 0, taken
    cdef bint threaded, settling
    cdef int band = t - w.layout.tables if t >= w.layout.tables else -1  # -1: a table
    cdef int slot, rc = 0 if r.n else read_counter(w, RUN_IDS, &dropped)
    memset(r.cursor, 0, sizeof(r.cursor))  # the table's cursors and block
    memset(r.dir, 0, sizeof(r.dir))        # directories stay with w until save_runs
    w.runs_written = True  # before any slot changes, whatever happens next
    while rc == 0 and (n or settle_due(&r, w.settle) or (
            merges_left(&r, band >= 0) if w.merge_limit == 0
            else merge_due(&r, w.merge_limit, band))):
        # a run id is never given twice in a table (so a block directory cached
        # for one can be trusted): each new run's is above every live one's, and
        # an emptied table's first is above those a rewrite dropped
        slot, id = free_slot(&r), new_run_id(r.id[r.n - 1] if r.n else dropped)
        if slot < 0:  # a directory of more runs than merges leave
            rc = CORRUPTED
            break
        if w.table_runs[t].written_from == 0:
            w.table_runs[t].written_from = id
        out = w.run_slots[t * RUN_SLOTS + slot]
        if n:  # the batch's run
            rc = merge_runs(w.txn, NULL, NULL, 0, perms, n, NULL, 0, out, id, &blocks, &entries)
            n = 0
            r.id[r.n], r.slot[r.n], r.entries[r.n] = id, slot, entries
            r.n += 1
            continue
        # the newest into one: a band's as many as merge_width says; else two,
        # or, in parts, as many as the merges of two would take
        threaded = w.merge_threads > 1 and r.id[r.n - 1] < w.table_runs[t].written_from
        settling = settle_due(&r, w.settle)
        if band >= 0 and not settling:
            m = merge_width(&r, band)
        else:
            m = cascade(&r, w.settle) if threaded else 2
        taken = newest_entries(&r, m)
        if threaded and taken < w.threaded_merge:
            threaded = False
            if band < 0 or settling:
                m = 2
                taken = newest_entries(&r, m)
        for i in range(m):
            ids[i], dbis[i] = r.id[r.n - m + i], w.run_slots[t * RUN_SLOTS + r.slot[r.n - m + i]]
        if threaded:
            rc = merge_in_parts(w, dbis, ids, r.entries + r.n - m, m, out, id, &blocks, &entries)
            if rc == NO_MEMORY:  # the parts held in memory: streamed instead
                rc, threaded = g_drop(w.txn, out, 0), False
        if rc == 0 and not threaded:
            rc = merge_runs(w.txn, dbis, ids, m, NULL, 0, NULL, 0, out, id, &blocks, &entries)
        for i in range(m):
            if rc == 0:
                rc = g_drop(w.txn, dbis[i], 0)
        w.merged += taken
        r.n -= m
        r.id[r.n], r.slot[r.n], r.entries[r.n] = id, slot, entries
        r.n += 1
    w.untidy = w.untidy or merges_left(&r, band >= 0)
    return rc if rc else save_runs(w, t, &r)
