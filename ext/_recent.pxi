# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi, _buffers.pxi,
# _work.pxi, _search.pxi, _merges.pxi, _writes.pxi, _tidy.pxi.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from bits cimport popcount64, read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, g_drop, g_stat, MDB_APPEND, MDB_cursor,
    mdb_cursor_close, MDB_FIRST, MDB_LAST, MDB_NEXT, MDB_NOTFOUND, MDB_stat, MDB_val,
)

cdef extern from "near.h" nogil:
    size_t near_values(const uint64_t* values, size_t n, uint64_t probe, int distance,
                       size_t* near)


# Recent (format.py): the run entries of the latest small writes, a record a
# call, in one sub-database, until they reach RECENT_LIMIT; then every run set
# takes one run of them and the call's own, and recent is emptied. Searches
# read recent beside the runs, in the same transaction (a read snapshot's view
# keeps it read; a write transaction reads it afresh each call): a few probes
# are compared with each of its fingerprints, many seek their ranges in a
# sorted copy of them a table (RecentTables).

cdef bytes recent_key = lmdb_format.RECENT
cdef const char* RECENT = recent_key  # meta's count of the values recent holds
cdef int RECENT_DAMAGED = -29996  # a record of recent is not one, or the count disagrees

# a search compares so many (probe, value) pairs one by one, past which it sorts a copy
# of recent for each table (about 1 ms at 8,192 values, made for the call): at
# 8,192 values that is 512 probes, where comparing costs about as much
cdef size_t COMPARED_AT_MOST = 1 << 22


cdef struct RecentTables:  # recent's distinct fingerprints, permuted and sorted for each table
    uint64_t* values        # table t's at values + t * n
    size_t n


cdef void recent_clear(Recent* r) noexcept nogil:
    """Empty ``r``, keeping its buffers."""
    cdef int g
    for g in range(RECENT_GROUPS):
        r.groups[g].size = 0
    r.values, r.loaded = 0, False


cdef void recent_free(Recent* r) noexcept nogil:
    cdef int g
    recent_clear(r)
    for g in range(RECENT_GROUPS):
        free(r.groups[g].data)
        r.groups[g].data, r.groups[g].cap = NULL, 0


cdef Recent* recent_copy(const Recent* r) noexcept nogil:
    """A copy of loaded ``r``, or NULL (no memory)."""
    cdef Recent* c = <Recent*>calloc(1, sizeof(Recent))
    cdef size_t size
    cdef int g
    if c == NULL:
        return NULL
    c.values, c.loaded = r.values, True
    for g in range(RECENT_GROUPS):
        size = r.groups[g].size
        c.groups[g].data = <uint64_t*>malloc(size * sizeof(uint64_t) + 1)
        c.groups[g].size = c.groups[g].cap = size
        if c.groups[g].data == NULL:
            recent_free(c)
            free(c)
            return NULL
        memcpy(c.groups[g].data, r.groups[g].data, size * sizeof(uint64_t))
    return c


cdef int unique_values(U64s* v) noexcept nogil:
    """Sort ``v``'s values, keeping each once."""
    cdef size_t i, kept = 0
    cdef int rc = sort_records(v.data, v.size, 1)
    for i in range(v.size if rc == 0 else 0):
        if kept == 0 or v.data[kept - 1] != v.data[i]:
            v.data[kept] = v.data[i]
            kept += 1
    v.size = kept if rc == 0 else v.size
    return rc


cdef int parse_recent(const uint8_t* raw, size_t size, Recent* r) noexcept nogil:
    """Add the groups of a stored record of recent to ``r``: RECENT_DAMAGED
    where it is not one (empty, a length off, groups out of order or empty, a
    group key neither RECENT_FINGERPRINTS nor a band's, values not ascending)."""
    cdef size_t at = 0, count, i
    cdef long key, last = -1
    cdef uint64_t x
    cdef int g, rc
    if size == 0:
        return RECENT_DAMAGED
    while at < size:
        if size - at < RECENT_GROUP_BYTES:
            return RECENT_DAMAGED
        key, count = <long>read_be(raw + at, 2), <size_t>read_be(raw + at + 2, 4)
        at += RECENT_GROUP_BYTES
        if count == 0 or key <= last or count > (size - at) // 8:
            return RECENT_DAMAGED
        if key == RECENT_FINGERPRINTS:
            g = FINGERPRINTS
        elif BAND_DIRECTORY <= key < BAND_DIRECTORY + SIGNATURE_BANDS:
            g = key - BAND_DIRECTORY
        else:
            return RECENT_DAMAGED
        for i in range(count):
            x = read_be(raw + at + 8 * i, 8)
            if i and x <= r.groups[g].data[r.groups[g].size - 1]:
                return RECENT_DAMAGED
            rc = u64_push(&r.groups[g], x)
            if rc:
                return rc
        at += 8 * count
        r.values += count
        last = key
    return 0


