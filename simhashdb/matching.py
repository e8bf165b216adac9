"""All-pairs matching in memory: every pair of fingerprints within a distance.

Same method as the database (permutation tables over ``blocks`` blocks), run
natively over arrays: each table is sorted by its leading blocks only, runs
sharing them are compared, and each pair is reported once, by the first table
that finds it.
"""

import sys
from array import array

from . import _ext
from .layout import Layout


def find_all(hashes, blocks, distance):
    """Every pair (a, b), a <= b, of fingerprints within ``distance`` bits, sorted.

    Pairs are of distinct values, as in simhash-py; a value that occurs more
    than once also gives the pair (a, a), once. Use :func:`find_all_indices`
    for every pair of positions.

    :param hashes: ints, ``array('Q')`` or numpy uint64.
    :param int blocks: blocks per fingerprint, distance < blocks <= 64.
    :param int distance: the largest Hamming distance of a pair.
    :raises InvalidArgumentError: for blocks or distance out of range.
    """
    layout = Layout(blocks, distance)
    values, counts = _ext.unique_sorted(hashes)
    flat = _match(values, layout)
    pairs = [(values[flat[p]], values[flat[p + 1]]) for p in range(0, len(flat), 2)]
    pairs += [(v, v) for v, c in zip(values, counts) if c > 1]
    pairs.sort()
    return pairs


def find_all_indices(hashes, blocks, distance):
    """Every pair of positions (i, j), i < j, whose fingerprints are within
    ``distance`` bits, sorted: an (M, 2) int64 numpy array where numpy is
    installed, else a list of tuples."""
    flat = _match(hashes, Layout(blocks, distance))
    try:
        import numpy
    except ImportError:
        return [(flat[p], flat[p + 1]) for p in range(0, len(flat), 2)]
    return numpy.frombuffer(flat, dtype=numpy.uint64).astype(numpy.int64).reshape(-1, 2)


def find_clusters(hashes, blocks, distance):
    """Connected components of the match graph of the distinct fingerprints:
    a fingerprint belongs to a cluster when it is within ``distance`` of at
    least one member. Each cluster sorted, clusters sorted, singletons left out."""
    layout = Layout(blocks, distance)
    values, _ = _ext.unique_sorted(hashes)
    labels = components(len(values), pair_chunks(values, layout))
    clusters = {}
    for value, label in zip(values, labels):
        clusters.setdefault(label, []).append(value)
    return sorted(c for c in clusters.values() if len(c) > 1)


def pair_chunks(values, layout, distance=None, chunk=1 << 20):
    """Yield flat ``array('Q')`` chunks [i, j, ...] of the position pairs of
    ``values`` within ``distance`` (default: the layout's), each pair once."""
    scanner = _scanner(values, layout, distance)
    while True:
        pairs = scanner.next_chunk(chunk)
        if pairs is None:
            return
        yield pairs


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


def _scanner(values, layout, distance=None):
    return _ext.PairScanner(values, layout.spec, layout.prefixes, layout.leading_masks,
                            layout.block_masks, layout.distance if distance is None else distance)
