# A part of _lmdb.pyx, which includes the parts in order; it builds on _values.pxi,
# _signature.pxi, _buffers.pxi, _work.pxi, _old_tables.pxi, _index.pxi.

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from bits cimport read_be, write_be
from clmdb cimport g_get, MDB_NEXT, MDB_NOTFOUND, MDB_SET_RANGE, MDB_val


# The band tables: table b holds an entry (the text's band key b << 32 | its
# fingerprint's top 32 bits) while a stored text document has it

cdef long IDENTITY_SPEC[3]  # a one-block "permutation" that leaves an entry as it is
IDENTITY_SPEC[0], IDENTITY_SPEC[1], IDENTITY_SPEC[2] = 0, 64, 0


cdef int note_bands(Work* w, const uint8_t* value, size_t size, uint64_t fp,
                    bint added) noexcept nogil:
    """Note the band entries of a document value (none for a document without
    a signature) as added to or taken from the band tables."""
    cdef const uint8_t* signature
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef int b, rc = 0
    if w.bands == NULL:
        return 0
    signature = value_signature(value, size, 2 * MINHASH_BINS)
    if signature == NULL or signature_bands(signature, keys) == 0:
        return 0
    for b in range(SIGNATURE_BANDS):
        rc = u64_push(&w.band_changes[b], ((<uint64_t>keys[b]) << 32) | (fp >> 32))
        if rc == 0:
            rc = u64_push(&w.band_changes[b], added)
        if rc:
            return rc
    return 0


cdef int entry_held(Work* w, int band, uint64_t entry) noexcept nogil:
    """1 if a stored document (as the index is now) has band entry ``entry`` in
    band table ``band``, 0 if none, or an LMDB error."""
    cdef uint8_t start[8]
    cdef MDB_val k, v, value
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef const uint8_t* signature
    cdef int rc
    write_be(start, (entry & 0xFFFFFFFFULL) << 32, 8)
    k.mv_size, k.mv_data = 8, start
    rc = index_get(w, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 8:
            return -30796  # MDB_CORRUPTED
        if (read_be(<uint8_t*>k.mv_data, 8) >> 32) != (entry & 0xFFFFFFFFULL):
            return 0
        rc = g_get(w.txn, w.docs, &v, &value)
        if rc == 0:
            signature = value_signature(<uint8_t*>value.mv_data, value.mv_size,
                                        2 * MINHASH_BINS)
            if signature != NULL and signature_bands(signature, keys) and \
                    keys[band] == (entry >> 32):
                return 1
        elif rc != MDB_NOTFOUND:
            return rc
        rc = index_get(w, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int update_bands(Work* w) noexcept nogil:
    """Put into the band tables the entries the batch's documents brought, and
    take out those it took away that no stored document has any more."""
    cdef U64s* changes
    cdef size_t n, i, j, added
    cdef uint64_t entry
    cdef bint adding
    cdef int b, rc = open_band_cursors(w), held
    if w.bands == NULL or rc:
        return rc
    for b in range(SIGNATURE_BANDS):
        changes = &w.band_changes[b]
        n = changes.size // 2
        if n:
            rc = sort_records(changes.data, n, 2)
        i = added = 0
        while rc == 0 and i < n:
            entry, adding, j = changes.data[2 * i], False, i
            while j < n and changes.data[2 * j] == entry:
                adding = adding or changes.data[2 * j + 1]
                j += 1
            if adding:  # gathered at the front (written behind what is read)
                changes.data[added] = entry
                added += 1
            else:
                held = entry_held(w, b, entry)
                if held < 0:
                    rc = held
                elif held == 0:
                    rc = delete_table_entries(w.band_cursors[b], &entry, 1)
            i = j
        if rc == 0 and added:
            rc = put_table_entries(w.band_cursors[b], changes.data, added)
        changes.size = 0
        if rc:
            return rc
    return 0
