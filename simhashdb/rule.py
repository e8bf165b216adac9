"""The text rule: when a document is a near-duplicate of a text.

The candidates of a text are the documents that share a band of its
resemblance signature (32 bands of 4 of its 128 MinHash bins) or whose
fingerprint is within the distance. A candidate text is a near-duplicate
when the estimated resemblance of the two texts' word 5-shingles is at least
the threshold; a document stored without text (no signature), when its
fingerprint is within the distance.

:class:`simhashdb.DB` (queries, batch decisions, find_all, clusters),
:func:`simhashdb.matching.text_pairs` (in memory), :mod:`simhashdb.spark`
and the CLI decide by this module. docs/database.md (Text in, decisions out)
says why the threshold is 0.45.

A short text (``short_words``: fewer words than that) is a near-duplicate
only at :data:`NEAR_EXACT` or more: a short page under a site's template
resembles its unrelated siblings through the template. Whether a text is
short is read from its signature (the bins its shingles fill), so stored
texts are judged as new ones are, and no count is stored.
"""

from __future__ import annotations

import collections
import itertools
import math
from array import array
from typing import NamedTuple

from . import _ext
from ._ext import bands
from .errors import InvalidArgumentError
from .records import signature as stored_signature

THRESHOLD = 0.45  # the least resemblance of a near-duplicate
NEAR_EXACT = 0.8  # the least resemblance of a short text's near-duplicate: one edited word passes
SHORT_WORDS = 0  # texts of fewer words are short (0: none); see docs/crawlers.md
BINS = _ext.BINS
NARROW_CODES = _ext.NARROW_BIN_CODES  # the values a filled 8-bit signature bin takes (1 to 255)
SHINGLE_WORDS = 5
GROUP_CHECKED = 64  # the most texts under one fingerprint block whose pairs sharing() checks


class Threshold(NamedTuple):
    """The text rule's bars: the least resemblance of a near-duplicate, and
    the filled signature bins under which a text is short (held to
    :data:`NEAR_EXACT`)."""
    least: float
    short_bins: int = 0


def text_rule(threshold=None, short_words=None):
    """The :class:`Threshold` of a text rule of least resemblance
    ``threshold`` (None: :data:`THRESHOLD`) whose texts of fewer than
    ``short_words`` words (None: :data:`SHORT_WORDS`) are short: those whose
    signatures fill fewer bins than such a text fills on average.

    :raises InvalidArgumentError: a threshold not in [0, 1], or short_words
        not an int >= 0.
    """
    if short_words is None:
        short_words = SHORT_WORDS
    if isinstance(short_words, bool) or not isinstance(short_words, int) or short_words < 0:
        raise InvalidArgumentError("short_words must be an int >= 0, got %s"
                                   % _ext.shown(short_words))
    shingles = max(short_words - SHINGLE_WORDS + 1, 0)
    return Threshold(check_threshold(threshold),
                     math.ceil(BINS * -math.expm1(shingles * math.log1p(-1 / BINS))))


def filled_bins(signature):
    """The bins a signature's shingles fill (0: no text)."""
    bins = memoryview(signature)
    return BINS - (bins if len(signature) == BINS else bins.cast("H")).tolist().count(0)


def one_width(signatures):
    """``signatures`` (bytes, or None) in one width: those of 16-bit bins
    narrowed where any has 8-bit ones; and that width's size in bytes."""
    sizes = {len(s) for s in signatures if s is not None}
    if len(sizes) < 2:
        return signatures, sizes.pop() if sizes else _ext.SIGNATURE_BYTES
    return [s if s is None else _ext.narrow(s) for s in signatures], _ext.SIGNATURE_BYTES


def passes(alike, signature, their_signature, threshold):
    """Whether two texts of resemblance ``alike`` are near-duplicates under
    ``threshold`` (a :class:`Threshold`)."""
    if alike < threshold.least:
        return False
    return alike >= NEAR_EXACT or not threshold.short_bins or min(
        filled_bins(signature), filled_bins(their_signature)) >= threshold.short_bins


