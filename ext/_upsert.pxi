# A part of _lmdb.pyx, which includes the parts in order; it builds on _signature.pxi, _codec.pxi,
# _buffers.pxi, _work.pxi, _slotted.pxi, _documents.pxi, _bands.pxi, _writes.pxi, _tidy.pxi.
#
# Upserts and removals of documents.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from bits cimport __builtin_prefetch, read_be, write_be
from clmdb cimport (
    chunk_stop, chunk_take, g_cursor_get, g_cursor_open, g_cursor_put, g_del, g_drop, g_get, g_stat,
    g_txn_begin, GUARD_FAULT, MDB_APPEND, MDB_APPENDDUP, MDB_cursor, mdb_cursor_close, MDB_dbi,
    MDB_env, MDB_FIRST, MDB_KEYEXIST, MDB_LAST, MDB_NEXT, MDB_NODUPDATA, MDB_NOOVERWRITE,
    MDB_NOTFOUND, MDB_RDONLY, MDB_SET, MDB_stat, MDB_txn, mdb_txn_abort, mdb_txn_env, mdb_txn_id,
    MDB_val, pthread_create, pthread_join, pthread_t,
)


cdef int unlink(Work* w, uint64_t old_fp, uint64_t id, U64s* touched) noexcept nogil:
    """Drop a stored document's fingerprint-index entry (``old_fp``, ``id``)."""
    cdef uint8_t fp_bytes[8]
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    w.unlinked = True
    cdef int rc = touch(w, touched, old_fp)
    if rc:
        return rc
    write_be(fp_bytes, old_fp, 8)
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = 8, fp_bytes
    v.mv_size, v.mv_data = ID_BYTES, id_bytes
    return slotted_delete(w, &w.index, &k, &v)


# Whether a batch's new fingerprints were in the index before: a descent in
# each slot but the batch's own, about 250 ns a slot, nearly all of it waiting
# on memory. A large batch whose transaction changed no slot before it shares
# them with a thread reading the last commit (the same slots: the writer holds
# the lock), which begins while the writer puts the index entries.

cdef enum:
    LOOKUP_CHUNK = 512          # lookups taken at a time
    THREAD_SHARE = 4096         # the fewest new documents a thread shares the work of


cdef extern from *:
    """
    #define chunk_take(p, n) __atomic_fetch_add((p), (n), __ATOMIC_RELAXED)
    #define chunk_stop(p, n) __atomic_store_n((p), (n), __ATOMIC_RELAXED)
    """
    size_t chunk_take(size_t* p, size_t n) nogil
    void chunk_stop(size_t* p, size_t n) nogil


cdef struct Lookups:
    MDB_env* env
    MDB_dbi dbis[INDEX_SLOTS]   # the slots with entries, but the batch's own
    SlotFilter* filters[INDEX_SLOTS]  # each one's filter, or NULL
    int slots
    const uint64_t* order       # the batch's index entries (fingerprint, id), sorted
    size_t n
    uint8_t* had                # per entry: 1 if its fingerprint was there
    size_t next                 # the first entry no one has taken
    int rc                      # the thread's
    bint began                  # the thread began its snapshot


cdef int look_up(Lookups* l, MDB_txn* txn) noexcept nogil:
    """Take chunks of the entries and note whether each one's fingerprint
    (where it is the first entry of it) is in one of the slots, in ``txn``."""
    cdef MDB_cursor* cursors[INDEX_SLOTS]
    cdef uint8_t key_bytes[8]
    cdef MDB_val k, v
    cdef size_t i, end
    cdef int s, opened = 0, rc = 0
    while rc == 0 and opened < l.slots:
        rc = g_cursor_open(txn, l.dbis[opened], &cursors[opened])
        opened += rc == 0
    i = chunk_take(&l.next, LOOKUP_CHUNK) if rc == 0 else l.n
    while i < l.n:
        end = min(i + LOOKUP_CHUNK, l.n)
        while rc == 0 and i < end:
            if i == 0 or l.order[2 * i] != l.order[2 * i - 2]:
                write_be(key_bytes, l.order[2 * i], 8)
                for s in range(l.slots):
                    k.mv_size, k.mv_data = 8, key_bytes
                    # (a filter built after unlink's deletions may rule out a
                    # fingerprint the last commit holds: touch noted it first)
                    if slot_lacks(l.filters[s], &k):
                        continue
                    rc = g_cursor_get(cursors[s], &k, &v, MDB_SET)
                    if rc != MDB_NOTFOUND:
                        l.had[i] = rc == 0
                        break
                rc = 0 if rc == MDB_NOTFOUND else rc
            i += 1
        i = chunk_take(&l.next, LOOKUP_CHUNK) if rc == 0 else l.n
    for s in range(opened):
        mdb_cursor_close(cursors[s])
    return rc


