"""Queries above the built distance (multi-probe) are exact: brute-force oracle
tests on adversarial data, on each backend."""

import itertools
import random

import pytest
from conftest import BACKENDS, as_tuples, brute_force, flip

from simhashdb import DB, InvalidArgumentError
from simhashdb.layout import Layout

MAX = 2**64 - 1
# (blocks, distance): k = 1, 2, 3, each queried at k + 1 .. 2k
LAYOUTS = [(2, 1), (4, 1), (4, 2), (5, 2), (4, 3), (5, 3)]


def block_starts(layout):
    """The lowest bit of each block, the most significant block first."""
    starts, top = [], 64
    for width in layout.widths:
        top -= width
        starts.append(top)
    return starts


def packed_bits(layout, block, n):
    """n adjacent bits from the top of ``block`` (running into the next ones)."""
    top = block_starts(layout)[block] + layout.widths[block] - 1
    return [(top - i) % 64 for i in range(n)]


def spread_bits(layout, n, shift=0):
    """n bits dealt round-robin over the blocks: the worst case for a
    multi-probe query, every table's leading blocks hold as many as can be."""
    starts = block_starts(layout)
    return [starts[(j + shift) % layout.blocks] + j // layout.blocks for j in range(n)]


def adversarial_docs(layout, seed, crowd=1500):
    """Variants of a few bases at exactly n flips for n = k + 1 .. 2k + 1
    (packed in one block, spread over all, at random), duplicates, 0 and
    2**64 - 1, and a crowd of thousands sharing one base's top 52 bits."""
    rng = random.Random(seed)
    k = layout.distance
    bases = [rng.getrandbits(64) for _ in range(4)] + [0, MAX]
    docs = {}
    for i, base in enumerate(bases):
        docs["base%d" % i] = docs["dup%d" % i] = base
        for n in range(1, 2 * k + 2):
            docs["packed%d-%d" % (i, n)] = flip(base, packed_bits(layout, i % layout.blocks, n))
            docs["spread%d-%d" % (i, n)] = flip(base, spread_bits(layout, n, i))
            docs["random%d-%d" % (i, n)] = flip(base, rng.sample(range(64), n))
        docs["dup-spread%d" % i] = docs["spread%d-%d" % (i, k + 1)]
    low = rng.sample(range(1 << 12), crowd)
    docs.update(("crowd%d" % j, (bases[0] & ~0xFFF) | v) for j, v in enumerate(low))
    docs.update(("rand%d" % j, rng.getrandbits(64)) for j in range(200))
    return bases, docs


def probes_near(layout, bases, seed):
    """Each base, and each base moved by a few packed or spread bits."""
    rng = random.Random(seed)
    probes = list(bases)
    for i, base in enumerate(bases):
        probes.append(flip(base, packed_bits(layout, (i + 1) % layout.blocks, 2)))
        probes.append(flip(base, spread_bits(layout, layout.distance, i + 1)))
        probes.append(flip(base, rng.sample(range(64), 1 + i % 3)))
    return probes + [rng.getrandbits(64) for _ in range(4)]


def test_prefix_flips_is_the_exact_worst_case():
    """A fingerprint within k2 bits differs, in the table whose leading blocks
    hold the fewest of its bits, in at most prefix_flips(k2) of them; and some
    arrangement needs that many (so probing fewer would miss, more would waste)."""
    for blocks, distance in LAYOUTS + [(6, 3), (7, 3), (3, 2), (6, 2)]:
        layout = Layout(blocks, distance)
        lead = blocks - distance
        for k2 in range(0, 2 * distance + 2):
            worst = 0
            for counts in itertools.product(range(k2 + 1), repeat=blocks):
                if sum(counts) == k2 and all(c <= w for c, w in zip(counts, layout.widths)):
                    worst = max(worst, sum(sorted(counts)[:lead]))
            assert layout.prefix_flips(k2) == worst, (blocks, distance, k2)


@pytest.mark.parametrize("blocks,distance", LAYOUTS)
def test_query_above_the_built_distance_equals_brute_force(tmp_path, backend, blocks, distance):
    layout = Layout(blocks, distance)
    bases, docs = adversarial_docs(layout, blocks * 10 + distance)
    probes = probes_near(layout, bases, blocks)
    with DB(str(tmp_path / "mp.db"), distance=distance, blocks=blocks) as db:
        db.insert_many(docs.items(), batch_size=1000)
        for k2 in range(distance + 1, 2 * distance + 1):
            expected = [brute_force(docs, p, k2) for p in probes]
            assert [as_tuples(m) for m in db.query_many(probes, distance=k2)] == expected
            for probe, want in list(zip(probes, expected))[::5]:
                assert as_tuples(db.query(probe, distance=k2)) == want
        assert db.check() == []


@pytest.mark.skipif("lmdb" not in BACKENDS, reason="the native backend was not built")
@pytest.mark.parametrize("blocks,distance", [(4, 1), (5, 3)])
def test_native_query_many_split_over_threads_above_the_built_distance(tmp_path, monkeypatch,
                                                                       blocks, distance):
    monkeypatch.setattr("simhashdb.storage.lmdb.native.PARALLEL_PROBES", 8)
    layout = Layout(blocks, distance)
    bases, docs = adversarial_docs(layout, 3, crowd=300)
    probes = probes_near(layout, bases, 4) * 2
    with DB(str(tmp_path / "mt.db"), distance=distance, blocks=blocks, backend="lmdb") as db:
        db.insert_many(docs.items())
        k2 = distance + 1
        assert [as_tuples(m) for m in db.query_many(probes, distance=k2)] == \
            [brute_force(docs, p, k2) for p in probes]


@pytest.mark.parametrize("blocks,distance", [(2, 1), (4, 2), (5, 3)])
def test_insert_if_new_above_the_built_distance_equals_brute_force(tmp_path, backend, blocks,
                                                                  distance):
    layout = Layout(blocks, distance)
    bases, docs = adversarial_docs(layout, 17, crowd=200)
    stored = dict(list(docs.items())[::2])
    rng = random.Random(blocks)
    with DB(str(tmp_path / "in.db"), distance=distance, blocks=blocks) as db:
        db.insert_many(stored.items())
        for k2 in range(distance + 1, 2 * distance + 1):
            fps = (list(docs.values())[1::2][:60] +
                   [flip(b, spread_bits(layout, k2, s)) for s, b in enumerate(bases)] +
                   [flip(b, rng.sample(range(64), k2 + 1)) for b in bases])
            offered = [("new%d-%d" % (k2, j), fp) for j, fp in enumerate(fps)]
            expected = []
            for key, fp in offered:  # each record also meets those stored before it
                expected.append(brute_force(stored, fp, k2))
                if not expected[-1]:
                    stored[key] = fp
            got = db.insert_if_new_many(offered, distance=k2, batch_size=25)
            assert [as_tuples(m) for m in got] == expected
            assert any(expected) and not all(expected)
        assert {r.key: r.fingerprint for r in db} == stored
        assert db.check() == []


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_database_built_for_exact_matches_answers_at_a_few_bits(tmp_path, backend, blocks):
    """k = 0: every table's prefix is the whole fingerprint, so a query at k2
    probes every fingerprint within k2 bits of its own."""
    layout = Layout(blocks, 0)
    bases, docs = adversarial_docs(layout, blocks, crowd=300)
    for k2, base in itertools.product((1, 2), bases):
        docs["exact%d-%d" % (k2, base % 1000)] = flip(base, spread_bits(layout, k2))
    probes = probes_near(layout, bases, 9)[:20]
    with DB(str(tmp_path / "k0.db"), distance=0, blocks=blocks) as db:
        db.insert_many(docs.items())
        for k2 in (1, 2):
            assert [as_tuples(m) for m in db.query_many(probes, distance=k2)] == \
                [brute_force(docs, p, k2) for p in probes]
        with pytest.raises(InvalidArgumentError, match="would probe"):
            db.query(0, distance=4)
        with pytest.raises(InvalidArgumentError, match="database's distance"):
            list(db.clusters(distance=1))
