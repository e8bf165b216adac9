# A part of _lmdb.pyx, which includes the parts in order; it builds on _buffers.pxi, _work.pxi,
# _slotted.pxi.
#
# The documents as records under ids (format.py): a record is the key's length
# (u16 BE), the key and the document value; the key map finds a key's id.

from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcmp, memcpy
from bits cimport read_be, write_be
from clmdb cimport g_copy, g_cursor_get, g_cursor_open, g_cursor_put, MDB_cursor, MDB_SET, MDB_val


cdef int open_records(Work* w) noexcept nogil:
    """Open the cursor on the records, once."""
    return 0 if w.record_cursor != NULL else g_cursor_open(w.txn, w.records, &w.record_cursor)


cdef int record_parts(const MDB_val* record, MDB_val* key, MDB_val* value) noexcept nogil:
    """Point ``key`` and ``value`` into a stored record; CORRUPTED where its
    key's length runs past it."""
    cdef const uint8_t* p = <const uint8_t*>record.mv_data
    cdef size_t size
    if record.mv_size < KEY_LENGTH_BYTES:
        return CORRUPTED
    size = read_be(p, KEY_LENGTH_BYTES)
    if size > record.mv_size - KEY_LENGTH_BYTES:
        return CORRUPTED
    key.mv_size, key.mv_data = size, <void*>(p + KEY_LENGTH_BYTES)
    value.mv_size = record.mv_size - KEY_LENGTH_BYTES - size
    value.mv_data = <void*>(p + KEY_LENGTH_BYTES + size)
    return 0


cdef int record_holds(const MDB_val* key, const uint8_t* want, size_t size) noexcept nogil:
    """0 if a record's key (``key``, in the map) is the key ``want``, else
    CORRUPTED: the key map or the index named the record of another document."""
    cdef uint8_t held[512]
    if key.mv_size != size or size > 512 or g_copy(held, key.mv_data, size):
        return CORRUPTED
    return 0 if memcmp(held, want, size) == 0 else CORRUPTED


cdef int read_id(const MDB_val* v, uint64_t* id) noexcept nogil:
    """The document id a value of the key map or the index holds."""
    if v.mv_size != ID_BYTES:
        return CORRUPTED
    id[0] = read_be(<const uint8_t*>v.mv_data, ID_BYTES)
    return 0


cdef int find_id(Work* w, const uint8_t* key, size_t key_size, uint64_t* id) noexcept nogil:
    """1 if the key map has ``key`` (``id``: its id), 0 if not, or an LMDB error."""
    cdef MDB_val k, v
    k.mv_size, k.mv_data = key_size, <void*>key
    cdef int rc = slotted_find(w, &w.keys, &k, &v)
    if rc == 1 and read_id(&v, id):
        return CORRUPTED
    return rc


cdef int read_record(MDB_cursor* records, uint64_t id, MDB_val* key, MDB_val* value) noexcept nogil:
    """The key and value of record ``id`` (MDB_NOTFOUND: none), through a
    cursor on the records (a sweep in id order stays on its leaves)."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    cdef int rc = g_cursor_get(records, &k, &v, MDB_SET)
    return rc if rc else record_parts(&v, key, value)


cdef int read_keyed(MDB_cursor* records, uint64_t id, const uint8_t* want, size_t size,
                    MDB_val* value, uint64_t* fp) noexcept nogil:
    """The value of record ``id``, which the key map names for key ``want``,
    and its fingerprint where ``fp`` is given: CORRUPTED where there is no such
    record, it holds another key, or its value leads with no fingerprint."""
    cdef MDB_val key
    cdef int rc = read_record(records, id, &key, value)
    if rc == 0:
        rc = record_holds(&key, want, size)
    if rc == 0 and fp != NULL and value_fingerprint(value, fp) != 0:
        rc = CORRUPTED
    return CORRUPTED if rc == MDB_NOTFOUND else rc


cdef int read_indexed(MDB_cursor* records, uint64_t id, uint64_t fp, MDB_val* key,
                      MDB_val* value) noexcept nogil:
    """The key and value of record ``id``, which the index holds under ``fp``:
    CORRUPTED where there is no such record, or it holds another fingerprint."""
    cdef uint64_t held
    cdef int rc = read_record(records, id, key, value)
    if rc == 0 and (value_fingerprint(value, &held) != 0 or held != fp):
        rc = CORRUPTED
    return CORRUPTED if rc == MDB_NOTFOUND else rc


cdef int put_record(Work* w, uint64_t id, const uint8_t* key, size_t key_size,
                    const uint8_t* value, size_t value_size, unsigned int flags) noexcept nogil:
    """Write record ``id`` through the records' cursor (``flags``: MDB_APPEND
    for a new id, 0 to replace one)."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    cdef size_t size = KEY_LENGTH_BYTES + key_size + value_size
    if key_size >> (8 * KEY_LENGTH_BYTES):
        return CORRUPTED
    while w.scratch_room < size:
        if make_room(<void**>&w.scratch, &w.scratch_room, w.scratch_room, 1):
            return NO_MEMORY
    write_be(w.scratch, key_size, KEY_LENGTH_BYTES)
    memcpy(w.scratch + KEY_LENGTH_BYTES, key, key_size)
    memcpy(w.scratch + KEY_LENGTH_BYTES + key_size, value, value_size)
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    v.mv_size, v.mv_data = size, w.scratch
    return g_cursor_put(w.record_cursor, &k, &v, flags)
