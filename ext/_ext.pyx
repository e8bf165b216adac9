# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Native kernels on fingerprint values: their checks, popcounts, the
tables' permutations and the Hamming verifier, the block codec of runs (for
the py-lmdb backend), signatures' bands and resemblance, and the pair
scanner. Takes ints and buffers, returns ints. Also the gate an LMDB
environment's transactions take turns at. (Text to fingerprints: _text.)"""

from array import array
from bisect import insort

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.math cimport sqrt
from libc.string cimport memcpy, memset
from bits cimport clz64, ctz64, popcount64

from simhashdb.errors import DatabaseError, InvalidArgumentError, InvalidFingerprintError

MAX_FINGERPRINT = 0xFFFFFFFFFFFFFFFF
_U64_FORMATS = frozenset(["Q", "L", "@Q", "@L", "=Q", "=L", "<Q", "<L"])


def check_fingerprint(x):
    """Return ``x`` as an int if it is a valid 64-bit fingerprint, else raise
    (a bool is not a fingerprint)."""
    try:
        if isinstance(x, bool):
            raise TypeError
        value = x.__index__()
    except (AttributeError, TypeError):
        raise InvalidFingerprintError(
            "expected a fingerprint as an int in [0, 2**64), got %s %s"
            % (type(x).__name__, shown(x))) from None
    if value < 0 or value > MAX_FINGERPRINT:
        raise InvalidFingerprintError(
            "expected a fingerprint in [0, 2**64), got %s" % shown(value))
    return value


def shown(value):
    """``value`` for an error message: its repr, shortened; an int too large
    to print in full as its size."""
    if isinstance(value, int) and not -10**40 < value < 10**40:
        return "an int of %d bits" % value.bit_length()
    try:
        text = repr(value)
    except Exception:
        return "a %s" % type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def as_fingerprints(hashes):
    """Return ``hashes`` as a C-contiguous uint64 memoryview.

    Accepts an unsigned 64-bit buffer (``array('Q')``, numpy uint64), used
    without copying, or any iterable of ints, validated one by one.
    """
    view = None
    if not isinstance(hashes, (list, tuple)):  # which have no buffer: no exception to make
        try:
            view = memoryview(hashes)
        except TypeError:
            pass
    if view is not None:
        if view.ndim != 1 or view.itemsize != 8 or view.format not in _U64_FORMATS:
            raise InvalidFingerprintError(
                "expected a 1-d buffer of unsigned 64-bit ints (array('Q') or numpy "
                "uint64), got format %r with %d-byte items and %d dimension(s)"
                % (view.format, view.itemsize, view.ndim))
        if not view.c_contiguous:
            raise InvalidFingerprintError("expected a contiguous buffer of fingerprints")
        return view.cast("B").cast("Q")
    try:
        items = hashes if isinstance(hashes, (list, tuple)) else list(hashes)
    except TypeError:
        raise InvalidFingerprintError("expected fingerprints (an iterable of ints or a uint64 "
                                      "buffer), got %s" % shown(hashes)) from None
    try:
        if any(type(x) is bool for x in items):
            raise TypeError
        return memoryview(array("Q", items))
    except (TypeError, OverflowError):
        for i, x in enumerate(items):
            try:
                check_fingerprint(x)
            except InvalidFingerprintError as exc:
                raise InvalidFingerprintError("item %d: %s" % (i, exc)) from None
        raise


include "_memory.pxi"


include "_gate.pxi"


include "_signature.pxi"



SIGNATURE_BYTES = NARROW_SIGNATURE  # a text's resemblance signature: 128 bins of 8 bits
WIDE_SIGNATURE_BYTES = WIDE_SIGNATURE  # of 16 bits (databases made before format 10)
BINS = MINHASH_BINS
NARROW_BIN_CODES = NARROW_CODES  # the values a filled 8-bit bin takes (1 to 255)
BANDS = SIGNATURE_BANDS  # the band keys of a signature


