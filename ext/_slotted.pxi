# Slotted structures (RUNS.md, "The index as runs"): sorted duplicates (an
# 8-byte key -> 8-byte ids) kept in a few slot sub-databases, its entries the
# union of theirs, each entry in exactly one of them. A write transaction puts
# its new entries into a slot of its own, which takes them in few pages
# whatever the map holds; deletes go to the slot that holds the entry; merges
# (the smallest slots in use into a free one, appended in order) keep about
# log_RATIO(N / batch) slots in use. Used twice:
# the fingerprint index (slots "fingerprints", "index:NN": fingerprint ->
# document id) and the key map (slots "hashes", "hashes:NN": key hash -> id).
# Included by _lmdb.pyx after Work (which holds both as Slotted).

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, g_del, g_drop, g_stat, g_txn_begin,
    GUARD_FAULT, MDB_APPEND, MDB_APPENDDUP, MDB_cursor, mdb_cursor_close, MDB_cursor_op, MDB_dbi,
    MDB_env, MDB_FIRST, MDB_GET_BOTH_RANGE, MDB_GET_CURRENT, MDB_KEYEXIST, MDB_NEXT, MDB_NEXT_NODUP,
    MDB_NODUPDATA, MDB_NOTFOUND, MDB_RDONLY, MDB_SET, MDB_SET_RANGE, MDB_stat,
    MDB_txn,
    mdb_txn_abort, mdb_txn_env, mdb_txn_id, MDB_val, pthread_cond_broadcast, pthread_cond_destroy,
    pthread_cond_init, pthread_cond_t, pthread_cond_wait, pthread_create, pthread_join,
    pthread_mutex_destroy, pthread_mutex_init, pthread_mutex_lock, pthread_mutex_t,
    pthread_mutex_unlock, pthread_t,
)

# A slot's filter: a Bloom filter of its keys (SLOT_FILTER_BITS a key, three
# bits of one 64-bit word), so that a lookup skips the slots that cannot hold
# its key (a crawler's new keys are in none, a stored one is in one) rather than
# descend each slot's B-tree. A slot gets one once the lookups there without
# it would have paid for reading the slot whole (SLOT_FILTER_RENT), and the
# Env keeps it while the slot only loses entries; only write transactions use
# them (a reader's snapshot may be older than a filter). A slot the
# transaction may add to (its own slot, a merge's sources and destination, one
# it writes again) is unsure: it gets no filter until the commit after, which
# drops its old one. A filter built from
# what a transaction left is dropped if it aborts; one whose slot holds more
# entries than it was built from is not trusted; and where another writer
# committed since (the next write transaction does not follow the Env's last),
# every filter is dropped (slot_filters_begin).

cdef enum:
    SLOT_FILTER_BITS = 12       # bits a key: about 1 key in 60 not in a slot passes its filter
    SLOT_FILTER_RENT = 32       # a slot gets a filter once lookups there reach its entries / this


cdef inline uint64_t slot_bits(uint64_t h) noexcept nogil:
    return (1ULL << (h & 63)) | (1ULL << ((h >> 6) & 63)) | (1ULL << ((h >> 12) & 63))


cdef inline uint64_t* slot_word(const SlotFilter* f, uint64_t h) noexcept nogil:
    return f.words + (((h >> 32) * f.count) >> 32)


cdef void slot_filter_drop(SlotFilter* f) noexcept nogil:
    free(f.words)
    f.words, f.count, f.entries, f.sought = NULL, 0, 0, 0


cdef void slot_filters_drop(SlotFilters* fs, uint32_t slots) noexcept nogil:
    """Drop the filters of ``slots`` (a bit a slot)."""
    cdef int s
    for s in range(INDEX_SLOTS):
        if (slots >> s) & 1:
            slot_filter_drop(&fs.slot[s])


cdef void slot_filters_begin(SlotFilters* fs, bint others_wrote) noexcept nogil:
    """A write transaction begins (``others_wrote``: after another writer's
    commit)."""
    if others_wrote:
        slot_filters_drop(fs, 0xFFFFFFFF)
    fs.unsure, fs.fresh = 0, 0


cdef void slot_filters_end(SlotFilters* fs, bint committed) noexcept nogil:
    """The write transaction committed, or aborted."""
    slot_filters_drop(fs, fs.unsure if committed else fs.fresh)
    fs.unsure, fs.fresh = 0, 0


