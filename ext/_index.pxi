# The fingerprint index as runs (RUNS.md, "The index as runs"): a fingerprint's
# keys are the union of its entries in a few dupsort slot sub-databases
# ("fingerprints", then "index:NN"), each (fingerprint, key) in exactly one of
# them. A write transaction puts its new entries into a slot of its own, which
# takes them in few pages whatever the index holds; deletes go to the slot that
# holds the entry; merges keep about log_RATIO(N / batch) slots in use. Included
# by _lmdb.pyx after Work (and Index, which Work holds).

cdef int index_open(Work* w) noexcept nogil:
    """Open a cursor on each slot in use and on the transaction's own, once
    (lazily: a search without hits never reads the index)."""
    cdef Index* ix = &w.ix
    cdef MDB_stat stat
    cdef int s, rc = 0
    if ix.opened:
        return 0
    index_close(w)  # what a failed open left
    for s in range(w.index_slots):
        rc = g_stat(w.txn, w.index_dbis[s], &stat)
        if rc == 0 and (stat.ms_entries or s == w.put_slot):
            rc = g_cursor_open(w.txn, w.index_dbis[s], &ix.cursor[ix.n])
            if rc == 0:
                ix.slot[ix.n], ix.on[ix.n] = s, False
                ix.n += 1
        if rc:
            return rc
    ix.opened = True
    return 0


cdef void index_close(Work* w) noexcept nogil:
    cdef int i
    for i in range(w.ix.n):
        mdb_cursor_close(w.ix.cursor[i])
    if w.ix.put != NULL:
        mdb_cursor_close(w.ix.put)
    w.ix.n, w.ix.opened, w.ix.at, w.ix.put = 0, False, -1, NULL


cdef inline int cmp_entry(const MDB_val* k, const MDB_val* v, const MDB_val* k2,
                          const MDB_val* v2) noexcept nogil:
    cdef int c = cmp_bytes(<const uint8_t*>k.mv_data, k.mv_size, <const uint8_t*>k2.mv_data,
                           k2.mv_size)
    return c if c else cmp_bytes(<const uint8_t*>v.mv_data, v.mv_size,
                                 <const uint8_t*>v2.mv_data, v2.mv_size)


cdef int index_pick(Index* ix, MDB_val* k, MDB_val* v) noexcept nogil:
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


cdef int index_get(Work* w, MDB_val* k, MDB_val* v, MDB_cursor_op op) noexcept nogil:
    """A cursor operation on the union of the slots, in (fingerprint, key)
    order: MDB_FIRST, MDB_SET, MDB_SET_RANGE, MDB_NEXT, MDB_NEXT_DUP or
    MDB_NEXT_NODUP (the moves only after a position was found)."""
    cdef Index* ix = &w.ix
    cdef MDB_val kk, vv
    cdef uint8_t at_key[8]
    cdef int i, rc = index_open(w)
    if rc:
        return rc
    if ix.n == 1:
        return g_cursor_get(ix.cursor[0], k, v, op)
    if op == MDB_FIRST or op == MDB_SET or op == MDB_SET_RANGE:
        for i in range(ix.n):
            kk, vv = k[0], v[0]
            rc = g_cursor_get(ix.cursor[i], &kk, &vv, op)
            ix.on[i] = rc == 0
            if rc and rc != MDB_NOTFOUND:
                return rc
    elif ix.at < 0:
        return MDB_NOTFOUND
    elif op == MDB_NEXT_NODUP:  # every sub-cursor on the current fingerprint moves past it
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
    return index_pick(ix, k, v)


cdef int index_seek(Work* w, MDB_val* k, MDB_val* v) noexcept nogil:
    """Position at the first entry at or past (``k``, ``v``): a fingerprint and
    a key, found by a descent in each slot, however many keys the fingerprint has."""
    cdef Index* ix = &w.ix
    cdef MDB_val kk, vv
    cdef int i, rc = index_open(w)
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
    return rc if rc and rc != MDB_NOTFOUND else index_pick(ix, k, v)


