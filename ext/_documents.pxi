# A part of _lmdb.pyx, which includes the parts in order; it builds on _signature.pxi (the
# hash), _buffers.pxi, _work.pxi, _slotted.pxi.
#
# The documents as records under ids (format.py): a record is the key's length
# (u16 BE), the key and the document value; the key map holds each id under its
# key's hash, and the record of one of the ids under a key's hash holds the key.
# Records are kept in zstd-compressed blocks of consecutive ids (``blocks``), or
# in a file of format 8 to 10 one an id (``records``), read and written as it is.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcmp, memcpy, memmove, memset
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, g_del, g_stat, MDB_APPEND, MDB_cursor,
    mdb_cursor_close, mdb_cursor_txn, MDB_FIRST, MDB_KEYEXIST, MDB_LAST, MDB_NEXT, MDB_NEXT_DUP,
    MDB_NOOVERWRITE, MDB_NOTFOUND, MDB_PREV, MDB_SET, MDB_SET_RANGE, MDB_stat, MDB_val,
)

cdef extern from *:
    """
    #include <pthread.h>
    #include <stdlib.h>
    #include <zstd.h>
    /* one compression and one decompression context a thread, made when first
       used and freed when the thread ends */
    typedef struct { ZSTD_CCtx* c; ZSTD_DCtx* d; } BlockContexts;
    static pthread_key_t block_key;
    static pthread_once_t block_once = PTHREAD_ONCE_INIT;
    static void block_contexts_free(void* p) {
        BlockContexts* b = (BlockContexts*)p;
        ZSTD_freeCCtx(b->c);
        ZSTD_freeDCtx(b->d);
        free(b);
    }
    static void block_key_make(void) { pthread_key_create(&block_key, block_contexts_free); }
    static BlockContexts* block_contexts(void) {
        BlockContexts* b;
        pthread_once(&block_once, block_key_make);
        b = (BlockContexts*)pthread_getspecific(block_key);
        if (b == NULL && (b = (BlockContexts*)calloc(1, sizeof(BlockContexts))) != NULL
                && pthread_setspecific(block_key, b) != 0) {
            free(b);
            b = NULL;
        }
        return b;
    }
    static ZSTD_CCtx* block_cctx(int level) {
        BlockContexts* b = block_contexts();
        if (b != NULL && b->c == NULL && (b->c = ZSTD_createCCtx()) != NULL) {
            if (ZSTD_isError(ZSTD_CCtx_setParameter(b->c, ZSTD_c_compressionLevel, level))
                    || ZSTD_isError(ZSTD_CCtx_setParameter(b->c, ZSTD_c_checksumFlag, 1))) {
                ZSTD_freeCCtx(b->c);
                b->c = NULL;
            }
        }
        return b == NULL ? NULL : b->c;
    }
    static ZSTD_DCtx* block_dctx(void) {
        BlockContexts* b = block_contexts();
        if (b != NULL && b->d == NULL)
            b->d = ZSTD_createDCtx();
        return b == NULL ? NULL : b->d;
    }
    """
    ctypedef struct ZSTD_CCtx:
        pass
    ctypedef struct ZSTD_DCtx:
        pass
    ZSTD_CCtx* block_cctx(int level) nogil
    ZSTD_DCtx* block_dctx() nogil
    size_t ZSTD_compress2(ZSTD_CCtx* c, void* dst, size_t cap, const void* src, size_t n) nogil
    size_t ZSTD_decompressDCtx(ZSTD_DCtx* d, void* dst, size_t cap, const void* src,
                               size_t n) nogil
    unsigned long long ZSTD_getFrameContentSize(const void* src, size_t n) nogil
    size_t ZSTD_compressBound(size_t n) nogil
    unsigned ZSTD_isError(size_t code) nogil

cdef enum:
    KEY_ROOM = 512  # room for a record's key: the longest stored is 511 bytes (MAX_KEY_BYTES)