cdef inline void slot_unsure(Slotted* m, int s) noexcept nogil:
    """The transaction may add entries to slot ``s``."""
    if m.filters != NULL:
        m.filters.unsure |= 1U << s


cdef int slot_filter_build(Work* w, Slotted* m, int s, SlotFilter* f) noexcept nogil:
    """Build ``f`` from the keys of slot ``s``: 0, or NO_MEMORY or the error
    of reading the slot (none built; CORRUPTED where the walk met fewer
    entries than LMDB counts, as past a damaged branch page)."""
    cdef MDB_cursor* cursor = NULL
    cdef MDB_stat stat
    cdef MDB_val k, v
    cdef uint64_t h, key, last = 0, walked = 0
    cdef int rc = g_stat(w.txn, m.dbis[s], &stat)
    if rc:
        return rc
    f.count = min(max(<uint64_t>1, (stat.ms_entries * SLOT_FILTER_BITS + 63) // 64),
                  <uint64_t>0xFFFFFFFF)
    f.words = <uint64_t*>calloc(f.count, sizeof(uint64_t))
    rc = NO_MEMORY if f.words == NULL else g_cursor_open(w.txn, m.dbis[s], &cursor)
    if rc == 0:
        rc = g_cursor_get(cursor, &k, &v, MDB_FIRST)
    while rc == 0:
        if k.mv_size != 8:
            rc = CORRUPTED
            break
        key = read_be(<const uint8_t*>k.mv_data, 8)
        if walked == 0 or key != last:
            h = fmix64(key)
            slot_word(f, h)[0] |= slot_bits(h)
        last, walked = key, walked + 1
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    if cursor != NULL:
        mdb_cursor_close(cursor)
    if rc == MDB_NOTFOUND and walked != stat.ms_entries:
        rc = CORRUPTED
    if rc != MDB_NOTFOUND:
        slot_filter_drop(f)
        return rc
    f.entries = stat.ms_entries
    m.filters.fresh |= 1U << s
    m.filters.read += stat.ms_entries
    return 0


cdef int slot_filter(Work* w, Slotted* m, int s, uint64_t entries, uint64_t lookups,
                     SlotFilter** out) noexcept nogil:
    """The filter of slot ``s`` (which holds ``entries``) that ``lookups``
    lookups may trust (``out``; NULL: none), built once the lookups there
    without one pay for it; 0 or an LMDB error."""
    cdef SlotFilters* fs = m.filters
    cdef SlotFilter* f
    cdef int rc
    out[0] = NULL
    if fs == NULL or entries == 0 or s == m.put_slot or (fs.unsure >> s) & 1:
        return 0
    f = &fs.slot[s]
    if f.words != NULL and entries > f.entries:  # added to by a write it was not told of
        fs.unsure |= 1U << s
        return 0
    if f.words == NULL:
        f.sought += lookups
        if f.sought * SLOT_FILTER_RENT < entries:
            return 0
        rc = slot_filter_build(w, m, s, f)
        if rc == GUARD_FAULT:
            return rc
        if rc:  # no memory, or damage the lookups meet where they reach it: none (not again)
            fs.unsure |= 1U << s
            return 0
    out[0] = f
    return 0


cdef inline bint slot_lacks(const SlotFilter* f, const MDB_val* k) noexcept nogil:
    """Whether filter ``f`` (or NULL) rules out key ``k``."""
    if f == NULL or k.mv_size != 8:
        return False
    cdef uint64_t h = fmix64(read_be(<const uint8_t*>k.mv_data, 8))
    cdef uint64_t bits = slot_bits(h)
    return (slot_word(f, h)[0] & bits) != bits


cdef inline int cursor_lacks(Work* w, Slotted* m, int i, const MDB_val* k,
                             bint* lacks) noexcept nogil:
    """Whether the slot of sub-cursor ``i`` cannot hold key ``k``
    (``lacks``): 0, or an LMDB error."""
    cdef SlotFilter* f = NULL
    cdef int rc = 0
    if m.filters != NULL and k.mv_size == 8:
        rc = slot_filter(w, m, m.ix.slot[i], m.ix.entries[i], 1, &f)
    lacks[0] = slot_lacks(f, k)
    return rc


cdef int slotted_open(Work* w, Slotted* m) noexcept nogil:
    """Open a cursor on each slot in use and on the transaction's own, once
    (lazily: a search without hits never reads the index)."""
    cdef SlotCursors* ix = &m.ix
    cdef MDB_stat stat
    cdef int s, rc = 0
    if ix.opened:
        return 0
    slotted_close(m)  # what a failed open left
    for s in range(m.slots):
        rc = g_stat(w.txn, m.dbis[s], &stat)
        if rc == 0 and (stat.ms_entries or s == m.put_slot):
            rc = g_cursor_open(w.txn, m.dbis[s], &ix.cursor[ix.n])
            if rc == 0:
                ix.slot[ix.n], ix.on[ix.n], ix.entries[ix.n] = s, False, stat.ms_entries
                ix.n += 1
        if rc:
            return rc
    ix.opened = True
    return 0


cdef void slotted_close(Slotted* m) noexcept nogil:
    cdef int i
    for i in range(m.ix.n):
        mdb_cursor_close(m.ix.cursor[i])
    if m.ix.put != NULL:
        mdb_cursor_close(m.ix.put)
    m.ix.n, m.ix.opened, m.ix.at, m.ix.put = 0, False, -1, NULL


cdef inline int cmp_entry(const MDB_val* k, const MDB_val* v, const MDB_val* k2,
                          const MDB_val* v2) noexcept nogil:
    cdef int c = cmp_bytes(<const uint8_t*>k.mv_data, k.mv_size, <const uint8_t*>k2.mv_data,
                           k2.mv_size)
    return c if c else cmp_bytes(<const uint8_t*>v.mv_data, v.mv_size,
                                 <const uint8_t*>v2.mv_data, v2.mv_size)


cdef int slots_pick(SlotCursors* ix, MDB_val* k, MDB_val* v) noexcept nogil:
    """Point ``k``, ``v`` at the least entry the positioned sub-cursors are on."""
    cdef MDB_val kk, vv
    cdef int i, rc
    ix.at = -1
    for i in range(ix.n):
        if ix.on[i]:
            rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_GET_CURRENT)
            if rc:
                return rc
            if ix.at < 0 or cmp_entry(&kk, &vv, k, v) < 0:
                ix.at, k[0], v[0] = i, kk, vv
    return 0 if ix.at >= 0 else MDB_NOTFOUND


