# Compressed sorted runs in LMDB (issue 22, RUNS.md), shared by _lmdb (tables
# kept as runs) and the prototype in tools/runs_prototype: the codec
# (_codec.pxi) on LMDB items. The host module provides NO_MEMORY and the
# format's constants (_format.pxi).

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memmove, memset
from bits cimport __builtin_prefetch, ctz64, read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, MDB_APPEND, MDB_cursor, mdb_cursor_close,
    MDB_cursor_op, MDB_dbi, MDB_GET_CURRENT, MDB_LAST, MDB_NEXT, MDB_NOTFOUND, MDB_PREV,
    MDB_SET_RANGE, MDB_txn, MDB_val,
)

include "_codec.pxi"


# Blocks in LMDB: an item per block, keyed by the run id and its first value

cdef inline bint summed(uint32_t run) noexcept nogil:
    """Whether the blocks of run ``run`` end in their checksum (format.py):
    every live run's do (load_runs)."""
    return (run >> CHECKSUM_BIT) & 1


cdef inline uint32_t new_run_id(uint64_t last) noexcept nogil:
    """The id of a new run after id ``last`` (format.py's new_run_id)."""
    return <uint32_t>(last + 1) | ((<uint32_t>1) << CHECKSUM_BIT)


cdef int load_block(Block* b, const MDB_val* k, const MDB_val* v) noexcept nogil:
    """Copy a block out of the map (guarded) and check it (its checksum and
    its header)."""
    if k.mv_size != RUN_KEY_BYTES or v.mv_size < 3 or v.mv_size > BLOCK_BYTES:
        return CORRUPTED
    if g_copy(b.buf, v.mv_data, v.mv_size):
        return CORRUPTED
    return block_header(b, read_be(<const uint8_t*>k.mv_data + 4, 8), v.mv_size, True)


# A run's block directory: where each of its blocks lies in the map, read
# once, so that a seek is a binary search instead of a B-tree descent. A run
# never changes once written and its pages stay put while a snapshot holds it,
# so a directory serves every snapshot in which the run is live.

cdef enum:
    DIR_STRIDE = 8      # a directory's top level: every 8th block's first value


cdef struct BlockDir:
    uint32_t run        # the run it was read from (its id, and its entries)
    uint64_t entries
    size_t n, cap, refs  # blocks; refs: its holders (see _lmdb's DirCache)
    uint64_t* firsts     # each block's first value, ascending
    const uint8_t** data  # each block's value in the map
    uint16_t* sizes      # its coded bytes (less its checksum, checked by dir_build)
    uint64_t* tops       # firsts[DIR_STRIDE * j]: ~6 KB a million entries, in cache
    uint64_t* filter     # the run's prefix filter (filter_holds), or NULL
    size_t filter_words
    int shift


# A run's prefix filter: a Bloom filter of the prefixes of its entries (entry
# >> shift, where shift leaves the prefix a probe's range spans: a table's
# leading blocks, a band's key), two bits of one word a prefix. A range within
# one prefix that the filter rules out holds none of the run's entries, so a
# search skips it without reading a block: most ranges of a probe or a band key
# hold nothing, and a run's blocks are far apart in the map. A prefix's word
# follows from its value (its place among all prefixes, so building the filter
# from the run's sorted entries writes it in order), its two bits from its hash
# (_hash.pxi's fmix64, which the host module includes first).

cdef inline uint64_t* filter_word(const BlockDir* d, uint64_t x) noexcept nogil:
    """The word of the filter that the prefix of entry ``x`` sets."""
    return d.filter + ((((x >> d.shift) << d.shift >> 32) * d.filter_words) >> 32)


cdef inline uint64_t filter_bits_of(const BlockDir* d, uint64_t x) noexcept nogil:
    """The two bits the prefix of entry ``x`` sets in its word."""
    cdef uint64_t h = fmix64(x >> d.shift)
    return ((<uint64_t>1) << (h & 63)) | ((<uint64_t>1) << ((h >> 6) & 63))