cdef uint64_t MAX_BODY = lmdb_format.MAX_BODY, MOST_EXPANDED = lmdb_format.MOST_EXPANDED
cdef size_t TAKEN_IN = lmdb_format.TAKEN_IN


cdef int open_records(Work* w) noexcept nogil:
    """Open the cursor on the records, once."""
    return 0 if w.rec.cursor != NULL else g_cursor_open(w.txn, w.rec.dbi, &w.rec.cursor)


cdef int record_parts(const MDB_val* record, MDB_val* key, MDB_val* value) noexcept nogil:
    """Point ``key`` and ``value`` into a stored record; CORRUPTED where its
    key's length runs past it."""
    cdef const uint8_t* p = <const uint8_t*>record.mv_data
    cdef size_t size
    if record.mv_size < KEY_LENGTH_BYTES:
        return CORRUPTED
    size = read_be(p, KEY_LENGTH_BYTES)
    if size > record.mv_size - KEY_LENGTH_BYTES:
        return CORRUPTED
    key.mv_size, key.mv_data = size, <void*>(p + KEY_LENGTH_BYTES)
    value.mv_size = record.mv_size - KEY_LENGTH_BYTES - size
    value.mv_data = <void*>(p + KEY_LENGTH_BYTES + size)
    return 0


cdef int read_id(const MDB_val* v, uint64_t* id) noexcept nogil:
    """The document id a value of the key map or the index holds."""
    if v.mv_size != ID_BYTES:
        return CORRUPTED
    id[0] = read_be(<const uint8_t*>v.mv_data, ID_BYTES)
    return 0


# Blocks of records

cdef inline uint64_t body_bound(size_t stored) noexcept nogil:
    """The largest body a block of ``stored`` bytes may hold (a larger size in
    its frame is damage, refused before any room is made for it)."""
    return min(MAX_BODY, MOST_EXPANDED * (<uint64_t>stored + 1))


cdef void block_clear(RecordBlock* b) noexcept nogil:
    b.ids.size, b.ends.size, b.size, b.held = 0, 0, 0, False


cdef void block_free(RecordBlock* b) noexcept nogil:
    free(b.ids.data)
    free(b.ends.data)
    free(b.body)
    memset(b, 0, sizeof(RecordBlock))


cdef inline size_t record_start(const RecordBlock* b, size_t i) noexcept nogil:
    return b.ends.data[i - 1] if i else 0


cdef int block_push(RecordBlock* b, uint64_t id, const uint8_t* a, size_t a_size, const uint8_t* c,
                    size_t c_size) noexcept nogil:
    """Append record ``id``: the bytes ``a`` then ``c``."""
    if room_for(&b.body, &b.room, b.size + a_size + c_size):
        return NO_MEMORY
    memcpy(b.body + b.size, a, a_size)
    if c_size:
        memcpy(b.body + b.size + a_size, c, c_size)
    b.size += a_size + c_size
    return NO_MEMORY if u64_push(&b.ids, id) or u64_push(&b.ends, b.size) else 0


cdef int leb_read(const uint8_t* p, size_t size, size_t* at, uint64_t* out) noexcept nogil:
    cdef int shift = 0
    cdef uint8_t byte = 0x80
    out[0] = 0
    while byte & 0x80:
        if at[0] >= size or shift > 63:
            return CORRUPTED
        byte = p[at[0]]
        at[0] += 1
        if shift == 63 and byte & 0x7E:  # (bits past the 64th)
            return CORRUPTED
        out[0] |= (<uint64_t>(byte & 0x7F)) << shift
        shift += 7
    return 0


cdef size_t leb_write(uint8_t* p, uint64_t n) noexcept nogil:
    cdef size_t at = 0
    while n >= 0x80:
        p[at] = <uint8_t>(n & 0x7F) | 0x80
        n >>= 7
        at += 1
    p[at] = <uint8_t>n
    return at + 1