cdef int slotted_get(Work* w, Slotted* m, MDB_val* k, MDB_val* v,
                     MDB_cursor_op op) noexcept nogil:
    """A cursor operation on the union of the slots, in (key, value) order:
    MDB_FIRST, MDB_SET, MDB_SET_RANGE, MDB_NEXT, MDB_NEXT_DUP or
    MDB_NEXT_NODUP (the moves only after a position was found)."""
    cdef SlotCursors* ix = &m.ix
    cdef MDB_val kk, vv
    cdef uint8_t at_key[8]
    cdef bint lacks = False
    cdef int i, rc = slotted_open(w, m)
    if rc:
        return rc
    if ix.n == 1:
        if op == MDB_SET:
            rc = cursor_lacks(w, m, 0, k, &lacks)
            if rc or lacks:
                return rc if rc else MDB_NOTFOUND
        return g_cursor_get(ix.cursor[0], k, v, op)
    if op == MDB_FIRST or op == MDB_SET or op == MDB_SET_RANGE:
        for i in range(ix.n):
            if op == MDB_SET:
                rc = cursor_lacks(w, m, i, k, &lacks)
                if rc:
                    return rc
                if lacks:
                    ix.on[i] = False
                    continue
            kk, vv = k[0], v[0]
            rc = g_cursor_get(ix.cursor[i], &kk, &vv, op)
            ix.on[i] = rc == 0
            if rc and rc != MDB_NOTFOUND:
                return rc
    elif ix.at < 0:
        return MDB_NOTFOUND
    elif op == MDB_NEXT_NODUP:  # every sub-cursor on the current key moves past it
        rc = g_cursor_get(ix.cursor[ix.at], &kk, &vv, MDB_GET_CURRENT)
        if rc == 0 and (kk.mv_size != 8 or g_copy(at_key, kk.mv_data, 8)):
            rc = CORRUPTED
        for i in range(ix.n if rc == 0 else 0):
            if ix.on[i]:
                rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_GET_CURRENT)
                if rc == 0 and kk.mv_size == 8 and memcmp(kk.mv_data, at_key, 8) == 0:
                    rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_NEXT_NODUP)
                    ix.on[i] = rc == 0
                if rc and rc != MDB_NOTFOUND:
                    return rc
        if rc and rc != MDB_NOTFOUND:
            return rc
    else:  # MDB_NEXT, MDB_NEXT_DUP: the sub-cursor of the current entry moves
        rc = g_cursor_get(ix.cursor[ix.at], &kk, &vv, op)
        ix.on[ix.at] = rc == 0
        if rc and rc != MDB_NOTFOUND:
            return rc
    return slots_pick(ix, k, v)


