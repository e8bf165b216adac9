# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp
from bits cimport read_be
from clmdb cimport MDB_val


# Growable buffers and sorting

cdef struct U64s:
    uint64_t* data
    size_t size, cap


cdef int make_room(void** data, size_t* cap, size_t size, size_t item) noexcept nogil:
    """Double the capacity of a full growable array (``size == cap``)."""
    cdef size_t wanted
    cdef void* grown
    if size < cap[0]:
        return 0
    wanted = cap[0] * 2 if cap[0] else 64
    grown = realloc(data[0], wanted * item)
    if grown == NULL:
        return NO_MEMORY
    data[0] = grown
    cap[0] = wanted
    return 0


cdef int room_for(uint8_t** data, size_t* room, size_t size) noexcept nogil:
    """Grow the bytes ``data`` (doubling) to hold ``size`` of them."""
    while room[0] < size:
        if make_room(<void**>data, room, room[0], 1):
            return NO_MEMORY
    return 0


cdef int u64_push(U64s* v, uint64_t x) noexcept nogil:
    if make_room(<void**>&v.data, &v.cap, v.size, sizeof(uint64_t)):
        return NO_MEMORY
    v.data[v.size] = x
    v.size += 1
    return 0


cdef int sort_records(uint64_t* data, size_t n, size_t stride) noexcept nogil:
    """Sort ``n`` records of ``stride`` uint64s by their first, stably."""
    cdef uint64_t* scratch
    cdef size_t i = 1
    while i < n and data[(i - 1) * stride] <= data[i * stride]:
        i += 1
    if i >= n:  # already in order (an import's notes, often)
        return 0
    scratch = <uint64_t*>malloc(n * stride * sizeof(uint64_t))
    if scratch == NULL:
        return NO_MEMORY
    radix_sort(data, scratch, n, stride)
    free(scratch)
    return 0


cdef struct Doc:
    const uint8_t* key
    size_t key_size
    uint64_t hash           # the key's (format.key_hash): its key map key, first in key order
    const uint8_t* value
    size_t value_size
    uint64_t fp
    size_t seq


cdef inline int cmp_bytes(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) noexcept nogil:
    """LMDB's default order: bytes compared, then the shorter first."""
    cdef int c = memcmp(a, b, na if na < nb else nb)
    if c:
        return c
    return (na > nb) - (na < nb)


cdef inline int cmp_key_order(const Doc* x, const Doc* y) noexcept nogil:
    """The key order (format.key_order): the keys' hashes, then the keys."""
    if x.hash != y.hash:
        return -1 if x.hash < y.hash else 1
    return cmp_bytes(x.key, x.key_size, y.key, y.key_size)


cdef int cmp_doc_key(const void* a, const void* b) noexcept nogil:
    cdef const Doc* x = <const Doc*>a
    cdef const Doc* y = <const Doc*>b
    cdef int c = cmp_key_order(x, y)
    if c:
        return c
    return (x.seq > y.seq) - (x.seq < y.seq)


cdef int value_fingerprint(const MDB_val* value, uint64_t* fp) noexcept nogil:
    """The fingerprint leading a document value (a msgpack array of an uint first)."""
    cdef const uint8_t* p = <const uint8_t*>value.mv_data
    cdef size_t n = value.mv_size, at
    cdef int width
    if n < 2:
        return -1
    at = 3 if p[0] == 0xdc else 5 if p[0] == 0xdd else 1
    if at >= n:
        return -1
    if p[at] < 0x80:
        fp[0] = p[at]
        return 0
    width = 1 if p[at] == 0xcc else 2 if p[at] == 0xcd else 4 if p[at] == 0xce else \
        8 if p[at] == 0xcf else 0
    if width == 0 or at + 1 + width > n:
        return -1
    fp[0] = read_be(p + at + 1, width)
    return 0
