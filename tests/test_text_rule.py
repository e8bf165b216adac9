"""One rule for text everywhere: insert_text_if_new(_many), query_text(_many),
DB.find_all and DB.clusters on a database of texts, and the CLI's import
--if-new, query --text, find-all and clusters give the decisions of one
oracle, a pair at a time: two texts are near-duplicates when they share a
band of their signatures or their fingerprints are within the database's
distance, and their resemblance reaches the threshold; a document stored
without text, when its fingerprint is within the distance."""

import collections
import itertools
import json
import pathlib
import random
import sysconfig
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

import simhashdb
from simhashdb import _ext, cli

pytestmark = pytest.mark.usefixtures("backend")

DISTANCE, THRESHOLD = 3, 0.45
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])


def corpus(seed=0):
    """(key, text) of stdlib texts and their copies edited in three ways:
    words from other texts, a block of another text, words of the same text."""
    rng = random.Random(seed)
    paths = sorted(p for p in STDLIB.glob("*.py") if 3000 < p.stat().st_size < 30000)
    originals = [p.read_text("utf-8") for p in rng.sample(paths, 14)]
    words = [t.split() for t in originals]
    docs = [("t%d" % i, t) for i, t in enumerate(originals)]
    for i, text in enumerate(originals[:10]):
        own, other = list(words[i]), words[(i + 1) % len(words)]
        for rate, kind in ((0.02, "foreign"), (0.08, "foreign"), (0.05, "block"),
                           (0.05, "same"), (0.3, "same")):
            edited = list(own)
            count = max(1, int(rate * len(own)))
            if kind == "block":
                at = rng.randrange(len(edited))
                edited[at:at] = other[:count]
            else:
                for j in rng.sample(range(len(edited)), count):
                    edited[j] = rng.choice(other if kind == "foreign" else own)
            docs.append(("t%d-%s%g" % (i, kind, rate), " ".join(edited)))
    return docs


def oracle(signed, fps):
    """The near-duplicate pairs of {key: signature or None} by the rule."""
    near = set()
    for a, b in itertools.combinations(sorted(fps), 2):
        d = (fps[a] ^ fps[b]).bit_count()
        sa, sb = signed[a], signed[b]
        if sa and sb:
            if (d <= DISTANCE or _ext.shares_a_band(sa, sb)) and \
                    simhashdb.resemblance(sa, sb) >= THRESHOLD:
                near.add((a, b))
        elif d <= DISTANCE:
            near.add((a, b))
    return near


@pytest.fixture(scope="module")
def texts():
    docs = corpus()
    prints = {k: simhashdb.fingerprint_with_signature(t) for k, t in docs}
    raw = {"raw-near": prints["t0"][0] ^ 0b101, "raw-far": prints["t0"][0] ^ (2**40 - 1)}
    signed = dict({k: s for k, (_, s) in prints.items()}, **dict.fromkeys(raw))
    fps = dict({k: fp for k, (fp, _) in prints.items()}, **raw)
    return docs, raw, signed, fps, oracle(signed, fps)


def test_the_rule_finds_edited_copies_that_fingerprints_alone_miss(texts):
    _, _, _, fps, near = texts
    by_distance = {(a, b) for a, b in near if (fps[a] ^ fps[b]).bit_count() <= DISTANCE}
    assert len(near) > len(by_distance) + 5  # the bands reach what the distance does not
    assert ("t0", "t0-foreign0.02") in near and ("t0", "t0-same0.3") not in near


