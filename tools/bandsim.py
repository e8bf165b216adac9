"""A band index over MinHash signatures, simulated (issue 21, item 1): the
design study behind the choice of signature size, bands, rows, empty-bin
handling and threshold, before any of it goes into the package.

The band rule: the candidates for a text are the stored documents that
share at least one LSH band of its MinHash signature, together with those
whose 64-bit fingerprint (recipe 3) is within ``k`` bits; a candidate is
confirmed when the estimated resemblance of the two signatures is at least
``threshold``.

Signatures are made here in numpy, the way simhashdb's native
``word_minhash`` makes them, but with any number of bins and bin width:
words as ``simhashdb.tokenize`` reads them (HTML through
``simhashdb.strip_html``, as recipe 3), hashed to 64 bits (BLAKE2b, cached),
word 5-shingles hashed by the native code's combination (rotate, xor,
multiply, fmix64; a text of fewer than 5 words is one shingle); a
one-permutation MinHash: the top log2(bins) bits of a shingle's hash name
its bin, the bin keeps the least rest, reduced to ``width`` bits as
``rest % (2^width - 1) + 1`` (0 marks an empty bin). The estimator is the
native one: equal bins over bins not empty in both.

Empty bins (a text of fewer shingles than bins leaves some) in bands:
- ``skip``: a band with an empty bin is neither stored nor looked up;
- ``zero``: empty bins are 0 in the band key; a band of empty bins alone is
  skipped;
- ``densify``: optimal densification (Shrivastava, 2017): an empty bin takes
  the value of the first non-empty bin along a fixed pseudo-random probe
  sequence of its own, so every band is full and two texts still agree in a
  bin with probability close to their Jaccard similarity.
The confirmation always uses the bins as they are (not densified).

Band keys are 64-bit hashes of (band number, the band's values); the key
bytes an index would need at a given size are reckoned apart (band_bytes).
"""

import hashlib

import numpy as np

import simhashdb

SHINGLE_WORDS = 5
M64 = (1 << 64) - 1
EMPTY = np.uint64(M64)
_C = np.uint64(0x9E3779B97F4A7C15)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_WORDS = {}


def _word_hash(word):
    h = int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"),
                                       digest_size=8).digest(), "little")
    _WORDS[word] = h
    return h


def _rotl(h, n):
    return (h << np.uint64(n)) | (h >> np.uint64(64 - n))


def fmix64(h):
    h = h ^ (h >> np.uint64(33))
    h = h * _F1
    h = h ^ (h >> np.uint64(33))
    h = h * _F2
    return h ^ (h >> np.uint64(33))


def words_of(text, html):
    return simhashdb.tokenize(simhashdb.normalize(simhashdb.strip_html(text) if html else text),
                              "words")


def shingle_hashes(text, html=False):
    """The distinct 64-bit hashes of the word 5-shingles of a text, sorted."""
    words = words_of(text, html)
    get = _WORDS.get
    w = np.array([get(x) or _word_hash(x) for x in words], dtype=np.uint64)
    n = len(w)
    if n == 0:
        return w
    length = min(n, SHINGLE_WORDS)
    count = n - length + 1
    h = np.zeros(count, dtype=np.uint64)
    for j in range(length):
        h = (_rotl(h, 23) ^ w[j:j + count]) * _C
    return np.unique(fmix64(h))


def one_permutation(hashes, bins):
    """The least rest of each bin's hashes (EMPTY where none), uint64[bins]."""
    shift = 64 - (bins.bit_length() - 1)
    least = np.full(bins, EMPTY, dtype=np.uint64)
    if len(hashes):
        np.minimum.at(least, (hashes >> np.uint64(shift)).astype(np.intp),
                      hashes & np.uint64((1 << shift) - 1))
    return least


def values(least, width):
    """A signature of ``width``-bit bins from the least rests (0: empty)."""
    return np.where(least == EMPTY, np.uint64(0),
                    least % np.uint64((1 << width) - 1) + np.uint64(1))


_PROBES = {}