cdef int index_seek(Work* w, MDB_val* k, MDB_val* v) noexcept nogil:
    """Position the index at the first entry at or past (``k``, ``v``): a
    fingerprint and an id, found by a descent in each slot, however many
    documents the fingerprint has."""
    cdef SlotCursors* ix = &w.index.ix
    cdef MDB_val kk, vv
    cdef int i, rc = slotted_open(w, &w.index)
    for i in range(ix.n if rc == 0 else 0):
        kk, vv = k[0], v[0]
        rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_GET_BOTH_RANGE)
        if rc == MDB_NOTFOUND:  # no such fingerprint, or every key of it comes before
            kk = k[0]
            rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_SET_RANGE)
            if rc == 0 and cmp_bytes(<const uint8_t*>kk.mv_data, kk.mv_size,
                                     <const uint8_t*>k.mv_data, k.mv_size) == 0:
                rc = g_cursor_get(ix.cursor[i], &kk, &vv, MDB_NEXT_NODUP)
        ix.on[i] = rc == 0
        if rc and rc != MDB_NOTFOUND:
            return rc
    return rc if rc and rc != MDB_NOTFOUND else slots_pick(ix, k, v)


cdef int slotted_find(Work* w, Slotted* m, const MDB_val* key, MDB_val* v) noexcept nogil:
    """1 if a slot has ``key`` (``v``: the first of its values there), 0 if
    none, or an LMDB error."""
    cdef SlotCursors* ix = &m.ix
    cdef MDB_val k
    cdef bint lacks = False
    cdef int i, rc = slotted_open(w, m)
    if rc:
        return rc
    ix.at = -1  # the lookups move the sub-cursors
    for i in range(ix.n):
        ix.on[i] = False
        rc = cursor_lacks(w, m, i, key, &lacks)
        if rc:
            return rc
        if lacks:
            continue
        k = key[0]
        rc = g_cursor_get(ix.cursor[i], &k, v, MDB_SET)
        if rc == 0:
            return 1
        if rc != MDB_NOTFOUND:
            return rc
    return 0


cdef int index_has(Work* w, uint64_t fp) noexcept nogil:
    """1 if the index has ``fp``, 0 if not, or an LMDB error."""
    cdef uint8_t key_bytes[8]
    cdef MDB_val k, v
    write_be(key_bytes, fp, 8)
    k.mv_size, k.mv_data = 8, key_bytes
    return slotted_find(w, &w.index, &k, &v)


cdef int slotted_empty(Work* w, Slotted* m) noexcept nogil:
    """1 if no slot has an entry, 0 if one has, or an LMDB error."""
    cdef MDB_val k, v
    cdef int rc = slotted_get(w, m, &k, &v, MDB_FIRST)
    return 1 if rc == MDB_NOTFOUND else 0 if rc == 0 else rc


cdef int slotted_delete(Work* w, Slotted* m, MDB_val* k, MDB_val* v) noexcept nogil:
    """Delete the entry (key, value) from the slot that holds it (if any)."""
    cdef MDB_val kk, vv
    cdef bint lacks = False
    cdef int i, rc = slotted_open(w, m)
    m.ix.at = -1
    for i in range(m.ix.n if rc == 0 else 0):
        m.ix.on[i] = False
        rc = cursor_lacks(w, m, i, k, &lacks)
        if rc:
            return rc
        if lacks:
            continue
        kk, vv = k[0], v[0]
        rc = g_del(w.txn, m.dbis[m.ix.slot[i]], &kk, &vv)
        if rc == 0:
            m.ix.entries[i] -= 1
        if rc != MDB_NOTFOUND:
            return rc
        rc = 0
    return rc


cdef int slotted_sizes(Work* w, Slotted* m, uint64_t* entries, int* used) noexcept nogil:
    cdef MDB_stat stat
    cdef int s, rc = 0
    used[0] = 0
    for s in range(m.slots):
        rc = g_stat(w.txn, m.dbis[s], &stat)
        if rc:
            return rc
        entries[s] = stat.ms_entries
        used[0] += stat.ms_entries > 0
    return 0