def test_every_entry_point_decides_as_the_oracle(texts, tmp_path, capsys):
    docs, raw, signed, fps, near = texts
    path = str(tmp_path / "db")
    with simhashdb.DB(path, distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(docs)
        db.insert_many(raw.items())
        pairs = {(p.key_a, p.key_b) for p in db.find_all()}
        assert pairs == near
        scored = [p for p in db.find_all() if p.resemblance is not None]
        assert all(p.resemblance >= THRESHOLD for p in scored) and scored
        clusters = list(db.clusters())
        found = db.query_text_many([t for _, t in docs])
    assert {frozenset(c) for c in clusters} == components(near)
    for (key, _), matches in zip(docs, found):
        assert {m.key for m in matches} - {key} == \
            {b if a == key else a for a, b in near if key in (a, b)}
    for command, expected in (("find-all", near), ("clusters", components(near))):
        assert cli.main([command, path]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        if command == "find-all":
            assert {tuple(line[:2]) for line in lines} == expected
            assert all(len(line) == 4 for line in lines if line[0] not in raw and
                       line[1] not in raw)
        else:
            assert {frozenset(line) for line in lines} == expected


def test_insert_if_new_keeps_what_the_oracle_says_is_new(texts, tmp_path):
    docs, _, signed, fps, near = texts
    order = list(docs)
    random.Random(1).shuffle(order)
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE) as db:
        found = db.insert_text_if_new_many(order, batch_size=7)
    kept = []
    for (key, _), matches in zip(order, found):
        expected = {k for k in kept if tuple(sorted((k, key))) in near}
        assert {m.key for m in matches} == expected
        if not expected:
            kept.append(key)


def components(pairs):
    groups = {}
    for a, b in pairs:
        merged = groups.get(a, {a}) | groups.get(b, {b})
        for k in merged:
            groups[k] = merged
    return {frozenset(g) for g in groups.values()}


def test_a_batch_decides_as_one_text_a_call(texts, tmp_path):
    """insert_text_if_new_many decides a batch together; each text must get
    what inserting the texts one a call gives: texts near others of the same
    batch, a key stored twice in it, a stored key replaced before a copy of
    its old text comes, texts too short for bands."""
    docs, _, _, _, _ = texts
    rng = random.Random(5)
    stored = [(key, text) for key, text in docs[:6]]
    batch = list(docs[6:]) + [(key, text) for key, text in rng.sample(docs, 8)]
    batch += [(stored[0][0], docs[-1][1]), ("old-copy", stored[0][1]),
              ("again", docs[7][1]), ("again", docs[8][1]), ("short", "two words"),
              ("short-copy", "two words"), ("short-other", "other words here")]
    rng.shuffle(batch)
    results = []
    for one_a_call in (False, True):
        with simhashdb.DB(str(tmp_path / str(one_a_call)), distance=DISTANCE) as db:
            db.insert_text_many(stored)
            if one_a_call:
                found = [db.insert_text_if_new(key, text) for key, text in batch]
            else:
                found = db.insert_text_if_new_many(batch)
            contents = sorted((r.key, r.fingerprint) for r in db)
        results.append(([sorted((m.key, m.fingerprint, m.distance, m.resemblance) for m in f)
                         for f in found], contents))
    assert results[0] == results[1]
    assert sum(1 for f in results[0][0] if f) >= 10  # the batch met itself and the store


def test_a_batch_decides_as_if_every_text_were_indexed(texts, tmp_path, monkeypatch):
    """Texts that share no band and no fingerprint block with another text of
    their batch are kept out of the batch's index (rule.sharing); decisions,
    their order and what is stored must be those of indexing every text."""
    docs, _, _, _, _ = texts
    rng = random.Random(7)
    batch = [(key, text) for key, text in docs] + [(key + "-again", text) for key, text in
                                                   rng.sample(docs, 10)]
    batch += [(docs[3][0], docs[4][1]), ("empty", ""), ("short", "two words")]
    rng.shuffle(batch)
    results = []
    for indexed in ("shared", "every"):
        if indexed == "every":
            monkeypatch.setattr(simhashdb.rule, "sharing", lambda fps, banded, d: [True] * len(fps))
        with simhashdb.DB(str(tmp_path / indexed), distance=DISTANCE) as db:
            db.insert_text_many(docs[:3])
            found = db.insert_text_if_new_many(batch)
            results.append(([[(m.key, m.fingerprint, m.distance, m.resemblance) for m in f]
                             for f in found], sorted((r.key, r.fingerprint) for r in db)))
    assert results[0] == results[1]
    assert sum(1 for f in results[0][0] if f) >= 10


def brute_force_sharing(fps, banded, distance, checked):
    """rule.sharing by every pair."""
    parts = min(distance + 1, 64)
    cuts = [(64 * p // parts, 64 * (p + 1) // parts) for p in range(parts)]
    block = [[(fp >> lo) % (1 << (hi - lo)) for lo, hi in cuts] for fp in fps]
    crowd = [collections.Counter(b[c] for b in block) for c in range(len(cuts))]
    shared = [False] * len(fps)
    for i, j in itertools.combinations(range(len(fps)), 2):
        same = [c for c in range(len(cuts)) if block[i][c] == block[j][c]]
        near = (fps[i] ^ fps[j]).bit_count() <= distance
        if any(crowd[c][block[i][c]] > checked or near for c in same) or \
                any(a == b for a, b in zip(banded[i], banded[j])):
            shared[i] = shared[j] = True
    return shared


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()), max_size=90),
       st.one_of(st.integers(0, 8), st.sampled_from([-2, -1, 63, 64, 2**31 - 1])),
       st.randoms(use_true_random=False))
