# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The stored document's bytes, natively, for :mod:`simhashdb.records`: plain
records (a key that is an int, str or bytes, a fingerprint that is an int, no
metadata) encoded exactly as msgpack encodes them."""

from libc.stdint cimport int64_t, uint8_t, uint64_t

include "_values.pxi"


cdef Py_ssize_t pack_uint(unsigned char* out, uint64_t x) noexcept:
    if x < 0x80:
        out[0] = <unsigned char>x
        return 1
    cdef int width = 1 if x <= 0xFF else 2 if x <= 0xFFFF else 4 if x <= 0xFFFFFFFF else 8
    cdef int i
    out[0] = 0xcc if width == 1 else 0xcd if width == 2 else 0xce if width == 4 else 0xcf
    for i in range(width):
        out[1 + i] = (x >> (8 * (width - 1 - i))) & 0xFF
    return 1 + width


cdef Py_ssize_t pack_int(unsigned char* out, int64_t x) noexcept:
    if x >= 0:
        return pack_uint(out, <uint64_t>x)
    if x >= -32:
        out[0] = <unsigned char>(x & 0xFF)
        return 1
    cdef int width = 1 if x >= -128 else 2 if x >= -32768 else 4 if x >= -2147483648 else 8
    cdef int i
    cdef uint64_t bits = <uint64_t>x
    out[0] = 0xd0 if width == 1 else 0xd1 if width == 2 else 0xd2 if width == 4 else 0xd3
    for i in range(width):
        out[1 + i] = (bits >> (8 * (width - 1 - i))) & 0xFF
    return 1 + width


cdef bytes pack_key_plain(object key, Py_ssize_t limit):
    """msgpack(key) for an int, str or bytes key within ``limit``, else None."""
    cdef unsigned char head[9]
    cdef Py_ssize_t n, size
    cdef const char* data
    if type(key) is int:
        if -9223372036854775808 <= key < 0:
            n = pack_int(head, key)
        elif 0 <= key <= 0xFFFFFFFFFFFFFFFF:
            n = pack_uint(head, key)
        else:
            return None
        return (<char*>head)[:n]
    if type(key) is str:
        try:
            raw = (<str>key).encode("utf-8")
        except UnicodeEncodeError:
            return None
        size = len(raw)
        if size < 32:
            head[0], n = 0xa0 | size, 1
        elif size < 256:
            head[0], head[1], n = 0xd9, size, 2
        else:
            head[0], head[1], head[2], n = 0xda, size >> 8, size & 0xFF, 3
    elif type(key) is bytes:
        raw = key
        size = len(raw)
        if size < 256:
            head[0], head[1], n = 0xc4, size, 2
        else:
            head[0], head[1], head[2], n = 0xc5, size >> 8, size & 0xFF, 3
    else:
        return None
    if size >= 65536 or n + size > limit:
        return None
    return (<char*>head)[:n] + raw


def encode_plain_documents(list records, Py_ssize_t limit, uint64_t stored_at):
    """(msgpack(key), fingerprint, msgpack([fingerprint, None, stored_at])) for
    each record, or None if any record is not plain (the caller then encodes
    them all the general way, which also explains what is wrong)."""
    cdef Py_ssize_t i, n = len(records)
    cdef unsigned char value[20]
    cdef Py_ssize_t size
    cdef list out = [None] * n
    cdef object record, key_bytes, fp
    for i in range(n):
        record = records[i]
        if type(record) is not tuple or not (len(record) == 2 or
                                             (len(record) == 3 and record[2] is None)):
            return None
        fp = record[1]
        if type(fp) is not int or not 0 <= fp <= 0xFFFFFFFFFFFFFFFF:
            return None
        key_bytes = pack_key_plain(record[0], limit)
        if key_bytes is None:
            return None
        value[0] = 0x93
        size = 1 + pack_uint(value + 1, fp)
        value[size] = 0xc0
        size += 1 + pack_uint(value + size + 1, stored_at)
        out[i] = (key_bytes, fp, (<char*>value)[:size])
    return out


def signature(const uint8_t[::1] value, size_t size):
    """The ``size`` bytes of the signature a well-formed document value
    holds, or None where it holds none this reading finds (the caller then
    reads the value the general way, which also tells a damaged one)."""
    if value.shape[0] == 0:
        return None
    cdef const uint8_t* found = value_signature(&value[0], value.shape[0], size)
    return None if found == NULL else (<const char*>found)[:size]
