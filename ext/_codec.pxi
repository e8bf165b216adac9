# The block codec of compressed sorted runs (RUNS.md), on plain memory: no
# LMDB. Included by _runs.pxi (runs in LMDB, for _lmdb and the prototype) and by _ext
# (the py-lmdb backend's codec).

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from bits cimport clz64, ctz64, popcount64

cdef enum:
    BLOCK_BYTES = 996   # a block's value: four items of a 12-byte key fill a 4 KiB page
    SUM_BYTES = 4       # a checksummed block's last bytes: block_sum, little-endian
    CODED_BYTES = BLOCK_BYTES - SUM_BYTES  # the coding of a block written now
    MOST = 4 * BLOCK_BYTES  # more entries than a block holds: each takes over 2 of its bits
    PAD = 16            # zero bytes after a copied block, so word reads stay inside
cdef size_t NOWHERE = <size_t>-1
cdef int CORRUPTED = -30796  # MDB_CORRUPTED
cdef int BLOCK_DAMAGED = -29997  # a block's bytes disagree with its checksum


# Bits

cdef inline uint64_t load_le64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16)
            | (<uint64_t>p[3] << 24) | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40)
            | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef inline uint32_t load_le32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


cdef inline uint64_t read_bits(const uint8_t* p, size_t pos, int width) noexcept nogil:
    """``width`` (< 64) bits at bit ``pos`` of ``p``, least significant first."""
    cdef const uint8_t* q = p + (pos >> 3)
    cdef int s = pos & 7
    cdef uint64_t x
    if width == 0:
        return 0
    x = load_le64(q) >> s
    if s + width > 64:
        x |= (<uint64_t>q[8]) << (64 - s)
    return x & ((~(<uint64_t>0)) >> (64 - width))