cdef int block_decode(Records* r, RecordBlock* b, uint64_t key, const MDB_val* v) noexcept nogil:
    """Decode into ``b`` the stored block ``v`` keyed ``key`` (its records' bytes
    first in ``b.body``); CORRUPTED where it is not a whole block."""
    cdef unsigned long long size
    cdef size_t got, at = 0, i
    cdef uint64_t count, step, length, doc = key
    block_clear(b)
    if room_for(&r.packed, &r.packed_room, v.mv_size + 1):
        return NO_MEMORY
    if g_copy(r.packed, v.mv_data, v.mv_size):  # (a fault reading the map: damage)
        return CORRUPTED
    size = ZSTD_getFrameContentSize(r.packed, v.mv_size)
    if size == 0 or size > body_bound(v.mv_size):  # (as are zstd's "unknown" and "error")
        return CORRUPTED
    if room_for(&b.body, &b.room, size) or block_dctx() == NULL:
        return NO_MEMORY
    got = ZSTD_decompressDCtx(block_dctx(), b.body, size, r.packed, v.mv_size)
    if ZSTD_isError(got) or got != size:
        return CORRUPTED
    if leb_read(b.body, size, &at, &count) or count == 0 or count > size:
        return CORRUPTED
    for i in range(count):
        if leb_read(b.body, size, &at, &step) or (i and step == 0) or doc + step < doc:
            return CORRUPTED
        doc += step
        if u64_push(&b.ids, doc):
            return NO_MEMORY
    length = 0
    for i in range(count):
        if leb_read(b.body, size, &at, &step) or step > size:
            return CORRUPTED
        length += step
        if u64_push(&b.ends, length):
            return NO_MEMORY
    if at + length != size:
        return CORRUPTED
    memmove(b.body, b.body + at, length)  # the records alone, from 0
    b.size, b.key, b.held, b.stored = length, key, True, v.mv_size
    return 0


cdef int block_encode(Records* r, const RecordBlock* b, size_t first, size_t end, uint64_t key,
                      size_t* stored) noexcept nogil:
    """Compress records ``first`` to ``end`` of ``b`` as a block keyed ``key``
    into ``r.packed`` (``stored``: its size)."""
    cdef size_t i, at = 0, begin = record_start(b, first)
    cdef size_t size = b.ends.data[end - 1] - begin
    cdef uint64_t last = key
    if room_for(&r.scratch, &r.scratch_room, 10 * (2 * (end - first) + 1) + size):
        return NO_MEMORY
    at += leb_write(r.scratch + at, end - first)
    for i in range(first, end):
        at += leb_write(r.scratch + at, b.ids.data[i] - last)
        last = b.ids.data[i]
    for i in range(first, end):
        at += leb_write(r.scratch + at, b.ends.data[i] - record_start(b, i))
    memcpy(r.scratch + at, b.body + begin, size)
    if room_for(&r.packed, &r.packed_room, ZSTD_compressBound(at + size)) or \
            block_cctx(RECORD_BLOCK_LEVEL) == NULL:
        return NO_MEMORY
    stored[0] = ZSTD_compress2(block_cctx(RECORD_BLOCK_LEVEL), r.packed, r.packed_room, r.scratch,
                               at + size)
    return NO_MEMORY if ZSTD_isError(stored[0]) else 0


