"""All-pairs matching in memory: every pair of fingerprints within a distance.

Same method as the database (permutation tables over ``blocks`` blocks), run
natively over arrays: each table is sorted by its leading blocks only, runs
sharing them are compared, and each pair is reported once, by the first table
that finds it.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from typing import Any, Optional

from . import _ext, rule
from .errors import InvalidArgumentError
from .layout import Layout


def find_all(hashes: Any, blocks: Optional[int] = None, distance: Optional[int] = None, *,
             number_of_blocks: Optional[int] = None, different_bits: Optional[int] = None
             ) -> list[tuple[int, int]]:
    """Every pair (a, b), a <= b, of fingerprints within ``distance`` bits, sorted.

    Pairs are of distinct values, as in simhash-py; a value that occurs more
    than once also gives the pair (a, a), once. Use :func:`find_all_indices`
    for every pair of positions.

    :param hashes: ints, ``array('Q')`` or numpy uint64.
    :param int blocks: blocks per fingerprint, distance < blocks <= 64
        (simhash-py's name, ``number_of_blocks``, is accepted too).
    :param int distance: the largest Hamming distance of a pair (or, as
        simhash-py names it, ``different_bits``).
    :raises InvalidArgumentError: for blocks or distance out of range.
    """
    layout = _layout(blocks, distance, number_of_blocks, different_bits)
    values, counts = _ext.unique_sorted(hashes)
    flat = _match(values, layout)
    pairs = [(values[flat[p]], values[flat[p + 1]]) for p in range(0, len(flat), 2)]
    pairs += [(v, v) for v, c in zip(values, counts) if c > 1]
    pairs.sort()
    return pairs


def find_all_indices(hashes: Any, blocks: Optional[int] = None, distance: Optional[int] = None,
                     *, number_of_blocks: Optional[int] = None,
                     different_bits: Optional[int] = None) -> list[tuple[int, int]]:
    """Every pair of positions (i, j), i < j, whose fingerprints are within
    ``distance`` bits, as a sorted list of tuples (``numpy.array(pairs)`` makes
    it an (M, 2) array). Parameters as for :func:`find_all`."""
    flat = _match(hashes, _layout(blocks, distance, number_of_blocks, different_bits))
    return list(zip(flat[0::2], flat[1::2]))


def find_clusters(hashes: Any, blocks: Optional[int] = None, distance: Optional[int] = None, *,
                  number_of_blocks: Optional[int] = None, different_bits: Optional[int] = None
                  ) -> list[list[int]]:
    """Connected components of the match graph of the distinct fingerprints:
    a fingerprint belongs to a cluster when it is within ``distance`` of at
    least one member. Each cluster sorted, clusters sorted, singletons left out.
    Parameters as for :func:`find_all`."""
    layout = _layout(blocks, distance, number_of_blocks, different_bits)
    values, _ = _ext.unique_sorted(hashes)
    labels = components(len(values), pair_chunks(values, layout))
    clusters = {}
    for value, label in zip(values, labels):
        clusters.setdefault(label, []).append(value)
    return sorted(c for c in clusters.values() if len(c) > 1)


def _layout(blocks, distance, number_of_blocks, different_bits):
    """The Layout of ``blocks`` and ``distance``, by our names or simhash-py's."""
    for ours, alias, theirs, name in ((blocks, number_of_blocks, "number_of_blocks", "blocks"),
                                      (distance, different_bits, "different_bits", "distance")):
        if ours is not None and alias is not None:
            raise InvalidArgumentError("give %s or %s (its simhash-py name), not both"
                                       % (name, theirs))
        if ours is None and alias is None:
            raise InvalidArgumentError("%s is required (simhash-py calls it %s)" % (name, theirs))
    return Layout(number_of_blocks if blocks is None else blocks,
                  different_bits if distance is None else distance)


def pair_chunks(values, layout, distance=None, chunk=1 << 20, table=None, sides=None):
    """Yield flat ``array('Q')`` chunks [i, j, ...] of the position pairs of
    ``values`` within ``distance`` (default: the layout's), each pair once.

    :param int table: scan this permutation table alone (default: all); a
        pair is still found only by the first table whose leading blocks it
        shares, so scans of each table apart find each pair once.
    :param sides: a byte per value: only pairs whose sides differ (the pairs
        across two parts of a group too large for one scan).
    """
    scanner = _scanner(values, layout, distance, table, sides)
    while True:
        pairs = scanner.next_chunk(chunk)
        if pairs is None:
            return
        yield pairs


def text_pairs(fingerprints, signatures, layout, threshold, distance=None):
    """Every pair of documents near each other by the text rule
    (:mod:`simhashdb.rule`), each once, as (i, j, resemblance)
    with i < j positions: two texts that share a band of their ``signatures``
    or whose ``fingerprints`` are within ``distance`` bits (default: the
    layout's), when their resemblance passes ``threshold`` (a float, or a
    :class:`simhashdb.rule.Threshold` with its short texts); a pair with a
    document without a signature (None), when within the distance
    (resemblance None)."""
    if not isinstance(threshold, rule.Threshold):
        threshold = rule.text_rule(threshold)
    signatures, size = rule.one_width(signatures)
    empty = bytes(size)
    pairs, scores = _ext.band_pairs(b"".join(s or empty for s in signatures), size,
                                    threshold.least)
    for p, score in enumerate(scores):
        i, j = pairs[2 * p], pairs[2 * p + 1]
        if rule.passes(score, signatures[i], signatures[j], threshold):
            yield i, j, score
    values, counts = _ext.unique_sorted(fingerprints)
    holders = {}
    for i, fp in enumerate(fingerprints):
        holders.setdefault(fp, []).append(i)

    def near(i, j):  # documents within the distance: the rest of the rule
        i, j = min(i, j), max(i, j)
        a, b = signatures[i], signatures[j]
        texts = bool(a and b and any(a) and any(b))
        if texts and _ext.shares_a_band(a, b):  # those that share one came from the bands
            return
        score = rule.judge(True, a, texts, b, threshold)
        if score is not False:
            yield i, j, score

    for value, count in zip(values, counts):
        for i, j in itertools.combinations(holders[value], 2) if count > 1 else ():
            yield from near(i, j)
    for chunk in pair_chunks(values, layout, distance):
        for p in range(0, len(chunk), 2):
            for i, j in itertools.product(holders[values[chunk[p]]],
                                          holders[values[chunk[p + 1]]]):
                yield from near(i, j)


def components(n, chunks):
    """Component label (smallest member) of each of ``n`` nodes joined by pair chunks."""
    labels = array("Q", range(n))
    for pairs in chunks:
        _ext.join_components(labels, pairs)
    _ext.component_labels(labels)
    return labels


def _match(values, layout):
    """Every position pair of ``values``, sorted, as one flat ``array('Q')``."""
    return _scanner(values, layout).next_chunk(sys.maxsize, sort=True) or array("Q")


def _scanner(values, layout, distance=None, table=None, sides=None):
    spec, prefixes, leading = (layout.spec, layout.prefixes, layout.leading_masks) \
        if table is None else layout.table_arrays(table)
    return _ext.PairScanner(values, spec, prefixes, leading, layout.block_masks,
                            layout.distance if distance is None else distance, sides)
