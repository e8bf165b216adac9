# All-pairs matching (included by _ext.pyx).
#
# For each permutation table: permute every fingerprint, sort by the leading
# blocks only (LSD radix on those bits), and compare the fingerprints of each
# run that shares them. A pair is kept only by the first table (in table
# order) whose leading blocks it shares, so it is reported once, with no set
# of pairs to deduplicate.

from libc.stdlib cimport qsort
from libc.string cimport memcpy

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
        memcpy(keys, src_k, n * sizeof(uint64_t))
        memcpy(ids, src_i, n * sizeof(uint32_t))


cdef class PairScanner:
    """Pairs of positions (i, j), i < j, of ``values`` within ``distance`` bits,
    found table by table and handed out in chunks, so that the caller never
    holds them all (``next_chunk`` splits only between runs of a shared prefix).
    With ``sides`` (a byte per value), only pairs whose sides differ: the pairs
    across two parts of a group too large for one scan."""

    cdef object values_ref, spec_ref, prefixes_ref, leading_ref, masks_ref
    cdef const uint64_t[::1] values
    cdef const uint8_t[::1] sides
    cdef bint across
    cdef const long[::1] spec
    cdef const uint64_t[::1] prefixes
    cdef const uint64_t[::1] leading
    cdef const uint64_t[::1] block_masks
    cdef uint64_t* keys
    cdef uint64_t* key_tmp
    cdef uint32_t* ids
    cdef uint32_t* id_tmp
    cdef Py_ssize_t n, tables, blocks, table, start
    cdef int distance, keep

    def __cinit__(self, values, const long[::1] spec, const uint64_t[::1] prefixes,
                  const uint64_t[::1] leading, const uint64_t[::1] block_masks, int distance,
                  sides=None):
        self.values = as_fingerprints(values)
        self.n = self.values.shape[0]
        self.across = sides is not None
        if self.across:
            self.sides = sides
            if self.sides.shape[0] != self.n:
                raise InvalidArgumentError("expected a side for each of the %d values, got %d"
                                           % (self.n, self.sides.shape[0]))
        if self.n >= 0xFFFFFFFF:
            raise InvalidArgumentError("at most 2**32 - 1 fingerprints can be matched at once")
        self.spec, self.prefixes, self.leading, self.block_masks = spec, prefixes, leading, block_masks
        self.tables, self.blocks = prefixes.shape[0], block_masks.shape[0]
        self.distance, self.keep = distance, popcount64(leading[0])
        self.table, self.start = -1, self.n
        size = self.n if self.n else 1
        self.keys = <uint64_t*>malloc(size * sizeof(uint64_t))
        self.key_tmp = <uint64_t*>malloc(size * sizeof(uint64_t))
        self.ids = <uint32_t*>malloc(size * sizeof(uint32_t))
        self.id_tmp = <uint32_t*>malloc(size * sizeof(uint32_t))
        if not (self.keys and self.key_tmp and self.ids and self.id_tmp):
            raise MemoryError("no memory to match %d fingerprints" % self.n)

    def __dealloc__(self):
        free(self.keys)
        free(self.key_tmp)
        free(self.ids)
        free(self.id_tmp)

    cdef void next_table(self) noexcept nogil:
        cdef Py_ssize_t i
        cdef const long* spec = &self.spec[3 * self.blocks * self.table]
        for i in range(self.n):
            self.keys[i] = permute_one(self.values[i], spec, self.blocks)
            self.ids[i] = <uint32_t>i
        sort_by_prefix(self.keys, self.ids, self.key_tmp, self.id_tmp, self.n,
                       popcount64(self.prefixes[self.table]))
        self.start = 0

    cdef int scan(self, PairBuffer* out, Py_ssize_t max_pairs) except -1 nogil:
        cdef Py_ssize_t end, a, b
        cdef uint64_t prefix, diff, first, lead
        cdef int blk, taken
        while out.length // 2 < max_pairs:
            if self.start >= self.n:
                if self.table + 1 >= self.tables:
                    return 0
                self.table += 1
                self.next_table()
                continue
            prefix = self.prefixes[self.table]
            lead = self.leading[self.table]
            end = self.start + 1
            while end < self.n and ((self.keys[end] ^ self.keys[self.start]) & prefix) == 0:
                end += 1
            for a in range(self.start, end):
                for b in range(a + 1, end):
                    if self.across and self.sides[self.ids[a]] == self.sides[self.ids[b]]:
                        continue
                    if popcount64(self.keys[a] ^ self.keys[b]) > self.distance:
                        continue
                    # keep the pair only in the first table whose leading blocks it shares
                    diff = self.values[self.ids[a]] ^ self.values[self.ids[b]]
                    first = 0
                    taken = 0
                    for blk in range(self.blocks):
                        if taken < self.keep and (diff & self.block_masks[blk]) == 0:
                            first |= (<uint64_t>1) << blk
                            taken += 1
                    if first != lead:
                        continue
                    if self.ids[a] < self.ids[b]:
                        push_pair(out, self.ids[a], self.ids[b])
                    else:
                        push_pair(out, self.ids[b], self.ids[a])
            self.start = end
        return 0

    def next_chunk(self, Py_ssize_t max_pairs=1 << 20, bint sort=False):
        """The next pairs as a flat ``array('Q')`` [i0, j0, i1, j1, ...] (about
        ``max_pairs`` of them, sorted if asked), or None when all are out."""
        cdef PairBuffer buf
        cdef uint64_t[::1] view
        buf.data, buf.length, buf.capacity = NULL, 0, 0
        try:
            with nogil:
                self.scan(&buf, max_pairs)
                if sort:
                    qsort(buf.data, buf.length // 2, 2 * sizeof(uint64_t), compare_pairs)
            if buf.length == 0:
                return None
            out = array("Q", [0]) * buf.length
            view = out
            memcpy(&view[0], buf.data, buf.length * sizeof(uint64_t))
            return out
        finally:
            free(buf.data)


def unique_sorted(values):
    """The distinct fingerprints of ``values``, sorted, and how often each occurs."""
    cdef const uint64_t[::1] vs = as_fingerprints(values)
    cdef Py_ssize_t n = vs.shape[0]
    sorted_values = array("Q", [0]) * n
    counts = array("Q", [0]) * n
    distinct = sort_and_count(vs, sorted_values, counts) if n else 0
    del sorted_values[distinct:], counts[distinct:]
    return sorted_values, counts


cdef Py_ssize_t sort_and_count(const uint64_t[::1] vs, uint64_t[::1] sv, uint64_t[::1] cn):
    cdef Py_ssize_t i, n = vs.shape[0], u = 0
    scratch = array("Q", [0]) * n
    cdef uint64_t[::1] sc = scratch
    with nogil:
        memcpy(&sv[0], &vs[0], n * sizeof(uint64_t))
        radix_sort(&sv[0], &sc[0], n, 1)
        for i in range(n):
            if i == 0 or sv[i] != sv[u - 1]:
                sv[u] = sv[i]
                cn[u] = 1
                u += 1
            else:
                cn[u - 1] += 1
    return u


def join_components(uint64_t[::1] parent, const uint64_t[::1] pairs):
    """Union the (i, j) of flat ``pairs`` in the union-find forest ``parent``
    (start from ``array('Q', range(n))``); roots are the smallest members."""
    cdef Py_ssize_t p
    cdef uint64_t a, b
    with nogil:
        for p in range(0, pairs.shape[0], 2):
            a = find_root(&parent[0], pairs[p])
            b = find_root(&parent[0], pairs[p + 1])
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b


def component_labels(uint64_t[::1] parent):
    """Point every node of the forest straight at its root (its component's label)."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(parent.shape[0]):
            parent[i] = find_root(&parent[0], i)


cdef inline uint64_t find_root(uint64_t* parent, uint64_t x) noexcept nogil:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


# The text rule's pairs by bands: texts that share a band of their signatures,
# each pair once (by the first band it shares), kept when their resemblance
# reaches the threshold. The pairs within the database's distance that share
# no band come from the fingerprint scan above (see simhashdb.matching).

cdef struct ScoredPairs:
    uint64_t* pairs  # i, j, i, j, ...
    double* scores
    Py_ssize_t length, capacity


cdef int push_scored(ScoredPairs* out, uint64_t a, uint64_t b, double score) except -1 nogil:
    if out.length == out.capacity:
        out.capacity = 2 * out.capacity + 1024
        grow(<void**>&out.pairs, 2 * out.capacity * sizeof(uint64_t))
        grow(<void**>&out.scores, out.capacity * sizeof(double))
    out.pairs[2 * out.length] = a
    out.pairs[2 * out.length + 1] = b
    out.scores[out.length] = score
    out.length += 1
    return 0


def band_pairs(const unsigned char[::1] signatures, Py_ssize_t size, double threshold,
               int only_band=-1):
    """The pairs (i, j), i < j, of ``signatures`` (``size`` bytes each, 128 or
    256; all zero for a document without text, which has no bands) that share a
    band, each once, whose resemblance is at least ``threshold``: a flat
    ``array('Q')`` [i, j, ...] and an ``array('d')`` of their resemblance.

    With ``only_band`` (a band number), the signatures all share that band (a
    group that Spark gathered): the pairs whose first shared band it is."""
    cdef Py_ssize_t n
    cdef Py_ssize_t i, a, c, start, end, first
    cdef int band, earlier
    cdef uint64_t x, y
    cdef uint32_t* keys = NULL
    cdef uint8_t* has = NULL
    cdef uint64_t* order = NULL
    cdef uint64_t* scratch = NULL
    cdef ScoredPairs out
    cdef double score
    cdef uint64_t[::1] pair_view
    cdef double[::1] score_view
    out.pairs, out.scores, out.length, out.capacity = NULL, NULL, 0, 0
    if not is_signature_size(size) or only_band >= SIGNATURE_BANDS or signatures.shape[0] % size:
        raise InvalidArgumentError("expected signatures of %d bytes (%d or %d) and a band "
                                   "below %d" % (size, NARROW_SIGNATURE, WIDE_SIGNATURE,
                                                 SIGNATURE_BANDS))
    n = signatures.shape[0] // size
    try:
        grow(<void**>&keys, (n * SIGNATURE_BANDS + 1) * sizeof(uint32_t))
        grow(<void**>&has, n + 1)
        grow(<void**>&order, (n + 1) * sizeof(uint64_t))
        grow(<void**>&scratch, (n + 1) * sizeof(uint64_t))
        with nogil:
            for i in range(n):
                has[i] = signature_bands(&signatures[i * size], size,
                                         &keys[i * SIGNATURE_BANDS]) != 0
            for band in range(SIGNATURE_BANDS):
                if only_band >= 0 and band != only_band:
                    continue
                first = 0
                for i in range(n):  # (band key, index) of each text, by band key
                    if has[i]:
                        order[first] = ((<uint64_t>keys[i * SIGNATURE_BANDS + band]) << 32) | i
                        first += 1
                if only_band < 0:
                    radix_sort(order, scratch, first, 1)
                start = 0
                while start < first:
                    end = start + 1
                    while end < first and (only_band >= 0 or
                                           (order[end] >> 32) == (order[start] >> 32)):
                        end += 1
                    for a in range(start, end):
                        for c in range(a + 1, end):
                            x, y = order[a] & 0xFFFFFFFFULL, order[c] & 0xFFFFFFFFULL
                            for earlier in range(band):  # found by an earlier band
                                if keys[x * SIGNATURE_BANDS + earlier] == \
                                        keys[y * SIGNATURE_BANDS + earlier]:
                                    break
                            else:
                                score = signature_resemblance(&signatures[x * size],
                                                              &signatures[y * size], size)
                                if score >= threshold:
                                    push_scored(&out, x if x < y else y, y if x < y else x,
                                                score)
                    start = end
        pairs, scores = array("Q", [0]) * (2 * out.length), array("d", [0.0]) * out.length
        if out.length:
            pair_view, score_view = pairs, scores
            memcpy(&pair_view[0], out.pairs, 2 * out.length * sizeof(uint64_t))
            memcpy(&score_view[0], out.scores, out.length * sizeof(double))
        return pairs, scores
    finally:
        free(keys)
        free(has)
        free(order)
        free(scratch)
        free(out.pairs)
        free(out.scores)


def shares_a_band(const unsigned char[::1] a, const unsigned char[::1] b):
    """Whether two signatures share a band (False where either has none)."""
    cdef const unsigned char* x
    cdef const unsigned char* y
    cdef unsigned char narrowed[NARROW_SIGNATURE]
    cdef Py_ssize_t size = meet(a, b, &x, &y, narrowed)
    return signatures_share_a_band(x, y, size)


def banded_resemblance(const unsigned char[::1] a, const unsigned char[::1] b, bint near):
    """The resemblance of two signatures where the text rule compares them:
    their texts' fingerprints are ``near`` or they share a band; else -1.0."""
    cdef const unsigned char* x
    cdef const unsigned char* y
    cdef unsigned char narrowed[NARROW_SIGNATURE]
    cdef Py_ssize_t size = meet(a, b, &x, &y, narrowed)
    if near or signatures_share_a_band(x, y, size):
        return signature_resemblance(x, y, size)
    return -1.0


cdef bint signatures_share_a_band(const unsigned char* a, const unsigned char* b,
                                  Py_ssize_t size) noexcept nogil:
    cdef uint32_t x[SIGNATURE_BANDS]
    cdef uint32_t y[SIGNATURE_BANDS]
    cdef int band
    if not signature_bands(a, size, x) or not signature_bands(b, size, y):
        return False
    for band in range(SIGNATURE_BANDS):
        if x[band] == y[band]:
            return True
    return False
