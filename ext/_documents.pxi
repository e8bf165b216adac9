# A part of _lmdb.pyx, which includes the parts in order; it builds on _signature.pxi (the
# hash), _buffers.pxi, _work.pxi, _slotted.pxi.
#
# The documents as records under ids (format.py): a record is the key's length
# (u16 BE), the key and the document value; the key map holds each id under its
# key's hash, and the record of one of the ids under a key's hash holds the key.

from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcmp, memcpy
from bits cimport read_be, write_be
from clmdb cimport (
    g_copy, g_cursor_get, g_cursor_open, g_cursor_put, MDB_cursor, MDB_NEXT_DUP, MDB_NOTFOUND,
    MDB_SET, MDB_val,
)

cdef enum:
    KEY_ROOM = 512  # room for a record's key: the longest stored is 511 bytes (MAX_KEY_BYTES)


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


cdef int read_id(const MDB_val* v, uint64_t* id) noexcept nogil:
    """The document id a value of the key map or the index holds."""
    if v.mv_size != ID_BYTES:
        return CORRUPTED
    id[0] = read_be(<const uint8_t*>v.mv_data, ID_BYTES)
    return 0


cdef int read_record(MDB_cursor* records, uint64_t id, MDB_val* key, MDB_val* value) noexcept nogil:
    """The key and value of record ``id`` (MDB_NOTFOUND: none), through a
    cursor on the records (a sweep in id order stays on its leaves)."""
    cdef uint8_t id_bytes[ID_BYTES]
    cdef MDB_val k, v
    write_be(id_bytes, id, ID_BYTES)
    k.mv_size, k.mv_data = ID_BYTES, id_bytes
    cdef int rc = g_cursor_get(records, &k, &v, MDB_SET)
    return rc if rc else record_parts(&v, key, value)


cdef int read_hashed(MDB_cursor* records, uint64_t id, const Doc* doc, MDB_val* value,
                     uint64_t* fp) noexcept nogil:
    """1 if record ``id``, which the key map holds under ``doc``'s key's hash,
    holds that key (``value``: its value, ``fp``: the value's fingerprint
    where given), 0 if it holds another key of that hash; CORRUPTED where
    there is no such record, its key has another hash, or the value leads
    with no fingerprint."""
    cdef uint8_t held[KEY_ROOM]
    cdef MDB_val key
    cdef int rc = read_record(records, id, &key, value)
    if rc:
        return CORRUPTED if rc == MDB_NOTFOUND else rc
    if key.mv_size > KEY_ROOM or g_copy(held, key.mv_data, key.mv_size):
        return CORRUPTED
    if key.mv_size != doc.key_size or memcmp(held, doc.key, doc.key_size):
        return 0 if hash_bytes(held, key.mv_size) == doc.hash else CORRUPTED
    return CORRUPTED if fp != NULL and value_fingerprint(value, fp) else 1


cdef int find_key(Work* w, const Doc* doc, uint64_t* id, MDB_val* value,
                  uint64_t* fp) noexcept nogil:
    """1 if ``doc``'s key is stored (``id``, ``value``, ``fp``: its id, value
    and fingerprint, as read_hashed), 0 if not, or an LMDB error: the
    records of the ids under the key's hash are read, those of other keys of
    that hash passed over."""
    cdef uint8_t hash[8]
    cdef MDB_val k, v
    cdef int rc = open_records(w)
    write_be(hash, doc.hash, 8)
    k.mv_size, k.mv_data = 8, hash
    if rc == 0:
        rc = slotted_get(w, &w.keys, &k, &v, MDB_SET)
    while rc == 0:
        rc = read_id(&v, id)
        if rc == 0:
            rc = read_hashed(w.record_cursor, id[0], doc, value, fp)
        if rc == 0:
            rc = slotted_get(w, &w.keys, &k, &v, MDB_NEXT_DUP)
    return 0 if rc == MDB_NOTFOUND else rc


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