cdef int append_entry(MDB_cursor* dst, MDB_val* k, MDB_val* v, uint8_t* last,
                      bint* have_last) noexcept nogil:
    """Append an entry to a slot written in order: an id of the key appended
    last (``last``, once ``have_last``) or a new key."""
    if k.mv_size != 8:
        return CORRUPTED
    if have_last[0] and memcmp(last, k.mv_data, 8) == 0:
        return g_cursor_put(dst, k, v, MDB_APPENDDUP)
    memcpy(last, k.mv_data, 8)
    have_last[0] = True
    return g_cursor_put(dst, k, v, MDB_APPEND)


cdef int slotted_merge_in_place(Work* w, Slotted* m, int a, int b, uint64_t entries) noexcept nogil:
    """Merge slot ``a`` into slot ``b`` (where no slot is free; ``entries``
    in both); ``a`` is emptied."""
    cdef MDB_cursor* src = NULL
    cdef MDB_cursor* dst = NULL
    cdef MDB_val k, v
    cdef int rc
    slotted_close(m)  # the emptied slot leaves its cursor nowhere
    if m.put_slot == a or m.put_slot == b:
        m.put_slot = -1
    slot_unsure(m, a)
    slot_unsure(m, b)
    rc = g_cursor_open(w.txn, m.dbis[a], &src)
    if rc == 0:
        rc = g_cursor_open(w.txn, m.dbis[b], &dst)
    if rc == 0:
        rc = g_cursor_get(src, &k, &v, MDB_FIRST)
    while rc == 0:
        rc = CORRUPTED if k.mv_size != 8 else g_cursor_put(dst, &k, &v, MDB_NODUPDATA)
        if rc == MDB_KEYEXIST:  # the same entry in both (never written so): kept once
            rc = 0
        if rc == 0:
            rc = g_cursor_get(src, &k, &v, MDB_NEXT)
    close_two(src, dst)
    rc = 0 if rc == MDB_NOTFOUND else rc
    if rc == 0:
        rc = g_drop(w.txn, m.dbis[a], 0)
    w.merged += entries
    return rc


# A merge into a free slot reads its sources in (key, value) order (Slots)
# and appends. Where the sources are as the last commit left them, a thread
# reads them in a snapshot of that commit and hands the entries to the writer
# in chunks (Feed), so that the writer's thread only puts.

cdef struct Slots:
    MDB_cursor* cursor[INDEX_SLOTS]
    MDB_val k[INDEX_SLOTS]
    MDB_val v[INDEX_SLOTS]
    bint on[INDEX_SLOTS]
    int n


cdef inline int slot_next(Slots* s, int i, MDB_cursor_op op) noexcept nogil:
    cdef int rc = g_cursor_get(s.cursor[i], &s.k[i], &s.v[i], op)
    s.on[i] = rc == 0
    return 0 if rc == MDB_NOTFOUND else rc


cdef int slots_open(Slots* s, MDB_txn* txn, const MDB_dbi* dbis, int n) noexcept nogil:
    """Cursors on the slots ``dbis``, each at its first entry."""
    cdef int rc = 0
    s.n = 0
    while rc == 0 and s.n < n:
        rc = g_cursor_open(txn, dbis[s.n], &s.cursor[s.n])
        if rc == 0:
            s.n += 1
            rc = slot_next(s, s.n - 1, MDB_FIRST)
    return rc


cdef void slots_close(Slots* s) noexcept nogil:
    cdef int i
    for i in range(s.n):
        mdb_cursor_close(s.cursor[i])
    s.n = 0


cdef int slots_least(const Slots* s) noexcept nogil:
    """The source whose entry comes first (-1: every one is at its end)."""
    cdef int i, at = -1
    for i in range(s.n):
        if s.on[i] and (at < 0 or cmp_entry(&s.k[i], &s.v[i], &s.k[at], &s.v[at]) < 0):
            at = i
    return at


cdef int slots_pass(Slots* s, int at) noexcept nogil:
    """Move the sources past source ``at``'s entry: an entry in two of them
    (never written so) is given once."""
    cdef int i, rc = 0
    for i in range(s.n):
        if rc == 0 and i != at and s.on[i] and \
                cmp_entry(&s.k[i], &s.v[i], &s.k[at], &s.v[at]) == 0:
            rc = slot_next(s, i, MDB_NEXT)
    return rc if rc else slot_next(s, at, MDB_NEXT)


