# The resemblance signature's bands, shared by _ext (for Python and the
# in-memory text pair scan) and _lmdb (the native backend's band tables).
#
# A signature is a one-permutation MinHash of 128 bins (0: an empty bin), in
# one of two widths (see word_minhash in _text.pyx): 16 bits a bin, big-endian
# (256 bytes, databases made before format 10), or 8 (128 bytes): a 16-bit bin v
# narrowed to 1 + (v - 1) mod 255, so that 0 still marks an empty bin (b-bit
# MinHash, Li and Koenig, 2010). Its bands: the bins in 32 runs of 4, after
# optimal densification (Shrivastava, 2017: an empty bin takes the value of the
# first non-empty bin along a fixed pseudo-random probe sequence of its own, so
# that two texts agree in a band with probability close to their Jaccard
# similarity to the 4th, empty bins or not). A band's key is a 32-bit hash of
# (its number, its 4 values). Two texts of Jaccard similarity J share at least
# one band with probability 1 - (1 - J^4)^32: 0.99 at J = 0.6 (a copy with 1
# word in 20 replaced), 0.01 at J = 0.1. Signatures of the two widths meet by
# narrowing the wider one.

from libc.stdint cimport uint32_t, uint64_t

include "_hash.pxi"  # the mixing its bands and densification use

cdef enum:
    MINHASH_BINS = 128
    SIGNATURE_BANDS = 32
    BAND_ROWS = 4
    DENSIFY_PROBES = 4 * MINHASH_BINS
    NARROW_SIGNATURE = MINHASH_BINS  # the bytes of a signature of 8-bit bins
    WIDE_SIGNATURE = 2 * MINHASH_BINS  # of 16-bit bins
    NARROW_CODES = 255  # the values a filled 8-bit bin takes: 1 to 255


cdef inline bint is_signature_size(Py_ssize_t size) noexcept nogil:
    """Whether ``size`` bytes are a signature's: NARROW_ or WIDE_SIGNATURE."""
    return size == NARROW_SIGNATURE or size == WIDE_SIGNATURE


cdef inline unsigned int signature_bin(const unsigned char* signature, Py_ssize_t size,
                                       int i) noexcept nogil:
    """Bin ``i`` of a signature of ``size`` bytes (NARROW_ or WIDE_SIGNATURE)."""
    if size == WIDE_SIGNATURE:
        return (signature[2 * i] << 8) | signature[2 * i + 1]
    return signature[i]


cdef inline void narrow_signature(const unsigned char* wide, unsigned char* narrow) noexcept nogil:
    """Write the 8-bit form of a signature of 16-bit bins to ``narrow``."""
    cdef int i
    cdef unsigned int v
    for i in range(MINHASH_BINS):
        v = (wide[2 * i] << 8) | wide[2 * i + 1]
        narrow[i] = 1 + (v - 1) % NARROW_CODES if v else 0


cdef int signature_bands(const unsigned char* signature, Py_ssize_t size,
                         uint32_t* keys) noexcept nogil:
    """Write the SIGNATURE_BANDS band keys of a signature of ``size`` bytes to
    ``keys``; returns the number written: 0 for a signature with no bin filled
    (a text with no word: it has no bands)."""
    cdef uint32_t bins[MINHASH_BINS]
    cdef uint32_t filled[MINHASH_BINS]
    cdef int i, t, j, count = 0, b, r
    cdef uint64_t h
    for i in range(MINHASH_BINS):
        bins[i] = signature_bin(signature, size, i)
        filled[i] = bins[i] != 0
        count += filled[i]
    if count == 0:
        return 0
    for i in range(MINHASH_BINS):
        if filled[i]:
            continue
        j = -1
        for t in range(1, DENSIFY_PROBES + 1):
            h = fmix64(((<uint64_t>i) * 0x100000001ULL + <uint64_t>t) * 0x9E3779B97F4A7C15ULL)
            if filled[h % MINHASH_BINS]:
                j = h % MINHASH_BINS
                break
        if j < 0:  # no probe landed on a filled bin: the next filled one, circularly
            j = (i + 1) % MINHASH_BINS
            while not filled[j]:
                j = (j + 1) % MINHASH_BINS
        bins[i] = bins[j]
    for b in range(SIGNATURE_BANDS):
        h = (<uint64_t>(b + 1)) * 0x9E3779B97F4A7C15ULL
        for r in range(BAND_ROWS):
            h = (rotl(h, 23) ^ bins[BAND_ROWS * b + r]) * 0x9E3779B97F4A7C15ULL
        keys[b] = <uint32_t>(fmix64(h) >> 32)
    return SIGNATURE_BANDS


cdef inline double signature_resemblance(const unsigned char* a, const unsigned char* b,
                                         Py_ssize_t size) noexcept nogil:
    """Estimated word 5-shingle Jaccard similarity of two signatures of
    ``size`` bytes: the share f of equal bins among those not empty in both
    (1.0 for two empty ones); for 8-bit bins, corrected for unrelated bins
    equal by chance (c = 1/255): max(0, (f - c) / (1 - c))."""
    cdef int i, used = 0, equal = 0
    cdef unsigned int x, y
    cdef double share
    for i in range(MINHASH_BINS):
        x = signature_bin(a, size, i)
        y = signature_bin(b, size, i)
        if x or y:
            used += 1
            equal += x == y
    if not used:
        return 1.0
    share = <double>equal / used
    if size == WIDE_SIGNATURE:
        return share
    return max(0.0, (share * NARROW_CODES - 1) / (NARROW_CODES - 1))