cdef int lookups_begin(Work* w, const uint64_t* order, size_t n, bint shared, Lookups* l,
                       pthread_t* thread, bint* started) noexcept nogil:
    """Set up the lookups of ``order``'s fingerprints in the slots with entries
    but the transaction's own (none where the index was empty), with room
    after ``l.had`` for the writer's notes of its own slot; where ``shared``
    and there are enough, start a thread that takes a share."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef int s, used, rc = 0
    l.env, l.order, l.n, l.next, l.rc, l.slots, l.began = mdb_txn_env(w.txn), order, n, 0, 0, 0, 0
    l.had = <uint8_t*>calloc(2 * n + 1, 1)
    if l.had == NULL:
        return NO_MEMORY
    if not w.index_was_empty:
        rc = slotted_sizes(w, &w.index, entries, &used)
    for s in range(w.index.slots if rc == 0 and not w.index_was_empty else 0):
        if entries[s] and s != w.index.put_slot:
            l.dbis[l.slots], l.filters[l.slots] = w.index.dbis[s], NULL
            if rc == 0:
                rc = slot_filter(w, &w.index, s, entries[s], n, &l.filters[l.slots])
            l.slots += 1
    started[0] = rc == 0 and shared and l.slots > 0 and n >= THREAD_SHARE and \
        w.merge_threads > 1 and pthread_create(thread, NULL, look_up_thread, l) == 0
    return rc


cdef void* look_up_thread(void* lookups) noexcept nogil:
    cdef Lookups* l = <Lookups*>lookups
    cdef MDB_txn* txn
    cdef int rc = g_txn_begin(l.env, NULL, MDB_RDONLY, &txn)
    l.began = rc == 0
    if rc == 0:
        rc = look_up(l, txn)
        mdb_txn_abort(txn)
    if rc == GUARD_FAULT or (rc and l.began):  # (else, such as a full reader table: the writer's)
        l.rc = rc
        chunk_stop(&l.next, l.n)
    return NULL


cdef struct Entries:
    const Doc* docs
    const uint64_t* ids         # each document's id
    size_t n
    uint64_t* order
    int rc


cdef int index_order(Entries* e) noexcept nogil:
    """The documents' index entries (fingerprint, id) in that order: sorted by
    id, then stably by fingerprint (the new documents' ids come in order, so
    the first sort has nothing to do but where a stored one is among them)."""
    cdef size_t i
    cdef int rc
    for i in range(e.n):
        e.order[2 * i], e.order[2 * i + 1] = e.ids[i], e.docs[i].fp
    rc = sort_records(e.order, e.n, 2)
    for i in range(e.n if rc == 0 else 0):
        e.order[2 * i], e.order[2 * i + 1] = e.order[2 * i + 1], e.order[2 * i]
    return rc if rc else sort_records(e.order, e.n, 2)


cdef void* index_order_thread(void* entries) noexcept nogil:
    (<Entries*>entries).rc = index_order(<Entries*>entries)
    return NULL


cdef int last_key(Work* w, Slotted* m, MDB_val* last) noexcept nogil:
    """The greatest key of ``m``'s slots (MDB_NOTFOUND: none)."""
    cdef MDB_val k, v
    cdef int i, rc = slotted_open(w, m), found = MDB_NOTFOUND
    m.ix.at = -1  # the cursors move
    for i in range(m.ix.n if rc == 0 else 0):
        m.ix.on[i] = False
        rc = g_cursor_get(m.ix.cursor[i], &k, &v, MDB_LAST)
        if rc == 0 and (found or cmp_bytes(<const uint8_t*>k.mv_data, k.mv_size,
                                           <const uint8_t*>last.mv_data, last.mv_size) > 0):
            last[0], found = k, 0
        if rc == MDB_NOTFOUND:
            rc = 0
    return rc if rc else found