cdef enum:
    FEED_FROM = 1 << 16     # the fewest entries a merge takes for a thread to read them
                            # (or Work.threaded_merge, where that is fewer)
    FEED_CHUNK = 1 << 16    # bytes of entries handed over at a time (4,096 entries)
    FEED_CHUNKS = 8         # chunks in flight


cdef struct Feed:
    MDB_env* env
    size_t snapshot         # the commit the sources are read in: the write transaction's last
    MDB_dbi dbis[INDEX_SLOTS]
    int n
    pthread_mutex_t lock
    pthread_cond_t moved    # a chunk was filled or emptied, or the thread ended or must stop
    uint8_t* chunk[FEED_CHUNKS]
    size_t size[FEED_CHUNKS]
    size_t filled, emptied  # chunks so far (chunk i is chunk[i % FEED_CHUNKS])
    bint began, ended, stop
    int rc                  # the thread's


cdef bint feed_publish(Feed* f, bint last) noexcept nogil:
    """Publish the chunk the thread filled and, unless it is the ``last``,
    wait for room for the next; False when the writer stopped."""
    pthread_mutex_lock(&f.lock)
    f.filled += 1
    pthread_cond_broadcast(&f.moved)
    while not last and f.filled - f.emptied == FEED_CHUNKS and not f.stop:
        pthread_cond_wait(&f.moved, &f.lock)
    cdef bint go_on = not f.stop
    pthread_mutex_unlock(&f.lock)
    return go_on


cdef int feed_fill(Feed* f, MDB_txn* txn) noexcept nogil:
    """Merge the sources in ``txn`` into chunks of entries: each its key and
    its value, 8 bytes each."""
    cdef Slots src
    cdef uint8_t* out
    cdef size_t used = 0
    cdef int at, rc = slots_open(&src, txn, f.dbis, f.n)
    cdef bint go_on = True
    out = f.chunk[f.filled % FEED_CHUNKS]
    while rc == 0 and go_on:
        at = slots_least(&src)
        if at < 0:
            break
        if src.k[at].mv_size != 8 or src.v[at].mv_size != 8:
            rc = CORRUPTED
            break
        if used + 16 > FEED_CHUNK:
            f.size[f.filled % FEED_CHUNKS] = used
            go_on = feed_publish(f, False)
            out, used = f.chunk[f.filled % FEED_CHUNKS], 0
            if not go_on:
                break
        if g_copy(out + used, src.k[at].mv_data, 8) or g_copy(out + used + 8, src.v[at].mv_data, 8):
            rc = CORRUPTED
            break
        used += 16
        rc = slots_pass(&src, at)
    slots_close(&src)
    if rc == 0 and go_on and used:
        f.size[f.filled % FEED_CHUNKS] = used
        feed_publish(f, True)
    return rc


cdef void* feed_thread(void* feed) noexcept nogil:
    cdef Feed* f = <Feed*>feed
    cdef MDB_txn* txn = NULL
    cdef int rc = g_txn_begin(f.env, NULL, MDB_RDONLY, &txn)
    cdef bint began = rc == 0 and mdb_txn_id(txn) == f.snapshot  # (always: the write lock is held)
    if began:
        rc = feed_fill(f, txn)
    if txn != NULL:
        mdb_txn_abort(txn)
    pthread_mutex_lock(&f.lock)
    f.began, f.ended = began, True
    f.rc = rc if began or rc == GUARD_FAULT else 0  # (else, such as a full reader table: the writer reads)
    pthread_cond_broadcast(&f.moved)
    pthread_mutex_unlock(&f.lock)
    return NULL


cdef int feed_drain(Feed* f, MDB_cursor* dst) noexcept nogil:
    """Append the thread's chunks' entries to ``dst`` until it ends."""
    cdef uint8_t last[8]
    cdef bint have_last = False
    cdef MDB_val k, v
    cdef uint8_t* p
    cdef uint8_t* end
    cdef int rc = 0
    while rc == 0:
        pthread_mutex_lock(&f.lock)
        while f.emptied == f.filled and not f.ended:
            pthread_cond_wait(&f.moved, &f.lock)
        if f.emptied == f.filled:  # ended
            pthread_mutex_unlock(&f.lock)
            break
        pthread_mutex_unlock(&f.lock)
        p = f.chunk[f.emptied % FEED_CHUNKS]
        end = p + f.size[f.emptied % FEED_CHUNKS]
        while rc == 0 and p < end:
            k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, p, 8, p + 8
            p += 16
            rc = append_entry(dst, &k, &v, last, &have_last)
        pthread_mutex_lock(&f.lock)
        f.emptied += 1
        f.stop = rc != 0
        pthread_cond_broadcast(&f.moved)
        pthread_mutex_unlock(&f.lock)
    return rc


