# The resemblance signature's bands, shared by _ext (for Python and the
# in-memory text pair scan) and _lmdb (the native backend's band tables).
#
# A signature is a one-permutation MinHash of 128 bins of 16 bits (0: an empty
# bin), big-endian (see word_minhash in _ext.pyx). Its bands: the bins in 32
# runs of 4, after optimal densification (Shrivastava, 2017: an empty bin
# takes the value of the first non-empty bin along a fixed pseudo-random probe
# sequence of its own, so that two texts agree in a band with probability
# close to their Jaccard similarity to the 4th, empty bins or not). A band's
# key is a 32-bit hash of (its number, its 4 values). Two texts of Jaccard
# similarity J share at least one band with probability 1 - (1 - J^4)^32:
# 0.99 at J = 0.6 (a copy with 1 word in 20 replaced), 0.01 at J = 0.1.

from libc.stdint cimport uint32_t, uint64_t

include "_hash.pxi"  # the mixing its bands and densification use

cdef enum:
    MINHASH_BINS = 128
    SIGNATURE_BANDS = 32
    BAND_ROWS = 4
    DENSIFY_PROBES = 4 * MINHASH_BINS


cdef int signature_bands(const unsigned char* signature, uint32_t* keys) noexcept nogil:
    """Write the SIGNATURE_BANDS band keys of a 256-byte signature to ``keys``;
    returns the number written: 0 for a signature with no bin filled (a text
    with no word: it has no bands)."""
    cdef uint32_t bins[MINHASH_BINS]
    cdef uint32_t filled[MINHASH_BINS]
    cdef int i, t, j, count = 0, b, r
    cdef uint64_t h
    for i in range(MINHASH_BINS):
        bins[i] = (signature[2 * i] << 8) | signature[2 * i + 1]
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
        bins[i] = (signature[2 * j] << 8) | signature[2 * j + 1]
    for b in range(SIGNATURE_BANDS):
        h = (<uint64_t>(b + 1)) * 0x9E3779B97F4A7C15ULL
        for r in range(BAND_ROWS):
            h = (rotl(h, 23) ^ bins[BAND_ROWS * b + r]) * 0x9E3779B97F4A7C15ULL
        keys[b] = <uint32_t>(fmix64(h) >> 32)
    return SIGNATURE_BANDS


cdef inline double signature_resemblance(const unsigned char* a,
                                         const unsigned char* b) noexcept nogil:
    """Estimated word 5-shingle Jaccard similarity of two signatures: equal
    bins over bins that are not empty in both (1.0 for two empty ones)."""
    cdef int i, used = 0, equal = 0
    cdef unsigned int x, y
    for i in range(MINHASH_BINS):
        x = (a[2 * i] << 8) | a[2 * i + 1]
        y = (b[2 * i] << 8) | b[2 * i + 1]
        if x or y:
            used += 1
            equal += x == y
    return <double>equal / used if used else 1.0
