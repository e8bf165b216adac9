# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi, _runs.pxi,
# _codec.pxi, _buffers.pxi, _work.pxi, _slotted.pxi, _documents.pxi, _recent.pxi.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcpy
from bits cimport ATOMIC_RELAXED, atomic_add, popcount64, write_be
from clmdb cimport (
    g_copy, g_cursor_open, mdb_cursor_close, mdb_cursor_dbi, mdb_cursor_txn, MDB_NEXT_DUP,
    MDB_NOTFOUND, MDB_SET, MDB_val,
)


# Search: every stored fingerprint within a distance of each probe

cdef struct Hit:
    uint64_t probe, fp, distance


cdef struct Hits:
    Hit* data
    size_t size, cap


cdef int hit_push(Hits* h, uint64_t probe, uint64_t fp, uint64_t distance) noexcept nogil:
    if make_room(<void**>&h.data, &h.cap, h.size, sizeof(Hit)):
        return NO_MEMORY
    h.data[h.size].probe = probe
    h.data[h.size].fp = fp
    h.data[h.size].distance = distance
    h.size += 1
    return 0


cdef int cmp_hit(const void* a, const void* b) noexcept nogil:
    cdef const Hit* x = <const Hit*>a
    cdef const Hit* y = <const Hit*>b
    if x.probe != y.probe:
        return (x.probe > y.probe) - (x.probe < y.probe)
    return (x.fp > y.fp) - (x.fp < y.fp)


cdef int scan_variants(Work* w, Py_ssize_t t, uint64_t base, uint64_t perm, int first_bit,
                       int flips, int distance, uint64_t probe, Hits* out) noexcept nogil:
    """Scan the prefix ``base`` and every prefix that differs from it in up to
    ``flips`` more of its bits below ``first_bit``."""
    cdef uint64_t mask = w.layout.prefixes[t]
    cdef long* spec = w.layout.spec + 3 * w.layout.blocks * t
    cdef int rc = scan_runs(&w.table_runs[t], base, base | ~mask, perm, distance, spec,
                            w.layout.blocks, probe, out)
    cdef int bit
    if rc or flips == 0:
        return rc
    for bit in range(64 - w.layout.prefix_bits[t], first_bit):
        rc = scan_variants(w, t, base ^ ((<uint64_t>1) << bit), perm, bit, flips - 1, distance,
                           probe, out)
        if rc:
            return rc
    return 0


cdef void sort_by_fp(Hit* hits, size_t n) noexcept nogil:
    """Sort one probe's hits by fingerprint (insertion: a probe has few)."""
    cdef size_t i, j
    cdef Hit h
    if n > 32:
        qsort(hits, n, sizeof(Hit), cmp_hit)
        return
    for i in range(1, n):
        h, j = hits[i], i
        while j and hits[j - 1].fp > h.fp:
            hits[j] = hits[j - 1]
            j -= 1
        hits[j] = h


cdef int sort_hits(Hits* hits) noexcept nogil:
    """Sort the hits by (probe, fingerprint): counted out by probe, then each
    probe's (few) by fingerprint."""
    cdef size_t n = hits.size, i, begin = 0
    cdef size_t low = hits.data[0].probe if n else 0, top = low
    for i in range(n):
        low, top = min(low, hits.data[i].probe), max(top, hits.data[i].probe)
    if n < 64 or low == top:  # few, or one probe's (search_pending)
        qsort(hits.data, n, sizeof(Hit), cmp_hit)
        return 0
    cdef size_t* ends = <size_t*>calloc(top + 2, sizeof(size_t))
    cdef Hit* by_probe = <Hit*>malloc(n * sizeof(Hit))
    if ends == NULL or by_probe == NULL:
        free(by_probe)
        free(ends)
        return NO_MEMORY
    for i in range(n):
        ends[hits.data[i].probe + 1] += 1
    for i in range(top + 1):
        ends[i + 1] += ends[i]
    for i in range(n):  # ends[p] moves from the start of p's hits to their end
        by_probe[ends[hits.data[i].probe]] = hits.data[i]
        ends[hits.data[i].probe] += 1
    for i in range(top + 1):
        sort_by_fp(by_probe + begin, ends[i] - begin)
        begin = ends[i]
    memcpy(hits.data, by_probe, n * sizeof(Hit))
    free(by_probe)
    free(ends)
    return 0


