# The permutations of the tables, their entries as big-endian bytes and their
# sort, shared by _ext (in-memory matching), _lmdb (the native backend) and
# _redis (the Redis backend's kernels). A layout is a flat int array of
# (source shift, width, destination shift) triples, ``blocks`` triples per table.

from libc.stdint cimport uint64_t
from libc.string cimport memcpy, memset

cdef inline uint64_t permute_one(uint64_t fp, const long* spec, Py_ssize_t blocks) noexcept nogil:
    cdef uint64_t out = 0, mask
    cdef Py_ssize_t b
    for b in range(blocks):
        mask = ((<uint64_t>1) << spec[3 * b + 1]) - 1 if spec[3 * b + 1] < 64 else ~(<uint64_t>0)
        out |= ((fp >> spec[3 * b]) & mask) << spec[3 * b + 2]
    return out


cdef inline uint64_t unpermute_one(uint64_t perm, const long* spec, Py_ssize_t blocks) noexcept nogil:
    cdef uint64_t out = 0, mask
    cdef Py_ssize_t b
    for b in range(blocks):
        mask = ((<uint64_t>1) << spec[3 * b + 1]) - 1 if spec[3 * b + 1] < 64 else ~(<uint64_t>0)
        out |= ((perm >> spec[3 * b + 2]) & mask) << spec[3 * b]
    return out


cdef void radix_sort(uint64_t* data, uint64_t* scratch, size_t n, size_t stride) noexcept nogil:
    """Sort ``n`` records of ``stride`` uint64s by their first, stably (least
    significant byte first, every byte counted in one read, the bytes all
    records share skipped); ``scratch`` holds as many."""
    cdef size_t counts[8][256]
    cdef size_t i, total, c, j
    cdef int d, shift
    cdef uint64_t x
    cdef uint64_t* src = data
    cdef uint64_t* dst = scratch
    cdef uint64_t* tmp
    if n == 0:
        return
    memset(counts, 0, sizeof(counts))
    for i in range(n):
        x = data[i * stride]
        for d in range(8):
            counts[d][(x >> (8 * d)) & 0xFF] += 1
    for d in range(8):
        shift = 8 * d
        if counts[d][(data[0] >> shift) & 0xFF] == n:
            continue
        total = 0
        for i in range(256):
            c = counts[d][i]
            counts[d][i] = total
            total += c
        for i in range(n):
            c = (src[i * stride] >> shift) & 0xFF
            for j in range(stride):
                dst[counts[d][c] * stride + j] = src[i * stride + j]
            counts[d][c] += 1
        tmp = src
        src = dst
        dst = tmp
    if src != data:
        memcpy(data, src, n * stride * sizeof(uint64_t))


cdef inline bytes be_key(uint64_t x):
    cdef unsigned char buf[8]
    cdef int i
    for i in range(8):
        buf[i] = (x >> (56 - 8 * i)) & 0xFF
    return (<char*>buf)[:8]


cdef inline uint64_t read_be64(const unsigned char* p) nogil:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40)
            | (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16)
            | (<uint64_t>p[6] << 8) | <uint64_t>p[7])
