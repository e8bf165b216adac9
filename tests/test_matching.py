import itertools
from array import array

import numpy as np
import pytest
import simhash as simhash_py  # simhash-pybind: the C++ reference
from hypothesis import given
from hypothesis import strategies as st

from simhashdb import InvalidArgumentError, _ext, find_all, find_all_indices, find_clusters
from simhashdb.layout import Layout

MAX = 2**64 - 1
PARAMS = [(b, d) for b in range(2, 9) for d in range(1, b)]


def oracle_indices(hashes, distance):
    return [(i, j) for i, j in itertools.combinations(range(len(hashes)), 2)
            if bin(hashes[i] ^ hashes[j]).count("1") <= distance]


def oracle_values(hashes, distance):
    return sorted({(min(hashes[i], hashes[j]), max(hashes[i], hashes[j]))
                   for i, j in oracle_indices(hashes, distance)})


def oracle_clusters(hashes, distance):
    values = sorted(set(hashes))
    group = {v: {v} for v in values}
    for a, b in itertools.combinations(values, 2):
        if bin(a ^ b).count("1") <= distance and group[a] is not group[b]:
            merged = group[a] | group[b]
            for v in merged:
                group[v] = merged
    return sorted({tuple(sorted(g)) for g in group.values() if len(g) > 1})


@st.composite
def adversarial(draw):
    """Fingerprints near a few bases: differences spread, packed into one block,
    at exactly the distance and one more; duplicates; 0 and 2**64-1."""
    blocks, distance = draw(st.sampled_from(PARAMS))
    layout = Layout(blocks, distance)
    bases = draw(st.lists(st.one_of(st.integers(0, MAX), st.sampled_from([0, MAX])),
                          min_size=1, max_size=5))
    hashes = list(bases)
    for base in bases:
        for _ in range(draw(st.integers(0, 6))):
            flips = draw(st.sampled_from([distance, distance + 1, draw(st.integers(0, 4))]))
            if draw(st.booleans()):  # every difference inside one block
                block = draw(st.integers(0, blocks - 1))
                low = 64 - sum(layout.widths[:block + 1])
                flips = min(flips, layout.widths[block])
                bit = st.integers(low, low + layout.widths[block] - 1)
            else:
                bit = st.integers(0, 63)
            value = base
            for b in draw(st.lists(bit, min_size=flips, max_size=flips, unique=True)):
                value ^= 1 << b
            hashes.append(value)
    hashes += draw(st.lists(st.sampled_from(hashes), max_size=3))  # duplicates
    return blocks, distance, hashes


@given(adversarial())
def test_find_all_indices_equals_brute_force(case):
    blocks, distance, hashes = case
    got = find_all_indices(hashes, blocks, distance)
    assert got == oracle_indices(hashes, distance)


@given(adversarial())
def test_find_all_and_clusters_equal_brute_force(case):
    blocks, distance, hashes = case
    expected = oracle_values(hashes, distance)
    repeated = sorted((v, v) for v in set(hashes) if hashes.count(v) > 1)
    assert find_all(hashes, blocks, distance) == sorted(set(expected) | set(repeated))
    assert [tuple(c) for c in find_clusters(hashes, blocks, distance)] == \
        oracle_clusters(hashes, distance)


@given(st.lists(st.integers(0, MAX), max_size=60), st.sampled_from([(4, 3), (5, 3), (6, 3)]))
def test_find_all_matches_simhash_py_on_distinct_values(hashes, params):
    blocks, distance = params
    ours = [(a, b) for a, b in find_all(hashes, blocks, distance) if a != b]
    reference = sorted((min(a, b), max(a, b)) for a, b in
                       simhash_py.find_all(hashes, blocks, distance))
    assert ours == reference


def test_seed_001_chain_is_one_cluster():
    a = 0
    b = a ^ 0b111
    c = b ^ (0b111 << 20)
    d = c ^ (0b111 << 40)
    assert bin(a ^ d).count("1") == 9
    assert find_clusters([d, b, a, c, 1 << 63 | 1 << 62 | 1 << 61 | 1 << 60], 6, 3) == \
        [[a, b, c, d]]
    assert find_all([a, b, c, d], 6, 3) == [(a, b), (b, c), (c, d)]


def test_buffers_and_edge_inputs():
    hashes = [5, 5 ^ 1, MAX, MAX ^ 3, 0]
    expected = find_all(hashes, 4, 2)
    assert find_all(array("Q", hashes), 4, 2) == expected
    assert find_all(np.array(hashes, dtype=np.uint64), 4, 2) == expected
    assert find_all(iter(hashes), 4, 2) == expected
    assert find_all([], 4, 3) == [] and find_clusters([], 4, 3) == []
    assert find_all_indices([7], 4, 3) == []
    assert find_all([7, 7, 7], 4, 3) == [(7, 7)]
    assert find_all_indices([7, 7, 7], 4, 3) == [(0, 1), (0, 2), (1, 2)]
    assert np.array(find_all_indices(np.array([7, 7], dtype=np.uint64), 4, 3)).shape == (1, 2)


@pytest.mark.parametrize("blocks,distance", [(3, 3), (2, 5), (65, 3), (4, -1), (4.0, 2)])
def test_bad_parameters_raise_instead_of_aborting(blocks, distance):
    with pytest.raises(InvalidArgumentError):
        find_all([1, 2], blocks, distance)


@given(adversarial(), st.randoms(use_true_random=False))
def test_scanner_with_sides_gives_exactly_the_pairs_across(case, rng):
    blocks, distance, hashes = case
    values = sorted(set(hashes))
    sides = bytes(rng.choice([1, 2]) for _ in values)
    layout = Layout(blocks, distance)
    scanner = _ext.PairScanner(array("Q", values), layout.spec, layout.prefixes,
                               layout.leading_masks, layout.block_masks, distance, sides)
    flat = scanner.next_chunk(1 << 30, sort=True) or []
    across = [(i, j) for i, j in oracle_indices(values, distance) if sides[i] != sides[j]]
    assert list(zip(flat[0::2], flat[1::2])) == across
    with pytest.raises(InvalidArgumentError):
        _ext.PairScanner(array("Q", values), layout.spec, layout.prefixes, layout.leading_masks,
                         layout.block_masks, distance, sides + b"\x01")


def test_simhash_py_keyword_names_are_accepted():
    hashes = [0, 1, 3, 0xFFFF << 40]
    assert find_all(hashes, number_of_blocks=4, different_bits=1) == find_all(hashes, 4, 1)
    assert simhash_py.find_all(hashes, number_of_blocks=4, different_bits=1) is not None
    assert find_all_indices(hashes, 4, different_bits=2) == find_all_indices(hashes, 4, 2)
    assert find_clusters(hashes, number_of_blocks=4, distance=1) == [[0, 1, 3]]
    with pytest.raises(InvalidArgumentError, match="not both"):
        find_all(hashes, 4, 1, different_bits=1)
    with pytest.raises(InvalidArgumentError, match="different_bits"):
        find_all(hashes, 4)