cdef int feed_merge(Work* w, const MDB_dbi* dbis, int n, MDB_cursor* dst,
                    bint* fed) noexcept nogil:
    """Merge the slots ``dbis``, as the last
    commit left them, into ``dst`` with a thread that reads them; ``fed``:
    whether the thread read them (else nothing was appended: no thread, or no
    snapshot for it)."""
    cdef Feed f
    cdef pthread_t thread
    cdef bint chunks = True
    cdef int i, rc = 0
    memset(&f, 0, sizeof(Feed))
    fed[0] = False
    f.env, f.snapshot, f.n = mdb_txn_env(w.txn), mdb_txn_id(w.txn) - 1, n
    memcpy(f.dbis, dbis, n * sizeof(MDB_dbi))
    for i in range(FEED_CHUNKS):
        f.chunk[i] = <uint8_t*>malloc(FEED_CHUNK)
        chunks = chunks and f.chunk[i] != NULL  # (no memory for them: the writer reads)
    if chunks and pthread_mutex_init(&f.lock, NULL) == 0:
        if pthread_cond_init(&f.moved, NULL) == 0:
            if pthread_create(&thread, NULL, feed_thread, &f) == 0:
                rc = feed_drain(&f, dst)
                pthread_join(thread, NULL)
                fed[0] = f.began
                rc = rc if rc else f.rc
            pthread_cond_destroy(&f.moved)
        pthread_mutex_destroy(&f.lock)
    for i in range(FEED_CHUNKS):
        free(f.chunk[i])
    return rc


cdef int slotted_merge(Work* w, Slotted* m, const int* slots, int n, int d, uint64_t entries,
                       bint committed) noexcept nogil:
    """Merge the ``n`` slots ``slots`` (``entries`` in all) into the free slot
    ``d``, appending in order, and empty them; ``committed``: the slots are as
    the last commit left them."""
    cdef MDB_dbi dbis[INDEX_SLOTS]
    cdef MDB_cursor* dst = NULL
    cdef Slots src
    cdef uint8_t last[8]
    cdef bint have_last = False, fed = False
    cdef int i, at, rc
    slotted_close(m)  # emptied slots leave their cursors nowhere
    slot_unsure(m, d)
    for i in range(n):
        dbis[i] = m.dbis[slots[i]]
        slot_unsure(m, slots[i])
        if m.put_slot == slots[i]:
            m.put_slot = -1
    rc = g_cursor_open(w.txn, m.dbis[d], &dst)
    if rc == 0 and committed and entries >= min(<uint64_t>FEED_FROM, w.threaded_merge) and \
            w.merge_threads > 1:
        rc = feed_merge(w, dbis, n, dst, &fed)
        w.fed_merges[0] += fed
    if rc == 0 and not fed:
        rc = slots_open(&src, w.txn, dbis, n)
        at = slots_least(&src) if rc == 0 else -1
        while at >= 0:  # each put before its source moves on, so its page is held
            rc = append_entry(dst, &src.k[at], &src.v[at], last, &have_last)
            if rc == 0:
                rc = slots_pass(&src, at)
            at = slots_least(&src) if rc == 0 else -1
        slots_close(&src)
    if dst != NULL:
        mdb_cursor_close(dst)
    for i in range(n):
        if rc == 0:
            rc = g_drop(w.txn, dbis[i], 0)
    w.merged += entries
    return rc


