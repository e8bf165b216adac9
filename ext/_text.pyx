# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Native text kernels: text to fingerprints and signatures. The hash of a
token, simhash accumulation, the UTF-8 tokenizer and case folding, words
weighted by a table, word-shingle MinHash, halo columns, and HTML markup
stripped. Takes bytes and buffers, returns ints and bytes."""

from array import array

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport sqrt
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize
from bits cimport ctz64

from simhashdb._ext import as_fingerprints, check_fingerprint
from simhashdb.errors import InvalidArgumentError

include "_memory.pxi"
include "_signature.pxi"  # MinHash's bins, and the hash's mixing
include "_casefold.pxi"


cdef uint64_t ASCII_HASH[128]  # hash_bytes of each one-byte ASCII token


cdef void init_ascii_hash() noexcept nogil:
    cdef uint8_t byte
    for byte in range(128):
        ASCII_HASH[byte] = hash_bytes(&byte, 1)


init_ascii_hash()


def fast_hash(const unsigned char[::1] data):
    """The 64-bit hash ``fingerprint`` uses by default, for bytes."""
    if data.shape[0] == 0:
        return hash_bytes(NULL, 0)
    return hash_bytes(&data[0], data.shape[0])


# Counting the 1 bits of many hashes, column by column: each hash adds its
# bytes, spread one bit to a byte, into eight 8-lane words, which are
# emptied into the 64 counts before a lane can overflow.

cdef uint64_t SPREAD[256]   # bit i of a byte -> byte i of a word


cdef void init_spread() noexcept nogil:
    cdef int b, i
    for b in range(256):
        SPREAD[b] = 0
        for i in range(8):
            if (b >> i) & 1:
                SPREAD[b] |= (<uint64_t>1) << (8 * i)


init_spread()


cdef struct BitCounter:
    int64_t ones[64]
    uint64_t lanes[8]
    Py_ssize_t pending
    Py_ssize_t count


cdef inline void counter_init(BitCounter* c) noexcept nogil:
    memset(c, 0, sizeof(BitCounter))


cdef inline void counter_flush(BitCounter* c) noexcept nogil:
    cdef int b, bit
    for b in range(8):
        for bit in range(8):
            c.ones[8 * b + bit] += (c.lanes[b] >> (8 * bit)) & 0xFF
        c.lanes[b] = 0
    c.pending = 0


cdef inline void counter_add(BitCounter* c, uint64_t h) noexcept nogil:
    cdef int b
    for b in range(8):
        c.lanes[b] += SPREAD[(h >> (8 * b)) & 0xFF]
    c.count += 1
    c.pending += 1
    if c.pending == 255:
        counter_flush(c)


cdef inline uint64_t counter_majority(BitCounter* c) noexcept nogil:
    """Bit j is 1 where more than half of the hashes have it (a tie gives 0)."""
    cdef uint64_t result = 0
    cdef int j
    counter_flush(c)
    for j in range(64):
        if 2 * c.ones[j] > c.count:
            result |= (<uint64_t>1) << j
    return result


cdef uint64_t simhash_of(const uint64_t* hashes, Py_ssize_t n) noexcept nogil:
    cdef BitCounter counter
    cdef Py_ssize_t i
    counter_init(&counter)
    for i in range(n):
        counter_add(&counter, hashes[i])
    return counter_majority(&counter)


def compute(hashes):
    """Simhash of 64-bit feature hashes: bit j is 1 where more hashes have it set
    than not (a tie gives 0). Same output as simhash-py's ``compute``."""
    cdef const uint64_t[::1] hs = as_fingerprints(hashes)
    if hs.shape[0] == 0:
        return 0
    with nogil:
        result = simhash_of(&hs[0], hs.shape[0])
    return result