cdef int index_has(Work* w, uint64_t fp) noexcept nogil:
    """1 if a slot has ``fp``, 0 if none, or an LMDB error."""
    cdef Index* ix = &w.ix
    cdef uint8_t key_bytes[8]
    cdef MDB_val k, v
    cdef int i, rc = index_open(w)
    if rc:
        return rc
    write_be(key_bytes, fp, 8)
    ix.at = -1  # the lookups move the sub-cursors
    for i in range(ix.n):
        ix.on[i] = False
        k.mv_size, k.mv_data = 8, key_bytes
        rc = g_cursor_get(ix.cursor[i], &k, &v, MDB_SET)
        if rc == 0:
            return 1
        if rc != MDB_NOTFOUND:
            return rc
    return 0


cdef int index_empty(Work* w) noexcept nogil:
    """1 if no slot has an entry, 0 if one has, or an LMDB error."""
    cdef MDB_val k, v
    cdef int rc = index_get(w, &k, &v, MDB_FIRST)
    return 1 if rc == MDB_NOTFOUND else 0 if rc == 0 else rc


cdef int index_delete(Work* w, MDB_val* k, MDB_val* v) noexcept nogil:
    """Delete the entry (fingerprint, key) from the slot that holds it (if any)."""
    cdef MDB_val kk, vv
    cdef int i, rc = index_open(w)
    w.ix.at = -1
    for i in range(w.ix.n if rc == 0 else 0):
        w.ix.on[i] = False
        kk, vv = k[0], v[0]
        rc = g_del(w.txn, w.index_dbis[w.ix.slot[i]], &kk, &vv)
        if rc != MDB_NOTFOUND:
            return rc
        rc = 0
    return rc


cdef int index_sizes(Work* w, uint64_t* entries, int* used) noexcept nogil:
    cdef MDB_stat stat
    cdef int s, rc = 0
    used[0] = 0
    for s in range(w.index_slots):
        rc = g_stat(w.txn, w.index_dbis[s], &stat)
        if rc:
            return rc
        entries[s] = stat.ms_entries
        used[0] += stat.ms_entries > 0
    return 0


cdef int append_entry(MDB_cursor* dst, MDB_val* k, MDB_val* v, uint8_t* last,
                      bint* have_last) noexcept nogil:
    """Append an entry to a slot written in order: a key of the fingerprint
    appended last (``last``, once ``have_last``), or a new fingerprint."""
    if k.mv_size != 8:
        return CORRUPTED
    if have_last[0] and memcmp(last, k.mv_data, 8) == 0:
        return g_cursor_put(dst, k, v, MDB_APPENDDUP)
    memcpy(last, k.mv_data, 8)
    have_last[0] = True
    return g_cursor_put(dst, k, v, MDB_APPEND)


cdef int index_merge(Work* w, int a, int b, const uint64_t* entries) noexcept nogil:
    """Merge slots ``a`` and ``b`` into a free slot (appending in order), or,
    where none is free, ``a`` into ``b``; the sources are emptied."""
    cdef MDB_cursor* src[2]
    cdef MDB_cursor* dst = NULL
    cdef MDB_val k[2]
    cdef MDB_val v[2]
    cdef bint on[2]
    cdef uint8_t last[8]
    cdef bint have_last = False
    cdef int i, d = -1, s, rc = 0
    for s in range(w.index_slots):
        if d < 0 and entries[s] == 0:
            d = s
    index_close(w)  # emptied slots leave their cursors nowhere
    if w.put_slot == a or w.put_slot == b:
        w.put_slot = -1
    src[0] = src[1] = NULL
    for i in range(2 if d >= 0 else 1):
        if rc == 0:
            rc = g_cursor_open(w.txn, w.index_dbis[a if i == 0 else b], &src[i])
        if rc == 0:
            rc = g_cursor_get(src[i], &k[i], &v[i], MDB_FIRST)
            on[i], rc = rc == 0, 0 if rc == MDB_NOTFOUND else rc
    if rc == 0:
        rc = g_cursor_open(w.txn, w.index_dbis[d if d >= 0 else b], &dst)
    if d < 0:
        on[1] = False
    while rc == 0 and (on[0] or on[1]):
        i = 1 if not on[0] or (on[1] and cmp_entry(&k[1], &v[1], &k[0], &v[0]) < 0) else 0
        if d < 0:
            rc = g_cursor_put(dst, &k[i], &v[i], MDB_NODUPDATA) if k[i].mv_size == 8 \
                else CORRUPTED
        else:
            rc = append_entry(dst, &k[i], &v[i], last, &have_last)
        if rc == MDB_KEYEXIST:  # the same entry in both (never written so): kept once
            rc = 0
        if rc == 0:
            rc = g_cursor_get(src[i], &k[i], &v[i], MDB_NEXT)
            on[i], rc = rc == 0, 0 if rc == MDB_NOTFOUND else rc
    for i in range(2):
        if src[i] != NULL:
            mdb_cursor_close(src[i])
    if dst != NULL:
        mdb_cursor_close(dst)
    if rc == 0:
        rc = g_drop(w.txn, w.index_dbis[a], 0)
    if rc == 0 and d >= 0:
        rc = g_drop(w.txn, w.index_dbis[b], 0)
    w.merged += entries[a] + entries[b]
    return rc


