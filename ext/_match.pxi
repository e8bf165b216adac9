# All-pairs matching in memory (included by _ext.pyx).
#
# For each permutation table: permute every fingerprint, sort by the leading
# blocks only (LSD radix on those bits), and compare the fingerprints of each
# run that shares them. A pair is kept only by the first table (in table
# order) whose leading blocks it shares, so it is reported once, with no set
# of pairs to deduplicate.

from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcpy
from libc.stdint cimport uint32_t

cdef struct PairBuffer:
    uint64_t* data
    Py_ssize_t length
    Py_ssize_t capacity


cdef int push_pair(PairBuffer* buf, uint64_t a, uint64_t b) except -1 nogil:
    cdef uint64_t* grown
    if buf.length + 2 > buf.capacity:
        buf.capacity = 2 * buf.capacity + 1024
        grown = <uint64_t*>realloc(buf.data, buf.capacity * sizeof(uint64_t))
        if grown == NULL:
            with gil:
                raise MemoryError("no memory for %d matching pairs" % (buf.length // 2))
        buf.data = grown
    buf.data[buf.length] = a
    buf.data[buf.length + 1] = b
    buf.length += 2
    return 0


cdef int compare_pairs(const void* x, const void* y) noexcept nogil:
    cdef const uint64_t* a = <const uint64_t*>x
    cdef const uint64_t* b = <const uint64_t*>y
    if a[0] != b[0]:
        return -1 if a[0] < b[0] else 1
    if a[1] != b[1]:
        return -1 if a[1] < b[1] else 1
    return 0


cdef void sort_by_prefix(uint64_t* keys, uint32_t* ids, uint64_t* key_tmp, uint32_t* id_tmp,
                         Py_ssize_t n, int prefix_bits) noexcept nogil:
    """Order (key, id) pairs by the top ``prefix_bits`` bits of key, 11 bits a pass."""
    cdef Py_ssize_t counts[2048]
    cdef Py_ssize_t i, total, c
    cdef int shift = 64 - prefix_bits, width
    cdef uint64_t digit_mask
    cdef uint64_t* src_k = keys
    cdef uint64_t* dst_k = key_tmp
    cdef uint32_t* src_i = ids
    cdef uint32_t* dst_i = id_tmp
    cdef uint64_t* swap_k
    cdef uint32_t* swap_i
    while shift < 64:
        width = 11 if 64 - shift > 11 else 64 - shift
        digit_mask = ((<uint64_t>1) << width) - 1
        memset(counts, 0, sizeof(counts))
        for i in range(n):
            counts[(src_k[i] >> shift) & digit_mask] += 1
        total = 0
        for i in range(digit_mask + 1):
            c = counts[i]
            counts[i] = total
            total += c
        for i in range(n):
            c = (src_k[i] >> shift) & digit_mask
            dst_k[counts[c]] = src_k[i]
            dst_i[counts[c]] = src_i[i]
            counts[c] += 1
        swap_k = src_k
        src_k = dst_k
        dst_k = swap_k
        swap_i = src_i
        src_i = dst_i
        dst_i = swap_i
        shift += width
    if src_k != keys:
        for i in range(n):
            keys[i] = src_k[i]
            ids[i] = src_i[i]


cdef int match_pairs(const uint64_t* values, Py_ssize_t n, const long* spec,
                     const uint64_t* prefixes, const uint64_t* leading, const uint64_t* block_masks,
                     Py_ssize_t tables, Py_ssize_t blocks, int distance, int keep,
                     PairBuffer* out) except -1 nogil:
    """Append to ``out`` the (i, j), i < j, of every pair of ``values`` within
    ``distance`` bits; ``keep`` is the number of leading blocks per table."""
    cdef uint64_t* keys = <uint64_t*>malloc(n * sizeof(uint64_t))
    cdef uint64_t* key_tmp = <uint64_t*>malloc(n * sizeof(uint64_t))
    cdef uint32_t* ids = <uint32_t*>malloc(n * sizeof(uint32_t))
    cdef uint32_t* id_tmp = <uint32_t*>malloc(n * sizeof(uint32_t))
    cdef Py_ssize_t t, i, start, end, a, b
    cdef uint64_t prefix, diff, equal, first
    cdef int prefix_bits, blk, taken
    if keys == NULL or key_tmp == NULL or ids == NULL or id_tmp == NULL:
        free(keys); free(key_tmp); free(ids); free(id_tmp)
        with gil:
            raise MemoryError("no memory to match %d fingerprints" % n)
    try:
        for t in range(tables):
            prefix = prefixes[t]
            prefix_bits = popcount64(prefix)
            for i in range(n):
                keys[i] = permute_one(values[i], &spec[3 * blocks * t], blocks)
                ids[i] = <uint32_t>i
            sort_by_prefix(keys, ids, key_tmp, id_tmp, n, prefix_bits)
            start = 0
            while start < n:
                end = start + 1
                while end < n and ((keys[end] ^ keys[start]) & prefix) == 0:
                    end += 1
                for a in range(start, end):
                    for b in range(a + 1, end):
                        if popcount64(keys[a] ^ keys[b]) > distance:
                            continue
                        # report only from the first table whose leading blocks the pair shares
                        diff = values[ids[a]] ^ values[ids[b]]
                        first = 0
                        taken = 0
                        for blk in range(blocks):
                            if taken < keep and (diff & block_masks[blk]) == 0:
                                first |= (<uint64_t>1) << blk
                                taken += 1
                        if first != leading[t]:
                            continue
                        if ids[a] < ids[b]:
                            push_pair(out, ids[a], ids[b])
                        else:
                            push_pair(out, ids[b], ids[a])
                start = end
    finally:
        free(keys); free(key_tmp); free(ids); free(id_tmp)
    return 0


def match_indices(values, const long[::1] spec, const uint64_t[::1] prefixes,
                  const uint64_t[::1] leading, const uint64_t[::1] block_masks, int distance):
    """Sorted pairs of positions (i, j), i < j, of ``values`` within ``distance``
    bits, as a flat ``array('Q')`` [i0, j0, i1, j1, ...]."""
    cdef const uint64_t[::1] vs = as_fingerprints(values)
    cdef Py_ssize_t n = vs.shape[0], tables = prefixes.shape[0]
    cdef Py_ssize_t blocks = block_masks.shape[0]
    cdef int keep = popcount64(leading[0])
    cdef PairBuffer buf
    cdef uint64_t[::1] view
    if n >= 0xFFFFFFFF:
        raise InvalidArgumentError("at most 2**32 - 1 fingerprints can be matched at once")
    buf.data = NULL
    buf.length = 0
    buf.capacity = 0
    try:
        if n > 1:
            with nogil:
                match_pairs(&vs[0], n, &spec[0], &prefixes[0], &leading[0], &block_masks[0],
                            tables, blocks, distance, keep, &buf)
                qsort(buf.data, buf.length // 2, 2 * sizeof(uint64_t), compare_pairs)
        out = array("Q", bytes(8 * buf.length))
        view = out
        if buf.length:
            memcpy(&view[0], buf.data, buf.length * sizeof(uint64_t))
        return out
    finally:
        free(buf.data)


def unique_sorted(values):
    """The distinct fingerprints of ``values``, sorted, and how often each occurs."""
    cdef const uint64_t[::1] vs = as_fingerprints(values)
    cdef Py_ssize_t i, n = vs.shape[0], u = 0
    sorted_values = array("Q", vs)
    scratch = array("Q", bytes(8 * n))
    counts = array("Q", bytes(8 * n))
    cdef uint64_t[::1] sv = sorted_values
    cdef uint64_t[::1] sc = scratch
    cdef uint64_t[::1] cn = counts
    if n == 0:
        return sorted_values, counts
    with nogil:
        radix_sort(&sv[0], &sc[0], n)
        for i in range(n):
            if i == 0 or sv[i] != sv[u - 1]:
                sv[u] = sv[i]
                cn[u] = 1
                u += 1
            else:
                cn[u - 1] += 1
    return sorted_values[:u], counts[:u]


def components(Py_ssize_t n, const uint64_t[::1] pairs):
    """Connected components of ``n`` nodes joined by the flat (i, j) ``pairs``:
    each node's component label (its smallest member)."""
    labels = array("Q", range(n))
    cdef uint64_t[::1] parent = labels
    cdef Py_ssize_t p, i
    cdef uint64_t a, b
    with nogil:
        for p in range(0, pairs.shape[0], 2):
            a = find_root(&parent[0], pairs[p])
            b = find_root(&parent[0], pairs[p + 1])
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b
        for i in range(n):
            parent[i] = find_root(&parent[0], i)
    return labels


cdef inline uint64_t find_root(uint64_t* parent, uint64_t x) noexcept nogil:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x