cdef int block_put(Records* r, uint64_t key, size_t stored, unsigned int flags) noexcept nogil:
    """Store ``r.packed`` (``stored`` bytes) as the block keyed ``key``."""
    cdef uint8_t key_bytes[ID_BYTES]
    cdef MDB_val k, v
    if r.read.held and r.read.key == key:
        r.read.held = False
    write_be(key_bytes, key, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, key_bytes
    v.mv_size, v.mv_data = stored, r.packed
    return g_cursor_put(r.cursor, &k, &v, flags)


cdef int block_of(Records* r, uint64_t id) noexcept nogil:
    """Decode into ``r.read`` the block that would hold record ``id`` (kept
    from the last read where it is that one); MDB_NOTFOUND where none would."""
    cdef RecordBlock* b = &r.read
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    cdef uint64_t key
    cdef int rc
    if b.held and b.key <= id <= b.ids.data[b.ids.size - 1]:
        return 0
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    rc = g_cursor_get(r.cursor, &k, &v, MDB_SET_RANGE)
    if rc == 0 and (k.mv_size != ID_BYTES or read_be(<uint8_t*>k.mv_data, ID_BYTES) != id):
        rc = g_cursor_get(r.cursor, &k, &v, MDB_PREV)
    elif rc == MDB_NOTFOUND:
        rc = g_cursor_get(r.cursor, &k, &v, MDB_LAST)
    if rc:
        return rc
    if k.mv_size != ID_BYTES:
        return CORRUPTED
    key = read_be(<uint8_t*>k.mv_data, ID_BYTES)
    if key > id:
        return CORRUPTED
    if b.held and b.key == key:
        return 0
    r.walk = 0
    return block_decode(r, b, key, &v)


cdef int block_find(const RecordBlock* b, uint64_t id, size_t* at) noexcept nogil:
    """Where record ``id`` is in ``b`` (MDB_NOTFOUND: not in it)."""
    cdef size_t low = 0, high = b.ids.size, mid
    while low < high:
        mid = (low + high) // 2
        if b.ids.data[mid] < id:
            low = mid + 1
        else:
            high = mid
    if low == b.ids.size or b.ids.data[low] != id:
        return MDB_NOTFOUND
    at[0] = low
    return 0


cdef void block_record(const RecordBlock* b, size_t i, MDB_val* record) noexcept nogil:
    record.mv_data = <void*>(b.body + record_start(b, i))
    record.mv_size = b.ends.data[i] - record_start(b, i)


cdef double packing_ratio(size_t body, size_t stored) noexcept nogil:
    """Body bytes a stored byte, as a block's target takes it: at most 4, so
    that a record read decodes at most about 8 KB."""
    return min(4.0, max(1.0, body / <double>max(stored, 1)))


cdef int blocks_store(Records* r, RecordBlock* b, bint whole, bint replaces,
                      unsigned int later) noexcept nogil:
    """Store the records of ``b`` as blocks of at most RECORD_BLOCK_BYTES each
    (a record larger alone): the first keyed ``b.key`` (over the stored block
    of that key where ``replaces``), the others by their first ids, put with
    ``later``; unless ``whole``, a last block not yet full stays in ``b``
    (moved to its front, keyed by its first id)."""
    cdef size_t first = 0, end, stored, target, n = b.ids.size
    cdef uint64_t key
    cdef int rc = 0
    while rc == 0 and first < n:
        target = <size_t>(RECORD_BLOCK_BYTES * r.ratio * 0.97)
        end = first + 1
        while end < n and b.ends.data[end] - record_start(b, first) <= target:
            end += 1
        if end == n and not whole and b.ends.data[n - 1] - record_start(b, first) <= target:
            break  # (a block not yet full)
        key = b.key if first == 0 else b.ids.data[first]
        rc = block_encode(r, b, first, end, key, &stored)
        while rc == 0 and stored > RECORD_BLOCK_BYTES and end - first > 1:
            end = first + max(1, <size_t>((end - first) * (RECORD_BLOCK_BYTES * 0.95 / stored)))
            rc = block_encode(r, b, first, end, key, &stored)
        if rc == 0 and end - first > 1:
            r.ratio = packing_ratio(b.ends.data[end - 1] - record_start(b, first), stored)
        if rc == 0:
            rc = block_put(r, key, stored, 0 if first == 0 and replaces else later)
        first = end if rc == 0 else first
    if first:  # what is left moves to the front
        stored = record_start(b, first)
        memmove(b.body, b.body + stored, b.size - stored)
        b.size -= stored
        for end in range(first, n):
            b.ids.data[end - first] = b.ids.data[end]
            b.ends.data[end - first] = b.ends.data[end] - stored
        b.ids.size = b.ends.size = n - first
        b.key = b.ids.data[0] if b.ids.size else 0
    return rc if rc != MDB_KEYEXIST else CORRUPTED  # (a block's key taken: damage)


cdef int tail_store(Records* r, bint whole) noexcept nogil:
    """Store the appended records (``r.tail``): appended blocks, the first
    over the stored block the tail took in, if it did."""
    cdef size_t before = r.tail.ids.size
    cdef int rc = blocks_store(r, &r.tail, whole, r.tail_replaces, MDB_APPEND)
    if r.tail.ids.size != before:
        r.tail_replaces = False
    return rc


cdef int flush_records(Work* w) noexcept nogil:
    """records_flush of the call's records."""
    return records_flush(&w.rec)


cdef int tail_begin(Records* r, uint64_t id) noexcept nogil:
    """Begin the records to append with id ``id``, which must be above every
    stored id (else the next id is damaged): the last stored block's records
    taken in where it is not full (under TAKEN_IN bytes)."""
    cdef MDB_val k, v
    cdef int rc = g_cursor_get(r.cursor, &k, &v, MDB_LAST)
    block_clear(&r.tail)
    r.tail_replaces = False
    if rc == MDB_NOTFOUND:
        r.tail.key = id
        return 0
    if rc == 0 and k.mv_size != ID_BYTES:
        rc = CORRUPTED
    if rc == 0 and v.mv_size < TAKEN_IN:
        rc = block_decode(r, &r.tail, read_be(<uint8_t*>k.mv_data, ID_BYTES), &v)
        r.tail_replaces = rc == 0
        if rc == 0:
            r.ratio = packing_ratio(r.tail.size, v.mv_size)
            return 0 if r.tail.ids.data[r.tail.ids.size - 1] < id else CORRUPTED
    elif rc == 0:  # (the last block read, for its last id)
        rc = block_of(r, read_be(<uint8_t*>k.mv_data, ID_BYTES))
        if rc == 0 and r.read.ids.data[r.read.ids.size - 1] >= id:
            rc = CORRUPTED
    r.tail.key = id
    return rc


cdef int tail_append(Records* r, uint64_t id, const uint8_t* head, size_t head_size,
                     const uint8_t* value, size_t value_size) noexcept nogil:
    """Append record ``id`` (above every stored one and every one appended)
    to the records to store."""
    cdef int rc = 0
    if r.tail.ids.size == 0:
        rc = tail_begin(r, id)
    elif r.tail.ids.data[r.tail.ids.size - 1] >= id:
        rc = CORRUPTED
    if rc == 0:
        rc = block_push(&r.tail, id, head, head_size, value, value_size)
    if rc == 0 and r.tail.size >= 2 * RECORD_BLOCK_BYTES * r.ratio:
        rc = tail_store(r, False)
    return rc


cdef int block_rewrite(Records* r, uint64_t key) noexcept nogil:
    """Store ``r.edit`` over the block keyed ``key``, as more than one where it
    outgrew its room, or remove that block where ``r.edit`` is empty."""
    cdef uint8_t key_bytes[ID_BYTES]
    cdef MDB_val k
    if r.read.held and r.read.key == key:
        r.read.held = False
    if r.edit.ids.size:
        r.edit.key = key
        return blocks_store(r, &r.edit, True, True, MDB_NOOVERWRITE)
    write_be(key_bytes, key, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, key_bytes
    return g_del(mdb_cursor_txn(r.cursor), r.dbi, &k, NULL)


cdef int record_replace(Records* r, uint64_t id, const uint8_t* head, size_t head_size,
                        const uint8_t* value, size_t value_size) noexcept nogil:
    """Replace record ``id`` in its block by ``head`` then ``value``, writing
    the block again; CORRUPTED where there is none."""
    cdef RecordBlock* b = &r.read
    cdef MDB_val record
    cdef size_t at, i
    cdef int rc = block_of(r, id)
    if rc == 0:
        rc = block_find(b, id, &at)
    if rc:
        return CORRUPTED if rc == MDB_NOTFOUND else rc
    block_clear(&r.edit)
    for i in range(b.ids.size):
        if rc == 0 and i != at:
            block_record(b, i, &record)
            rc = block_push(&r.edit, b.ids.data[i], <uint8_t*>record.mv_data, record.mv_size,
                            NULL, 0)
        elif rc == 0:
            rc = block_push(&r.edit, id, head, head_size, value, value_size)
    if rc == 0:
        r.ratio = packing_ratio(b.size, b.stored)
    return rc if rc else block_rewrite(r, b.key)


cdef int remove_gone(Records* r) noexcept nogil:
    """Take the records of the ids removed (``r.gone``, each stored) out of
    their blocks, each block written again once; CORRUPTED where one is not
    stored."""
    cdef RecordBlock* b = &r.read
    cdef MDB_val record
    cdef size_t i = 0, j, at
    cdef int rc = sort_records(r.gone.data, r.gone.size, 1)
    while rc == 0 and i < r.gone.size:
        rc = block_of(r, r.gone.data[i])
        j = i
        block_clear(&r.edit)
        for at in range(b.ids.size if rc == 0 else 0):
            if j < r.gone.size and b.ids.data[at] == r.gone.data[j]:
                j += 1
            elif rc == 0:
                block_record(b, at, &record)
                rc = block_push(&r.edit, b.ids.data[at], <uint8_t*>record.mv_data,
                                record.mv_size, NULL, 0)
        if rc == 0 and (j == i or j < r.gone.size and
                        r.gone.data[j] <= b.ids.data[b.ids.size - 1]):
            rc = CORRUPTED  # (an id removed that its block lacks)
        if rc == 0:
            r.ratio = packing_ratio(b.size, b.stored)
            rc = block_rewrite(r, b.key)
        i = j
    r.gone.size = 0
    return CORRUPTED if rc == MDB_NOTFOUND else rc


cdef int records_flush(Records* r) noexcept nogil:
    """Take out the records removed and store those appended (before anything
    reads or changes the records, and at the end of a call)."""
    cdef int rc = remove_gone(r) if r.gone.size else 0
    return rc if rc or r.tail.ids.size == 0 else tail_store(r, True)


# Records, in either form

cdef int read_record(Records* r, uint64_t id, MDB_val* key, MDB_val* value) noexcept nogil:
    """The key and value of record ``id`` (MDB_NOTFOUND: none); they stay
    readable until the next call on ``r``. In blocks, a sweep in id order
    decodes each block once."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    cdef size_t at
    cdef int rc = 0
    if not r.blocks:
        write_be(id_bytes, id, ID_BYTES)
        k.mv_size, k.mv_data = ID_BYTES, id_bytes
        rc = g_cursor_get(r.cursor, &k, &v, MDB_SET)
    else:
        if r.tail.ids.size or r.gone.size:
            rc = records_flush(r)
        if rc == 0:
            rc = block_of(r, id)
        if rc == 0:
            rc = block_find(&r.read, id, &at)
        if rc == 0:
            block_record(&r.read, at, &v)
    return rc if rc else record_parts(&v, key, value)


cdef int record_next(Records* r, bint first, uint64_t* id, MDB_val* key,
                     MDB_val* value) noexcept nogil:
    """The first record (``first``) or the one after the last this gave, in id
    order (MDB_NOTFOUND: no more; CORRUPTED: ids out of order); ``r.walked``
    counts the items read."""
    cdef MDB_val k, v
    cdef int rc = 0
    if first:
        r.walked = 0
    if not r.blocks or first or r.walk >= r.read.ids.size:
        rc = g_cursor_get(r.cursor, &k, &v, MDB_FIRST if first else MDB_NEXT)
        if rc == 0 and k.mv_size != ID_BYTES:
            rc = CORRUPTED
        r.walked += rc == 0
        if rc == 0 and not r.blocks:
            id[0] = read_be(<uint8_t*>k.mv_data, ID_BYTES)
        elif rc == 0:
            rc = block_decode(r, &r.read, read_be(<uint8_t*>k.mv_data, ID_BYTES), &v)
        r.walk = 0
    if rc == 0 and r.blocks:
        id[0] = r.read.ids.data[r.walk]
        block_record(&r.read, r.walk, &v)
        r.walk += 1
    if rc == 0 and not first and id[0] <= r.walk_last:
        rc = CORRUPTED
    r.walk_last = id[0] if rc == 0 else r.walk_last
    return rc if rc else record_parts(&v, key, value)


cdef int put_record(Work* w, uint64_t id, const uint8_t* key, size_t key_size,
                    const uint8_t* value, size_t value_size, unsigned int flags) noexcept nogil:
    """Write record ``id`` (``flags``: MDB_APPEND for a new id, above every
    stored one; 0 to replace one)."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    cdef size_t size = KEY_LENGTH_BYTES + key_size + value_size
    cdef int rc = 0
    if key_size >> (8 * KEY_LENGTH_BYTES):
        return CORRUPTED
    if room_for(&w.rec.scratch, &w.rec.scratch_room, size):
        return NO_MEMORY
    write_be(w.rec.scratch, key_size, KEY_LENGTH_BYTES)
    memcpy(w.rec.scratch + KEY_LENGTH_BYTES, key, key_size)
    if w.rec.blocks and flags & MDB_APPEND:
        return tail_append(&w.rec, id, w.rec.scratch, KEY_LENGTH_BYTES + key_size, value,
                           value_size)
    if w.rec.blocks:
        rc = flush_records(w)
        return rc if rc else record_replace(&w.rec, id, w.rec.scratch,
                                            KEY_LENGTH_BYTES + key_size, value, value_size)
    memcpy(w.rec.scratch + KEY_LENGTH_BYTES + key_size, value, value_size)
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    v.mv_size, v.mv_data = size, w.rec.scratch
    return g_cursor_put(w.rec.cursor, &k, &v, flags)


cdef int delete_record(Work* w, uint64_t id) noexcept nogil:
    """Remove record ``id``, which is stored (in blocks, once the records are
    flushed: a block's removals are written together)."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k
    cdef int rc = open_records(w)
    if rc == 0 and w.rec.blocks:
        return u64_push(&w.rec.gone, id)
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    return rc if rc else g_del(w.txn, w.rec.dbi, &k, NULL)


cdef int count_records(Work* w, uint64_t* count) noexcept nogil:
    """The documents stored: in blocks, the key map's entries (one a document)."""
    cdef MDB_stat stat
    cdef uint64_t entries[KEY_SLOTS]
    cdef int s, used, rc
    if not w.rec.blocks:
        rc = g_stat(w.txn, w.rec.dbi, &stat)
        count[0] = stat.ms_entries
        return rc
    rc = slotted_sizes(w, &w.keys, entries, &used)
    count[0] = 0
    for s in range(w.keys.slots if rc == 0 else 0):
        count[0] += entries[s]
    return rc


cdef void records_close(Records* r) noexcept nogil:
    if r.cursor != NULL:
        mdb_cursor_close(r.cursor)
    r.cursor = NULL
    block_free(&r.read)
    block_free(&r.tail)
    block_free(&r.edit)
    free(r.gone.data)
    r.gone.data, r.gone.size, r.gone.cap = NULL, 0, 0
    free(r.packed)
    free(r.scratch)
    r.packed, r.packed_room, r.scratch, r.scratch_room = NULL, 0, NULL, 0


# Lookups

cdef int read_hashed(Records* records, uint64_t id, const Doc* doc, MDB_val* value,
                     uint64_t* fp) noexcept nogil:
    """1 if record ``id``, which the key map holds under ``doc``'s key's hash,
    holds that key (``value``: its value, ``fp``: the value's fingerprint
    where given), 0 if it holds another key of that hash; CORRUPTED where
    there is no such record, its key has another hash, or the value leads
    with no fingerprint."""
    cdef uint8_t held[KEY_ROOM]
    cdef MDB_val key
    cdef int rc = read_record(records, id, &key, value)
    if rc:
        return CORRUPTED if rc == MDB_NOTFOUND else rc
    if key.mv_size > KEY_ROOM or g_copy(held, key.mv_data, key.mv_size):
        return CORRUPTED
    if key.mv_size != doc.key_size or memcmp(held, doc.key, doc.key_size):
        return 0 if hash_bytes(held, key.mv_size) == doc.hash else CORRUPTED
    return CORRUPTED if fp != NULL and value_fingerprint(value, fp) else 1


cdef int find_key(Work* w, const Doc* doc, uint64_t* id, MDB_val* value,
                  uint64_t* fp) noexcept nogil:
    """1 if ``doc``'s key is stored (``id``, ``value``, ``fp``: its id, value
    and fingerprint, as read_hashed), 0 if not, or an LMDB error: the
    records of the ids under the key's hash are read, those of other keys of
    that hash passed over."""
    cdef uint8_t hash[8]
    cdef MDB_val k, v
    cdef int rc = open_records(w)
    write_be(hash, doc.hash, 8)
    k.mv_size, k.mv_data = 8, hash
    if rc == 0:
        rc = slotted_get(w, &w.keys, &k, &v, MDB_SET)
    while rc == 0:
        rc = read_id(&v, id)
        if rc == 0:
            rc = read_hashed(&w.rec, id[0], doc, value, fp)
        if rc == 0:
            rc = slotted_get(w, &w.keys, &k, &v, MDB_NEXT_DUP)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int read_indexed(Records* records, uint64_t id, uint64_t fp, MDB_val* key,
                      MDB_val* value) noexcept nogil:
    """The key and value of record ``id``, which the index holds under ``fp``:
    CORRUPTED where there is no such record, or it holds another fingerprint."""
    cdef uint64_t held
    cdef int rc = read_record(records, id, key, value)
    if rc == 0 and (value_fingerprint(value, &held) != 0 or held != fp):
        rc = CORRUPTED
    return CORRUPTED if rc == MDB_NOTFOUND else rc


cdef int copy_records(Records* source, Work* w, const uint64_t* skip, size_t n) noexcept nogil:
    """Append every record of ``source`` but the ``n`` ids ``skip`` (ascending)
    to ``w``'s empty records, in blocks; CORRUPTED where the walk met fewer
    items than LMDB counts (a damaged branch page ends a walk early)."""
    cdef MDB_val key, value
    cdef uint64_t id
    cdef size_t j = 0
    cdef int rc = open_records(w)
    if rc == 0:
        rc = record_next(source, True, &id, &key, &value)
    while rc == 0:
        while j < n and skip[j] < id:
            j += 1
        if j < n and skip[j] == id:
            j += 1
        else:
            rc = put_record(w, id, <uint8_t*>key.mv_data, key.mv_size, <uint8_t*>value.mv_data,
                            value.mv_size, MDB_APPEND)
        if rc == 0:
            rc = record_next(source, False, &id, &key, &value)
    if rc == MDB_NOTFOUND:
        rc = walked_whole(mdb_cursor_txn(source.cursor), source.dbi, source.walked)
    return rc if rc else flush_records(w)