cdef Py_ssize_t signature_size(const unsigned char[::1] signature) except -1:
    """The size of a signature, checked: 128 bytes (8-bit bins) or 256 (16-bit)."""
    if not is_signature_size(signature.shape[0]):
        raise InvalidArgumentError("a signature is %d bytes (8-bit bins) or %d (16-bit), got %d"
                                   % (NARROW_SIGNATURE, WIDE_SIGNATURE, signature.shape[0]))
    return signature.shape[0]


cdef Py_ssize_t meet(const unsigned char[::1] a, const unsigned char[::1] b,
                     const unsigned char** x, const unsigned char** y,
                     unsigned char* narrowed) except -1:
    """Point ``x`` and ``y`` at signatures ``a`` and ``b`` in one width, the
    wider narrowed into ``narrowed`` (NARROW_SIGNATURE bytes) where they
    differ; returns the size they meet at."""
    cdef Py_ssize_t size_a = signature_size(a), size_b = signature_size(b)
    x[0], y[0] = &a[0], &b[0]
    if size_a == size_b:
        return size_a
    if size_a == WIDE_SIGNATURE:
        narrow_signature(&a[0], narrowed)
        x[0] = narrowed
    else:
        narrow_signature(&b[0], narrowed)
        y[0] = narrowed
    return NARROW_SIGNATURE


def narrow(const unsigned char[::1] signature):
    """The 8-bit form (128 bytes) of a signature, itself where it has it."""
    if signature_size(signature) == NARROW_SIGNATURE:
        return bytes(signature)
    out = bytearray(NARROW_SIGNATURE)
    cdef unsigned char[::1] view = out
    narrow_signature(&signature[0], &view[0])
    return bytes(out)


def num_differing_bits(a, b):
    """Hamming distance between two 64-bit fingerprints."""
    cdef uint64_t x = check_fingerprint(a)
    cdef uint64_t y = check_fingerprint(b)
    return popcount64(x ^ y)


def num_differing_bits_many(hashes, other):
    """Hamming distances, as ``array('B')``, between each of ``hashes`` and
    ``other``: one fingerprint, or a buffer of the same length (pairwise)."""
    cdef const uint64_t[::1] hs = as_fingerprints(hashes)
    cdef const uint64_t[::1] os
    cdef Py_ssize_t i, n = hs.shape[0]
    cdef uint64_t probe
    out = array("B", [0]) * n
    cdef unsigned char[::1] res = out
    if isinstance(other, int) or not hasattr(other, "__len__"):
        probe = check_fingerprint(other)
        with nogil:
            for i in range(n):
                res[i] = popcount64(hs[i] ^ probe)
        return out
    os = as_fingerprints(other)
    if os.shape[0] != n:
        raise InvalidArgumentError(
            "expected two sequences of equal length, got %d and %d" % (n, os.shape[0]))
    with nogil:
        for i in range(n):
            res[i] = popcount64(hs[i] ^ os[i])
    return out


# Permutation tables. A layout is a flat int array of (source shift, width,
# destination shift) triples, ``blocks`` triples per table; ``prefixes`` holds
# each table's leading-block mask.

include "_tables.pxi"


def resemblance(const unsigned char[::1] a, const unsigned char[::1] b):
    """Estimated word 5-shingle Jaccard similarity of two signatures (see
    _signature.pxi), of either width: a wider one is narrowed to meet a
    narrower one."""
    cdef const unsigned char* x
    cdef const unsigned char* y
    cdef unsigned char narrowed[NARROW_SIGNATURE]
    cdef Py_ssize_t size = meet(a, b, &x, &y, narrowed)
    return signature_resemblance(x, y, size)


def bands(const unsigned char[::1] signature):
    """The band keys of a signature of either width (an ``array('I')`` of 32;
    empty for a signature with no bin filled): see _signature.pxi."""
    cdef Py_ssize_t size = signature_size(signature)
    out = array("I", [0]) * SIGNATURE_BANDS
    cdef uint32_t[::1] keys = out
    return out if signature_bands(&signature[0], size, &keys[0]) else array("I")