cdef int read_recent(Work* w, Recent* r) noexcept nogil:
    """Add recent's records to ``r``, checked (parse_recent), and check that
    they hold the values meta counts (RECENT_DAMAGED where not)."""
    cdef MDB_cursor* cursor = NULL
    cdef MDB_stat stat
    cdef MDB_val k, v
    cdef uint64_t counted, before = r.values
    cdef uint8_t* raw = NULL
    cdef size_t room = 0
    cdef int rc = read_counter(w, RECENT, &counted)
    if rc or w.recent_dbi == 0:  # (a file of format 8 has none)
        return rc if rc or counted == 0 else RECENT_DAMAGED
    rc = g_stat(w.txn, w.recent_dbi, &stat)
    if rc or (stat.ms_entries == 0 and counted == 0):
        return rc
    rc = g_cursor_open(w.txn, w.recent_dbi, &cursor)
    if rc == 0:
        rc = g_cursor_get(cursor, &k, &v, MDB_FIRST)
    while rc == 0:
        if k.mv_size != 8 or v.mv_size >> 32:
            rc = RECENT_DAMAGED
            break
        if room_for(&raw, &room, v.mv_size):
            rc = NO_MEMORY
        if rc == 0 and g_copy(raw, v.mv_data, v.mv_size):
            rc = CORRUPTED
        if rc == 0:
            rc = parse_recent(raw, v.mv_size, r)
        if rc == 0:
            rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    if cursor != NULL:
        mdb_cursor_close(cursor)
    free(raw)
    rc = 0 if rc == MDB_NOTFOUND else rc
    return RECENT_DAMAGED if rc == 0 and r.values - before != counted else rc


cdef int load_recent(Work* w, Recent* r) noexcept nogil:
    """Read recent into ``r`` (emptied first)."""
    recent_clear(r)
    cdef int rc = read_recent(w, r)
    r.loaded = rc == 0
    return rc


cdef int recent_tables(Work* w, const U64s* fps, RecentTables* out) noexcept nogil:
    """``fps`` once each, permuted and sorted for each table into ``out`` (its
    values freed by the caller): a search then seeks a range as in a run."""
    cdef U64s distinct
    cdef Py_ssize_t t
    cdef size_t i
    cdef long* spec
    distinct.data = <uint64_t*>malloc(fps.size * sizeof(uint64_t) + 1)
    distinct.size, distinct.cap = fps.size, fps.size
    if distinct.data == NULL:
        return NO_MEMORY
    memcpy(distinct.data, fps.data, fps.size * sizeof(uint64_t))
    cdef int rc = unique_values(&distinct)
    out.n = distinct.size
    out.values = <uint64_t*>malloc(w.layout.tables * out.n * sizeof(uint64_t) + 1)
    if out.values == NULL:
        rc = NO_MEMORY
    for t in range(w.layout.tables if rc == 0 else 0):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        for i in range(out.n):
            out.values[t * out.n + i] = permute_one(distinct.data[i], spec, w.layout.blocks)
        if rc == 0:
            rc = sort_records(out.values + t * out.n, out.n, 1)
    free(distinct.data)
    return rc


cdef int recent_of(Work* w, Recent** out) noexcept nogil:
    """Recent as this transaction reads it (read once a call), or NULL where it holds nothing."""
    out[0] = NULL
    if w.recent == NULL:
        return 0
    cdef int rc = 0 if w.recent.loaded else load_recent(w, w.recent)
    if rc == 0 and w.recent.values:
        out[0] = w.recent
    return rc