def _probes(bins, attempts=None):
    """Per bin, its fixed pseudo-random sequence of bins to borrow from."""
    if bins not in _PROBES:
        attempts = attempts or 4 * bins
        seeds = (np.arange(bins, dtype=np.uint64)[:, None] * np.uint64(0x100000001)
                 + np.arange(1, attempts + 1, dtype=np.uint64)[None, :])
        _PROBES[bins] = (fmix64(seeds * _C) % np.uint64(bins)).astype(np.intp)
    return _PROBES[bins]


def densify(sig):
    """Optimal densification: each empty bin takes the value of the first
    non-empty bin of its probe sequence (the first non-empty bin after it,
    circularly, in the rare case none of 4 x bins probes finds one)."""
    filled = sig != 0
    if filled.all() or not filled.any():
        return sig
    bins = len(sig)
    empty = np.flatnonzero(~filled)
    probes = _probes(bins)[empty]
    hit = filled[probes]
    first = hit.argmax(axis=1)
    source = probes[np.arange(len(empty)), first]
    missed = ~hit[np.arange(len(empty)), first]
    if missed.any():
        nonzero = np.flatnonzero(filled)
        for k in np.flatnonzero(missed):
            after = nonzero[nonzero > empty[k]]
            source[k] = after[0] if len(after) else nonzero[0]
    out = sig.copy()
    out[empty] = sig[source]
    return out


def estimate(a, b):
    """Estimated resemblance of two signatures (rows), as the native code."""
    used = (a != 0) | (b != 0)
    n = used.sum(axis=-1)
    equal = ((a == b) & used).sum(axis=-1)
    return np.where(n > 0, equal / np.maximum(n, 1), 1.0)


def exact_jaccard(a, b):
    """Jaccard similarity of two sorted arrays of distinct shingle hashes."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


class Config:
    """One band index design: ``bins`` x ``width`` bits of signature, ``bands``
    x ``rows`` bins in bands, ``empty`` handling, ``threshold``, ``k``."""

    def __init__(self, bins=128, width=16, bands=32, rows=4, empty="densify", threshold=0.4,
                 k=3):
        assert bands * rows <= bins and empty in ("skip", "zero", "densify")
        self.bins, self.width, self.bands, self.rows = bins, width, bands, rows
        self.empty, self.threshold, self.k = empty, threshold, k

    @property
    def name(self):
        return "%dx%d b%d r%d %s t%.2f" % (self.bins, self.width, self.bands, self.rows,
                                           self.empty, self.threshold)

    def s_curve(self, s):
        """The probability that a pair whose bins agree with probability
        ``s`` shares a band: 1 - (1 - s^r)^b."""
        return 1 - (1 - s ** self.rows) ** self.bands

    def signatures(self, least):
        """(signature rows for confirmation, band keys, band valid mask) of
        a matrix of least rests (one text a row) of this config's bins."""
        sig = values(least, self.width)
        banded = np.array([densify(row) for row in sig]) if self.empty == "densify" else sig
        cut = banded[:, :self.bands * self.rows].reshape(len(sig), self.bands, self.rows)
        key = np.broadcast_to(np.arange(1, self.bands + 1, dtype=np.uint64)[None, :],
                              cut.shape[:2]).copy() * _C
        for j in range(self.rows):
            key = (_rotl(key, 23) ^ cut[:, :, j]) * _C
        key = fmix64(key)
        if self.empty == "skip":
            valid = (cut != 0).all(axis=2)
        else:
            valid = (cut != 0).any(axis=2)
        return sig, key, valid


class Texts:
    """Shingle hashes, one-permutation rests (for 128 and 256 bins) and
    fingerprints of texts, computed once and shared by every config."""

    BINS = (128, 256)

    def __init__(self):
        self.fp, self.least, self.size = [], {b: [] for b in self.BINS}, []
        self.shingles = {}  # index -> shingle hashes, for the texts kept

    def add(self, text, html, keep=False):
        hashes = shingle_hashes(text, html)
        i = len(self.fp)
        self.fp.append(simhashdb.fingerprint(text, html=html))
        for b in self.BINS:
            self.least[b].append(one_permutation(hashes, b))
        self.size.append(len(hashes))
        if keep:
            self.shingles[i] = hashes
        return i, hashes

    def freeze(self):
        self.fp = np.array(self.fp, dtype=np.uint64)
        self.least = {b: np.array(v) for b, v in self.least.items()}
        self.size = np.array(self.size)


def popcount(x):
    return np.bitwise_count(x)