def compute_weighted(pairs):
    """Weighted simhash of ``(hash, weight)`` pairs: each hash adds +weight to the
    columns of its 1 bits and -weight to its 0 bits; a positive column gives 1."""
    cdef double sums[64]
    cdef double w
    cdef uint64_t h, result = 0
    cdef int j
    memset(sums, 0, sizeof(sums))
    for i, pair in enumerate(pairs):
        try:
            hash_value, weight = pair
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                "item %d: expected a (hash, weight) pair, got %r" % (i, pair)) from None
        h = check_fingerprint(hash_value)
        try:
            w = weight
        except TypeError:
            raise InvalidArgumentError(
                "item %d: expected a real number as weight, got %r" % (i, weight)) from None
        if w != w or w in (float("inf"), float("-inf")):
            raise InvalidArgumentError("item %d: weight must be finite, got %r" % (i, weight))
        for j in range(64):
            if (h >> j) & 1:
                sums[j] += w
            else:
                sums[j] -= w
    for j in range(64):
        if sums[j] > 0:
            result |= (<uint64_t>1) << j
    return result


cdef inline void add_shingles(BitCounter* counter, const uint64_t* token_hashes,
                              Py_ssize_t available, uint64_t lengths) noexcept nogil:
    """Count one shingle of each length in the bit mask ``lengths`` (bit L set:
    L tokens) starting at ``token_hashes``, of those that fit in ``available``
    tokens; a shingle's hash combines its tokens' hashes in order."""
    cdef uint64_t h = 0
    cdef Py_ssize_t j = 0
    while (lengths >> (j + 1)) and j < available:
        h = rotl(h, 23) ^ token_hashes[j]
        h *= 0x9E3779B97F4A7C15ULL
        j += 1
        if (lengths >> j) & 1:
            counter_add(counter, fmix64(h))


cdef Py_ssize_t cap_runs(uint64_t* token_hashes, uint8_t* cjk, Py_ssize_t n,
                         Py_ssize_t max_run) noexcept nogil:
    """Drop, in place, each token that repeats the ``max_run`` tokens before it
    (0: none); return how many tokens are left."""
    cdef Py_ssize_t i, kept = 0, run = 0
    if max_run == 0:
        return n
    for i in range(n):
        run = run + 1 if kept and token_hashes[i] == token_hashes[kept - 1] else 1
        if run <= max_run:
            token_hashes[kept] = token_hashes[i]
            cjk[kept] = cjk[i]
            kept += 1
    return kept


cdef uint64_t shingle_simhash(uint64_t* token_hashes, uint8_t* cjk, Py_ssize_t n,
                             uint64_t lengths, uint64_t cjk_lengths,
                             Py_ssize_t max_run) noexcept nogil:
    """Simhash of the shingles of the tokens (runs capped at ``max_run``, see
    cap_runs): from each position, one shingle of each length in the bit mask
    ``lengths`` (``cjk_lengths`` from a CJK character, where ``cjk`` flags
    them); a text too short for any shingle is one shingle; no token gives 0."""
    cdef BitCounter counter
    cdef Py_ssize_t i
    n = cap_runs(token_hashes, cjk, n, max_run)
    if n == 0:
        return 0
    counter_init(&counter)
    for i in range(n):
        add_shingles(&counter, token_hashes + i, n - i,
                     cjk_lengths if cjk[i] else lengths)
    if counter.count == 0:
        add_shingles(&counter, token_hashes, n, (<uint64_t>1) << n)
    return counter_majority(&counter)


def fingerprint_tokens(list tokens, uint64_t lengths, uint64_t cjk_lengths,
                       Py_ssize_t max_run):
    """Simhash of the shingles of tokens (UTF-8 bytes), from the tokens'
    ``fast_hash`` (see shingle_simhash); a token that is one CJK character
    starts shingles of the lengths in ``cjk_lengths``."""
    cdef Py_ssize_t n = len(tokens), i
    cdef bytes tok
    cdef uint32_t cp
    token_hashes = array("Q", [0]) * n
    flags = array("B", [0]) * n
    cdef uint64_t[::1] th = token_hashes
    cdef uint8_t[::1] cjk = flags
    for i in range(n):
        tok = tokens[i]
        th[i] = hash_bytes(<const uint8_t*><char*>tok, len(tok))
        if len(tok) and decode_utf8(<const uint8_t*><char*>tok, len(tok), 0, &cp) == len(tok):
            cjk[i] = char_class(cp) == CJK
    if n == 0:
        return 0
    with nogil:
        result = shingle_simhash(&th[0], &cjk[0], n, lengths, cjk_lengths, max_run)
    return result