cdef int put_key(Work* w, const Doc* doc, uint64_t id, int* appending) noexcept nogil:
    """Put a new key's entry (its hash, ``id``) into the transaction's own key
    slot: appended while the batch's hashes come after what the slot holds
    (``appending``, decided at the batch's first put; -1: undecided)."""
    cdef MDB_cursor* put = NULL
    cdef uint8_t hash[8]
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    cdef int rc = slotted_put_cursor(w, &w.keys, &put)
    if rc == 0 and appending[0] < 0:
        rc = g_cursor_get(put, &k, &v, MDB_LAST)
        appending[0] = rc == MDB_NOTFOUND or (rc == 0 and k.mv_size == 8 and
                                              doc.hash > read_be(<const uint8_t*>k.mv_data, 8))
        rc = 0 if rc == MDB_NOTFOUND else rc
    write_be(hash, doc.hash, 8)
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, hash, ID_BYTES, id_bytes
    if rc or not appending[0]:
        return rc if rc else g_cursor_put(put, &k, &v, 0)
    rc = g_cursor_put(put, &k, &v, MDB_APPEND)
    return g_cursor_put(put, &k, &v, MDB_APPENDDUP) if rc == MDB_KEYEXIST else rc  # (a hash twice)


cdef int upsert(Work* w, Doc* docs, size_t n, U64s* touched) noexcept nogil:
    """Store documents (in key order, unique), replacing existing keys: a new
    key takes the next id (meta ``next id``) and its record is appended; a
    stored one keeps its id, its record replaced where it is."""
    cdef MDB_val k, v, old
    cdef uint8_t fp_bytes[8]
    cdef uint8_t id_bytes[ID_BYTES]
    cdef size_t i, fresh = 0
    cdef int rc, found
    cdef uint64_t old_fp, id, next_id = 0, first_id
    cdef bint appending = False, changed, first, had
    cdef int keys_appending = -1  # undecided (put_key)
    cdef uint64_t* order = NULL
    cdef MDB_cursor* put = NULL
    cdef uint64_t merged
    cdef Lookups lookups
    cdef pthread_t thread
    cdef bint started = False
    cdef uint8_t* own = NULL
    cdef Entries entries
    cdef pthread_t sorter
    cdef bint sorting = False
    cdef Doc* added = <Doc*>malloc((n + 1) * sizeof(Doc))
    cdef uint64_t* ids = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    memset(&lookups, 0, sizeof(Lookups))
    if added == NULL or ids == NULL:
        free(added)
        free(ids)
        return NO_MEMORY
    rc = slotted_empty(w, &w.index)
    if rc >= 0:
        w.index_was_empty, w.unlinked = rc == 1, False
        rc = read_counter(w, NEXT_ID, &next_id)
    first_id = next_id
    if rc == 0:
        rc = last_key(w, &w.keys, &k)
    if rc == MDB_NOTFOUND:
        appending, rc = True, 0
    elif rc == 0 and n:
        rc = CORRUPTED if k.mv_size != 8 else 0
        appending = rc == 0 and docs[0].hash > read_be(<uint8_t*>k.mv_data, 8)
    if rc == 0 and appending and n >= THREAD_SHARE and w.merge_threads > 1:
        # every document is new: its index entries are sorted while it is put
        for i in range(n):
            ids[i] = next_id + i
        entries.docs, entries.ids, entries.n, entries.rc = docs, ids, n, 0
        entries.order = order = <uint64_t*>malloc(2 * n * sizeof(uint64_t))
        sorting = order != NULL and pthread_create(&sorter, NULL, index_order_thread,
                                                   &entries) == 0
    i = 0
    while rc == 0 and i < n:
        changed = True  # the document is new, or has another fingerprint now
        found = 0 if appending else find_key(w, &docs[i], &id, &old, &old_fp)
        if found == 1:
            rc = note_bands(w, <uint8_t*>old.mv_data, old.mv_size, old_fp, False)
            if rc == 0 and old_fp == docs[i].fp:
                changed = False
            elif rc == 0:
                rc = unlink(w, old_fp, id, touched)
            if rc == 0:
                rc = put_record(w, id, docs[i].key, docs[i].key_size, docs[i].value,
                                docs[i].value_size, 0)
        elif found == 0:
            id = next_id
            next_id += 1
            rc = put_record(w, id, docs[i].key, docs[i].key_size, docs[i].value,
                            docs[i].value_size, MDB_APPEND)
            if rc == 0:
                rc = put_key(w, &docs[i], id, &keys_appending)
        else:
            rc = found
        if rc == 0:
            rc = note_bands(w, docs[i].value, docs[i].value_size, docs[i].fp, True)
        if rc == 0 and changed:  # noted as its fingerprint goes into the index, below
            added[fresh] = docs[i]
            if not sorting:  # (else the sorting thread reads them: they are these)
                ids[fresh] = id
            fresh += 1
        i += 1
    if rc == 0:
        rc = flush_records(w)
    if sorting:
        pthread_join(sorter, NULL)
        rc = rc if rc else entries.rc
    if rc == 0 and next_id != first_id:
        rc = write_counter(w, NEXT_ID, next_id)
    if rc == 0 and fresh:
        # the index entries (index_order). A fingerprint's first put tells
        # whether the transaction's own slot had it, lookups whether the others
        # did (noted after the puts, and after the notes unlink took, so theirs
        # come first).
        if not sorting:  # (a buffer for a thread that did not start holds them too)
            entries.docs, entries.ids, entries.n = added, ids, fresh
            if order == NULL:
                order = <uint64_t*>malloc(2 * fresh * sizeof(uint64_t))
            entries.order = order
            rc = NO_MEMORY if order == NULL else index_order(&entries)
        merged = w.merged
        if rc == 0:
            rc = slotted_put_cursor(w, &w.index, &put)
        if rc == 0:
            rc = g_cursor_get(put, &k, &v, MDB_LAST)
        if rc == MDB_NOTFOUND:
            appending, rc = True, 0
        elif rc == 0:
            appending = order[0] > read_be(<uint8_t*>k.mv_data, 8)
        # the slots before the transaction's own, shared where they are as
        # committed. They are where no earlier call changed the index and no
        # merge freed a slot (every merge counts in w.merged): then the two
        # views differ only by the entries unlink took out, each of whose
        # fingerprints was noted first (touch, before the deletion, as it stood
        # before the batch), and the first note of a fingerprint counts
        if rc == 0:
            rc = lookups_begin(w, order, fresh, w.index_committed and merged == w.merged,
                               &lookups, &thread, &started)
        if rc == 0:
            own = lookups.had + fresh  # whether the transaction's own slot had it
        for i in range(fresh):
            if rc:
                break
            first, had = i == 0 or order[2 * i] != order[2 * i - 2], False
            write_be(fp_bytes, order[2 * i], 8)
            write_be(id_bytes, order[2 * i + 1], ID_BYTES)
            k.mv_size, k.mv_data = 8, fp_bytes
            v.mv_size, v.mv_data = ID_BYTES, id_bytes
            if appending:
                rc = g_cursor_put(put, &k, &v, MDB_APPEND if first else MDB_APPENDDUP)
            else:
                if first:
                    rc = g_cursor_put(put, &k, &v, MDB_NOOVERWRITE)
                    had = rc == MDB_KEYEXIST
                    own[i] = had
                if had or not first:  # another document's entry of the fingerprint
                    k.mv_size, k.mv_data = 8, fp_bytes  # (a refused put points them at it)
                    v.mv_size, v.mv_data = ID_BYTES, id_bytes
                    rc = g_cursor_put(put, &k, &v, MDB_NODUPDATA)
                    if rc == MDB_KEYEXIST:
                        rc = 0
        if rc == 0 and lookups.slots:  # the writer's share
            rc = look_up(&lookups, w.txn)
        if rc:
            chunk_stop(&lookups.next, fresh)
        if started:
            pthread_join(thread, NULL)
            rc = rc if rc else lookups.rc
            w.shared_lookups[0] += lookups.began
        for i in range(fresh if rc == 0 else 0):
            if i == 0 or order[2 * i] != order[2 * i - 2]:
                rc = note_touched(touched, order[2 * i], own[i] or lookups.had[i])
                if rc:
                    break
        free(lookups.had)
    free(order)
    free(added)
    free(ids)
    if rc == 0:
        rc = update_tables(w, touched)
    if rc == 0:
        rc = update_bands(w)
    return rc


