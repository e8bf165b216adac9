# A part of _ext.pyx: which texts of a batch could be a candidate of another
# (simhashdb.rule.sharing), by values held more than once in a column: a
# hash table a column, rows chained under their value, in O(n).

cdef struct Repeats:  # a column's values, each with the chain of its rows
    uint64_t* keys
    int64_t* head  # a slot's last row (-1: empty), the chain's start
    uint32_t* counts
    int64_t* next  # the row before it under its value (-1: none)
    size_t mask  # slots - 1, a power of two at least twice the rows


cdef void mark_repeats(Repeats* r, const uint64_t* values, size_t n, const uint64_t* fps,
                       const size_t* rows, int distance, size_t checked,
                       uint8_t* shared) noexcept nogil:
    """Mark in ``shared`` the rows (``rows[i]`` of value ``i``) whose value
    another holds: with ``fps``, only those within ``distance`` of one of them,
    unless more than ``checked`` hold it (then all)."""
    cdef size_t i, h
    cdef int64_t a, b
    memset(r.head, 0xFF, (r.mask + 1) * sizeof(int64_t))
    for i in range(n):
        h = fmix64(values[i]) & r.mask
        while r.head[h] >= 0 and r.keys[h] != values[i]:
            h = (h + 1) & r.mask
        if r.head[h] < 0:
            r.keys[h], r.counts[h] = values[i], 0
        r.next[i], r.head[h] = r.head[h], <int64_t>i
        r.counts[h] += 1
    for h in range(r.mask + 1):
        if r.head[h] < 0 or r.counts[h] < 2:
            continue
        a = r.head[h]
        while a >= 0:
            if fps == NULL or r.counts[h] > checked:
                shared[rows[a]] = 1
            else:
                b = r.next[a]
                while b >= 0:
                    if popcount64(fps[rows[a]] ^ fps[rows[b]]) <= distance:
                        shared[rows[a]] = shared[rows[b]] = 1
                    b = r.next[b]
            a = r.next[a]


def shared_texts(fingerprints, list banded, list cuts, int distance, Py_ssize_t checked):
    """For each text of a batch (``fingerprints``, ints or a uint64 buffer;
    ``banded``, its band keys: ``array('I')`` of one length, or empty),
    whether another shares one of its band keys (in the same band) or is
    within ``distance`` bits under one of the fingerprint blocks ``cuts``
    ((low bit, high bit), at most 64; all under a block more than ``checked``
    share)."""
    cdef const uint64_t[::1] fps = as_fingerprints(fingerprints)
    cdef size_t n = fps.shape[0], used = 0, slots = 2, i, j, p, parts = len(cuts)
    cdef size_t width = max([len(row) for row in banded] or [0]), crowd = max(checked, 0)
    cdef int lo[64]
    cdef int hi[64]
    cdef const uint32_t[::1] keys
    if <size_t>len(banded) != n:
        raise InvalidArgumentError("expected a list of band keys a fingerprint")
    if parts > 64:
        raise InvalidArgumentError("expected at most 64 blocks of bits, got %d" % parts)
    for p in range(parts):
        lo[p], hi[p] = cuts[p]
        if not 0 <= lo[p] < hi[p] <= 64:
            raise InvalidArgumentError("expected blocks of bits low..high, 0 <= low < high "
                                       "<= 64, got %s" % shown(cuts[p]))
    if n == 0:
        return []
    while slots < 2 * n:
        slots *= 2
    cdef Repeats r
    r.mask = slots - 1
    r.keys = <uint64_t*>malloc(slots * sizeof(uint64_t))
    r.head = <int64_t*>malloc(slots * sizeof(int64_t))
    r.counts = <uint32_t*>malloc(slots * sizeof(uint32_t))
    r.next = <int64_t*>malloc(n * sizeof(int64_t))
    cdef uint32_t* bands = <uint32_t*>malloc((n * width + 1) * sizeof(uint32_t))  # band-major
    cdef uint64_t* values = <uint64_t*>malloc(n * sizeof(uint64_t))  # the column marked
    cdef size_t* rows = <size_t*>malloc(n * sizeof(size_t))
    cdef uint8_t* shared = <uint8_t*>calloc(n, 1)
    try:
        if not (r.keys and r.head and r.counts and r.next and bands and values and rows
                and shared):
            raise MemoryError()
        for i in range(n):
            keys = banded[i]
            if keys.shape[0] == 0:
                continue
            if <size_t>keys.shape[0] != width:
                raise InvalidArgumentError("expected %d band keys or none, got %d"
                                           % (width, keys.shape[0]))
            for j in range(width):
                bands[j * n + used] = keys[j]
            rows[used] = i
            used += 1
        with nogil:
            for j in range(width if used else 0):
                for i in range(used):
                    values[i] = bands[j * n + i]
                mark_repeats(&r, values, used, NULL, rows, 0, 0, shared)
            for i in range(n):
                rows[i] = i
            for p in range(parts):
                for i in range(n):
                    values[i] = (fps[i] >> lo[p]) & (~0ULL >> (64 - (hi[p] - lo[p])))
                mark_repeats(&r, values, n, &fps[0], rows, distance, crowd, shared)
        return [shared[i] != 0 for i in range(n)]
    finally:
        free(r.keys)
        free(r.head)
        free(r.counts)
        free(r.next)
        free(bands)
        free(values)
        free(rows)
        free(shared)
