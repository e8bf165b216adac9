# The 64-bit hash of bytes and its mixing, shared by the text kernels (a
# token's hash: simhashdb.fast_hash), the signature's bands and the native
# backend's key map (an encoded key's hash).

from libc.stdint cimport uint8_t, uint64_t


cdef inline uint64_t rotl(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t fmix64(uint64_t h) noexcept nogil:
    h ^= h >> 33
    h *= 0xff51afd7ed558ccdULL
    h ^= h >> 33
    h *= 0xc4ceb9fe1a85ec53ULL
    h ^= h >> 33
    return h


cdef inline uint64_t read_le64(const uint8_t* p) nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16)
            | (<uint64_t>p[3] << 24) | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40)
            | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef uint64_t hash_bytes(const uint8_t* p, Py_ssize_t n) nogil:
    """A fast, well-mixed 64-bit hash: word-at-a-time mixing, avalanche finish."""
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL ^ (<uint64_t>n * 0xC2B2AE3D27D4EB4FULL)
    cdef uint64_t w
    cdef Py_ssize_t i = 0, j
    while i + 8 <= n:
        w = read_le64(p + i) * 0x87c37b91114253d5ULL
        h ^= rotl(w, 31) * 0x4cf5ad432745937fULL
        h = rotl(h, 27) * 5 + 0x52dce729
        i += 8
    w = 0
    j = 0
    while i < n:
        w |= (<uint64_t>p[i]) << (8 * j)
        i += 1
        j += 1
    h ^= rotl(w * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL
    return fmix64(h)