cdef int recent_append(Work* w, Recent* f, uint64_t values) noexcept nogil:
    """Append ``f``'s groups (sorted, each value once) to recent as one record
    under the next sequence number, and count its ``values``."""
    cdef MDB_cursor* cursor = NULL
    cdef MDB_val k, v
    cdef uint8_t seq[8]
    cdef size_t size = 0, at = 0, i
    cdef int g, rc
    for g in range(RECENT_GROUPS):
        size += RECENT_GROUP_BYTES + 8 * f.groups[g].size if f.groups[g].size else 0
    cdef uint8_t* raw = <uint8_t*>malloc(size + 1)
    if raw == NULL:
        return NO_MEMORY
    for g in range(RECENT_GROUPS):  # the bands' keys first: RECENT_FINGERPRINTS is the highest
        if f.groups[g].size == 0:
            continue
        write_be(raw + at, RECENT_FINGERPRINTS if g == FINGERPRINTS else BAND_DIRECTORY + g, 2)
        write_be(raw + at + 2, f.groups[g].size, 4)
        at += RECENT_GROUP_BYTES
        for i in range(f.groups[g].size):
            write_be(raw + at, f.groups[g].data[i], 8)
            at += 8
    rc = g_cursor_open(w.txn, w.recent_dbi, &cursor)
    if rc == 0:
        rc = g_cursor_get(cursor, &k, &v, MDB_LAST)
    if rc == 0 and (k.mv_size != 8 or read_be(<uint8_t*>k.mv_data, 8) == 0xFFFFFFFFFFFFFFFFULL):
        rc = RECENT_DAMAGED  # (no key follows the last)
    write_be(seq, read_be(<uint8_t*>k.mv_data, 8) + 1 if rc == 0 else 0, 8)
    k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, seq, size, raw
    if rc == 0 or rc == MDB_NOTFOUND:
        rc = g_cursor_put(cursor, &k, &v, MDB_APPEND)
    if cursor != NULL:
        mdb_cursor_close(cursor)
    free(raw)
    return rc if rc else add_to_counter(w, RECENT, values)


cdef int write_runs(Work* w, Recent* f) noexcept nogil:
    """Give every run set with values in ``f`` (sorted, each once) one run of them."""
    cdef U64s* fps = &f.groups[FINGERPRINTS]
    cdef uint64_t* perms
    cdef int b, rc = 0
    if fps.size:
        perms = <uint64_t*>malloc(fps.size * sizeof(uint64_t))
        rc = NO_MEMORY if perms == NULL else append_runs(w, fps.data, fps.size, perms)
        free(perms)
    for b in range(SIGNATURE_BANDS):
        if rc == 0 and f.groups[b].size:
            rc = add_run(w, w.layout.tables + b, f.groups[b].data, f.groups[b].size)
    return rc


cdef int store_fresh(Work* w, bint flush) noexcept nogil:
    """Put the run entries this call adds (``w.fresh``) into recent as one
    record while recent's values and theirs stay within its limit
    (RECENT_LIMIT); past it, or to ``flush`` recent (before a rewrite), give
    every run set one run of recent's and theirs (sorted, each once) and
    empty recent."""
    cdef Recent* f = w.fresh
    cdef uint64_t held = 0, values = 0
    cdef int g, rc = 0
    for g in range(RECENT_GROUPS):
        if rc == 0:
            rc = unique_values(&f.groups[g])
        values += f.groups[g].size
    if rc == 0 and w.recent_dbi:
        rc = read_counter(w, RECENT, &held)
    if rc or (values == 0 and (held == 0 or not flush)):
        return rc
    if w.recent != NULL:
        w.recent.loaded = False  # read again by the next search
    if w.recent_dbi and not flush and held + values <= w.recent_limit:
        rc = recent_append(w, f, values)
    else:
        if held:
            rc = read_recent(w, f)
        for g in range(RECENT_GROUPS):
            if rc == 0 and held:
                rc = unique_values(&f.groups[g])
        if rc == 0:
            rc = write_runs(w, f)
        if rc == 0 and held:
            rc = g_drop(w.txn, w.recent_dbi, 0)
        if rc == 0 and held:
            rc = write_counter(w, RECENT, 0)
    recent_clear(f)
    return rc


cdef int flush_recent(Work* w) noexcept nogil:
    """Write recent out as runs and empty it (before a step of a rewrite)."""
    cdef Recent f
    memset(&f, 0, sizeof(Recent))
    cdef Recent* own = w.fresh
    w.fresh = &f
    cdef int rc = store_fresh(w, True)
    w.fresh = own
    recent_free(&f)
    return rc


