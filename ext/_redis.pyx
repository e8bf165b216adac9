# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Kernels of the Redis backend (:mod:`simhashdb.storage.redis`): a key's
cluster slot, the records of the bucket scripts (MERGE for writes, SCAN for
queries) and the hits of a SCAN reply, the band entries of signatures, the
shards of the document and fingerprint hashes, a batch's plan and the
protocol's packing. A bucket key is a table's (or a band's) key followed by
the bucket (the leading ``bits`` of a permuted fingerprint, or of a band
entry) in bits / 4 hex digits; an entry is the remaining ``width`` bytes,
big-endian."""

from array import array
from bisect import insort

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize
from bits cimport popcount64

from simhashdb._ext import as_fingerprints

include "_memory.pxi"
include "_tables.pxi"
include "_signature.pxi"


cdef uint16_t CRC16[256]  # CRC-16/XMODEM (polynomial 0x1021), the one of Redis Cluster


cdef void init_crc16() noexcept nogil:
    cdef uint32_t i, c
    cdef int b
    for i in range(256):
        c = i << 8
        for b in range(8):
            c = ((c << 1) ^ 0x1021) if c & 0x8000 else c << 1
        CRC16[i] = c & 0xFFFF


init_crc16()


cdef inline uint16_t slot_of(const unsigned char* key, Py_ssize_t n) noexcept nogil:
    """The cluster slot of a key: the CRC of its hash tag (the bytes between
    its first { and the next }, if any) or else of all of it, mod 16384."""
    cdef Py_ssize_t i, start = -1, end = -1
    cdef uint16_t crc = 0
    for i in range(n):
        if key[i] == b'{':
            start = i
            break
    if start >= 0:
        for i in range(start + 1, n):
            if key[i] == b'}':
                end = i
                break
        if end > start + 1:
            key, n = key + start + 1, end - start - 1
    for i in range(n):
        crc = (crc << 8) ^ CRC16[((crc >> 8) ^ key[i]) & 0xFF]
    return crc & 0x3FFF


def key_slot(const unsigned char[::1] key):
    """The Redis Cluster slot of ``key`` (bytes), its hash tag respected."""
    return slot_of(&key[0], key.shape[0]) if key.shape[0] else 0


cdef class RecordBuffer:
    """A node's records, cut into blobs of ``limit`` bytes or ``per_blob``
    records (the one that ends a blob may pass ``limit``); with ``slots``, each
    blob is a (blob, [slot of its records' keys, ...]) pair."""
    cdef unsigned char* data
    cdef Py_ssize_t size, capacity, limit, records, per_blob
    cdef list blobs
    cdef list slots  # of the blob being filled (None: not tracked)
    cdef long last_slot

    def __cinit__(self, Py_ssize_t limit, Py_ssize_t per_blob, bint slots=False):
        self.capacity = 4096
        self.data = <unsigned char*>malloc(self.capacity)
        if self.data == NULL:
            raise MemoryError()
        self.size = self.records = 0
        self.limit, self.per_blob = limit, per_blob
        self.blobs = []
        self.slots = [] if slots else None
        self.last_slot = -1

    def __dealloc__(self):
        free(self.data)

    cdef unsigned char* grow(self, Py_ssize_t more) except NULL:
        """Room for ``more`` bytes at the end."""
        if self.size + more > self.capacity:
            self.capacity = 2 * (self.size + more)
            grow(<void**>&self.data, self.capacity)
        self.size += more
        return self.data + self.size - more

    cdef int end_record(self, long slot) except -1:
        """A record ends (its key in ``slot``; the records come slot by slot)."""
        if self.slots is not None and slot != self.last_slot:
            self.slots.append(slot)
            self.last_slot = slot
        self.records += 1
        if self.size >= self.limit or self.records == self.per_blob:
            self.flush()
        return 0

    cdef int flush(self) except -1:
        if self.size:
            blob = PyBytes_FromStringAndSize(<char*>self.data, self.size)
            if self.slots is None:
                self.blobs.append(blob)
            else:
                self.blobs.append((blob, self.slots))
                self.slots, self.last_slot = [], -1
        self.size = self.records = 0
        return 0


cdef class BucketKeys:
    """The bucket keys of one database and the node (by index) owning each."""
    cdef unsigned char* key
    cdef Py_ssize_t size
    cdef uint16_t slot  # of the key built last
    cdef list table_keys
    cdef int bits
    cdef const uint16_t[::1] owners

    def __cinit__(self, list table_keys, int bits, const uint16_t[::1] owners, Py_ssize_t nodes):
        cdef Py_ssize_t slot
        if owners.shape[0] != 16384:
            raise ValueError("owners must name the node of each of the 16384 slots")
        for slot in range(16384):
            if owners[slot] >= nodes:
                raise ValueError("owners name a node past the %d nodes" % nodes)
        self.table_keys, self.bits, self.owners = table_keys, bits, owners
        self.key = <unsigned char*>malloc(max(len(k) for k in table_keys) + 16)
        if self.key == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.key)

    cdef Py_ssize_t build(self, Py_ssize_t table, uint64_t value):
        """The key of ``value``'s bucket in ``table`` into ``self.key``; its node."""
        cdef bytes prefix = self.table_keys[table]
        cdef Py_ssize_t n = len(prefix)
        cdef int digits = self.bits // 4, d
        cdef uint64_t bucket = value >> (64 - self.bits) if self.bits else 0
        memcpy(self.key, <const char*>prefix, n)
        for d in range(digits):
            self.key[n + d] = b"0123456789abcdef"[(bucket >> (4 * (digits - 1 - d))) & 0xF]
        self.size = n + digits
        self.slot = slot_of(self.key, self.size)
        return self.owners[self.slot]

    cdef int put(self, RecordBuffer out) except -1:
        memcpy(out.grow(self.size), self.key, self.size)
        return 0


cdef inline void put_entries(unsigned char* p, const uint64_t* values, Py_ssize_t n,
                             int width) noexcept nogil:
    """The low ``width`` bytes of each value, big-endian."""
    cdef Py_ssize_t i
    cdef int b
    for i in range(n):
        for b in range(width):
            p[i * width + b] = (values[i] >> (8 * (width - 1 - b))) & 0xFF


cdef inline void put_u32(unsigned char* p, uint32_t x) noexcept nogil:
    p[0] = x >> 24
    p[1] = (x >> 16) & 0xFF
    p[2] = (x >> 8) & 0xFF
    p[3] = x & 0xFF


cdef inline Py_ssize_t bucket_end(const uint64_t[::1] values, Py_ssize_t i, uint64_t bucket,
                                  int bits) noexcept nogil:
    """The first index from ``i`` whose value is not in ``bucket``."""
    while i < values.shape[0] and (bits == 0 or values[i] >> (64 - bits) == bucket):
        i += 1
    return i


cdef struct Bucket:
    # a bucket a batch changes: its slot, table, bucket number, and its adds
    # and deletes (ranges of the table's sorted permuted values)
    uint32_t slot, table
    uint64_t bucket
    Py_ssize_t add_start, add_end, delete_start, delete_end


def merge_buckets(list added, list deleted, list table_keys, int bits, int width,
                  const uint16_t[::1] owners, Py_ssize_t nodes, Py_ssize_t limit):
    """The MERGE records that add the entries ``added[t]`` (a sorted uint64
    buffer) to table ``t`` (of key ``table_keys[t]``: a permutation table or a
    band, all keys of one length) and remove ``deleted[t]``, per node
    (``owners``: the node of each slot): (blob, slots) pairs, a blob of about
    ``limit`` bytes and the slots of its keys (sorted; the records go slot by
    slot, so a blob spans few). A record is a bucket key, the bucket's add
    count and delete count (4 bytes each), its adds and its deletes, each
    sorted."""
    cdef Py_ssize_t tables = len(table_keys), t, i, j, n = 0, capacity = 1024, r, k, slot
    # where each slot's records start in ``order`` (on the heap: 131 KB is too
    # much for the stack of a thread)
    cdef Py_ssize_t* starts = <Py_ssize_t*>calloc(16385, sizeof(Py_ssize_t))
    cdef Py_ssize_t* order = NULL
    cdef list buffers = [RecordBuffer(limit, 0, True) for _ in range(nodes)]
    cdef BucketKeys keys = BucketKeys(table_keys, bits, owners, nodes)
    cdef const uint64_t[::1] a
    cdef const uint64_t[::1] d
    cdef uint64_t first, bucket
    cdef RecordBuffer out
    cdef unsigned char* p
    cdef Bucket* records = <Bucket*>malloc(capacity * sizeof(Bucket))
    cdef const uint64_t** add_values = <const uint64_t**>calloc(tables, sizeof(uint64_t*))
    cdef const uint64_t** delete_values = <const uint64_t**>calloc(tables, sizeof(uint64_t*))
    try:
        if records == NULL or add_values == NULL or delete_values == NULL or starts == NULL:
            raise MemoryError()
        if len(added) != tables or len(deleted) != tables:
            raise ValueError("added and deleted entries must come for each of the %d tables"
                             % tables)
        for t in range(tables):
            a, d = added[t], deleted[t]
            for i in range(1, a.shape[0]):
                if a[i - 1] > a[i]:
                    raise ValueError("the entries added to table %d are not sorted" % t)
            for i in range(1, d.shape[0]):
                if d[i - 1] > d[i]:
                    raise ValueError("the entries deleted from table %d are not sorted" % t)
            if a.shape[0]:
                add_values[t] = &a[0]
            if d.shape[0]:
                delete_values[t] = &d[0]
            i = j = 0
            while i < a.shape[0] or j < d.shape[0]:
                first = a[i] if j >= d.shape[0] or (i < a.shape[0] and a[i] <= d[j]) else d[j]
                bucket = first >> (64 - bits) if bits else 0
                if n == capacity:
                    capacity *= 2
                    grow(<void**>&records, capacity * sizeof(Bucket))
                keys.build(t, first)
                records[n].slot, records[n].table, records[n].bucket = keys.slot, t, bucket
                records[n].add_start, records[n].delete_start = i, j
                i = bucket_end(a, i, bucket, bits)
                j = bucket_end(d, j, bucket, bits)
                records[n].add_end, records[n].delete_end = i, j
                n += 1
        # the records slot by slot (a counting sort: within a slot, as they came)
        order = <Py_ssize_t*>malloc(max(n, 1) * sizeof(Py_ssize_t))
        if order == NULL:
            raise MemoryError()
        for r in range(n):
            starts[records[r].slot + 1] += 1
        for slot in range(16384):
            starts[slot + 1] += starts[slot]
        for r in range(n):
            order[starts[records[r].slot]] = r
            starts[records[r].slot] += 1
        for k in range(n):
            r = order[k]
            t = records[r].table
            out = buffers[keys.build(t, records[r].bucket << (64 - bits) if bits else 0)]
            keys.put(out)
            i = records[r].add_end - records[r].add_start
            j = records[r].delete_end - records[r].delete_start
            p = out.grow(8 + (i + j) * width)
            put_u32(p, i)
            put_u32(p + 4, j)
            if i:
                put_entries(p + 8, add_values[t] + records[r].add_start, i, width)
            if j:
                put_entries(p + 8 + i * width, delete_values[t] + records[r].delete_start, j,
                            width)
            out.end_record(records[r].slot)
    finally:
        free(records)
        free(order)
        free(starts)
        free(add_values)
        free(delete_values)
    for out in buffers:
        out.flush()
    return [out.blobs for out in buffers]


def scan_records(const uint64_t[::1] firsts, const uint64_t[::1] table_of,
                 const uint64_t[::1] prefixes, list table_keys, int bits, int width,
                 const uint16_t[::1] owners, Py_ssize_t nodes, Py_ssize_t per_blob):
    """The SCAN records of the ranges (``firsts``, ``table_of``: a range of a
    table spans the values that share its first's leading blocks), per node
    (``owners``: the node of each slot): (blobs of ``per_blob`` records, the
    range of each record). A record is a bucket key, the range's first and
    last entries."""
    cdef Py_ssize_t r, n = firsts.shape[0], node
    cdef list buffers = [RecordBuffer(1 << 62, per_blob) for _ in range(nodes)]
    cdef list ranges = [array("Q") for _ in range(nodes)]
    cdef BucketKeys keys = BucketKeys(table_keys, bits, owners, nodes)
    cdef RecordBuffer out
    cdef uint64_t bounds[2]
    cdef unsigned char* p
    for r in range(n):
        if table_of[r] >= <uint64_t>len(table_keys):
            raise ValueError("a range of table %d, past the tables" % table_of[r])
        node = keys.build(table_of[r], firsts[r])
        out = buffers[node]
        keys.put(out)
        bounds[0], bounds[1] = firsts[r], firsts[r] | ~prefixes[table_of[r]]
        put_entries(out.grow(2 * width), bounds, 2, width)
        out.end_record(keys.slot)
        ranges[node].append(r)
    for out in buffers:
        out.flush()
    return [(out.blobs, node_ranges) for out, node_ranges in zip(buffers, ranges)]


cdef Py_ssize_t answered_range(list reply, Py_ssize_t k, Py_ssize_t c, Py_ssize_t per_blob,
                               const uint64_t[::1] node_ranges, const uint64_t[::1] firsts,
                               int width) except -1:
    """The range (an index into ``firsts``) that record ``reply[k]`` of call
    ``c`` answers, checked: a record that call sent, its entries whole."""
    cdef Py_ssize_t r = c * per_blob + <Py_ssize_t>reply[k] - 1
    if not (c * per_blob <= r < min(node_ranges.shape[0], (c + 1) * per_blob)):
        raise ValueError("a SCAN reply names record %r, not one sent" % reply[k])
    if len(reply[k + 1]) % width:
        raise ValueError("a SCAN reply of %d bytes, not whole entries" % len(reply[k + 1]))
    r = node_ranges[r]
    if r >= firsts.shape[0]:
        raise ValueError("a SCAN range %d past those sent" % r)
    return r


def scan_hits(list calls, const uint64_t[::1] node_ranges, Py_ssize_t per_blob,
              const uint64_t[::1] firsts, const uint64_t[::1] probe_of,
              const uint64_t[::1] table_of, probes, const long[::1] spec, Py_ssize_t tables,
              int bits, int width, int distance, list found):
    """Add to ``found`` (a dict per probe) {fingerprint: distance} of each
    entry of the SCAN replies ``calls`` of one node (a reply of a call:
    record number from 1, its entries, ...) within ``distance`` of its probe."""
    cdef const uint64_t[::1] ps = as_fingerprints(probes)
    cdef Py_ssize_t c, k, e, r, n, blocks = spec.shape[0] // (3 * tables)
    cdef const unsigned char[::1] entries
    cdef uint64_t head, value, fp
    cdef int b, d
    cdef list reply
    for c in range(len(calls)):
        reply = calls[c]
        for k in range(0, len(reply) - 1, 2):
            r = answered_range(reply, k, c, per_blob, node_ranges, firsts, width)
            head = firsts[r] >> (64 - bits) << (64 - bits) if bits else 0
            entries = reply[k + 1]
            n = entries.shape[0] // width
            for e in range(n):
                value = head
                for b in range(width):
                    value |= <uint64_t>entries[e * width + b] << (8 * (width - 1 - b))
                fp = unpermute_one(value, &spec[3 * blocks * table_of[r]], blocks)
                d = popcount64(fp ^ ps[probe_of[r]])
                if d <= distance:
                    found[probe_of[r]][fp] = d


# The band index: band b holds the entry (band key << 32 | fingerprint >> 32)
# of each band key b of the stored text documents, in buckets of its own cut as
# a table's are (a bucket key is a band's key and the entry's leading bits).

BAND_PREFIXES = array("Q", [0xFFFFFFFF00000000]) * SIGNATURE_BANDS  # a band key's span


def band_ranges(const uint32_t[::1] keys):
    """The SCAN ranges of band queries (``keys``: SIGNATURE_BANDS band keys a
    query, query after query) for :func:`scan_records` (with
    ``BAND_PREFIXES``): (firsts, band of each), range ``q * SIGNATURE_BANDS +
    b`` spanning the entries of query q's key in band b."""
    cdef Py_ssize_t i, n = keys.shape[0]
    if n % SIGNATURE_BANDS:
        raise ValueError("band queries come as %d keys each, got %d keys"
                         % (SIGNATURE_BANDS, n))
    firsts, bands = array("Q", [0]) * n, array("Q", [0]) * n
    cdef uint64_t[::1] f = firsts
    cdef uint64_t[::1] t = bands
    for i in range(n):
        f[i] = (<uint64_t>keys[i]) << 32
        t[i] = i % SIGNATURE_BANDS
    return firsts, bands


def band_hits(list calls, const uint64_t[::1] node_ranges, Py_ssize_t per_blob,
              const uint64_t[::1] firsts, int bits, int width, list found):
    """Add to ``found`` (a set per query) the fingerprint prefix (top 32 bits)
    named by each entry of the SCAN replies ``calls`` of one node (a reply of
    a call: record number from 1, its entries, ...) that has its range's band
    key (a bucket sent whole holds others); ranges as :func:`band_ranges`
    numbers them."""
    cdef Py_ssize_t c, k, e, r, n
    cdef const unsigned char[::1] entries
    cdef uint64_t head, value
    cdef int b
    cdef list reply
    cdef set prefixes
    for c in range(len(calls)):
        reply = calls[c]
        for k in range(0, len(reply) - 1, 2):
            r = answered_range(reply, k, c, per_blob, node_ranges, firsts, width)
            if r // SIGNATURE_BANDS >= len(found):
                raise ValueError("a band range %d past the queries" % r)
            head = firsts[r] >> (64 - bits) << (64 - bits) if bits else 0
            entries = reply[k + 1]
            n = entries.shape[0] // width
            prefixes = found[r // SIGNATURE_BANDS]
            for e in range(n):
                value = head
                for b in range(width):
                    value |= <uint64_t>entries[e * width + b] << (8 * (width - 1 - b))
                if value >> 32 == firsts[r] >> 32:
                    prefixes.add(value & 0xFFFFFFFFULL)


def sorted_band_entries(list signatures, fps, list without=None):
    """For each of the SIGNATURE_BANDS bands, the entries (band key << 32 |
    fingerprint >> 32) of the ``signatures`` (128 or 256 bytes, or None:
    a document stored without one) of the fingerprints ``fps``, sorted, each
    once, less those in ``without[band]`` (sorted uint64 buffers, or None):
    a list of uint64 arrays. A signature with no bin filled has no entries."""
    cdef const uint64_t[::1] hs = as_fingerprints(fps)
    cdef Py_ssize_t n = len(signatures), m = 0, i, k, j, wn, b
    cdef const unsigned char[::1] signature
    cdef const uint64_t[::1] w
    cdef const uint64_t* left_out
    cdef uint64_t[::1] dst
    cdef uint64_t x
    cdef list out = []
    if hs.shape[0] != n:
        raise ValueError("%d signatures for %d fingerprints" % (n, hs.shape[0]))
    if without is not None and len(without) != SIGNATURE_BANDS:
        raise ValueError("entries to leave out come for each of the %d bands" % SIGNATURE_BANDS)
    # the band keys of each document with a signature, then one band at a time
    cdef uint32_t* keys = <uint32_t*>malloc(max(n, 1) * SIGNATURE_BANDS * sizeof(uint32_t))
    cdef uint32_t* prefixes = <uint32_t*>malloc(max(n, 1) * sizeof(uint32_t))
    cdef uint64_t* entries = <uint64_t*>malloc(max(n, 1) * sizeof(uint64_t))
    cdef uint64_t* scratch = <uint64_t*>malloc(max(n, 1) * sizeof(uint64_t))
    try:
        if keys == NULL or prefixes == NULL or entries == NULL or scratch == NULL:
            raise MemoryError()
        for i in range(n):
            if signatures[i] is None:
                continue
            signature = signatures[i]
            if not is_signature_size(signature.shape[0]):
                raise ValueError("a signature is %d bytes, not %d or %d"
                                 % (signature.shape[0], NARROW_SIGNATURE, WIDE_SIGNATURE))
            if signature_bands(&signature[0], signature.shape[0], keys + m * SIGNATURE_BANDS):
                prefixes[m] = hs[i] >> 32
                m += 1
        for b in range(SIGNATURE_BANDS):
            wn, left_out = 0, NULL
            if without is not None and without[b] is not None:
                w = without[b]
                wn = w.shape[0]
                for j in range(1, wn):
                    if w[j - 1] > w[j]:
                        raise ValueError("the entries to leave out of band %d are not sorted" % b)
                if wn:
                    left_out = &w[0]
            with nogil:
                for i in range(m):
                    entries[i] = ((<uint64_t>keys[i * SIGNATURE_BANDS + b]) << 32) | prefixes[i]
                radix_sort(entries, scratch, m, 1)
                k = j = 0
                for i in range(m):
                    x = entries[i]
                    if k and entries[k - 1] == x:
                        continue
                    while j < wn and left_out[j] < x:
                        j += 1
                    if j < wn and left_out[j] == x:
                        continue
                    entries[k] = x
                    k += 1
            found = array("Q", [0]) * k
            if k:
                dst = found
                memcpy(&dst[0], entries, k * sizeof(uint64_t))
            out.append(found)
    finally:
        free(keys)
        free(prefixes)
        free(entries)
        free(scratch)
    return out


cdef uint32_t CRC32[256]  # CRC-32 (reflected polynomial 0xEDB88320), zlib's


cdef void init_crc32() noexcept nogil:
    cdef uint32_t i, c
    cdef int b
    for i in range(256):
        c = i
        for b in range(8):
            if c & 1:
                c = (c >> 1) ^ 0xEDB88320u
            else:
                c >>= 1
        CRC32[i] = c


init_crc32()


cdef inline uint32_t crc32_of(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t c = 0xFFFFFFFF
    cdef Py_ssize_t i
    for i in range(n):
        c = (c >> 8) ^ CRC32[(c ^ p[i]) & 0xFF]
    return ~c


cdef inline uint64_t shard_of(object name, int shard_bits, bint by_fingerprint) except? 0:
    """The hash (shard) of a document (``name`` its key: by the first
    ``shard_bits`` bits of the key's CRC-32) or a fingerprint (an int: by its
    own first bits)."""
    cdef uint64_t fp
    cdef bytes key
    if shard_bits == 0:
        return 0
    if by_fingerprint:
        fp = name
        return fp >> (64 - shard_bits)
    key = name
    return crc32_of(<const unsigned char*>key, len(key)) >> (32 - shard_bits)


def hash_writes(list fields, int shard_bits, bint by_fingerprint):
    """The (name, value or None) ``fields`` of documents or fingerprints (see
    :func:`hash_reads`) by hash: {shard: ([field, value, field, value, ...],
    [removed field, ...])}."""
    cdef dict shards = {}
    cdef uint64_t shard
    cdef list sets
    for pair in fields:  # tuples, or lists once a pending plan was read back
        name, value = pair
        shard = shard_of(name, shard_bits, by_fingerprint)
        group = shards.get(shard)
        if group is None:
            group = shards[shard] = ([], [])
        field = be_key(name) if by_fingerprint else name
        if value is None:
            (<list>group[1]).append(field)
        else:
            sets = group[0]
            sets.append(field)
            sets.append(value)
    return shards


def hash_reads(list names, int shard_bits, bint by_fingerprint):
    """The ``names`` of documents (keys, bytes) or fingerprints (ints) by the
    hash that holds them: {shard: ([name, ...], [field, ...])}. A document's
    hash is the first ``shard_bits`` bits of its key's CRC-32, a
    fingerprint's its own; a fingerprint's field is it in 8 bytes, big-endian."""
    cdef dict shards = {}
    cdef uint64_t shard
    for name in names:
        shard = shard_of(name, shard_bits, by_fingerprint)
        group = shards.get(shard)
        if group is None:
            group = shards[shard] = ([], [])
        (<list>group[0]).append(name)
        (<list>group[1]).append(be_key(name) if by_fingerprint else name)
    return shards


def unread(names, dict read):
    """The distinct ``names`` not in ``read``, in order."""
    cdef list out = []
    cdef set seen = set()
    for name in names:
        if name not in read and name not in seen:
            seen.add(name)
            out.append(name)
    return out


cdef bytes join_keys(list keys):
    """Keys, each after its 2-byte length (big-endian)."""
    cdef Py_ssize_t size = 0, at = 0
    cdef bytes key
    for key in keys:
        size += 2 + len(key)
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char* p = <unsigned char*><char*>out
    for key in keys:
        p[at] = len(key) >> 8
        p[at + 1] = len(key) & 0xFF
        memcpy(p + at + 2, <const char*>key, len(key))
        at += 2 + len(key)
    return out


def planned_documents(dict documents, dict committed):
    """The (key, value) of ``documents`` whose value is not the ``committed``
    one, and how many documents they add (less those they remove)."""
    cdef list changed = []
    cdef Py_ssize_t added = 0
    for key, value in documents.items():
        before = committed[key]
        if value != before:
            changed.append((key, value))
            added += (value is not None) - (before is not None)
    return changed, added


def planned_fingerprints(dict fingerprints, dict committed):
    """The (fingerprint, its joined keys or None) of ``fingerprints`` (fp ->
    sorted keys) whose keys are not the ``committed`` ones (fp -> tuple), the
    fingerprints they add and remove, and how many they add less remove."""
    cdef list changed = []
    cdef Py_ssize_t distinct = 0
    cdef list keys
    cdef tuple before
    added, removed = array("Q"), array("Q")
    for fp, keys in fingerprints.items():
        before = committed[fp]
        if len(keys) != len(before) or tuple(keys) != before:
            changed.append((fp, join_keys(keys) if keys else None))
            if keys and not before:
                added.append(fp)
                distinct += 1
            elif before and not keys:
                removed.append(fp)
                distinct -= 1
    return changed, added, removed, distinct


cdef inline Py_ssize_t put_header(unsigned char* p, char kind, Py_ssize_t n) noexcept:
    """``kind``, ``n`` in decimal and CRLF at ``p`` (or only the size, p NULL)."""
    cdef char digits[24]
    cdef Py_ssize_t count = 0, i
    while True:
        digits[count] = c'0' + n % 10
        count += 1
        n //= 10
        if n == 0:
            break
    if p != NULL:
        p[0] = kind
        for i in range(count):
            p[1 + i] = digits[count - 1 - i]
        p[1 + count] = b'\r'
        p[2 + count] = b'\n'
    return 3 + count


cdef bytes as_argument(object a):
    """A command's argument as bytes: bytes, str (UTF-8), int, float (repr)."""
    if type(a) is bytes:
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    if isinstance(a, float):
        return repr(a).encode()
    if isinstance(a, (bytes, bytearray, memoryview)):
        return bytes(a)
    raise TypeError("a Redis command takes bytes, str, int or float arguments, got %s"
                    % type(a).__name__)


def pack_commands(commands):
    """The commands (sequences of bytes, str, int and float arguments) in the
    Redis protocol, as one bytes."""
    cdef Py_ssize_t size = 0, at = 0, n
    cdef bytes arg
    for command in commands:
        size += put_header(NULL, b'*', len(command))
        for a in command:
            n = len(<bytes>a) if type(a) is bytes else len(as_argument(a))
            size += put_header(NULL, b'$', n) + n + 2
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char* p = <unsigned char*><char*>out
    for command in commands:
        at += put_header(p + at, b'*', len(command))
        for a in command:
            arg = as_argument(a)
            n = len(arg)
            at += put_header(p + at, b'$', n)
            memcpy(p + at, <const char*>arg, n)
            p[at + n] = b'\r'
            p[at + n + 1] = b'\n'
            at += n + 2
    return out


def put_documents(list documents, dict docs, dict committed, dict fingerprints, fingerprint_of):
    """Store the (key, fp, value) ``documents`` in a batch: ``docs`` (key ->
    value), ``fingerprints`` (fp -> its keys, sorted), where ``committed``
    (key -> value or None) holds the keys' committed values and
    ``fingerprints`` their fingerprints; ``fingerprint_of(value)`` reads one.
    Returns the fingerprints that gained a key."""
    cdef list moved = []
    cdef list keys
    cdef Py_ssize_t n
    for key, fp, value in documents:
        old = docs.get(key, docs)
        if old is docs:
            old = committed[key]
        old_fp = None if old is None else fingerprint_of(old)
        docs[key] = value
        if old_fp != fp:
            if old_fp is not None:
                (<list>fingerprints[old_fp]).remove(key)
            keys = fingerprints[fp]
            n = len(keys)
            if n == 0 or keys[n - 1] < key:
                keys.append(key)
            else:
                insort(keys, key)
            moved.append(fp)
    return moved


def add_absent(fps, dict fingerprints, dict committed):
    """Record the fingerprints ``fps`` not in ``fingerprints`` as absent: no
    keys (a list to fill) in ``fingerprints``, none in ``committed``."""
    for fp in fps:
        if fp not in fingerprints:
            fingerprints[fp] = []
            committed[fp] = ()