cdef int dedupe_hits(Hits* hits) noexcept nogil:
    """Sort the hits by (probe, fingerprint), keeping each once."""
    cdef size_t i, kept = 0
    cdef int rc = sort_hits(hits)
    if rc:
        return rc
    for i in range(hits.size):
        if kept == 0 or hits.data[i].probe != hits.data[kept - 1].probe or \
                hits.data[i].fp != hits.data[kept - 1].fp:
            hits.data[kept] = hits.data[i]
            kept += 1
    hits.size = kept
    return 0


cdef int search_pending(Work* w, uint64_t fp, int distance, uint64_t probe, bint replaced,
                        Hits* out) noexcept nogil:
    """To the hits from ``out``'s start, found in the tables before
    insert_if_new stored anything, add its pending fingerprints within
    ``distance`` of ``fp`` (compared one by one), keep each once, and keep
    only those the index still has where the call ``replaced`` documents."""
    cdef size_t i
    cdef int rc
    for i in range(w.pending.size):
        if popcount64(w.pending.data[i] ^ fp) <= distance:
            rc = hit_push(out, probe, w.pending.data[i], popcount64(w.pending.data[i] ^ fp))
            if rc:
                return rc
    rc = dedupe_hits(out)
    return drop_stale(w, out) if replaced and rc == 0 else rc


cdef int search_many(Work* w, const uint64_t* probes, size_t n, int distance, int flips,
                     Hits* out) noexcept nogil:
    """The distinct fingerprints the tables and recent hold within ``distance``
    of each probe (removed ones too: drop_stale), as hits sorted by (probe,
    fingerprint): table by table in the order of the permuted
    probes, so that neighbouring seeks share the pages on their way down."""
    if n > 1 or flips:  # one range a table: a seek costs less than setting up sweeps
        return sweep_tables(w, probes, n, distance, flips, out)
    cdef uint64_t* order = <uint64_t*>malloc((2 * n + 1) * sizeof(uint64_t))
    cdef Py_ssize_t t
    cdef size_t i
    cdef int rc = 0
    cdef long* spec
    if order == NULL:
        return NO_MEMORY
    if n:
        prefetch_probe(w, probes[0])
    for t in range(w.layout.tables):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        for i in range(n):
            order[2 * i], order[2 * i + 1] = permute_one(probes[i], spec, w.layout.blocks), i
        rc = sort_records(order, n, 2)
        i = 0
        while rc == 0 and i < n:
            rc = scan_variants(w, t, order[2 * i] & w.layout.prefixes[t], order[2 * i], 64,
                               flips, distance, order[2 * i + 1], out)
            i += 1
        if rc:
            break
    free(order)
    if rc == 0:
        rc = recent_hits(w, probes, n, distance, flips, out)
    return rc if rc else dedupe_hits(out)


cdef void prefetch_probe(Work* w, uint64_t probe) noexcept nogil:
    """Start reading, in every run of every table, what the probe's range
    needs, all at once and in three rounds, so that the scan that follows
    waits on memory about three times, not three times a run: the words of
    the runs' prefix filters; then, of the runs whose filter holds the
    range, the stretches of their directories; then the blocks those find."""
    cdef Py_ssize_t t, round_
    cdef size_t i
    cdef uint64_t lo, hi
    cdef uint64_t los[MAX_TABLES]
    cdef const BlockDir* d
    for t in range(w.layout.tables):
        los[t] = permute_one(probe, w.layout.spec + 3 * w.layout.blocks * t,
                             w.layout.blocks) & w.layout.prefixes[t]
    for round_ in range(3):
        for t in range(w.layout.tables):
            lo, hi = los[t], los[t] | ~w.layout.prefixes[t]
            for i in range(w.table_runs[t].n):
                d = w.table_runs[t].dir[i]
                if d == NULL or d.n == 0:
                    continue
                if round_ == 0:
                    if d.filter != NULL:  # (a hint, as filter_ranges gives it)
                        __builtin_prefetch(filter_word(d, lo))
                elif not filter_holds(d, lo, hi):
                    continue
                elif round_ == 1:
                    prefetch_stretch(d, lo)
                else:
                    prefetch_block(d, dir_seek(d, lo))