cdef int recent_hits(Work* w, const uint64_t* probes, size_t n, int distance, int flips,
                     Hits* out) noexcept nogil:
    """Add the hits of recent's fingerprints for ``n`` probes: compared one by
    one where they are few, else seeking each probe's ranges (within ``flips``
    bits of its prefix, as in a run) in each table's sorted copy."""
    cdef Recent* r
    cdef int rc = recent_of(w, &r)
    if rc or r == NULL or r.groups[FINGERPRINTS].size == 0:
        return rc
    cdef U64s* fps = &r.groups[FINGERPRINTS]
    cdef RecentTables tables
    cdef size_t i, j, found
    if n * fps.size > COMPARED_AT_MOST:
        tables.values = NULL
        rc = recent_tables(w, fps, &tables)
        if rc == 0:
            rc = sorted_hits(w, &tables, probes, n, distance, flips, out)
        free(tables.values)
        return rc
    cdef size_t* near = <size_t*>malloc(fps.size * sizeof(size_t))
    if near == NULL:
        return NO_MEMORY
    for i in range(n):
        found = near_values(fps.data, fps.size, probes[i], distance, near)
        for j in range(found):
            if rc == 0:
                rc = hit_push(out, i, fps.data[near[j]], popcount64(fps.data[near[j]] ^ probes[i]))
    free(near)
    return rc


cdef size_t first_at_least(const uint64_t* values, size_t n, size_t stride,
                           uint64_t x) noexcept nogil:
    """The index of the first of ``n`` records of ``stride`` values, sorted by
    their first, whose first is at least ``x`` (``n``: none)."""
    cdef size_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) // 2
        if values[stride * mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int sorted_hits(Work* w, const RecentTables* r, const uint64_t* probes, size_t n,
                     int distance, int flips, Hits* out) noexcept nogil:
    """recent_hits by each table's sorted copy: the ranges a probe's prefixes
    (push_ranges) cover, each sought and read."""
    cdef U64s ranges
    cdef Py_ssize_t t
    cdef size_t i, at, m = r.n
    cdef uint64_t perm, x
    cdef const uint64_t* values
    cdef long* spec
    cdef int rc = 0
    ranges.data, ranges.size, ranges.cap = NULL, 0, 0
    for t in range(w.layout.tables):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        values = r.values + t * m
        ranges.size = 0
        for i in range(n):
            perm = permute_one(probes[i], spec, w.layout.blocks)
            if rc == 0:
                rc = push_ranges(w, t, perm & w.layout.prefixes[t], perm, 64, flips, i, &ranges)
        for i in range(ranges.size // 4 if rc == 0 else 0):
            at = first_at_least(values, m, 1, ranges.data[4 * i])
            while rc == 0 and at < m and values[at] <= ranges.data[4 * i + 1]:
                x = values[at]
                if popcount64(x ^ ranges.data[4 * i + 2]) <= distance:
                    rc = hit_push(out, ranges.data[4 * i + 3],
                                  unpermute_one(x, spec, w.layout.blocks),
                                  popcount64(x ^ ranges.data[4 * i + 2]))
                at += 1
        if rc:
            break
    free(ranges.data)
    return rc


cdef int recent_band_hits(Work* w, int band, const uint64_t* ranges, size_t n,
                          Hits* out) noexcept nogil:
    """Add a hit (query, entry) for each of recent's entries of ``band`` under
    a query's key: ``ranges`` (first, last, 0, query) sorted by first, as
    band_sweep gives its runs."""
    cdef Recent* r
    cdef int rc = recent_of(w, &r)
    cdef size_t i, at
    cdef uint64_t first
    for i in range(r.groups[band].size if rc == 0 and r != NULL else 0):
        first = r.groups[band].data[i] & 0xFFFFFFFF00000000ULL
        at = first_at_least(ranges, n, 4, first)
        while rc == 0 and at < n and ranges[4 * at] == first:
            rc = hit_push(out, ranges[4 * at + 3], r.groups[band].data[i], 0)
            at += 1
    return rc


cdef int recent_values(Work* w, Py_ssize_t t, U64s* values) noexcept nogil:
    """Add recent's values of run set ``t`` to ``values``: a table's
    fingerprints permuted, a band's entries."""
    cdef Recent* r
    cdef int rc = recent_of(w, &r)
    cdef Py_ssize_t tables = w.layout.tables
    cdef const long* spec = w.layout.spec + 3 * w.layout.blocks * t
    cdef U64s* g
    cdef size_t i
    if rc or r == NULL:
        return rc
    g = &r.groups[t - tables if t >= tables else FINGERPRINTS]
    for i in range(g.size):
        rc = u64_push(values, g.data[i] if t >= tables else
                      permute_one(g.data[i], spec, w.layout.blocks))
        if rc:
            return rc
    return 0
