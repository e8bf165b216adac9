"""simhashdb.rule, the one text rule: its vector form (Spark's) decides as its
pair-at-a-time form, and the database's find_all, the in-memory
matching.text_pairs and the oracle of tests/test_text_rule.py give the same
pairs of a small corpus."""

import random

import pytest

import simhashdb
from simhashdb import _ext, matching, rule
from simhashdb.layout import Layout
from test_text_rule import DISTANCE, THRESHOLD, corpus, oracle

numpy = pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def signed():
    """(key, fingerprint, signature) of the corpus of tests/test_text_rule.py."""
    return [(key, *simhashdb.fingerprint_with_signature(text)) for key, text in corpus(1)]


def test_the_threshold_is_checked():
    assert rule.check_threshold(None) == THRESHOLD == rule.THRESHOLD
    assert rule.check_threshold(0) == 0 and rule.check_threshold(1.0) == 1.0
    for bad in (-0.1, 1.5, True, "0.5", float("nan")):
        with pytest.raises(simhashdb.InvalidArgumentError):
            rule.check_threshold(bad)


def test_resemblances_of_rows_equal_the_resemblance_of_each_pair(signed):
    rows = numpy.frombuffer(b"".join(s for _, _, s in signed), numpy.uint8).reshape(
        -1, _ext.SIGNATURE_BYTES)
    rng = random.Random(2)
    a = numpy.array([rng.randrange(len(signed)) for _ in range(300)])
    b = numpy.array([rng.randrange(len(signed)) for _ in range(300)])
    expected = [simhashdb.resemblance(signed[i][2], signed[j][2]) for i, j in zip(a, b)]
    assert rule.resemblances(rows, a, b).tolist() == pytest.approx(expected, abs=0)


def test_kept_pairs_keep_what_judge_keeps(signed):
    """Every combination of text or not, banded or not, near or not, score
    below or at least the threshold, against the one-pair rule."""
    sig = signed[0][2]
    other = next(s for _, _, s in signed if not _ext.shares_a_band(s, sig))
    cases = []
    for texts in (False, True):
        for theirs in ((sig, other) if texts else (None,)):
            for near in (False, True):
                banded = texts and _ext.shares_a_band(sig, theirs)
                score = rule.judge(near, sig, _ext.bands(sig), theirs, rule.text_rule())
                kept = score is not False
                cases.append((texts, banded, near, _ext.banded_resemblance(sig, theirs, True)
                              if texts else numpy.nan, kept))
    texts, banded, near, scores, expected = (numpy.array(c) for c in zip(*cases))
    passed = scores >= THRESHOLD
    assert rule.kept_pairs(texts, banded, near, passed).tolist() == expected.tolist()
    assert expected.any() and not expected.all()


def test_the_database_in_memory_and_the_oracle_pair_the_same_texts(tmp_path, signed):
    keys = [key for key, _, _ in signed]
    fps = [fp for _, fp, _ in signed]
    signatures = [s for _, _, s in signed]
    signatures[3] = None  # a document without text
    expected = oracle(dict(zip(keys, signatures)), dict(zip(keys, fps)))
    in_memory = {tuple(sorted((keys[i], keys[j])))
                 for i, j, _ in matching.text_pairs(fps, signatures, Layout(DISTANCE + 1, DISTANCE),
                                                    THRESHOLD)}
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.import_records((key, fp, None, None, s) for key, fp, s in zip(keys, fps, signatures))
        stored = {(p.key_a, p.key_b) for p in db.find_all()}
    assert expected and in_memory == expected == stored
