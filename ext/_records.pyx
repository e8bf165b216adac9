# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The stored document's bytes, natively, for :mod:`simhashdb.records`: plain
records (a key that is an int, str or bytes, a fingerprint that is an int, no
metadata), and arrays of int keys and fingerprints, encoded exactly as msgpack
encodes them; and matches of int keys as flat arrays."""

from cpython cimport array
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcmp, memcpy

include "_values.pxi"

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
    int PyGC_Disable()
    int PyGC_Enable()
    object PyUnicode_DecodeUTF8(const char*, Py_ssize_t, const char*)
    object PyBytes_FromStringAndSize(const char*, Py_ssize_t)
    object PyType_GenericAlloc(type, Py_ssize_t)
    void PyTuple_SET_ITEM(object, Py_ssize_t, object)  # steals a reference
    void Py_INCREF(object)

cdef extern from *:
    """
    /* A new tuple's cached hash (Python 3.14 on) as tuple's own __new__ leaves
       it: not computed yet; PyType_GenericAlloc leaves 0, a hash taken as cached. */
    static inline void tuple_hash_unknown(PyObject* t) {
    #if PY_VERSION_HEX >= 0x030E0000
        ((PyTupleObject*)t)->ob_hash = -1;
    #endif
    }
    """
    void tuple_hash_unknown(object)


cdef Py_ssize_t pack_uint(unsigned char* out, uint64_t x) noexcept:
    if x < 0x80:
        out[0] = <unsigned char>x
        return 1
    cdef int width = 1 if x <= 0xFF else 2 if x <= 0xFFFF else 4 if x <= 0xFFFFFFFF else 8
    cdef int i
    out[0] = 0xcc if width == 1 else 0xcd if width == 2 else 0xce if width == 4 else 0xcf
    for i in range(width):
        out[1 + i] = (x >> (8 * (width - 1 - i))) & 0xFF
    return 1 + width


cdef Py_ssize_t pack_int(unsigned char* out, int64_t x) noexcept:
    if x >= 0:
        return pack_uint(out, <uint64_t>x)
    if x >= -32:
        out[0] = <unsigned char>(x & 0xFF)
        return 1
    cdef int width = 1 if x >= -128 else 2 if x >= -32768 else 4 if x >= -2147483648 else 8
    cdef int i
    cdef uint64_t bits = <uint64_t>x
    out[0] = 0xd0 if width == 1 else 0xd1 if width == 2 else 0xd2 if width == 4 else 0xd3
    for i in range(width):
        out[1 + i] = (bits >> (8 * (width - 1 - i))) & 0xFF
    return 1 + width


cdef bytes pack_key_plain(object key, Py_ssize_t limit):
    """msgpack(key) for an int, str or bytes key within ``limit``, else None."""
    cdef unsigned char head[9]
    cdef Py_ssize_t n, size
    cdef const char* data
    if type(key) is int:
        if -9223372036854775808 <= key < 0:
            n = pack_int(head, key)
        elif 0 <= key <= 0xFFFFFFFFFFFFFFFF:
            n = pack_uint(head, key)
        else:
            return None
        return (<char*>head)[:n]
    if type(key) is str:
        try:
            raw = (<str>key).encode("utf-8")
        except UnicodeEncodeError:
            return None
        size = len(raw)
        if size < 32:
            head[0], n = 0xa0 | size, 1
        elif size < 256:
            head[0], head[1], n = 0xd9, size, 2
        else:
            head[0], head[1], head[2], n = 0xda, size >> 8, size & 0xFF, 3
    elif type(key) is bytes:
        raw = key
        size = len(raw)
        if size < 256:
            head[0], head[1], n = 0xc4, size, 2
        else:
            head[0], head[1], head[2], n = 0xc5, size >> 8, size & 0xFF, 3
    else:
        return None
    if size >= 65536 or n + size > limit:
        return None
    return (<char*>head)[:n] + raw


def encode_plain_documents(list records, Py_ssize_t limit, uint64_t stored_at):
    """(msgpack(key), fingerprint, msgpack([fingerprint, None, stored_at])) for
    each record, or None if any record is not plain (the caller then encodes
    them all the general way, which also explains what is wrong)."""
    cdef Py_ssize_t i, n = len(records)
    cdef unsigned char value[20]
    cdef Py_ssize_t size
    cdef list out = [None] * n
    cdef object record, key_bytes, fp
    for i in range(n):
        record = records[i]
        if type(record) is not tuple or not (len(record) == 2 or
                                             (len(record) == 3 and record[2] is None)):
            return None
        fp = record[1]
        if type(fp) is not int or not 0 <= fp <= 0xFFFFFFFFFFFFFFFF:
            return None
        key_bytes = pack_key_plain(record[0], limit)
        if key_bytes is None:
            return None
        value[0] = 0x93
        size = 1 + pack_uint(value + 1, fp)
        value[size] = 0xc0
        size += 1 + pack_uint(value + size + 1, stored_at)
        out[i] = (key_bytes, fp, (<char*>value)[:size])
    return out


cdef inline int64_t read_int(const uint8_t* p, int width, bint signed) noexcept nogil:
    """The int of ``width`` bytes at ``p`` (native order), widened; unsigned
    widths up to 4 and signed ones keep their value, an unsigned 8 its bits."""
    cdef int8_t i8
    cdef int16_t i16
    cdef int32_t i32
    cdef int64_t i64
    if width == 8:
        memcpy(&i64, p, 8)
        return i64
    if width == 4:
        memcpy(&i32, p, 4)
        return i32 if signed else <int64_t><uint32_t>i32
    if width == 2:
        memcpy(&i16, p, 2)
        return i16 if signed else <int64_t><uint16_t>i16
    i8 = <int8_t>p[0]
    return i8 if signed else <int64_t>p[0]


def first_negative(const uint8_t[::1] keys, int width, bint signed):
    """The index of the first negative of the ``width``-byte ints ``keys``, or -1."""
    cdef Py_ssize_t i
    if signed:
        for i in range(keys.shape[0] // width):
            if read_int(&keys[i * width], width, True) < 0:
                return i
    return -1


cdef class PackedDocuments:
    """Documents of int keys (encode_int_documents) in flat buffers, with no
    object a record: each key in a slot of ``keys`` (KEY_SLOT bytes, its
    length in ``key_sizes``), each value likewise in ``values``. A sequence
    of (key, fingerprint, value) tuples, each made when asked for, for the
    backends that read tuples; the native LMDB backend reads the buffers."""

    cdef readonly bytes keys, key_sizes, values, value_sizes
    cdef const uint64_t[::1] fps
    cdef Py_ssize_t n

    def __len__(self):
        return self.n

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("document index out of range")
        return self.document(i)

    def __iter__(self):
        return iter(self.tuples())

    def tuples(self):
        """Every document as a (key, fingerprint, value) tuple, in a list."""
        cdef Py_ssize_t i
        cdef list out = [None] * self.n
        for i in range(self.n):
            document = self.document(i)
            PyObject_GC_UnTrack(document)  # of bytes and an int: no cycle to collect
            out[i] = document
        return out

    cdef tuple document(self, Py_ssize_t i):
        cdef const char* keys = self.keys
        cdef const char* values = self.values
        cdef const unsigned char* key_sizes = self.key_sizes
        cdef const unsigned char* value_sizes = self.value_sizes
        return (PyBytes_FromStringAndSize(keys + KEY_SLOT * i, key_sizes[i]), self.fps[i],
                PyBytes_FromStringAndSize(values + VALUE_SLOT * i, value_sizes[i]))

    @property
    def fingerprints(self):
        return self.fps


def encode_int_documents(const uint8_t[::1] keys, int width, bint signed,
                         const uint64_t[::1] fps, Py_ssize_t start, Py_ssize_t stop,
                         uint64_t stored_at):
    """The documents of :func:`encode_plain_documents` for the records
    ``start`` to ``stop`` of non-negative int keys (a buffer of ``width``-byte
    ints, ``signed`` or not) and the fingerprints ``fps``, as PackedDocuments."""
    cdef Py_ssize_t i, n = stop - start
    cdef PackedDocuments out = PackedDocuments.__new__(PackedDocuments)
    cdef array.array own = array.clone(array.array("Q"), n, False)  # the values' fingerprints,
    cdef unsigned long long* fp = own.data.as_ulonglongs            # whatever the caller's become
    out.n, out.fps = n, own
    out.keys = PyBytes_FromStringAndSize(NULL, KEY_SLOT * n)
    out.key_sizes = PyBytes_FromStringAndSize(NULL, n)
    out.values = PyBytes_FromStringAndSize(NULL, VALUE_SLOT * n)
    out.value_sizes = PyBytes_FromStringAndSize(NULL, n)
    cdef unsigned char* key = <unsigned char*><char*>out.keys
    cdef unsigned char* key_size = <unsigned char*><char*>out.key_sizes
    cdef unsigned char* value = <unsigned char*><char*>out.values
    cdef unsigned char* value_size = <unsigned char*><char*>out.value_sizes
    cdef Py_ssize_t size
    for i in range(n):
        key_size[i] = pack_uint(key + KEY_SLOT * i,
                                <uint64_t>read_int(&keys[(start + i) * width], width, signed))
        fp[i] = fps[start + i]
        value[0] = 0x93
        size = 1 + pack_uint(value + 1, fp[i])
        value[size] = 0xc0
        size += 1 + pack_uint(value + size + 1, stored_at)
        value_size[i] = size
        value += VALUE_SLOT
    return out


ctypedef struct Hit:
    Py_ssize_t probe
    uint64_t key
    long distance


cdef int cmp_hit(const void* a, const void* b) noexcept nogil:
    cdef const Hit* x = <const Hit*>a
    cdef const Hit* y = <const Hit*>b
    if x.probe != y.probe:
        return -1 if x.probe < y.probe else 1
    if x.distance != y.distance:
        return -1 if x.distance < y.distance else 1
    return -1 if x.key < y.key else (1 if x.key > y.key else 0)


cdef bint unpack_uint(bytes data, uint64_t* out):
    """Whether ``data`` is msgpack of an int in [0, 2**64), read into ``out``."""
    cdef const uint8_t* p = <const uint8_t*><char*>data
    cdef Py_ssize_t size = len(data), width
    if size == 1 and p[0] < 0x80:
        out[0] = p[0]
        return True
    if size < 2 or not 0xcc <= p[0] <= 0xcf:
        return False
    width = 1 << (p[0] - 0xcc)
    if size != 1 + width:
        return False
    out[0] = read_be(p + 1, <int>width)
    return True


def hit_arrays(list found):
    """(probe indexes array('q'), keys array('Q'), distances array('B')) of
    the (stored key, fingerprint, distance) hits of each probe in ``found``,
    sorted by (probe, distance, key).

    :raises ValueError: (the stored key) for a key that is not an int in [0, 2**64)."""
    cdef Py_ssize_t probe, j, n = 0
    for hits in found:
        n += len(hits)
    cdef Hit* all_hits = <Hit*>malloc((n + 1) * sizeof(Hit))
    if all_hits == NULL:
        raise MemoryError()
    cdef array.array probes = array.array("q"), keys = array.array("Q")
    cdef array.array distances = array.array("B")
    try:
        n = 0
        for probe in range(len(found)):
            for hit in found[probe]:
                key = hit[0]
                if type(key) is not bytes or not unpack_uint(key, &all_hits[n].key):
                    raise ValueError(key)
                all_hits[n].probe, all_hits[n].distance = probe, hit[2]
                n += 1
        qsort(all_hits, n, sizeof(Hit), cmp_hit)
        array.resize(probes, n)
        array.resize(keys, n)
        array.resize(distances, n)
        for j in range(n):
            probes.data.as_longlongs[j] = all_hits[j].probe
            keys.data.as_ulonglongs[j] = all_hits[j].key
            distances.data.as_uchars[j] = <unsigned char>all_hits[j].distance
    finally:
        free(all_hits)
    return probes, keys, distances


cdef enum:
    INT_KEY, STR_KEY, BYTES_KEY  # the order Matches sort keys in (db._key_order)


cdef struct KeyHit:
    const uint8_t* payload  # a str's UTF-8 or the bytes, inside the stored key
    uint64_t number  # an int key, two's complement
    Py_ssize_t size, at  # the payload's size; the hit's place in its list
    long distance
    int kind
    bint negative


cdef bint read_key(bytes key, KeyHit* out):
    """Whether the stored ``key`` is msgpack of an int, str or bytes (not a
    long key's digest), read into ``out``."""
    cdef const uint8_t* p = <const uint8_t*><char*>key
    cdef Py_ssize_t size = len(key), head = 1
    cdef int width
    cdef int64_t signed_number
    if size == 0:
        return False
    cdef uint8_t c = p[0]
    out.negative = False
    if c < 0x80 or c >= 0xe0:
        out.kind, out.number, out.negative = INT_KEY, <uint64_t><int64_t><int8_t>c, c >= 0xe0
        return size == 1
    if 0xcc <= c <= 0xd3:
        width = 1 << ((c - 0xcc) & 3)
        if size != 1 + width:
            return False
        out.kind, out.number = INT_KEY, read_be(p + 1, width)
        if c >= 0xd0 and width < 8 and out.number >> (8 * width - 1):  # sign-extend
            out.number |= ~(<uint64_t>0) << (8 * width)
        signed_number = <int64_t>out.number
        out.negative = c >= 0xd0 and signed_number < 0
        return True
    if 0xa0 <= c <= 0xbf:
        out.kind, out.size = STR_KEY, c & 0x1f
    elif c == 0xd9 or c == 0xda or c == 0xdb or c == 0xc4 or c == 0xc5 or c == 0xc6:
        out.kind = STR_KEY if c >= 0xd9 else BYTES_KEY
        head += 1 << ((c - (0xd9 if c >= 0xd9 else 0xc4)))
        if size < head:
            return False
        out.size = read_be(p + 1, head - 1)
    else:
        return False
    out.payload = p + head
    return size == head + out.size


cdef int cmp_key_hit(const void* a, const void* b) noexcept nogil:
    """By (distance, key): ints, then strs, then bytes, each in Python's order
    (UTF-8 bytes sort as their code points)."""
    cdef const KeyHit* x = <const KeyHit*>a
    cdef const KeyHit* y = <const KeyHit*>b
    cdef int c
    if x.distance != y.distance:
        return -1 if x.distance < y.distance else 1
    if x.kind != y.kind:
        return -1 if x.kind < y.kind else 1
    if x.kind == INT_KEY:
        if x.negative != y.negative:
            return -1 if x.negative else 1
        if x.negative:
            return -1 if <int64_t>x.number < <int64_t>y.number else \
                (1 if <int64_t>x.number > <int64_t>y.number else 0)
        return -1 if x.number < y.number else (1 if x.number > y.number else 0)
    c = memcmp(x.payload, y.payload, x.size if x.size < y.size else y.size)
    if c:
        return c
    return -1 if x.size < y.size else (1 if x.size > y.size else 0)


cdef object new_match(type match, object key, object fp, object distance):
    """``match((key, fp, distance))``, untracked (of a key and ints: no cycle
    to collect), made as tuple's own ``__new__`` makes a subclass's, without its
    argument tuple."""
    made = PyType_GenericAlloc(match, 3)
    Py_INCREF(key)
    PyTuple_SET_ITEM(made, 0, key)
    Py_INCREF(fp)
    PyTuple_SET_ITEM(made, 1, fp)
    Py_INCREF(distance)
    PyTuple_SET_ITEM(made, 2, distance)
    tuple_hash_unknown(made)
    PyObject_GC_UnTrack(made)
    return made


cdef object key_object(const KeyHit* h):
    if h.kind == INT_KEY:
        return <int64_t>h.number if h.negative else h.number
    if h.kind == STR_KEY:
        return PyUnicode_DecodeUTF8(<const char*>h.payload, h.size, NULL)
    return PyBytes_FromStringAndSize(<const char*>h.payload, h.size)


def matches(list found, type match):
    """Lists of ``match`` tuples (key, fingerprint, distance) of the (stored
    key, fingerprint, distance) hits of each probe in ``found``, sorted by
    (distance, key), as db._matches makes them; or None where a key is a long
    key's digest (its key is in its document) or not one this reads."""
    cdef Py_ssize_t n = 0, i, j
    for hits in found:
        if type(hits) is not list:
            return None
        n = max(n, len(<list>hits))
    cdef KeyHit* keyed = <KeyHit*>malloc((n + 1) * sizeof(KeyHit))
    if keyed == NULL:
        raise MemoryError()
    cdef list out = []
    cdef int collecting = PyGC_Disable()  # lists of new tuples: nothing for it to collect
    try:
        for hits in found:
            n = len(<list>hits)
            for i in range(n):
                hit = (<list>hits)[i]
                if type(hit) is not tuple or len(<tuple>hit) != 3 or \
                        type((<tuple>hit)[0]) is not bytes or \
                        not read_key((<tuple>hit)[0], &keyed[i]):
                    return None
                keyed[i].distance, keyed[i].at = (<tuple>hit)[2], i
            if n > 1:
                qsort(keyed, n, sizeof(KeyHit), cmp_key_hit)
            ordered = []
            for j in range(n):
                hit = (<list>hits)[keyed[j].at]
                try:
                    key = key_object(&keyed[j])
                except UnicodeDecodeError:
                    return None
                ordered.append(new_match(match, key, (<tuple>hit)[1], (<tuple>hit)[2]))
            out.append(ordered)
    finally:
        free(keyed)
        if collecting:
            PyGC_Enable()
    return out


def signature(const uint8_t[::1] value):
    """The signature a well-formed document value holds (128 or 256 bytes),
    or None where it holds none this reading finds (the caller then reads the
    value the general way, which also tells a damaged one)."""
    cdef size_t size = 0
    if value.shape[0] == 0:
        return None
    cdef const uint8_t* found = value_signature(&value[0], value.shape[0], &size)
    return None if found == NULL else (<const char*>found)[:size]


cdef Py_ssize_t read_uint(const uint8_t* p, Py_ssize_t at, Py_ssize_t n, uint64_t* out) noexcept:
    """The msgpack unsigned int at ``p[at:]`` into ``out``; the offset after
    it, or -1 where there is none there."""
    cdef Py_ssize_t width
    if at >= n:
        return -1
    if p[at] < 0x80:
        out[0] = p[at]
        return at + 1
    if not 0xcc <= p[at] <= 0xcf:
        return -1
    width = 1 << (p[at] - 0xcc)
    if at + 1 + width > n:
        return -1
    out[0] = read_be(p + at + 1, <int>width)
    return at + 1 + width


def plain_items(object value):
    """[fingerprint, None, stored_at] of a plain document value (bytes: an
    array of an unsigned int, nil and an unsigned int, as a record without
    metadata is stored), or None for any other (read and checked the general
    way)."""
    if type(value) is not bytes:
        return None
    cdef const uint8_t* p = <const uint8_t*><char*>value
    cdef Py_ssize_t n = len(<bytes>value), at
    cdef uint64_t fp, when
    if n < 4 or p[0] != 0x93:
        return None
    at = read_uint(p, 1, n, &fp)
    if at < 0 or at >= n or p[at] != 0xc0:
        return None
    if read_uint(p, at + 1, n, &when) != n:
        return None
    return [fp, None, when]
