# The permutations of the tables, shared by _ext (in-memory matching) and
# _lmdb (the native backend). A layout is a flat int array of (source shift,
# width, destination shift) triples, ``blocks`` triples per table.

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