def check_threshold(threshold):
    """A text rule's least resemblance: ``threshold``, checked, or :data:`THRESHOLD`.

    :raises InvalidArgumentError: not a number in [0, 1].
    """
    if threshold is None:
        return THRESHOLD
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
            not 0 <= threshold <= 1:
        raise InvalidArgumentError("threshold must be a number in [0, 1], got %s"
                                   % _ext.shown(threshold))
    return threshold


def judge(near, signature, banded, their_signature, threshold):
    """The text rule (``threshold``: a :class:`Threshold`) on one candidate
    of a text of ``signature`` (its bands ``banded``; empty: no text): the
    texts' resemblance where it is a near-duplicate text, None where it is a
    near-duplicate by its distance (either has no text, and their
    fingerprints are ``near``: within the distance), False where it is none.
    ``their_signature`` is the candidate's (None: stored without text)."""
    if not (banded and their_signature):
        return None if near else False
    alike = _ext.banded_resemblance(signature, their_signature, near)
    return alike if passes(alike, signature, their_signature, threshold) else False


def search(view, fps, signatures, distance, threshold, banded=None):
    """For each text (fingerprint, signature), its near-duplicates stored in
    ``view`` (a storage View) as (key, fingerprint, distance, resemblance or
    None) hits (``banded``: the signatures' bands, where the caller has them)."""
    near = view.search(_ext.as_fingerprints(fps), distance)
    ours = banded if banded is not None else [bands(signature) for signature in signatures]
    asking = [i for i, keys in enumerate(ours) if keys]
    banded = dict(zip(asking, view.band_search(array("I", b"".join(  # (bytes: one copy)
        ours[i] for i in asking))))) if asking else {}
    candidates = []
    for i, fp in enumerate(fps):
        mine = {key: (theirs, d) for key, theirs, d in near[i]}
        for key, theirs in banded.get(i, ()):
            mine.setdefault(key, (theirs, _ext.num_differing_bits(fp, theirs)))
        candidates.append(mine)
    keys = list(dict.fromkeys(key for mine in candidates for key in mine))
    values = dict(zip(keys, view.get_many(keys)))
    found = []
    for i, (signature, mine) in enumerate(zip(signatures, candidates)):
        hits = []
        for key, (theirs, d) in mine.items():
            value = values[key]
            if value is None:  # removed meanwhile: on Redis, which keeps no snapshots,
                continue  # this read is then done again (Storage.read_whole)
            alike = judge(d <= distance, signature, ours[i], stored_signature(value), threshold)
            if alike is not False:
                hits.append((key, theirs, d, alike))
        found.append(hits)
    return found