# The native tokenizer over UTF-8: runs of word characters are tokens, and
# each CJK character is a token of its own.

cdef enum:
    SEPARATOR = 0
    WORD = 1
    CJK = 2


cdef inline int char_class(uint32_t cp) noexcept nogil:
    if cp < 0x80:
        return WORD if (cp - 48 < 10 or cp - 97 < 26 or cp - 65 < 26) else SEPARATOR
    if ((0x3040 <= cp <= 0x30FF) or (0x3400 <= cp <= 0x4DBF) or (0x4E00 <= cp <= 0x9FFF)
            or (0xF900 <= cp <= 0xFAFF) or (0x1100 <= cp <= 0x11FF)
            or (0x3130 <= cp <= 0x318F) or (0xAC00 <= cp <= 0xD7AF)):
        return CJK
    if (cp <= 0xBF or cp == 0xD7 or cp == 0xF7 or (0x2000 <= cp <= 0x2BFF)
            or (0x3000 <= cp <= 0x303F) or (0xFE10 <= cp <= 0xFE6F)
            or (0xFF00 <= cp <= 0xFF0F) or (0x1F000 <= cp <= 0x1FAFF)):
        return SEPARATOR  # punctuation, symbols, spaces, emoji
    return WORD


cdef inline Py_ssize_t decode_utf8(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                                   uint32_t* cp) noexcept nogil:
    """Decode the code point at ``p[i]`` into ``cp``; return its length in bytes."""
    cdef uint8_t b = p[i]
    if b < 0x80 or i + 1 >= n:
        cp[0] = b
        return 1
    if b < 0xE0:
        cp[0] = ((b & 0x1F) << 6) | (p[i + 1] & 0x3F)
        return 2
    if b < 0xF0 or i + 3 >= n:
        cp[0] = ((b & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F) \
            if i + 2 < n else b
        return 3 if i + 2 < n else 1
    cp[0] = (((b & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6)
             | (p[i + 3] & 0x3F))
    return 4


cdef inline bint is_space(uint32_t cp) noexcept nogil:
    return ((9 <= cp <= 13) or cp == 32 or cp == 0x85 or cp == 0xA0 or cp == 0x1680
            or (0x2000 <= cp <= 0x200A) or cp == 0x2028 or cp == 0x2029 or cp == 0x202F
            or cp == 0x205F or cp == 0x3000)


cdef inline Py_ssize_t next_token(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                                  Py_ssize_t* start, bint chars) noexcept nogil:
    """Find the token at or after ``p[i]``: set ``start``, return its end (or -1).
    With ``chars``, each code point but white space is a token."""
    cdef uint32_t cp
    cdef Py_ssize_t length
    cdef int kind
    while i < n:
        length = decode_utf8(p, n, i, &cp)
        if chars:
            if not is_space(cp):
                start[0] = i
                return i + length
            i += length
            continue
        kind = char_class(cp)
        if kind == CJK:
            start[0] = i
            return i + length
        if kind == WORD:
            start[0] = i
            i += length
            while i < n:
                length = decode_utf8(p, n, i, &cp)
                if char_class(cp) != WORD:
                    break
                i += length
            return i
        i += length
    return -1


def tokens_utf8(const unsigned char[::1] text, bint chars=False):
    """The tokens of UTF-8 ``text`` as str: words and single CJK characters, or
    with ``chars`` every character but white space."""
    cdef Py_ssize_t n = text.shape[0], i = 0, start = 0, end
    out = []
    if n == 0:
        return out
    while True:
        end = next_token(&text[0], n, i, &start, chars)
        if end < 0:
            return out
        out.append(bytes(text[start:end]).decode("utf-8", "surrogatepass"))
        i = end


def fingerprint_utf8(const unsigned char[::1] text, uint64_t lengths, bint chars,
                     uint64_t cjk_lengths, Py_ssize_t max_run):
    """``fingerprint_tokens`` of the native tokens of UTF-8 ``text`` (see
    ``tokens_utf8``), with no Python object per token."""
    cdef Py_ssize_t n = text.shape[0], i = 0, start = 0, end, count = 0, capacity = 1024
    cdef uint64_t* hashes
    cdef uint8_t* cjk
    cdef uint64_t result, token_hash
    cdef uint32_t cp
    cdef uint8_t byte, flag
    if n == 0:
        return 0
    hashes = <uint64_t*>malloc(capacity * sizeof(uint64_t))
    cjk = <uint8_t*>malloc(capacity)
    try:
        if hashes == NULL or cjk == NULL:
            raise MemoryError()
        with nogil:
            while i < n:
                byte = text[i]
                if chars and byte < 0x80:  # the common case, from a table
                    i += 1
                    if is_space(byte):
                        continue
                    token_hash, flag = ASCII_HASH[byte], 0
                else:
                    end = next_token(&text[0], n, i, &start, chars)
                    if end < 0:
                        break
                    token_hash = hash_bytes(&text[start], end - start)
                    flag = (decode_utf8(&text[0], n, start, &cp) == end - start
                            and char_class(cp) == CJK)
                    i = end
                if count == capacity:
                    capacity *= 2
                    grow(<void**>&hashes, capacity * sizeof(uint64_t))
                    grow(<void**>&cjk, capacity)
                hashes[count] = token_hash
                cjk[count] = flag
                count += 1
            result = shingle_simhash(hashes, cjk, count, lengths, cjk_lengths, max_run)
        return result
    finally:
        free(hashes)
        free(cjk)


def halo_add(long long[::1] columns, const unsigned char[::1] digest):
    """Add one hash digest to bit-average halo columns: -1 for a 1 bit, +1 for a
    0 bit, bits read most significant first (samecode's convention)."""
    cdef Py_ssize_t i, nbits = columns.shape[0]
    if digest.shape[0] * 8 < nbits:
        raise InvalidArgumentError(
            "digest of %d bytes is too short for %d columns" % (digest.shape[0], nbits))
    with nogil:
        for i in range(nbits):
            if (digest[i >> 3] >> (7 - (i & 7))) & 1:
                columns[i] -= 1
            else:
                columns[i] += 1


def halo_digest(const long long[::1] columns):
    """Bytes of a halo hash: bit i (most significant first) is 1 where column i > 0."""
    cdef Py_ssize_t i, nbits = columns.shape[0]
    out = bytearray((nbits + 7) // 8)
    cdef unsigned char[::1] res = out
    with nogil:
        for i in range(nbits):
            if columns[i] > 0:
                res[i >> 3] |= 1 << (7 - (i & 7))
    return bytes(out)


# Distinct words weighted by a table (recipe 3).

cdef enum:
    TABLE_BUCKET_BITS = 12  # a table's hashes are found by their top 12 bits


cdef inline uint8_t table_weight(const uint64_t* hashes, const uint8_t* weights,
                                 const uint32_t* starts, uint64_t h,
                                 uint8_t absent) noexcept nogil:
    """The weight of feature hash ``h`` in a table sorted by hash, or
    ``absent``; ``starts[b]``: the first entry whose top bits are ``b`` or more."""
    cdef uint32_t i = starts[h >> (64 - TABLE_BUCKET_BITS)]
    cdef uint32_t end = starts[(h >> (64 - TABLE_BUCKET_BITS)) + 1]
    while i < end and hashes[i] < h:
        i += 1
    return weights[i] if i < end and hashes[i] == h else absent


def table_starts(const uint64_t[::1] table):
    """Where each of the 4,096 ranges of top bits starts in a sorted ``table``
    (4,097 entries, the last its length): ``table_weight`` reads a hash's
    range alone."""
    out = array("I", [0]) * ((1 << TABLE_BUCKET_BITS) + 1)
    cdef uint32_t[::1] starts = out
    cdef Py_ssize_t i = 0, bucket
    for bucket in range(1 << TABLE_BUCKET_BITS):
        starts[bucket] = i
        while i < table.shape[0] and (table[i] >> (64 - TABLE_BUCKET_BITS)) == bucket:
            i += 1
    starts[1 << TABLE_BUCKET_BITS] = i
    return out


cdef uint8_t ASCII_SEPARATOR[256]  # 1 for an ASCII byte that is no word character
cdef uint8_t ASCII_WORD[256]  # 1 for an ASCII letter or digit


cdef void init_ascii_classes() noexcept nogil:
    cdef int byte
    for byte in range(256):
        ASCII_SEPARATOR[byte] = byte < 0x80 and char_class(byte) == SEPARATOR
        ASCII_WORD[byte] = byte < 0x80 and char_class(byte) == WORD


init_ascii_classes()


cdef inline Py_ssize_t next_word(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                                 Py_ssize_t* start) noexcept nogil:
    """``next_token`` in words, with ASCII letters, digits and separators read
    from tables."""
    cdef uint32_t cp
    cdef Py_ssize_t length
    while i < n and ASCII_SEPARATOR[p[i]]:
        i += 1
    if i >= n:
        return -1
    if p[i] >= 0x80:
        return next_token(p, n, i, start, False)
    start[0] = i
    while i < n and ASCII_WORD[p[i]]:
        i += 1
    while i < n and p[i] >= 0x80:  # the word may go on in other letters
        length = decode_utf8(p, n, i, &cp)
        if char_class(cp) != WORD:
            break
        i += length
        while i < n and ASCII_WORD[p[i]]:
            i += 1
    return i


cdef inline void add_weighted(int64_t* ones, uint64_t h, int64_t w) noexcept nogil:
    """Add ``w`` to the count of each 1 bit of ``h``."""
    while h:
        ones[ctz64(h)] += w
        h &= h - 1


cdef Py_ssize_t word_hashes(const uint8_t* p, Py_ssize_t n,
                            uint64_t** hashes) except -1 nogil:
    """Hash each word of UTF-8 ``p[:n]`` (as ``next_word`` reads them) into a
    new malloc'd ``*hashes`` (the caller frees it); return their number."""
    cdef Py_ssize_t i = 0, start = 0, end, count = 0, capacity = n // 8 + 16
    hashes[0] = <uint64_t*>malloc(capacity * sizeof(uint64_t))
    if hashes[0] == NULL:
        with gil:
            raise MemoryError()
    while True:
        end = next_word(p, n, i, &start)
        if end < 0:
            return count
        i = end
        if count == capacity:
            capacity *= 2
            grow(<void**>hashes, capacity * sizeof(uint64_t))
        hashes[0][count] = hash_bytes(p + start, end - start)
        count += 1


cdef int weighted_simhash(const uint64_t* hashes, Py_ssize_t count, const uint64_t* table,
                          const uint8_t* weights, const uint32_t* starts, uint8_t absent,
                          uint64_t* result) except -1 nogil:
    """Set ``result`` to the weighted simhash of the distinct ``hashes``: one
    seen ``c`` times weighs sqrt(c) times its weight in ``table`` (sorted, with
    ``weights`` and ``table_starts``), or times ``absent`` if not in it. Integer sums, so the result
    is the same on every platform; no hash: 0."""
    cdef Py_ssize_t j, slot, slots = 64
    cdef uint64_t* keys
    cdef uint32_t* counts
    cdef uint64_t h
    cdef int64_t ones[64]
    cdef int64_t total = 0, w
    cdef int bit
    result[0] = 0
    if count == 0:
        return 0
    # count each distinct hash in an open-addressing table (hash 0 is stored
    # as a key of its own: slots are empty where counts is 0)
    while slots < 2 * count:
        slots *= 2
    keys = <uint64_t*>malloc(slots * sizeof(uint64_t))
    counts = <uint32_t*>calloc(slots, sizeof(uint32_t))
    if keys == NULL or counts == NULL:
        free(keys)
        free(counts)
        with gil:
            raise MemoryError()
    for j in range(count):
        h = hashes[j]
        slot = <Py_ssize_t>(h >> 7) & (slots - 1)
        while counts[slot] and keys[slot] != h:
            slot = (slot + 1) & (slots - 1)
        keys[slot] = h
        counts[slot] += 1
    memset(ones, 0, sizeof(ones))
    for slot in range(slots):
        if counts[slot]:
            h = keys[slot]
            w = <int64_t>(sqrt(<double>counts[slot])
                          * table_weight(table, weights, starts, h, absent) + 0.5)
            add_weighted(ones, h, w)
            total += w
    free(keys)
    free(counts)
    for bit in range(64):  # the weights of the hashes with the bit outweigh the others'
        if 2 * ones[bit] > total:
            result[0] |= (<uint64_t>1) << bit
    return 0


DEF SHINGLE_WORDS = 5


cdef void word_shingle_minhash(const uint64_t* words, Py_ssize_t count,
                               unsigned char* signature) noexcept nogil:
    """Write the resemblance signature of ``count`` word hashes to
    ``signature`` (2 * MINHASH_BINS bytes, zeroed): a one-permutation MinHash
    of their 5-shingles (fewer words are one shingle). A shingle goes to the
    bin its hash's top 7 bits name; a bin keeps the 16-bit image (1 to 65535)
    of its least hash below them; 0 marks an empty bin."""
    cdef uint64_t least[MINHASH_BINS]
    cdef uint64_t rest
    cdef Py_ssize_t end
    cdef int b
    for b in range(MINHASH_BINS):
        least[b] = 0xFFFFFFFFFFFFFFFFULL
    for end in range(SHINGLE_WORDS, count + 1):
        add_minhash(least, words + end - SHINGLE_WORDS, SHINGLE_WORDS)
    if 0 < count < SHINGLE_WORDS:
        add_minhash(least, words, count)
    for b in range(MINHASH_BINS):
        if least[b] != 0xFFFFFFFFFFFFFFFFULL:
            rest = least[b] % 65535 + 1
            signature[2 * b] = rest >> 8
            signature[2 * b + 1] = rest & 0xFF


cdef inline void add_minhash(uint64_t* least, const uint64_t* words,
                             Py_ssize_t length) noexcept nogil:
    """Put the shingle of ``length`` consecutive words into its bin."""
    cdef uint64_t h = 0, rest
    cdef Py_ssize_t j
    for j in range(length):
        h = rotl(h, 23) ^ words[j]
        h *= 0x9E3779B97F4A7C15ULL
    h = fmix64(h)
    rest = h & 0x01FFFFFFFFFFFFFFULL
    if rest < least[h >> 57]:
        least[h >> 57] = rest


def casefold_fingerprint(str text, const uint64_t[::1] table, const uint8_t[::1] weights,
                         const uint32_t[::1] starts, uint8_t absent, bint signature=False):
    """(fingerprint, signature or None) of the words of ``text.casefold()``,
    folded natively and read once (words and single CJK characters, as
    ``tokens_utf8``). The fingerprint: ``weighted_simhash`` of their hashes
    (``fast_hash`` of their UTF-8) with ``table`` (sorted hashes of words),
    ``weights``, its ``table_starts`` and ``absent``; no word: 0. With ``signature``, also their
    resemblance signature (``word_minhash``)."""
    cdef Py_ssize_t entries = table.shape[0], n, count
    cdef uint8_t* folded = NULL
    cdef uint64_t* hashes = NULL
    cdef uint64_t result
    cdef bytes out = None
    if entries != weights.shape[0] or entries == 0 or starts.shape[0] != (
            1 << TABLE_BUCKET_BITS) + 1 or starts[1 << TABLE_BUCKET_BITS] != entries:
        raise InvalidArgumentError("a weight table needs one weight per hash, a hash, "
                                   "and its table_starts")
    try:
        n = casefold_utf8(text, &folded)
        with nogil:
            count = word_hashes(folded, n, &hashes)
            weighted_simhash(hashes, count, &table[0], &weights[0], &starts[0], absent, &result)
        if signature:
            out = PyBytes_FromStringAndSize(NULL, 2 * MINHASH_BINS)
            memset(<char*>out, 0, 2 * MINHASH_BINS)
            word_shingle_minhash(hashes, count, <unsigned char*><char*>out)
        return result, out
    finally:
        free(folded)
        free(hashes)


def casefold(str text):
    """``text.casefold()`` as UTF-8 ("surrogatepass"), folded as
    ``casefold_fingerprint`` folds it."""
    cdef uint8_t* folded = NULL
    cdef Py_ssize_t n
    try:
        n = casefold_utf8(text, &folded)
        return PyBytes_FromStringAndSize(<char*>folded, n)
    finally:
        free(folded)


def word_minhash(const unsigned char[::1] text):
    """The resemblance signature of UTF-8 ``text``: ``word_shingle_minhash``
    of its words (as ``next_word`` reads them), 256 bytes."""
    cdef uint64_t* hashes = NULL
    cdef Py_ssize_t count
    out = bytearray(2 * MINHASH_BINS)
    cdef unsigned char[::1] res = out
    try:
        with nogil:
            count = word_hashes(&text[0] if text.shape[0] else NULL, text.shape[0], &hashes)
            word_shingle_minhash(hashes, count, &res[0])
        return bytes(out)
    finally:
        free(hashes)


# Markup, for recipe 3's reading of HTML (simhashdb.fingerprint.strip_html):
# each comment, CDATA section, script, style, template or noscript element,
# tag, and bogus tag (</ not before a letter, <!, <?) becomes one space,
# scanned in one pass over the UTF-8 bytes (every delimiter is ASCII, so a
# multi-byte character is never mistaken for one). Markup left open runs to
# the end of the document. tests/test_html.py holds the same grammar as a
# regular expression, the oracle this scanner must agree with.

cdef inline bint markup_space(uint8_t c) noexcept nogil:
    """ASCII white space (\\s of an ASCII regular expression)."""
    return c == 32 or 9 <= c <= 13


cdef inline bint name_end(uint8_t c) noexcept nogil:
    """What may follow an element's name: [\\t\\n\\r\\f />]."""
    return c == 9 or c == 10 or c == 13 or c == 12 or c == 32 or c == 47 or c == 62


cdef inline bint starts_ci(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                           const char* word) noexcept nogil:
    """Whether p[i:] starts with the lowercase ASCII ``word``, in any case."""
    cdef Py_ssize_t j = 0
    while word[j]:
        if i + j >= n or (p[i + j] | 0x20 if 65 <= p[i + j] <= 90 else p[i + j]) != word[j]:
            return False
        j += 1
    return True


cdef inline Py_ssize_t tag_end(const uint8_t* p, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """From ``k`` inside a tag, the position of its first '>' outside quotes
    (a quote left open runs to the end), or ``n``."""
    cdef uint8_t quote
    while k < n and p[k] != 62:
        if p[k] == 34 or p[k] == 39:
            quote = p[k]
            k += 1
            while k < n and p[k] != quote:
                k += 1
        k += 1
    return k if k < n else n


cdef Py_ssize_t element_end(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                            const char* name, Py_ssize_t length, bint loose) noexcept nogil:
    """The end of the element ``name`` (lowercase, ``length`` letters) whose
    start tag begins at ``i``, or -1 where none does (a start tag closed by
    '/>' is a plain tag). A script or style ends at '</name' before white
    space, '/' or '>'; a template or noscript (``loose``) at '</ name >' or
    '</name' with attributes."""
    cdef Py_ssize_t k = i + 1 + length, m, q
    if not starts_ci(p, n, i + 1, name) or k >= n or not name_end(p[k]):
        return -1
    k = tag_end(p, n, k)
    if k >= n:
        return n
    if p[k - 1] == 47:  # <name .../>
        return -1
    m = k + 1
    while m + 1 < n:
        if p[m] == 60 and p[m + 1] == 47:
            if not loose:
                q = m + 2 + length
                if starts_ci(p, n, m + 2, name) and q < n and name_end(p[q]):
                    while q < n and p[q] != 62:
                        q += 1
                    return q + 1 if q < n else n
            else:
                q = m + 2
                while q < n and markup_space(p[q]):
                    q += 1
                if starts_ci(p, n, q, name):
                    q += length
                    while q < n and markup_space(p[q]):
                        q += 1
                    if q < n and p[q] == 62:
                        return q + 1
                q = m + 2 + length
                if starts_ci(p, n, m + 2, name) and q < n and name_end(p[q]) and p[q] != 62:
                    while q < n and p[q] != 62:
                        q += 1
                    if q < n:
                        return q + 1
        m += 1
    return n


cdef Py_ssize_t markup_end(const uint8_t* p, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """The end of the markup that starts at ``p[i]`` (a '<'), or -1 where none does."""
    cdef Py_ssize_t k, m, end
    if i + 1 >= n:
        return -1
    if starts_ci(p, n, i, "<!--"):
        k = i + 4
        while k + 1 < n:
            if p[k] == 45 and p[k + 1] == 45:
                m = k + 2
                while m < n and markup_space(p[m]):
                    m += 1
                if m < n and p[m] == 62:
                    return m + 1
            k += 1
        return n
    if starts_ci(p, n, i, "<![cdata["):
        k = i + 9
        while k + 2 < n:
            if p[k] == 93 and p[k + 1] == 93 and p[k + 2] == 62:
                return k + 3
            k += 1
        return n
    end = element_end(p, n, i, "script", 6, False)
    if end < 0:
        end = element_end(p, n, i, "style", 5, False)
    if end < 0:
        end = element_end(p, n, i, "template", 8, True)
    if end < 0:
        end = element_end(p, n, i, "noscript", 8, True)
    if end >= 0:
        return end
    k = i + 2 if p[i + 1] == 47 else i + 1
    if k < n and (65 <= p[k] <= 90 or 97 <= p[k] <= 122):
        k = tag_end(p, n, k + 1)
        return k + 1 if k < n else n
    if p[i + 1] == 47 or p[i + 1] == 33 or p[i + 1] == 63:
        k = i + 2
        while k < n and p[k] != 62:
            k += 1
        return k + 1 if k < n else n
    return -1


def strip_markup(const unsigned char[::1] html):
    """UTF-8 ``html`` with each piece of markup replaced by one space (see above)."""
    cdef Py_ssize_t n = html.shape[0], i = 0, start = 0, end, out = 0
    cdef const uint8_t* p = &html[0] if n else NULL
    result = bytearray(n)
    cdef unsigned char[::1] res = result
    with nogil:
        while i < n:
            if p[i] == 60:
                end = markup_end(p, n, i)
                if end >= 0:
                    memcpy(&res[out], p + start, i - start)
                    out += i - start
                    res[out] = 32
                    out += 1
                    i = start = end
                    continue
            i += 1
        if n:
            memcpy(&res[out], p + start, n - start)
        out += n - start
    return bytes(result[:out])