cdef inline bint filter_holds(const BlockDir* d, uint64_t lo, uint64_t hi) noexcept nogil:
    """Whether run ``d`` may hold entries in [lo, hi]: False only where the
    range lies within one prefix that the filter rules out."""
    if d.filter == NULL or (lo >> d.shift) != (hi >> d.shift):
        return True
    cdef uint64_t bits = filter_bits_of(d, lo)
    return (filter_word(d, lo)[0] & bits) == bits


cdef inline size_t last_at_most(const uint64_t* a, size_t lo, size_t hi, uint64_t x) noexcept nogil:
    """The last index in [lo, hi) of the sorted ``a`` whose value is at most
    ``x`` (``lo`` when none is)."""
    cdef size_t below = upper_bound(a + lo, hi - lo, x)
    return lo + below - 1 if below else lo


cdef size_t dir_find(const BlockDir* d, uint64_t x, size_t lo, size_t hi) noexcept nogil:
    """The last block in [lo, hi) whose first value is at most ``x`` (``lo``
    when none is)."""
    return last_at_most(d.firsts, lo, hi, x)


cdef inline size_t dir_top(const BlockDir* d, uint64_t x) noexcept nogil:
    """The first block of the stretch of DIR_STRIDE blocks dir_seek looks in for ``x``."""
    return DIR_STRIDE * last_at_most(d.tops, 0, (d.n + DIR_STRIDE - 1) // DIR_STRIDE, x)


cdef size_t dir_seek(const BlockDir* d, uint64_t x) noexcept nogil:
    """dir_find over the whole directory: first among the tops, then in the
    stretch of DIR_STRIDE blocks that one begins (two short searches, where one
    over all the blocks would miss the cache at each of its last steps)."""
    cdef size_t top = dir_top(d, x)
    return dir_find(d, x, top, min(top + DIR_STRIDE, d.n))


cdef inline void prefetch_stretch(const BlockDir* d, uint64_t x) noexcept nogil:
    """Start reading the first values of the stretch dir_seek looks in for ``x``."""
    cdef size_t top = dir_top(d, x)
    __builtin_prefetch(d.firsts + top)
    __builtin_prefetch(d.firsts + min(top + DIR_STRIDE, d.n) - 1)


cdef inline void prefetch_block(const BlockDir* d, size_t at) noexcept nogil:
    """Start reading block ``at`` from the map, each of its cache lines (a
    hint: it never faults, nor reads a page the process has not mapped)."""
    cdef size_t line = (<size_t>d.data[at]) & ~(<size_t>63)
    cdef size_t end = <size_t>d.data[at] + d.sizes[at]
    while line < end:
        __builtin_prefetch(<const void*>line)
        line += 64


cdef size_t dir_gallop(const BlockDir* d, uint64_t x, size_t at) noexcept nogil:
    """dir_find from block ``at`` on, for a sweep's ascending seeks."""
    cdef size_t step = 1, hi = at + 1
    while hi < d.n and d.firsts[hi] <= x:
        at = hi
        hi = at + step
        step *= 2
    return dir_find(d, x, at, min(hi, d.n))


# Reading a run: its blocks by the directory, or by a cursor over them, an
# entry at a time

cdef struct RunIter:
    MDB_cursor* cursor
    const BlockDir* dir  # the run's directory (cursor unused), or NULL
    uint32_t run
    bint more       # blocks of the run may follow the current one
    size_t at       # with a directory: the current block
    size_t i        # the next entry of the block: 0 its first, i its (i-1)-th offset
    size_t pos      # where the next offset's high bit is looked for
    Block b


cdef int dir_load(RunIter* it, size_t at) noexcept nogil:
    """Copy block ``at`` of the directory out of the map (guarded), check its
    header (dir_build checked its checksum)."""
    it.at = at
    if g_copy(it.b.buf, it.dir.data[at], it.dir.sizes[at]):
        return CORRUPTED
    return block_header(&it.b, it.dir.firsts[at], it.dir.sizes[at], False)


cdef void start_at(RunIter* it, uint64_t lo) noexcept nogil:
    """Position ``it`` in the block it holds at the bucket of ``lo``
    (select_zero), or at the block's first entry where ``lo`` is not past it."""
    cdef uint64_t t
    cdef size_t z
    it.i, it.pos = 0, 0
    if lo <= it.b.first:
        return
    t = (lo - it.b.first) >> it.b.L
    it.i = 1
    if t:  # past the t-th zero, before which t buckets end
        z = select_zero(&it.b, t)
        if z == NOWHERE:
            it.i = it.b.c + 1
        else:
            it.pos, it.i = z + 1, 2 + z - t


cdef inline bint in_run(const MDB_val* k, uint32_t run) noexcept nogil:
    return k.mv_size == RUN_KEY_BYTES and read_be(<const uint8_t*>k.mv_data, 4) == run


cdef int iter_seek(RunIter* it, uint64_t lo) noexcept nogil:
    """Position ``it`` so that iter_next gives the run's entries from the
    bucket of ``lo`` on (the few before ``lo`` there are the caller's to skip)."""
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef int rc
    it.more, it.i, it.b.c = False, 1, 0  # empty, until a block is found
    if it.dir != NULL:
        if it.dir.n == 0:
            return 0
        rc = dir_load(it, dir_seek(it.dir, lo))
        if rc == 0:
            it.more = True
            start_at(it, lo)
        return rc
    write_be(key, it.run, 4)
    write_be(key + 4, lo, 8)
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key
    rc = g_cursor_get(it.cursor, &k, &v, MDB_SET_RANGE)
    if rc == 0 and in_run(&k, it.run) and read_be(<const uint8_t*>k.mv_data + 4, 8) == lo:
        it.more, it.i, it.pos = True, 0, 0
        return load_block(&it.b, &k, &v)
    if rc and rc != MDB_NOTFOUND:
        return rc
    rc = g_cursor_get(it.cursor, &k, &v, MDB_PREV if rc == 0 else MDB_LAST)
    if rc == 0 and in_run(&k, it.run):  # the block before lo: start at lo's bucket
        rc = load_block(&it.b, &k, &v)
        if rc:
            return rc
        it.more = True
        start_at(it, lo)
        return 0
    if rc and rc != MDB_NOTFOUND:
        return rc
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key  # lo is before the run's first block
    rc = g_cursor_get(it.cursor, &k, &v, MDB_SET_RANGE)
    if rc == 0 and in_run(&k, it.run):
        it.more, it.i, it.pos = True, 0, 0
        return load_block(&it.b, &k, &v)
    return 0 if rc == 0 or rc == MDB_NOTFOUND else rc


cdef int iter_next(RunIter* it, uint64_t* out) noexcept nogil:
    """The next entry of the run into ``out``: 0, MDB_NOTFOUND at its end, or an error."""
    cdef MDB_val k, v
    cdef uint64_t word
    cdef size_t w, p
    cdef int rc
    while it.i > it.b.c:
        if not it.more:
            return MDB_NOTFOUND
        if it.dir != NULL:
            it.more = it.at + 1 < it.dir.n
            rc = dir_load(it, it.at + 1) if it.more else MDB_NOTFOUND
            if rc:
                return rc
            it.i, it.pos = 0, 0
            continue
        rc = g_cursor_get(it.cursor, &k, &v, MDB_NEXT)
        if rc == 0 and not in_run(&k, it.run):
            rc = MDB_NOTFOUND
        if rc:
            it.more = False
            return rc
        rc = load_block(&it.b, &k, &v)
        if rc:
            return rc
        it.i, it.pos = 0, 0
    if it.i == 0:
        it.i = 1
        out[0] = it.b.first
        return 0
    w = it.pos >> 6
    word = load_le64(it.b.high + 8 * w) & ((~(<uint64_t>0)) << (it.pos & 63)) \
        if w < it.b.high_words else 0
    while word == 0:
        w += 1
        if w >= it.b.high_words:
            return CORRUPTED
        word = load_le64(it.b.high + 8 * w)
    p = 64 * w + ctz64(word)
    out[0] = it.b.first + ((<uint64_t>(p - (it.i - 1)) << it.b.L)
                           | read_bits(it.b.low, (it.i - 1) * it.b.L, it.b.L))
    it.i += 1
    it.pos = p + 1
    return 0


cdef int scan_run(RunIter* it, uint64_t lo, uint64_t hi, size_t* count) noexcept nogil:
    """Count the run's entries in [lo, hi]."""
    cdef uint64_t x
    cdef int rc = iter_seek(it, lo)
    while rc == 0:
        rc = iter_next(it, &x)
        if rc == 0 and x > hi:
            return 0
        if rc == 0 and x >= lo:
            count[0] += 1
    return 0 if rc == MDB_NOTFOUND else rc


# A batch of ranges sorted by their start: the block that holds a range's
# start is kept while the next ranges start in it, and the cursor moves on to
# the next block before it seeks

cdef size_t block_rank(const Block* b, uint64_t x) noexcept nogil:
    """How many of the block's entries are at most ``x``: the ones before the
    bucket of ``x`` (found with select_zero), then those in it up to ``x``."""
    cdef uint64_t d, t, low
    cdef size_t i = 0, p = 0, z
    if x < b.first:
        return 0
    d = x - b.first
    t, low = d >> b.L, d & ((((<uint64_t>1) << b.L) - 1) if b.L else 0)
    if t:
        z = select_zero(b, t)
        if z == NOWHERE:
            return b.c + 1
        p, i = z + 1, z + 1 - t
    while i < b.c and (b.high[p >> 3] >> (p & 7)) & 1 and read_bits(b.low, i * b.L, b.L) <= low:
        i += 1
        p += 1
    return i + 1


cdef struct Sweep:
    RunIter it          # its block the kept one, its cursor on the block after it
    bint kept, has_next
    uint64_t next_first


cdef int sweep_keep(Sweep* sw) noexcept nogil:
    """Keep the block in ``sw.it.b`` and look at the next block's first value."""
    cdef MDB_val k, v
    sw.kept = True
    if sw.it.dir != NULL:
        sw.has_next = sw.it.at + 1 < sw.it.dir.n
        if sw.has_next:
            sw.next_first = sw.it.dir.firsts[sw.it.at + 1]
        return 0
    cdef int rc = g_cursor_get(sw.it.cursor, &k, &v, MDB_NEXT)
    sw.has_next = rc == 0 and in_run(&k, sw.it.run)
    if sw.has_next:
        sw.next_first = read_be(<const uint8_t*>k.mv_data + 4, 8)
    return 0 if rc == 0 or rc == MDB_NOTFOUND else rc


cdef int sweep_to(Sweep* sw, uint64_t lo) noexcept nogil:
    """Keep the block that holds ``lo``: the next one if it does, else a seek
    (with a directory: a gallop from the kept block)."""
    cdef MDB_val k, v
    cdef int rc
    cdef size_t start
    if sw.it.dir != NULL:
        start, sw.kept, sw.has_next = sw.it.at if sw.kept else 0, False, False
        if sw.it.dir.n == 0:
            return 0
        rc = dir_load(&sw.it, dir_gallop(sw.it.dir, lo, start))
        sw.it.more = True
        return rc if rc else sweep_keep(sw)
    if sw.has_next:
        rc = g_cursor_get(sw.it.cursor, &k, &v, MDB_GET_CURRENT)
        if rc == 0:
            rc = load_block(&sw.it.b, &k, &v)
        if rc == 0:
            rc = sweep_keep(sw)
        if rc or not sw.has_next or lo < sw.next_first:
            return rc
    rc = iter_seek(&sw.it, lo)
    if rc or not sw.it.more:  # an empty run
        sw.kept = sw.has_next = False
        return rc
    return sweep_keep(sw)


cdef int sweep_count(Sweep* sw, RunIter* rest, uint64_t lo, uint64_t hi, size_t* count) noexcept nogil:
    """Count the run's entries in [lo, hi] (``lo`` at least the last range's)."""
    cdef int rc = 0
    if sw.has_next and lo >= sw.next_first:
        rc = sweep_to(sw, lo)
        if rc:
            return rc
    if sw.kept:
        count[0] += block_rank(&sw.it.b, hi) - (block_rank(&sw.it.b, lo - 1) if lo else 0)
    if sw.has_next and hi >= sw.next_first:  # the range goes on past the block
        rc = scan_run(rest, sw.next_first, hi, count)
    return rc


# Writing a run (its id checksummed: format.py's new_run_id): values gathered
# in a buffer, checked, and cut into blocks, each sealed with its checksum and
# appended; the last, unfinished block stays in the buffer

cdef enum:
    OUT = 4 * MOST      # the buffer's values: a full block fits three times over


cdef struct Blocks:
    uint8_t* data       # each block: its first value (8 bytes), its size (2), its value
    size_t size, cap


cdef int blocks_push(Blocks* out, uint64_t first, const uint8_t* value, uint16_t size) noexcept nogil:
    """Append a block to ``out``."""
    cdef size_t need = out.size + 10 + size, cap = max(out.size + 10 + size, 2 * out.cap)
    cdef void* grown
    if need > out.cap:
        grown = realloc(out.data, cap)
        if grown == NULL:
            return NO_MEMORY
        out.data, out.cap = <uint8_t*>grown, cap
    memcpy(out.data + out.size, &first, 8)
    memcpy(out.data + out.size + 8, &size, 2)
    memcpy(out.data + out.size + 10, value, size)
    out.size = need
    return 0


cdef struct RunWriter:
    MDB_cursor* cursor  # where blocks are put, or NULL: into ``sink``
    Blocks* sink
    uint32_t run
    uint64_t* out       # OUT values: [0, clean) checked, [clean, n) not yet
    size_t clean, n
    uint64_t last       # the last value put in a block, when blocks > 0
    const uint64_t* drop  # sorted values to leave out, and how many are left
    size_t n_drop
    size_t blocks, guess, entries
    uint8_t buf[BLOCK_BYTES + PAD]


cdef int writer_flush(RunWriter* wr, bint final) noexcept nogil:
    """Check the new values (ascending; equal ones and dropped ones left out),
    put every block they complete (all of them when ``final``), and keep the rest."""
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t i, w = wr.clean, start = 0, n
    cdef uint64_t x, prev = wr.out[w - 1] if w else wr.last
    cdef bint any = w or wr.blocks
    cdef int rc
    for i in range(wr.clean, wr.n):
        x = wr.out[i]
        if any and x <= prev:
            if x == prev:
                continue
            return CORRUPTED
        while wr.n_drop and wr.drop[0] < x:
            wr.drop += 1
            wr.n_drop -= 1
        if wr.n_drop and wr.drop[0] == x:
            continue
        wr.out[w] = prev = x
        w += 1
        any = True
    while w - start > MOST or (final and w > start):
        n = block_length(wr.out + start, w - start, &wr.guess)
        write_be(key, wr.run, 4)
        write_be(key + 4, wr.out[start], 8)
        k.mv_size, k.mv_data = RUN_KEY_BYTES, key
        v.mv_size = seal_block(wr.out[start], wr.buf, encode_block(wr.out + start, n, wr.buf))
        v.mv_data = wr.buf
        if wr.cursor == NULL:
            rc = blocks_push(wr.sink, wr.out[start], wr.buf, v.mv_size)
        else:
            rc = g_cursor_put(wr.cursor, &k, &v, MDB_APPEND)
        if rc:
            return rc
        wr.blocks += 1
        wr.entries += n
        wr.last = wr.out[start + n - 1]
        start += n
    memmove(wr.out, wr.out + start, (w - start) * sizeof(uint64_t))
    wr.clean = wr.n = w - start
    return 0


# Reading runs to merge: a block decoded at a time into an array

cdef struct Source:
    MDB_cursor* cursor  # NULL: ``vals`` is the whole source, or ``dir`` gives its blocks
    const BlockDir* dir
    size_t at, end      # with ``dir``: the next block, and the end of those to read
    uint64_t lo, hi     # with ``dir``: the values read, from lo, below hi if ``bounded``
    bint bounded
    MDB_dbi dbi
    uint32_t run
    const uint64_t* vals
    size_t i, n         # the next entry of vals, and how many it holds
    uint64_t* buf       # MOST values, a decoded block
    Block b


cdef int source_next(Source* s, MDB_cursor_op op) noexcept nogil:
    """Decode the run's next block (the first with MDB_SET_RANGE); n = 0 at its end."""
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef int rc
    write_be(key, s.run, 4)
    memset(key + 4, 0, 8)
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key
    s.i = s.n = 0
    rc = g_cursor_get(s.cursor, &k, &v, op)
    if rc == MDB_NOTFOUND or (rc == 0 and not in_run(&k, s.run)):
        return 0
    if rc == 0:
        rc = load_block(&s.b, &k, &v)
    if rc == 0:
        rc = decode_entries(&s.b, s.buf)
        s.n = s.b.c + 1
    return rc


cdef int source_next_block(Source* s) noexcept nogil:
    """Decode the next block of ``s.dir`` that holds values in [lo, hi) (copied
    out of the map, guarded), and keep only those; n = 0 past the last."""
    cdef int rc
    s.i = s.n = 0
    while s.at < s.end:
        if g_copy(s.b.buf, s.dir.data[s.at], s.dir.sizes[s.at]):
            return CORRUPTED
        rc = block_header(&s.b, s.dir.firsts[s.at], s.dir.sizes[s.at], False)  # (dir_build checked)
        if rc == 0:
            rc = decode_entries(&s.b, s.buf)
        if rc:
            return rc
        s.at += 1
        s.n = s.b.c + 1
        if s.lo > s.buf[0]:
            s.i = upper_bound(s.buf, s.n, s.lo - 1)
        if s.bounded and s.buf[s.n - 1] >= s.hi:
            s.n, s.end = upper_bound(s.buf, s.n, s.hi - 1), s.at
        if s.i < s.n:
            return 0
        s.i = s.n = 0
    return 0


cdef int source_refill(Source* s) noexcept nogil:
    """The run's next block, once the current one is used up."""
    if s.i == s.n and s.dir != NULL:
        return source_next_block(s)
    if s.i == s.n and s.cursor != NULL:
        return source_next(s, MDB_NEXT)
    return 0


cdef int merge_two(Source* a, Source* b, RunWriter* wr) noexcept nogil:
    """Merge two sources into ``wr`` without branches on the data, until the
    block of one of them is used up or the buffer is full."""
    cdef const uint64_t* x = a.vals
    cdef const uint64_t* y = b.vals
    cdef size_t i = a.i, j = b.i, k = wr.n, t
    cdef uint64_t u, v
    while i < a.n and j < b.n and k < OUT:
        u, v = x[i], y[j]
        t = u <= v
        wr.out[k] = u if t else v
        i += t
        j += 1 - t
        k += 1
    a.i, b.i, wr.n = i, j, k
    return 0


cdef int writer_take(RunWriter* wr, const uint64_t* values, size_t n) noexcept nogil:
    """Add sorted ``values`` to the writer's buffer, putting blocks as it fills."""
    cdef size_t part
    cdef int rc
    while n:
        part = min(n, OUT - wr.n)
        memcpy(wr.out + wr.n, values, part * sizeof(uint64_t))
        wr.n += part
        values += part
        n -= part
        if wr.n == OUT:
            rc = writer_flush(wr, False)
            if rc:
                return rc
    return 0


cdef int merge_round(Source* src, size_t* live, size_t n, uint64_t** bufs, RunWriter* wr) noexcept nogil:
    """Merge the entries of the ``n`` live sources up to the first end of one of
    their blocks (MOST entries at most from an array) into ``wr``: the pieces
    merged pairwise without branches, log2(n) passes between two buffers."""
    cdef const uint64_t* piece[64]
    cdef size_t size[64]
    cdef size_t s, k, count = n, at, flip = 0
    cdef uint64_t horizon = ~(<uint64_t>0)
    cdef Source* x
    for k in range(n):
        x = &src[live[k]]
        horizon = min(horizon, x.vals[min(x.n, x.i + MOST) - 1])
    for k in range(n):
        x = &src[live[k]]
        piece[k] = x.vals + x.i
        size[k] = upper_bound(piece[k], min(x.n - x.i, MOST), horizon)
        x.i += size[k]
    while count > 1:
        at = 0
        for k in range(0, count, 2):
            if k + 1 < count:
                s = merge_arrays(piece[k], size[k], piece[k + 1], size[k + 1], bufs[flip] + at)
            else:
                s = size[k]
                memcpy(bufs[flip] + at, piece[k], s * sizeof(uint64_t))
            piece[k // 2], size[k // 2] = bufs[flip] + at, s
            at += s
        count = (count + 1) // 2
        flip = 1 - flip
    return writer_take(wr, piece[0], size[0])


cdef int merge_sources(Source* src, size_t m, RunWriter* wr) noexcept nogil:
    """Merge the ``m`` sources into ``wr`` (its buffer allocated for the merge):
    one copied, two merged as they stream, more in rounds (merge_round)."""
    cdef size_t* live = <size_t*>malloc(m * sizeof(size_t))
    cdef uint64_t* bufs[2]
    cdef size_t s, n
    cdef int rc = 0
    bufs[0] = <uint64_t*>malloc(m * MOST * sizeof(uint64_t))
    bufs[1] = <uint64_t*>malloc(m * MOST * sizeof(uint64_t))
    wr.out = <uint64_t*>malloc(OUT * sizeof(uint64_t))
    if live == NULL or bufs[0] == NULL or bufs[1] == NULL or wr.out == NULL:
        rc = NO_MEMORY
    while rc == 0:
        n = 0
        for s in range(m):
            if src[s].i < src[s].n:
                live[n] = s
                n += 1
        if n == 0:
            rc = writer_flush(wr, True)
            break
        if n == 1:
            rc = writer_take(wr, src[live[0]].vals + src[live[0]].i, src[live[0]].n - src[live[0]].i)
            src[live[0]].i = src[live[0]].n
        elif n == 2:
            rc = merge_two(&src[live[0]], &src[live[1]], wr)
            if rc == 0 and wr.n == OUT:
                rc = writer_flush(wr, False)
        else:
            rc = merge_round(src, live, n, bufs, wr)
        for s in range(n):
            if rc == 0:
                rc = source_refill(&src[live[s]])
    free(live)
    free(bufs[0])
    free(bufs[1])
    free(wr.out)
    wr.out = NULL
    return rc


cdef int merge_runs(MDB_txn* txn, const MDB_dbi* dbis, const uint32_t* runs, size_t m,
                    const uint64_t* extra, size_t n_extra, const uint64_t* drop, size_t n_drop,
                    MDB_dbi out, uint32_t run, size_t* blocks, size_t* entries) noexcept nogil:
    """Write as run ``run`` into the empty slot ``out`` the union of the ``m``
    (< 64) runs ``runs`` (in the slots ``dbis``) and the sorted ``extra``
    values, less the sorted ``drop`` values; the sources stay where they are."""
    cdef Source* src = <Source*>calloc(m + 1, sizeof(Source))
    cdef RunWriter wr
    cdef size_t s
    cdef int rc = NO_MEMORY if src == NULL else 0
    wr.run, wr.clean, wr.n, wr.blocks, wr.guess, wr.entries = run, 0, 0, 0, 2, 0
    wr.drop, wr.n_drop, wr.cursor, wr.sink = drop, n_drop, NULL, NULL
    for s in range(m if rc == 0 else 0):
        src[s].run, src[s].dbi = runs[s], dbis[s]
        src[s].buf = <uint64_t*>malloc(MOST * sizeof(uint64_t))
        src[s].vals = src[s].buf
        rc = NO_MEMORY if src[s].buf == NULL else g_cursor_open(txn, dbis[s], &src[s].cursor)
        if rc == 0:
            rc = source_next(&src[s], MDB_SET_RANGE)
        if rc:
            break
    if rc == 0:
        src[m].vals, src[m].n = extra, n_extra
        rc = g_cursor_open(txn, out, &wr.cursor)
    if rc == 0:
        rc = merge_sources(src, m + 1, &wr)
    if wr.cursor != NULL:
        mdb_cursor_close(wr.cursor)
    for s in range(m if src != NULL else 0):
        if src[s].cursor != NULL:
            mdb_cursor_close(src[s].cursor)
        free(src[s].buf)
    free(src)
    blocks[0], entries[0] = wr.blocks, wr.entries
    return rc