def _cuts(distance):
    """The d + 1 blocks of a fingerprint's 64 bits, as (low bit, high bit):
    two fingerprints within d bits agree on one of them."""
    parts = min(distance + 1, 64)
    return [(64 * p // parts, 64 * (p + 1) // parts) for p in range(parts)]


def sharing(fps, banded, distance):
    """Which texts of a batch (fingerprints ``fps``, band keys ``banded``)
    share a band with another of them or have another within the distance:
    those alone can be a candidate of another, so only they go in the batch's
    :class:`Kept` index (most of a crawler's batch is not). Texts under a
    fingerprint block shared by more than :data:`GROUP_CHECKED` are all
    counted in unchecked."""
    return _ext.shared_texts(fps, banded, _cuts(distance), distance, GROUP_CHECKED)


class Kept:
    """The texts a batch of decisions has kept so far (``documents``: key ->
    encoded document, the last one a key kept), found as :func:`search` finds
    stored ones: by a shared band, or by a fingerprint within the distance,
    through the blocks of :func:`_cuts`. A text kept ``alone`` (one that
    shares neither with another text of the batch: :func:`sharing`) is not
    indexed: no other can find it."""

    def __init__(self, distance, threshold):
        self.distance, self.threshold = distance, threshold
        self.cuts = _cuts(distance)
        self.documents, self.signatures = {}, {}
        self.by_band, self.by_block = collections.defaultdict(list), collections.defaultdict(list)

    def _blocks(self, fp):
        return [(p, (fp >> lo) & ((1 << (hi - lo)) - 1)) for p, (lo, hi) in enumerate(self.cuts)]

    def add(self, document, signature, alone=False):
        key, fp, _ = document
        self.documents[key] = document
        if alone:
            return
        self.signatures[key] = signature
        for band in enumerate(bands(signature)):
            self.by_band[band].append(document)
        for block in self._blocks(fp):
            self.by_block[block].append(document)

    def hits(self, fp, signature):
        """The kept texts near a text, as :func:`search` gives hits."""
        ours = bands(signature)
        candidates = itertools.chain(
            *(self.by_band.get(band, ()) for band in enumerate(ours)),
            *(self.by_block.get(block, ()) for block in self._blocks(fp)))
        hits = {}
        for document in candidates:
            key, theirs, _ = document
            if key in hits or self.documents[key] is not document:  # seen, or replaced
                continue
            d = _ext.num_differing_bits(fp, theirs)
            alike = judge(d <= self.distance, signature, ours, self.signatures[key],
                          self.threshold)
            if alike is not False:
                hits[key] = (key, theirs, d, alike)
        return list(hits.values())


def decide(store, texts, distance, threshold):
    """The hits of each (document, signature) of ``texts`` in order, each
    stored when it has none, as if decided one after another: all are
    searched at once in ``store`` (a storage Txn) as it was before them, the
    texts kept earlier in the batch are compared in memory (:class:`Kept`),
    and the kept ones are stored together, so a batch writes each structure
    once."""
    fps, banded = [d[1] for d, _ in texts], [bands(s) for _, s in texts]
    found = search(store, fps, [s for _, s in texts], distance, threshold, banded)
    shared = sharing(fps, banded, distance)
    kept = Kept(distance, threshold)
    for i, (document, signature) in enumerate(texts):
        if kept.documents:  # a stored hit a kept text replaced is gone
            found[i] = [h for h in found[i] if h[0] not in kept.documents]
            if shared[i]:
                found[i] += kept.hits(document[1], signature)
        if not found[i]:
            kept.add(document, signature, alone=not shared[i])
    store.upsert(list(kept.documents.values()))
    return found


def _bins(signatures):
    """A numpy (n, 128 or 256) uint8 array of signatures as (n, 128) bins;
    equality and emptiness ignore the byte order."""
    return signatures if signatures.shape[1] == BINS else signatures.view("<u2")


def resemblances(signatures, a, b):
    """The resemblance of the signatures of rows ``a`` and ``b`` of a numpy
    (n, 128 or 256) uint8 array, as :func:`simhashdb.resemblance` computes it
    one pair at a time: equal bins over bins not empty in both (1.0 where
    both are empty), corrected for bins equal by chance where they have 8 bits."""
    bins = _bins(signatures)
    x, y = bins[a], bins[b]
    used = (x | y) != 0
    equal, filled = ((x == y) & used).sum(axis=1), used.sum(axis=1)
    share = equal / filled.clip(min=1)
    share[filled == 0] = 1.0
    if signatures.shape[1] == BINS:
        share = (share * NARROW_CODES - 1) / (NARROW_CODES - 1)
        share[share < 0] = 0.0
    return share


def passing(signatures, a, b, scores, threshold):
    """:func:`passes` over numpy arrays: for the pairs of rows ``a`` and ``b``
    of a (n, 128 or 256) uint8 array of ``signatures``, of resemblances ``scores``."""
    passed = scores >= threshold.least
    if threshold.short_bins:
        def is_short(rows):
            return (_bins(signatures)[rows] != 0).sum(axis=1) < threshold.short_bins
        passed &= ~(is_short(a) | is_short(b)) | (scores >= NEAR_EXACT)
    return passed


def kept_pairs(texts, banded, near, passed):
    """Which candidate pairs the rule keeps, as numpy boolean arrays: pairs of
    two ``texts`` that share a band (``banded``) or are ``near`` and whose
    scores ``passed`` (:func:`passing`); any other pair when it is ``near``."""
    return (texts & (banded | near) & passed) | (~texts & near)