cdef int index_merges(Work* w, uint64_t limit) noexcept nogil:
    """Merge the two smallest slots in use while the smaller holds over 1/RATIO
    of the other's entries, or the slots run short; a merge of more than
    ``limit`` entries (0: any) is left for tidy (``w.untidy``)."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef int a, b, s, used, rc = 0
    while rc == 0:
        rc = index_sizes(w, entries, &used)
        a = b = -1
        for s in range(w.index_slots):
            if entries[s] == 0:
                continue
            if a < 0 or entries[s] < entries[a]:
                a, b = s, a
            elif b < 0 or entries[s] < entries[b]:
                b = s
        if rc or b < 0:
            break
        if used < INDEX_SLOTS - 1 and entries[a] * RATIO <= entries[b]:
            break
        if used < INDEX_SLOTS - 1 and limit and entries[a] + entries[b] > limit:
            w.untidy = True
            break
        rc = index_merge(w, a, b, entries)
    return rc


cdef int index_put_cursor(Work* w, MDB_cursor** put) noexcept nogil:
    """The cursor on the transaction's own slot, chosen (a free one: merges keep
    one) the first time it puts."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef int s, used, rc = 0
    if w.ix.put != NULL:
        put[0] = w.ix.put
        return 0
    if w.index_slots == 1:  # slots not added yet (see Env.open_dbs): the one there is
        w.put_slot = 0
    while w.put_slot < 0 and rc == 0:
        rc = index_sizes(w, entries, &used)
        for s in range(w.index_slots):
            if w.put_slot < 0 and entries[s] == 0:
                w.put_slot = s
        if rc == 0 and w.put_slot < 0:  # every slot in use (a writer of another kind)
            rc = index_merges(w, 0)
    index_close(w)  # opened again with the slot among the ones it reads
    if rc == 0:
        rc = index_open(w)
    if rc == 0:
        rc = g_cursor_open(w.txn, w.index_dbis[w.put_slot], &w.ix.put)
    put[0] = w.ix.put
    return rc


cdef int index_copy(Work* w, MDB_txn* target, MDB_dbi dst_dbi) noexcept nogil:
    """Append every entry of the index, in order, to the empty ``dst_dbi``."""
    cdef MDB_cursor* dst
    cdef MDB_val k, v
    cdef uint8_t last[8]
    cdef bint have_last = False
    cdef int rc = g_cursor_open(target, dst_dbi, &dst)
    if rc:
        return rc
    rc = index_get(w, &k, &v, MDB_FIRST)
    while rc == 0:
        rc = append_entry(dst, &k, &v, last, &have_last)
        if rc == 0:
            rc = index_get(w, &k, &v, MDB_NEXT)
    mdb_cursor_close(dst)
    return 0 if rc == MDB_NOTFOUND else rc