cdef inline void store_le(uint8_t* p, uint64_t x, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        p[i] = (x >> (8 * i)) & 0xFF


# Checksums: a block's first value and coded bytes hashed in four lanes of
# 8-byte words. Each step is a bijection of its lane for a given word and of
# the word for a given lane, so a block that differs in one word always ends
# in other lanes; the lanes are mixed down to 32 bits.

cdef enum:
    SUM_LANES = 4
cdef uint64_t SUM_MUL = 0x9E3779B97F4A7C15ULL, SUM_MIX1 = 0xFF51AFD7ED558CCDULL
cdef uint64_t SUM_MIX2 = 0xC4CEB9FE1A85EC53ULL


cdef inline uint64_t sum_step(uint64_t lane, uint64_t word) noexcept nogil:
    lane ^= word
    return ((lane << 29) | (lane >> 35)) * SUM_MUL


cdef uint32_t block_sum(uint64_t first, const uint8_t* p, size_t n) noexcept nogil:
    """The checksum of a block whose first value is ``first`` and whose coded
    bytes are ``p[:n]``."""
    cdef uint64_t lanes[SUM_LANES]
    cdef uint64_t tail = 0, h
    cdef size_t i = 0, words = n // 8
    cdef int j
    for j in range(SUM_LANES):
        lanes[j] = sum_step(first + <uint64_t>j, n)
    while i + SUM_LANES <= words:
        for j in range(SUM_LANES):
            lanes[j] = sum_step(lanes[j], load_le64(p + 8 * (i + j)))
        i += SUM_LANES
    while i < words:
        lanes[0] = sum_step(lanes[0], load_le64(p + 8 * i))
        i += 1
    for i in range(8 * words, n):
        tail |= (<uint64_t>p[i]) << (8 * (i - 8 * words))
    h = sum_step(lanes[1], tail)
    h = (h ^ (h >> 31)) * SUM_MIX1 + lanes[0]
    h = (h ^ (h >> 31)) * SUM_MIX1 + lanes[2]
    h = (h ^ (h >> 31)) * SUM_MIX1 + lanes[3]
    h = (h ^ (h >> 33)) * SUM_MIX2
    return <uint32_t>(h ^ (h >> 32))


cdef inline size_t seal_block(uint64_t first, uint8_t* out, size_t size) noexcept nogil:
    """Append the checksum to the block of ``size`` coded bytes in ``out``."""
    store_le(out + size, block_sum(first, out, size), SUM_BYTES)
    return size + SUM_BYTES


# Blocks: the first value in the key; the value holds c (2 bytes, little-endian),
# L (1 byte), the low L bits of each offset x_i = v_i - first (i < c), packed,
# then the high bit vector, bit (x_i >> L) + i set for each i (Elias-Fano)

cdef inline int low_width(uint64_t span, size_t c) noexcept nogil:
    """Elias-Fano's low width for ``c`` offsets up to ``span``: floor(log2(span / c))."""
    cdef uint64_t q = span // c if c else 0
    return 63 - clz64(q) if q else 0


cdef inline size_t block_size(uint64_t span, size_t c) noexcept nogil:
    cdef int L = low_width(span, c)
    return 3 + (c * L + 7) // 8 + ((span >> L) + c + 7) // 8


cdef size_t encode_block(const uint64_t* values, size_t n, uint8_t* out) noexcept nogil:
    """Encode sorted distinct ``values[1:n]`` as offsets from ``values[0]`` into ``out``
    (the size it returns, and 8 bytes more, writable)."""
    cdef size_t c = n - 1, i, pos, size = block_size(values[c] - values[0], c), w = 0
    cdef int L = low_width(values[c] - values[0], c), fill = 0
    cdef uint64_t mask = ((<uint64_t>1) << L) - 1, x, acc = 0, spill, word = 0
    cdef uint8_t* low = out + 3
    cdef uint8_t* high = low + (c * L + 7) // 8
    memset(out, 0, size)
    out[0], out[1], out[2] = c & 0xFF, c >> 8, L
    for i in range(c):  # the low bits, a word at a time and without branches
        x = (values[i + 1] - values[0]) & mask
        acc |= x << fill
        spill = (x >> 1) >> (63 - fill)  # the bits that pass the word, if it fills
        fill += L
        store_le(low, acc, 8)  # may pass into the high bits, which are written next
        low += 8 * (fill >> 6)
        acc = spill if fill >= 64 else acc
        fill &= 63
    store_le(low, acc, 8)
    for i in range(c):  # the high bits, a word at a time
        pos = ((values[i + 1] - values[0]) >> L) + i
        if pos >> 6 != w:
            store_le(high + 8 * w, word, 8)
            w, word = pos >> 6, 0
        word |= (<uint64_t>1) << (pos & 63)
    store_le(high + 8 * w, word, 8)
    return size


cdef struct Block:
    uint64_t first
    size_t c
    int L
    const uint8_t* low
    const uint8_t* high
    size_t high_words
    uint8_t buf[BLOCK_BYTES + PAD]


cdef int block_header(Block* b, uint64_t first, size_t size, bint summed) noexcept nogil:
    """Read the header of the ``size``-byte block already copied into
    ``b.buf``, whose first value is ``first``; check its checksum where it
    is ``summed`` (BLOCK_DAMAGED), pad it and check the header."""
    cdef size_t low_bytes
    if summed:
        if size < 3 + SUM_BYTES:
            return CORRUPTED
        size -= SUM_BYTES
        if block_sum(first, b.buf, size) != load_le32(b.buf + size):
            return BLOCK_DAMAGED
    memset(b.buf + size, 0, PAD)
    b.first = first
    b.c, b.L = b.buf[0] | (<size_t>b.buf[1] << 8), b.buf[2]
    low_bytes = (b.c * b.L + 7) // 8
    if b.c >= MOST or b.L > 63 or 3 + low_bytes > size:
        return CORRUPTED
    b.low = b.buf + 3
    b.high = b.low + low_bytes
    b.high_words = (size - 3 - low_bytes + 7) // 8
    return 0


cdef inline size_t select_zero(const Block* b, uint64_t r) noexcept nogil:
    """The position of the ``r``-th (from 1) zero of the high bits, reading
    the padding after them as zeros; NOWHERE past the padding."""
    cdef size_t w
    cdef uint64_t zeros
    cdef int z
    for w in range(b.high_words + 1):
        zeros = ~load_le64(b.high + 8 * w)
        z = popcount64(zeros)
        if r <= <uint64_t>z:
            while r > 1:
                zeros &= zeros - 1
                r -= 1
            return 64 * w + ctz64(zeros)
        r -= z
    return NOWHERE


cdef int decode_entries(const Block* b, uint64_t* out) noexcept nogil:
    """Every entry of the block into ``out`` (c + 1 of them), in order."""
    cdef size_t i = 0, w, p
    cdef uint64_t word
    out[0] = b.first
    for w in range(b.high_words):
        if i == b.c:
            break
        word = load_le64(b.high + 8 * w)
        while word and i < b.c:
            p = 64 * w + ctz64(word)
            word &= word - 1
            out[i + 1] = b.first + ((<uint64_t>(p - i) << b.L) | read_bits(b.low, i * b.L, b.L))
            i += 1
    return 0 if i == b.c else CORRUPTED


# Cutting sorted values into blocks, and merging them

cdef inline bint fits(const uint64_t* a, size_t n, size_t avail) noexcept nogil:
    return n <= avail and block_size(a[n - 1] - a[0], n - 1) <= CODED_BYTES


cdef size_t block_length(const uint64_t* a, size_t avail, size_t* guess) noexcept nogil:
    """How many of ``a`` the next block takes: a length that fits when the next
    does not, galloping from the last block's length (``guess``, updated)."""
    cdef size_t lo = 1, hi = guess[0], mid, step = 1
    if fits(a, hi, avail):
        lo = hi
        while fits(a, lo + step, avail):
            lo += step
            step *= 2
        hi = lo + step
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if fits(a, mid, avail):
            lo = mid
        else:
            hi = mid
    guess[0] = lo if lo > 1 else 2
    return lo


cdef size_t merge_arrays(const uint64_t* a, size_t na, const uint64_t* b, size_t nb,
                         uint64_t* out) noexcept nogil:
    """Merge sorted ``a`` and ``b`` into ``out`` without branches on the data."""
    cdef size_t i = 0, j = 0, k = 0, t
    cdef uint64_t u, v
    while i < na and j < nb:
        u, v = a[i], b[j]
        t = u <= v
        out[k] = u if t else v
        i += t
        j += 1 - t
        k += 1
    memcpy(out + k, a + i, (na - i) * sizeof(uint64_t))
    k += na - i
    memcpy(out + k, b + j, (nb - j) * sizeof(uint64_t))
    return k + nb - j


cdef inline size_t upper_bound(const uint64_t* a, size_t n, uint64_t x) noexcept nogil:
    """How many of the sorted ``a[:n]`` are at most ``x``."""
    cdef size_t lo = 0, half
    while n:
        half = n // 2
        if a[lo + half] <= x:
            lo += half + 1
            n -= half + 1
        else:
            n = half
    return lo