cdef int copy_skipping(MDB_txn* last, MDB_txn* txn, MDB_dbi dbi, const MDB_val* keys,
                       const MDB_val* values, size_t n) noexcept nogil:
    """Empty sub-database ``dbi`` and append to it, in order, what snapshot
    ``last`` holds in it but the entries ``keys`` (with ``values`` where a
    sub-database of duplicates: the (key, value) pairs), sorted in its order."""
    cdef MDB_cursor* reader = NULL
    cdef MDB_cursor* writer = NULL
    cdef MDB_val k, v
    cdef uint8_t last_key[8]
    cdef bint have_last = False
    cdef size_t j = 0, walked = 0
    cdef int c = 1, rc = g_drop(txn, dbi, 0)
    if rc == 0:
        rc = g_cursor_open(last, dbi, &reader)
    if rc == 0:
        rc = g_cursor_open(txn, dbi, &writer)
    if rc == 0:
        rc = g_cursor_get(reader, &k, &v, MDB_FIRST)
    while rc == 0:
        while j < n:
            c = cmp_entry(&keys[j], &values[j], &k, &v) if values != NULL else \
                cmp_bytes(<const uint8_t*>keys[j].mv_data, keys[j].mv_size,
                          <const uint8_t*>k.mv_data, k.mv_size)
            if c >= 0:
                break
            j += 1
        if j < n and c == 0:
            j += 1
        elif values != NULL:
            rc = append_entry(writer, &k, &v, last_key, &have_last)
        else:
            rc = g_cursor_put(writer, &k, &v, MDB_APPEND)
        walked += 1
        if rc == 0:
            rc = g_cursor_get(reader, &k, &v, MDB_NEXT)
    close_two(reader, writer)
    return walked_whole(last, dbi, walked) if rc == MDB_NOTFOUND else rc


