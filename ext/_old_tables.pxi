# A part of _lmdb.pyx, which includes the parts in order; it builds on _tables.pxi, _search.pxi.
#
# Tables in simhashdb 0.3's form (dupsort ``table:NNN``: the permuted
# fingerprint's top 2 bytes as key, the other 6 as value): scanned, and
# written until they are converted to runs.

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from bits cimport popcount64, read_be, write_be
from clmdb cimport (
    g_cursor_del, g_cursor_get, g_cursor_put, MDB_APPEND, MDB_APPENDDUP, MDB_cursor, MDB_GET_BOTH,
    MDB_GET_BOTH_RANGE, MDB_KEYEXIST, MDB_LAST, MDB_MULTIPLE, MDB_NEXT, MDB_NODUPDATA, MDB_NOTFOUND,
    MDB_SET_RANGE, MDB_val,
)


cdef inline void old_entry(uint64_t perm, uint8_t* key, uint8_t* value, MDB_val* k,
                           MDB_val* v) noexcept nogil:
    """Point ``k`` and ``v`` at ``perm`` as a table in 0.3's form keeps it: its
    top 2 bytes in ``key``, the other 6 in ``value``."""
    write_be(key, perm >> 48, 2)
    write_be(value, perm, 6)
    k.mv_size, k.mv_data = 2, key
    v.mv_size, v.mv_data = 6, value


cdef int scan_range(MDB_cursor* cursor, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                    const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """Verify every entry of one table in [lo, hi] against the permuted probe."""
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef uint64_t entry
    cdef int rc, d
    old_entry(lo, key_bytes, value_bytes, &k, &v)
    rc = g_cursor_get(cursor, &k, &v, MDB_GET_BOTH_RANGE)
    if rc == MDB_NOTFOUND:
        if (lo >> 48) == (hi >> 48):
            return 0
        write_be(key_bytes, (lo >> 48) + 1, 2)
        k.mv_size, k.mv_data = 2, key_bytes
        rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 2 or v.mv_size != 6:
            return -30796  # MDB_CORRUPTED
        entry = (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6)
        if entry > hi:
            return 0
        d = popcount64(entry ^ perm)
        if d <= distance:
            rc = hit_push(out, probe, unpermute_one(entry, spec, blocks), d)
            if rc:
                return rc
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int put_table_entries(MDB_cursor* cursor, uint64_t* perms, size_t n) noexcept nogil:
    """Add sorted permuted fingerprints to a table: where they come after what
    is stored, all the values of one key in one append (MDB_MULTIPLE)."""
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef MDB_val run[2]
    cdef uint64_t last = 0
    cdef bint have_last
    cdef size_t i, j, end
    cdef uint8_t* values
    cdef int rc = g_cursor_get(cursor, &k, &v, MDB_LAST)
    if rc and rc != MDB_NOTFOUND:
        return rc
    have_last = rc == 0
    if have_last:
        last = (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6)
    if n == 0 or not have_last or perms[0] > last:
        values = <uint8_t*>malloc(6 * n)
        if values == NULL:
            return NO_MEMORY
        i = rc = 0
        while rc == 0 and i < n:
            end = i + 1
            while end < n and (perms[end] >> 48) == (perms[i] >> 48):
                end += 1
            for j in range(i, end):
                write_be(values + 6 * (j - i), perms[j], 6)
            write_be(key_bytes, perms[i] >> 48, 2)
            k.mv_size, k.mv_data = 2, key_bytes
            run[0].mv_size, run[0].mv_data = 6, values
            run[1].mv_size, run[1].mv_data = end - i, NULL
            rc = g_cursor_put(cursor, &k, run, MDB_MULTIPLE | (
                MDB_APPENDDUP if have_last and (perms[i] >> 48) == (last >> 48) else MDB_APPEND))
            i = end
        free(values)
        return rc
    for i in range(n):
        old_entry(perms[i], key_bytes, value_bytes, &k, &v)
        rc = g_cursor_put(cursor, &k, &v, MDB_NODUPDATA)
        if rc and rc != MDB_KEYEXIST:
            return rc
    return 0


cdef int delete_table_entries(MDB_cursor* cursor, uint64_t* perms, size_t n) noexcept nogil:
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef size_t i
    cdef int rc
    for i in range(n):
        old_entry(perms[i], key_bytes, value_bytes, &k, &v)
        rc = g_cursor_get(cursor, &k, &v, MDB_GET_BOTH)
        if rc == 0:
            rc = g_cursor_del(cursor, 0)
        if rc and rc != MDB_NOTFOUND:
            return rc
    return 0
