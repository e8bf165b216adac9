# Declarations every extension shares: the compiler's bit builtins and
# big-endian integers. Inline only, so cimporting it adds no module.

from libc.stdint cimport uint8_t, uint64_t

cdef extern from *:
    void __builtin_prefetch(const void* p) nogil
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    int clz64 "__builtin_clzll"(unsigned long long) nogil
    uint64_t atomic_add "__atomic_fetch_add"(uint64_t* p, uint64_t v, int order) nogil
    int ATOMIC_RELAXED "__ATOMIC_RELAXED"


cdef inline uint64_t read_be(const uint8_t* p, int n) noexcept nogil:
    """The ``n``-byte big-endian integer at ``p``."""
    cdef uint64_t x = 0
    cdef int i
    for i in range(n):
        x = (x << 8) | p[i]
    return x


cdef inline void write_be(uint8_t* p, uint64_t x, int n) noexcept nogil:
    """Write ``x`` as ``n`` bytes big-endian at ``p``."""
    cdef int i
    for i in range(n):
        p[n - 1 - i] = x & 0xFF
        x >>= 8