cdef int walked_whole(MDB_txn* txn, MDB_dbi dbi, size_t walked) noexcept nogil:
    """0 if a walk of ``dbi`` met as many entries as LMDB counts in it, else
    MDB_CORRUPTED: a damaged branch page can end a cursor's walk early, and a
    copy must not drop what it did not reach."""
    cdef MDB_stat stat
    cdef int rc = g_stat(txn, dbi, &stat)
    return rc if rc else (0 if stat.ms_entries == walked else CORRUPTED)


cdef int without_entries(Work* w, MDB_txn* last, Slotted* m, uint64_t* pairs,
                         size_t n) noexcept nogil:
    """Write the slots of ``m`` again from ``last`` without its ``n`` entries
    ``pairs`` ((key, id) each, in id order: sorted here by key, stably)."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef uint8_t* raw = <uint8_t*>malloc(16 * n + 1)
    cdef MDB_val* keys = <MDB_val*>malloc((2 * n + 1) * sizeof(MDB_val))
    cdef size_t i
    cdef int s, used, rc = NO_MEMORY if raw == NULL or keys == NULL else sort_records(pairs, n, 2)
    for i in range(n if rc == 0 else 0):
        write_be(raw + 16 * i, pairs[2 * i], 8)
        write_be(raw + 16 * i + 8, pairs[2 * i + 1], ID_BYTES)
        keys[i].mv_size, keys[i].mv_data = 8, raw + 16 * i
        keys[n + i].mv_size, keys[n + i].mv_data = ID_BYTES, raw + 16 * i + 8
    if rc == 0:
        rc = slotted_sizes(w, m, entries, &used)
    for s in range(m.slots):
        if rc == 0 and entries[s]:
            slot_unsure(m, s)
            rc = copy_skipping(last, w.txn, m.dbis[s], keys, keys + n, n)
    free(raw)
    free(keys)
    return rc


cdef int records_without(Work* w, MDB_txn* last, const uint64_t* gone, size_t found,
                         const MDB_val* keys) noexcept nogil:
    """Write the records again from ``last`` without the ``found`` ids of the
    triples ``gone`` (ascending; ``keys``: those ids as stored keys)."""
    cdef Records source
    cdef uint64_t* ids
    cdef size_t i
    cdef int rc
    if not w.rec.blocks:
        return copy_skipping(last, w.txn, w.rec.dbi, keys, NULL, found)
    records_close(&w.rec)  # (its cursor and the block it read: the records are emptied)
    ids = <uint64_t*>malloc((found + 1) * sizeof(uint64_t))
    memset(&source, 0, sizeof(Records))
    source.dbi, source.blocks, source.ratio = w.rec.dbi, True, 1.0
    rc = NO_MEMORY if ids == NULL else g_drop(w.txn, w.rec.dbi, 0)
    for i in range(found if rc == 0 else 0):
        ids[i] = gone[3 * i]
    if rc == 0:
        rc = g_cursor_open(last, source.dbi, &source.cursor)
    if rc == 0:
        rc = copy_records(&source, w, ids, found)
    records_close(&source)
    free(ids)
    return rc


cdef int write_without(Work* w, MDB_txn* last, const Doc* docs, uint64_t* gone,
                       size_t found) noexcept nogil:
    """Write the records, the key map's and the index's slots again without
    the ``found`` documents ``gone`` ((id, fingerprint, index in ``docs``)
    triples), appended in order from ``last``, a snapshot holding what the
    transaction holds. Their leaves come out full, where removals in place
    copy leaves and leave them sparse."""
    cdef size_t i
    cdef uint8_t* id_bytes = <uint8_t*>malloc(ID_BYTES * found + 1)
    cdef MDB_val* keys = <MDB_val*>malloc((found + 1) * sizeof(MDB_val))
    cdef uint64_t* pairs = <uint64_t*>malloc((2 * found + 1) * sizeof(uint64_t))
    cdef int rc = NO_MEMORY if id_bytes == NULL or keys == NULL or pairs == NULL else 0
    slotted_close(&w.index)  # the slots are written again below
    slotted_close(&w.keys)
    if rc == 0:  # the records, by id
        rc = sort_records(gone, found, 3)
    for i in range(found if rc == 0 else 0):
        write_be(id_bytes + ID_BYTES * i, gone[3 * i], ID_BYTES)
        keys[i].mv_size, keys[i].mv_data = ID_BYTES, id_bytes + ID_BYTES * i
        pairs[2 * i], pairs[2 * i + 1] = docs[gone[3 * i + 2]].hash, gone[3 * i]
    if rc == 0:
        rc = records_without(w, last, gone, found, keys)
    if rc == 0:
        rc = without_entries(w, last, &w.keys, pairs, found)
    for i in range(found if rc == 0 else 0):
        pairs[2 * i], pairs[2 * i + 1] = gone[3 * i + 1], gone[3 * i]
    if rc == 0:
        rc = without_entries(w, last, &w.index, pairs, found)
    free(id_bytes)
    free(keys)
    free(pairs)
    return rc if rc else write_counter(w, REMOVED, 0)


cdef int count_stored(Work* w, const Doc* docs, size_t n, size_t* stored) noexcept nogil:
    cdef uint64_t id
    cdef MDB_val value
    cdef size_t i
    cdef int rc
    stored[0] = 0
    for i in range(n):
        rc = find_key(w, &docs[i], &id, &value, NULL)
        if rc < 0:
            return rc
        stored[0] += rc
    return 0


cdef int remove(Work* w, Doc* docs, size_t n, U64s* touched, size_t* count,
                bint may_rewrite) noexcept nogil:
    """Remove documents (in key order, unique) that are stored: in place, or
    (``may_rewrite``: the transaction has changed nothing yet) by writing the
    records, the key map and the index again without them (write_without),
    where the batch brings the documents removed since they were last written
    whole (meta ``removed``) over 1/RUN_RATIO of them (so each removal costs
    about RUN_RATIO entries written)."""
    cdef MDB_val k, v, old
    cdef uint64_t records = 0
    cdef MDB_txn* last = NULL
    cdef uint8_t hash[8]
    cdef uint8_t id_bytes[ID_BYTES]
    cdef uint64_t old_fp, id, removed = 0
    cdef size_t stored = 0
    cdef uint64_t* gone = NULL  # (id, fingerprint, index in docs) of each one stored
    cdef size_t i
    cdef int rc = 0
    w.index_was_empty, w.unlinked = False, True
    if may_rewrite and n:
        rc = read_counter(w, REMOVED, &removed)
        if rc == 0:
            rc = count_records(w, &records)
        if rc == 0 and (removed + n) * RUN_RATIO > records:
            rc = count_stored(w, docs, n, &stored)  # (absent keys count for nothing)
        if rc == 0 and (removed + stored) * RUN_RATIO > records and g_txn_begin(
                mdb_txn_env(w.txn), NULL, MDB_RDONLY, &last):
            last = NULL  # no reader slot for the snapshot: in place
        if last != NULL and mdb_txn_id(last) + 1 != mdb_txn_id(w.txn):
            mdb_txn_abort(last)  # (never: the write lock is held)
            last = NULL
        if last != NULL:
            gone = <uint64_t*>malloc((3 * n + 1) * sizeof(uint64_t))
            if gone == NULL:
                rc = NO_MEMORY
    for i in range(n if rc == 0 else 0):
        rc = find_key(w, &docs[i], &id, &old, &old_fp)
        if rc == 0:
            continue
        if rc == 1:
            rc = note_bands(w, <uint8_t*>old.mv_data, old.mv_size, old_fp, False)
        if rc == 0 and last != NULL:
            rc = touch(w, touched, old_fp)
            gone[3 * count[0]], gone[3 * count[0] + 1], gone[3 * count[0] + 2] = id, old_fp, i
        elif rc == 0:
            rc = unlink(w, old_fp, id, touched)
            write_be(id_bytes, id, ID_BYTES)
            if rc == 0:
                rc = delete_record(w, id)
            write_be(hash, docs[i].hash, 8)
            k.mv_size, k.mv_data, v.mv_size, v.mv_data = 8, hash, ID_BYTES, id_bytes
            if rc == 0:
                rc = slotted_delete(w, &w.keys, &k, &v)
        if rc:
            break
        count[0] += 1
    if rc == 0 and last != NULL:
        rc = write_without(w, last, docs, gone, count[0])
    elif rc == 0 and count[0]:
        rc = add_to_counter(w, REMOVED, count[0])
    if rc == 0:  # (the records removed in place, taken out of their blocks)
        rc = flush_records(w)
    if last != NULL:
        mdb_txn_abort(last)
    free(gone)
    if rc == 0:
        rc = update_tables(w, touched)
    return rc if rc else update_bands(w)


cdef size_t sort_unique(Doc* docs, size_t n) noexcept nogil:
    """Sort documents in key order, keeping the last of each key; returns the count kept."""
    cdef size_t i, kept = 0
    for i in range(1, n):  # input in key order needs no sort
        if cmp_key_order(&docs[i - 1], &docs[i]) >= 0:
            break
    else:
        return n
    qsort(docs, n, sizeof(Doc), cmp_doc_key)
    for i in range(n):
        if i + 1 < n and cmp_key_order(&docs[i], &docs[i + 1]) == 0:
            continue
        docs[kept] = docs[i]
        kept += 1
    return kept


cdef Doc* load_packed(documents) except NULL:
    """Point Doc structs at the slots of a records.PackedDocuments (which the
    caller holds for as long as they are used)."""
    cdef const uint8_t[::1] keys = documents.keys
    cdef const uint8_t[::1] key_sizes = documents.key_sizes
    cdef const uint8_t[::1] values = documents.values
    cdef const uint8_t[::1] value_sizes = documents.value_sizes
    cdef const uint64_t[::1] fps = documents.fingerprints
    cdef size_t i, n = fps.shape[0]
    cdef Doc* docs = <Doc*>malloc((n + 1) * sizeof(Doc))
    if docs == NULL:
        raise MemoryError()
    for i in range(n):
        docs[i].key, docs[i].key_size = &keys[KEY_SLOT * i], key_sizes[i]
        docs[i].hash = hash_bytes(docs[i].key, docs[i].key_size)
        docs[i].value, docs[i].value_size = &values[VALUE_SLOT * i], value_sizes[i]
        docs[i].fp, docs[i].seq = fps[i], i
    return docs


cdef Doc* load_docs(list documents, bint with_values) except NULL:
    """Point Doc structs at the bytes of (key, fingerprint, value) tuples (or keys)."""
    cdef size_t i, n = len(documents)
    cdef Doc* docs = <Doc*>malloc((n + 1) * sizeof(Doc))
    if docs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            item = documents[i]
            key = item[0] if with_values else item
            docs[i].key = <const uint8_t*>PyBytes_AS_STRING(key)
            docs[i].key_size = PyBytes_GET_SIZE(key)
            docs[i].hash = hash_bytes(docs[i].key, docs[i].key_size)
            docs[i].seq = i
            if with_values:
                value = item[2]
                docs[i].fp = item[1]
                docs[i].value = <const uint8_t*>PyBytes_AS_STRING(value)
                docs[i].value_size = PyBytes_GET_SIZE(value)
    except BaseException:
        free(docs)
        raise
    return docs