cdef int merge_chain(const uint64_t* entries, int slots, int used, uint64_t limit, uint64_t settle,
                     int* chain, uint64_t* total, uint32_t* taken, bint* untidy) noexcept nogil:
    """The slots of the next merge (how many; 0: none): the two smallest in use
    while the smaller holds over 1/RUN_RATIO of the other (or the slots run short,
    or, settling, the two hold at most ``settle`` entries), extended while its
    output would be merged next. A merge of more than ``limit`` entries (0: any)
    is left (``untidy``)."""
    cdef uint64_t x, y
    cdef int s, a, b, n = 0
    total[0], taken[0] = 0, 0
    while True:
        a = b = -1
        for s in range(slots):
            if entries[s] == 0 or (taken[0] >> s) & 1:
                continue
            if a < 0 or entries[s] < entries[a]:
                a, b = s, a
            elif b < 0 or entries[s] < entries[b]:
                b = s
        if (n == 0 and b < 0) or (n and (a < 0 or (b >= 0 and entries[b] < total[0]))):
            break
        x = entries[a] if n == 0 else min(total[0], entries[a])
        y = entries[b] if n == 0 else max(total[0], entries[a])
        if used < INDEX_SLOTS - 1 and x * RUN_RATIO <= y and not (settle and x + y <= settle):
            break
        if used < INDEX_SLOTS - 1 and limit and x + y > limit:
            untidy[0] = True
            break
        chain[n] = a
        n += 1
        taken[0] |= 1 << a
        if n == 1:
            chain[n] = b
            n += 1
            taken[0] |= 1 << b
        total[0] = x + y
        used -= 1
    return n


cdef int slotted_merges(Work* w, Slotted* m, uint64_t limit, bint committed) noexcept nogil:
    """The merges merge_chain calls for, until there are none; a merge of more
    than ``limit`` entries (0: any) is left for tidy (``w.untidy``).
    ``committed``: the slots are as the last commit left them, so that a
    merge of slots this call has not written may be read by a thread."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef uint64_t total
    cdef int chain[INDEX_SLOTS]
    cdef uint32_t written = 0, taken
    cdef int s, n, d, used, rc = 0
    while rc == 0:
        rc = slotted_sizes(w, m, entries, &used)
        n = merge_chain(entries, m.slots, used, limit, w.settle, chain, &total, &taken, &w.untidy) \
            if rc == 0 else 0
        if n == 0:
            break
        d = -1
        for s in range(m.slots):
            if d < 0 and entries[s] == 0:
                d = s
        if d < 0:  # every slot in use (a writer of another kind)
            rc = slotted_merge_in_place(w, m, chain[0], chain[1],
                                        entries[chain[0]] + entries[chain[1]])
            written |= (1 << chain[0]) | (1 << chain[1])
        else:
            rc = slotted_merge(w, m, chain, n, d, total, committed and not (written & taken))
            written |= taken | (1 << d)
    return rc


cdef int merges(Work* w, uint64_t limit, bint committed) noexcept nogil:
    """slotted_merges of the index, then of the key map."""
    cdef int rc = slotted_merges(w, &w.index, limit, committed)
    return rc if rc else slotted_merges(w, &w.keys, limit, committed)


cdef int slotted_put_cursor(Work* w, Slotted* m, MDB_cursor** put) noexcept nogil:
    """The cursor on the transaction's own slot, chosen (a free one: merges keep
    one) the first time it puts."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef int s, used, rc = 0
    if m.ix.put != NULL:
        put[0] = m.ix.put
        return 0
    if m.slots == 1:  # slots not added yet (see Env.open_dbs): the one there is
        m.put_slot = 0
    while m.put_slot < 0 and rc == 0:
        rc = slotted_sizes(w, m, entries, &used)
        for s in range(m.slots):
            if m.put_slot < 0 and entries[s] == 0:
                m.put_slot = s
        if rc == 0 and m.put_slot < 0:  # every slot in use (a writer of another kind)
            rc = slotted_merges(w, m, 0, False)
    slotted_close(m)  # opened again with the slot among the ones it reads
    if rc == 0:
        slot_unsure(m, m.put_slot)
        rc = slotted_open(w, m)
    if rc == 0:
        rc = g_cursor_open(w.txn, m.dbis[m.put_slot], &m.ix.put)
    put[0] = m.ix.put
    return rc


cdef int slotted_copy(Work* w, Slotted* m, MDB_txn* target, MDB_dbi dst_dbi) noexcept nogil:
    """Append every entry of ``m``, in order, to the empty ``dst_dbi``."""
    cdef MDB_cursor* dst
    cdef MDB_val k, v
    cdef uint8_t last[8]
    cdef bint have_last = False
    cdef int rc = g_cursor_open(target, dst_dbi, &dst)
    if rc:
        return rc
    rc = slotted_get(w, m, &k, &v, MDB_FIRST)
    while rc == 0:
        rc = append_entry(dst, &k, &v, last, &have_last)
        if rc == 0:
            rc = slotted_get(w, m, &k, &v, MDB_NEXT)
    mdb_cursor_close(dst)
    return 0 if rc == MDB_NOTFOUND else rc
