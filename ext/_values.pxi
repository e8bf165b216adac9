# The stored document value's bytes, read natively (see simhashdb.records for
# the format), shared by _lmdb (band updates) and _records.

from libc.stdint cimport uint8_t
from bits cimport read_be

cdef enum:  # the slots of records.PackedDocuments, which _lmdb reads
    KEY_SLOT = 9     # msgpack of an int in [0, 2**64): at most 9 bytes
    VALUE_SLOT = 20  # [fingerprint, nil, stored_at]: at most 1 + 9 + 1 + 9 bytes

cdef const uint8_t* msgpack_skip(const uint8_t* p, const uint8_t* end, int depth) noexcept nogil:
    """The end of the msgpack object at ``p``, or NULL where it is damaged,
    runs past ``end`` or nests deeper than 64."""
    cdef uint8_t c
    cdef size_t n = 0, size = 0, head
    if p >= end or depth > 64:
        return NULL
    c = p[0]
    if c <= 0x7f or c >= 0xe0 or c == 0xc0 or c == 0xc2 or c == 0xc3:
        return p + 1
    if 0xa0 <= c <= 0xbf:
        size, head = c & 0x1f, 1
    elif 0x80 <= c <= 0x9f:
        n, head = (c & 0x0f) * (2 if c < 0x90 else 1), 1
    elif c == 0xdc or c == 0xde:
        if end - p < 3:
            return NULL
        n, head = read_be(p + 1, 2) * (2 if c == 0xde else 1), 3
    elif c == 0xdd or c == 0xdf:
        if end - p < 5:
            return NULL
        n, head = read_be(p + 1, 4) * (2 if c == 0xdf else 1), 5
    elif c == 0xc4 or c == 0xc5 or c == 0xc6 or c == 0xd9 or c == 0xda or c == 0xdb:
        head = 1 + (1 if c == 0xc4 or c == 0xd9 else 2 if c == 0xc5 or c == 0xda else 4)
        if <size_t>(end - p) < head:
            return NULL
        size = read_be(p + 1, head - 1)
    elif c == 0xc7 or c == 0xc8 or c == 0xc9:
        head = 2 + (1 if c == 0xc7 else 2 if c == 0xc8 else 4)
        if <size_t>(end - p) < head:
            return NULL
        size = read_be(p + 1, head - 2)
    elif c == 0xca or c == 0xcb:  # float 32, 64
        size, head = 4 if c == 0xca else 8, 1
    elif 0xcc <= c <= 0xd3:  # uint and int of 1, 2, 4, 8 bytes
        size, head = 1 << ((c - 0xcc) % 4), 1
    elif 0xd4 <= c <= 0xd8:  # fixext: a type byte and 1, 2, 4, 8 or 16 bytes
        size, head = 1 + (1 << (c - 0xd4)), 1
    else:
        return NULL
    if n:
        p += head
        while n and p != NULL:
            p = msgpack_skip(p, end, depth + 1)
            n -= 1
        return p
    if size > <size_t>(end - p) - head:
        return NULL
    return p + head + size


cdef const uint8_t* value_signature(const uint8_t* p, size_t size,
                                    size_t* signature_bytes) noexcept nogil:
    """The resemblance signature a document value holds (its 4th item, a
    msgpack bin of 128 bytes or of 256: see simhashdb.records), its size put
    in ``signature_bytes``, or NULL for a value with none (a document stored
    without text) or a damaged one."""
    cdef const uint8_t* end = p + size
    cdef size_t items
    cdef int i
    if size < 1:
        return NULL
    if 0x90 <= p[0] <= 0x9f:
        items, p = p[0] & 0x0f, p + 1
    elif p[0] == 0xdc and size >= 3:
        items, p = read_be(p + 1, 2), p + 3
    else:
        return NULL
    if items < 4:
        return NULL
    for i in range(3):
        p = msgpack_skip(p, end, 0)
        if p == NULL:
            return NULL
    if <size_t>(end - p) >= 2 + 128 and p[0] == 0xc4 and p[1] == 128:
        signature_bytes[0] = 128
        return p + 2
    if <size_t>(end - p) >= 3 + 256 and p[0] == 0xc5 and read_be(p + 1, 2) == 256:
        signature_bytes[0] = 256
        return p + 3
    return NULL