def test_sharing_equals_every_pair_checked(shape, distance, rnd):
    """Random and crowded batches: fingerprints a few bits from six bases, 0 and
    2**64 - 1 among them, band keys of a few values, texts without bands."""
    bases = [rnd.getrandbits(64) for _ in range(4)] + [0, 2**64 - 1]
    fps = [bases[b] ^ sum(1 << bit for bit in rnd.sample(range(64), flips))
           for b, flips, _ in shape]
    banded = [array("I", [rnd.randrange(40) for _ in range(4)]) if has else array("I")
              for _, _, has in shape]
    checked = rnd.choice([1, 2, 64])
    assert _ext.shared_texts(fps, banded, simhashdb.rule._cuts(distance), distance, checked) == \
        brute_force_sharing(fps, banded, distance, checked)


@pytest.mark.parametrize("cuts", [[(0.2, 0.7)], [(0, 65)], [(5, 5)], [(-1, 3)], [(0, 64)] * 65])
def test_sharing_refuses_blocks_outside_the_64_bits(cuts):
    with pytest.raises(simhashdb.InvalidArgumentError, match="blocks of bits"):
        _ext.shared_texts([1, 2], [array("I")] * 2, cuts, 1, 64)


def test_sharing_marks_the_texts_another_could_find():
    fp = 0x0123456789ABCDEF
    fps = [fp, fp ^ (1 << 63), fp ^ 0xFFFFFFFFFFFFFFFF, 0x00FF00FF00FF00FF, 7, 7 ^ 0xFFFF << 48]
    banded = [array("I", keys) for keys in ([1, 2], [3, 4], [5, 6], [7, 8], [9, 8], [10, 11])]
    # 0 and 1 are within 3 bits; 3 and 4 share band 1; 4 and 5 share three of the four
    # 16-bit blocks but differ in 16 bits; 2 shares nothing
    assert simhashdb.rule.sharing(fps, banded, 3) == [True, True, False, True, True, False]
    none = [array("I")] * 6
    assert simhashdb.rule.sharing(fps, none, 3) == [True, True, False, False, False, False]
    assert simhashdb.rule.sharing(fps, none, 16) == [True, True, False, False, True, True]
    assert simhashdb.rule.sharing(fps[:1], banded[:1], 0) == [False]
    # 128 under one block, pairwise 4 bits or more apart: over GROUP_CHECKED, all counted in
    apart = [fp ^ (a << 56 | a << 48) for a in range(256) if a.bit_count() % 2 == 0]
    assert len(apart) > simhashdb.rule.GROUP_CHECKED
    assert simhashdb.rule.sharing(apart, [array("I")] * len(apart), 3) == [True] * len(apart)
    assert simhashdb.rule.sharing(apart[:60], [array("I")] * 60, 3) == [False] * 60