cdef int sweep_tables(Work* w, const uint64_t* probes, size_t n, int distance, int flips,
                      Hits* out) noexcept nogil:
    """search_many over tables kept as runs: each table's ranges sorted by
    their start and swept over each run (sweep_runs)."""
    cdef U64s ranges
    cdef Py_ssize_t t
    cdef size_t i
    cdef uint64_t perm
    cdef long* spec
    cdef int rc = 0
    ranges.data, ranges.size, ranges.cap = NULL, 0, 0
    for t in range(w.layout.tables):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        ranges.size = 0
        for i in range(n):
            perm = permute_one(probes[i], spec, w.layout.blocks)
            rc = push_ranges(w, t, perm & w.layout.prefixes[t], perm, 64, flips, i, &ranges)
            if rc:
                break
        if rc == 0:
            rc = sort_records(ranges.data, ranges.size // 4, 4)
        if rc == 0:
            rc = sweep_runs(&w.table_runs[t], ranges.data, ranges.size // 4, distance, spec,
                            w.layout.blocks, out)
        if rc:
            break
    free(ranges.data)
    if rc == 0:
        rc = recent_hits(w, probes, n, distance, flips, out)
    return rc if rc else dedupe_hits(out)


cdef int emit_hits(RunIter* it, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                   const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """The run's entries from where ``it`` stands up to ``hi`` that are at least
    ``lo`` and within ``distance`` of ``perm``, as hits."""
    cdef uint64_t x
    cdef int rc
    while True:
        rc = iter_next(it, &x)
        if rc or x > hi:
            return 0 if rc == MDB_NOTFOUND else rc
        if x >= lo and popcount64(x ^ perm) <= distance:
            rc = hit_push(out, probe, unpermute_one(x, spec, blocks), popcount64(x ^ perm))
            if rc:
                return rc


cdef int scan_runs(TableRuns* r, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                   const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """The hits in [lo, hi] of every live run of a table (a fingerprint may come from two)."""
    cdef RunIter it
    cdef size_t i
    cdef uint64_t skipped = 0
    cdef int rc = 0
    for i in range(r.n):
        it.cursor, it.dir, it.run = r.cursor[i], r.dir[i], r.id[i]
        if it.dir == NULL:  # (a view's runs, shared by threads, all have one)
            r.sought[i] += 1
        elif not filter_holds(it.dir, lo, hi):
            skipped += 1
            continue
        rc = iter_seek(&it, lo)
        if rc == 0:
            rc = emit_hits(&it, lo, hi, perm, distance, spec, blocks, probe, out)
        if rc:
            return rc
    if skipped:  # (only a run with a directory has a filter: the runs have a cache)
        atomic_add(&r.cache.skipped, skipped, ATOMIC_RELAXED)
    return 0


cdef int push_ranges(Work* w, Py_ssize_t t, uint64_t base, uint64_t perm, int first_bit,
                     int flips, uint64_t probe, U64s* ranges) noexcept nogil:
    """As scan_variants, but note each range as (lo, hi, permuted probe, probe)."""
    cdef uint64_t mask = w.layout.prefixes[t]
    cdef int bit, rc = u64_push(ranges, base)
    if rc == 0:
        rc = u64_push(ranges, base | ~mask)
    if rc == 0:
        rc = u64_push(ranges, perm)
    if rc == 0:
        rc = u64_push(ranges, probe)
    if rc or flips == 0:
        return rc
    for bit in range(64 - w.layout.prefix_bits[t], first_bit):
        rc = push_ranges(w, t, base ^ ((<uint64_t>1) << bit), perm, bit, flips - 1, probe, ranges)
        if rc:
            return rc
    return 0


cdef int block_hits(RunIter* it, const uint64_t* q, int distance, const long* spec,
                    Py_ssize_t blocks, Hits* out) noexcept nogil:
    """emit_hits for the range ``q`` (lo, hi, perm, probe) inside the block
    ``it`` holds, from the bucket of lo (select_zero), leaving its cursor."""
    cdef bint more = it.more
    start_at(it, q[0])
    it.more = False
    cdef int rc = emit_hits(it, q[0], q[1], q[2], distance, spec, blocks, q[3], out)
    it.more = more
    return rc


cdef enum:
    SWEEP_AHEAD = 8  # a sweep starts reading the blocks of the next ranges this far ahead
    FILTER_AHEAD = 16  # and the filter's words of the next ranges this far ahead


cdef void filter_ranges(const BlockDir* d, const uint64_t* q, size_t n, uint8_t* held) noexcept nogil:
    """For each of ``n`` ranges (lo, hi, perm, probe): whether run ``d`` may
    hold entries in it (filter_holds)."""
    cdef size_t j
    for j in range(n):
        if j + FILTER_AHEAD < n:
            __builtin_prefetch(filter_word(d, q[4 * (j + FILTER_AHEAD)]))
        held[j] = filter_holds(d, q[4 * j], q[4 * j + 1])


cdef int sweep_runs(TableRuns* r, const uint64_t* q, size_t n, int distance, const long* spec,
                    Py_ssize_t blocks, Hits* out) noexcept nogil:
    """scan_runs for ``n`` ranges (lo, hi, perm, probe) sorted by lo, each run
    swept once: the block that holds a range's start is kept while the next
    ranges start in it, and the cursor steps on before it seeks; a range the
    run's filter rules out is skipped."""
    cdef Sweep sw
    cdef RunIter rest
    cdef uint8_t* held = <uint8_t*>malloc(n + 1)  # a run with a filter: whether it may hold range j
    cdef size_t i, j, ahead, at, block
    cdef bint filtered, prefetched
    cdef uint64_t skipped = 0
    cdef int rc = NO_MEMORY if held == NULL else 0
    for i in range(r.n if rc == 0 else 0):
        sw.it.cursor, sw.it.dir, sw.it.run, sw.kept, sw.has_next = \
            r.cursor[i], r.dir[i], r.id[i], False, False
        rest.run, rest.dir, rest.cursor = r.id[i], r.dir[i], NULL
        filtered = rest.dir != NULL and rest.dir.filter != NULL
        if filtered:
            filter_ranges(rest.dir, q, n, held)
        if rest.dir == NULL:
            r.sought[i] += n
            rc = g_cursor_open(mdb_cursor_txn(r.cursor[i]), mdb_cursor_dbi(r.cursor[i]),
                                 &rest.cursor)
        if rc:
            break
        j = 0
        while filtered and j < n and not held[j]:
            j += 1
        rc = sweep_to(&sw, q[4 * j]) if j < n else 0
        ahead, at, prefetched = j, 0, False
        while rc == 0 and j < n:
            while rest.dir != NULL and rest.dir.n and ahead < min(n, j + SWEEP_AHEAD):  # blocks to come
                if not filtered or held[ahead]:
                    block = dir_gallop(rest.dir, q[4 * ahead], at)
                    if block != at or not prefetched:
                        prefetch_block(rest.dir, block)
                    at, prefetched = block, True
                ahead += 1
            if filtered and not held[j]:
                skipped += 1
                j += 1
                continue
            if sw.has_next and q[4 * j] >= sw.next_first:
                rc = sweep_to(&sw, q[4 * j])
            if rc == 0 and sw.kept:
                rc = block_hits(&sw.it, q + 4 * j, distance, spec, blocks, out)
            if rc == 0 and sw.has_next and q[4 * j + 1] >= sw.next_first:  # on past the block
                rc = scan_runs_one(&rest, sw.next_first, q + 4 * j, distance, spec, blocks, out)
            j += 1
        if rest.cursor != NULL:
            mdb_cursor_close(rest.cursor)
        if rc:
            break
    free(held)
    if skipped:  # (only a run with a directory has a filter: the runs have a cache)
        atomic_add(&r.cache.skipped, skipped, ATOMIC_RELAXED)
    return rc


cdef int scan_runs_one(RunIter* it, uint64_t lo, const uint64_t* q, int distance,
                       const long* spec, Py_ssize_t blocks, Hits* out) noexcept nogil:
    """The hits of the range ``q`` in one run from ``lo`` on (a seek)."""
    cdef int rc = iter_seek(it, lo)
    return rc if rc else emit_hits(it, lo, q[1], q[2], distance, spec, blocks, q[3], out)


cdef int drop_stale(Work* w, Hits* hits) noexcept nogil:
    """Keep the hits whose fingerprint the index has (a run keeps the entries
    of removed fingerprints until the tables are written again:
    rewrite_tables)."""
    cdef size_t i, kept = 0
    cdef int rc
    for i in range(hits.size):
        rc = index_has(w, hits.data[i].fp)
        if rc < 0:
            return rc
        if rc:
            hits.data[kept] = hits.data[i]
            kept += 1
    hits.size = kept
    return 0


cdef struct Keyed:  # one document of a hit: its key at bytes[at:at + size]
    size_t hit, at, size


cdef struct KeyedHits:
    Keyed* data
    size_t size, cap
    uint8_t* bytes
    size_t used, room


cdef int hit_ids(Work* w, const Hits* hits, U64s* found) noexcept nogil:
    """(id, hit) of each document that has a hit's fingerprint now (none for
    a removed one), sorted by id: the index read in fingerprint order, each
    fingerprint once however many probes hit it."""
    cdef uint8_t fp_bytes[8]
    cdef MDB_val k, v
    cdef U64s by_fp  # (fingerprint, hit) of each hit
    cdef uint64_t id
    cdef size_t i, j, at = 0
    cdef int rc = 0
    by_fp.data, by_fp.size, by_fp.cap = NULL, 0, 0
    for i in range(hits.size):
        rc = u64_push(&by_fp, hits.data[i].fp)
        if rc == 0:
            rc = u64_push(&by_fp, i)
        if rc:
            break
    if rc == 0:
        rc = sort_records(by_fp.data, hits.size, 2)
    while rc == 0 and at < hits.size:
        j = at + 1  # the hits of this fingerprint: at to j
        while j < hits.size and by_fp.data[2 * j] == by_fp.data[2 * at]:
            j += 1
        write_be(fp_bytes, by_fp.data[2 * at], 8)
        k.mv_size, k.mv_data = 8, fp_bytes
        rc = slotted_get(w, &w.index, &k, &v, MDB_SET)
        while rc == 0:
            rc = read_id(&v, &id)
            for i in range(at, j if rc == 0 else at):
                rc = u64_push(found, id)
                if rc == 0:
                    rc = u64_push(found, by_fp.data[2 * i + 1])
                if rc:
                    break
            if rc == 0:
                rc = slotted_get(w, &w.index, &k, &v, MDB_NEXT_DUP)
        rc = 0 if rc == MDB_NOTFOUND else rc
        at = j
    free(by_fp.data)
    return rc if rc else sort_records(found.data, found.size // 2, 2)


cdef int read_keys(Work* w, const Hits* hits, KeyedHits* out) noexcept nogil:
    """The keys of the documents that have each hit's fingerprint now (none for
    a removed one), copied into ``out``: their ids from the index (hit_ids),
    then each record read once, in id order."""
    cdef MDB_val k, value
    cdef U64s found  # (id, hit) of each document
    cdef size_t i, key_at = 0, key_size = 0
    cdef int rc
    found.data, found.size, found.cap = NULL, 0, 0
    out.size, out.used = 0, 0
    rc = hit_ids(w, hits, &found)
    for i in range(found.size // 2 if rc == 0 else 0):
        if i == 0 or found.data[2 * i] != found.data[2 * i - 2]:  # a record not read yet
            rc = read_indexed(&w.rec, found.data[2 * i],
                              hits.data[found.data[2 * i + 1]].fp, &k, &value)
            if rc == 0 and room_for(&out.bytes, &out.room, out.used + k.mv_size):
                rc = NO_MEMORY
            if rc == 0 and g_copy(out.bytes + out.used, k.mv_data, k.mv_size):
                rc = CORRUPTED
            if rc == 0:
                key_at, key_size = out.used, k.mv_size
                out.used += key_size
        if rc == 0 and make_room(<void**>&out.data, &out.cap, out.size, sizeof(Keyed)):
            rc = NO_MEMORY
        if rc:
            break
        out.data[out.size].hit, out.data[out.size].at = found.data[2 * i + 1], key_at
        out.data[out.size].size = key_size
        out.size += 1
    free(found.data)
    return rc