def pack_key(fp):
    """A fingerprint as an 8-byte big-endian key."""
    return be_key(check_fingerprint(fp))


def unpack_key(const unsigned char[::1] key):
    """The fingerprint of an 8-byte big-endian key."""
    return read_be64(&key[0])


def scan_bounds(fp, const long[::1] spec, const uint64_t[::1] prefixes):
    """The permuted fingerprint for each table, and for each table the (first
    key, last key) of the range of keys that share its leading blocks."""
    cdef Py_ssize_t t, tables = prefixes.shape[0], blocks = spec.shape[0] // (3 * tables)
    cdef uint64_t value = check_fingerprint(fp), perm, lo
    perms = []
    bounds = []
    for t in range(tables):
        perm = permute_one(value, &spec[3 * blocks * t], blocks)
        lo = perm & prefixes[t]
        perms.append(perm)
        bounds.append((be_key(lo), be_key(lo | ~prefixes[t])))
    return perms, bounds


def unpermute(perm, const long[::1] spec, Py_ssize_t table, Py_ssize_t tables):
    """The fingerprint whose permutation for ``table`` is ``perm``."""
    cdef Py_ssize_t blocks = spec.shape[0] // (3 * tables)
    return unpermute_one(check_fingerprint(perm), &spec[3 * blocks * table], blocks)


def verify(probe, const unsigned char[::1] keys, int distance):
    """The Hamming verifier: (candidate, distance) for each 8-byte big-endian
    key in ``keys`` within ``distance`` bits of ``probe``."""
    cdef uint64_t p = check_fingerprint(probe), c
    cdef Py_ssize_t i, n = keys.shape[0] // 8
    cdef int d
    out = []
    for i in range(n):
        c = read_be64(&keys[8 * i])
        d = popcount64(c ^ p)
        if d <= distance:
            out.append((c, d))
    return out


def table_values(fps, const long[::1] spec, Py_ssize_t table, Py_ssize_t tables):
    """``fps`` permuted for ``table``, sorted: an array of uint64."""
    cdef const uint64_t[::1] hs = as_fingerprints(fps)
    cdef Py_ssize_t i, n = hs.shape[0], blocks = spec.shape[0] // (3 * tables)
    perms = array("Q", [0]) * n
    scratch = array("Q", [0]) * n
    cdef uint64_t[::1] ps = perms
    cdef uint64_t[::1] sc = scratch
    if n:
        with nogil:
            for i in range(n):
                ps[i] = permute_one(hs[i], &spec[3 * blocks * table], blocks)
            radix_sort(&ps[0], &sc[0], n, 1)
    return perms


def table_items(fps, const long[::1] spec, Py_ssize_t table, Py_ssize_t tables):
    """``fps`` permuted for ``table``, sorted, as (2-byte key, 6-byte value)
    pairs: the big-endian permuted fingerprint split for a dupfixed table."""
    cdef uint64_t[::1] ps = table_values(fps, spec, table, tables)
    cdef Py_ssize_t i, n = ps.shape[0]
    cdef unsigned char buf[8]
    cdef int b
    cdef list prefixes = TABLE_KEYS
    out = [None] * n
    for i in range(n):
        for b in range(8):
            buf[b] = (ps[i] >> (56 - 8 * b)) & 0xFF
        out[i] = (prefixes[ps[i] >> 48], PyBytes_FromStringAndSize(<char*>buf + 2, 6))
    return out


def probe_starts(probes, const long[::1] spec, const uint64_t[::1] prefixes):
    """The range a probe scans in each table, by its first permuted value:
    (firsts, probe of each, table of each), probe by probe, table by table."""
    cdef const uint64_t[::1] ps = as_fingerprints(probes)
    cdef Py_ssize_t i, t, n = ps.shape[0], tables = prefixes.shape[0]
    cdef Py_ssize_t blocks = spec.shape[0] // (3 * tables)
    firsts = array("Q", [0]) * (n * tables)
    probe_of = array("Q", [0]) * (n * tables)
    table_of = array("Q", [0]) * (n * tables)
    cdef uint64_t[::1] f = firsts
    cdef uint64_t[::1] po = probe_of
    cdef uint64_t[::1] to = table_of
    with nogil:
        for i in range(n):
            for t in range(tables):
                f[i * tables + t] = permute_one(ps[i], &spec[3 * blocks * t], blocks) & prefixes[t]
                po[i * tables + t] = i
                to[i * tables + t] = t
    return firsts, probe_of, table_of


TABLE_KEYS = [i.to_bytes(2, "big") for i in range(65536)]


# Tables kept as compressed sorted runs (RUNS.md): the block codec, for the
# py-lmdb backend, which writes the same blocks as the native one

include "_codec.pxi"


def encode_run(values):
    """Strictly ascending ``values`` (a uint64 buffer) cut into blocks as the
    native backend cuts a run: a list of (first value, block bytes), each
    block ending in its checksum."""
    cdef const uint64_t[::1] vs = as_fingerprints(values)
    cdef size_t n = vs.shape[0], start = 0, i, length, size, guess = 2
    cdef uint8_t buf[BLOCK_BYTES + PAD]
    for i in range(1, n):
        if vs[i] <= vs[i - 1]:
            raise InvalidArgumentError("a run's values must be strictly ascending: %d follows %d"
                                       % (vs[i], vs[i - 1]))
    blocks = []
    while start < n:
        length = block_length(&vs[start], n - start, &guess)
        size = seal_block(vs[start], buf, encode_block(&vs[start], length, buf))
        blocks.append((vs[start], PyBytes_FromStringAndSize(<char*>buf, size)))
        start += length
    return blocks


def decode_block(first, const unsigned char[::1] block):
    """The values of a block whose first value is ``first``, ascending: an
    array('Q'). ValueError where the block is damaged (its checksum, header,
    size, bits or values disagree), without reading past its end."""
    cdef Block b
    cdef size_t size = block.shape[0], ones = 0, w
    cdef uint64_t span
    cdef int rc
    if size < 3 or size > BLOCK_BYTES:
        raise ValueError("a damaged block: %d bytes" % size)
    memcpy(b.buf, &block[0], size)
    rc = block_header(&b, check_fingerprint(first), size, True)
    if rc == BLOCK_DAMAGED:
        raise ValueError("a damaged block: its bytes disagree with its checksum")
    if rc:
        raise ValueError("a damaged block: its header claims more than it holds")
    size -= SUM_BYTES
    out = array("Q", [0]) * (b.c + 1)
    cdef uint64_t[::1] vs = out
    if decode_entries(&b, &vs[0]):
        raise ValueError("a damaged block: fewer entries than its header claims")
    for w in range(b.high_words):
        ones += popcount64(load_le64(b.high + 8 * w))
    span = vs[b.c] - vs[0]
    for w in range(b.c):
        if vs[w + 1] <= vs[w]:
            raise ValueError("a damaged block: its values do not ascend")
    if ones != b.c or b.L != low_width(span, b.c) or size != block_size(span, b.c):
        raise ValueError("a damaged block: its bits disagree with its header")
    return out


def merge_unique(a, b):
    """The union of two ascending uint64 buffers without duplicates: an array('Q')."""
    cdef const uint64_t[::1] x = as_fingerprints(a)
    cdef const uint64_t[::1] y = as_fingerprints(b)
    cdef size_t na = x.shape[0], nb = y.shape[0], n, i, kept = 0
    out = array("Q", [0]) * (na + nb)
    if na + nb == 0:
        return out
    cdef uint64_t[::1] o = out
    with nogil:
        n = merge_arrays(&x[0] if na else NULL, na, &y[0] if nb else NULL, nb, &o[0])
        for i in range(n):
            if kept == 0 or o[i] != o[kept - 1]:
                o[kept] = o[i]
                kept += 1
    return out[:kept]


include "_match.pxi"

include "_repeats.pxi"


