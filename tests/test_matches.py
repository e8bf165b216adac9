"""Matches are built natively from a search's hits (keys decoded, sorted by
(distance, key), as Match tuples); the Python reading stays for long keys and
text hits. Both must give the same lists, and queries the oracle's."""

import random

from hypothesis import given, strategies as st

import simhashdb
from simhashdb import Decision, Match, _records
from simhashdb.results import matches as _matches, names as _names
from simhashdb.records import encode_key
from conftest import brute_force, flip

KEYS = st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=300),
                 st.binary(max_size=300))
EDGE_INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
             2**64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63]
HITS = st.lists(st.tuples(st.one_of(KEYS, st.sampled_from(EDGE_INTS)),
                          st.integers(0, 2**64 - 1), st.integers(0, 64)),
                max_size=80, unique_by=lambda hit: (type(hit[0]), hit[0]))


def python_matches(found):
    names = _names(None, found)
    return [_matches(hits, names) for hits in found]


@given(st.lists(HITS, max_size=5))
def test_native_matches_are_the_python_ones(probes):
    found = [[(encode_key(key, 10**6), fp, d) for key, fp, d in hits] for hits in probes]
    native = _records.matches(found, Match)
    expected = python_matches(found)
    assert native == expected
    assert [[type(m) for m in ms] for ms in native] == [[Match] * len(ms) for ms in expected]
    assert [[type(m.key) for m in ms] for ms in native] == \
        [[type(m.key) for m in ms] for ms in expected]
    assert [[hash(m) for m in ms] for ms in native] == [[hash(m) for m in ms] for ms in expected]


def test_native_matches_hash_as_the_tuples_they_equal():
    """A native Match is a tuple in sets and dicts: its hash is its tuple's
    (Python 3.14 caches a tuple's hash in the tuple, not yet computed when made)."""
    hits = [(encode_key(key), fp, d) for key, fp, d in [(7, 2**63 + 5, 2), ("a", 3, 0), (b"x", 9, 1)]]
    native = _records.matches([hits], Match)[0]
    assert [hash(m) for m in native] == [hash(tuple(m)) for m in native]
    assert set(native) == {tuple(m) for m in native} and len({hash(m) for m in native}) == 3


def test_a_decision_is_the_list_of_its_matches():
    match = Match("a", 1, 0)
    decision = Decision([match], "b", "duplicate")
    assert decision == [match] and decision.replaced is None and decision.reason is None
    assert (decision.key, decision.status) == ("b", "duplicate")
    assert Decision([], "a", replaced="old").replaced == "old"
    assert repr(Decision([], "k", "invalid", "no words")) == \
        "Decision(key='k', status='invalid', [], reason='no words')"


def test_long_keys_and_text_hits_are_left_to_python():
    assert _records.matches([[(encode_key("x" * 600), 1, 0)]], Match) is None  # a digest
    assert _records.matches([[(encode_key(1), 1, 0, 0.5)]], Match) is None
    assert _records.matches([[(b"\xc1", 1, 0)]], Match) is None  # not a key msgpack writes
    assert _records.matches([[(b"\xa2a", 1, 0)]], Match) is None  # cut short


def test_queries_of_every_kind_of_key_match_the_oracle(db_path, backend):
    rng = random.Random(5)
    base = rng.getrandbits(64)
    keys = EDGE_INTS + ["", "é", "z" * 40, "long" * 200, b"", b"\x00", b"\xff" * 300,
                        b"long" * 200]
    docs = {key: flip(base, rng.sample(range(64), rng.randint(0, 4))) for key in keys}
    with simhashdb.DB(db_path, distance=3, blocks=5, backend=backend) as db:
        db.insert_many(docs.items())
        probes = [base, flip(base, [3]), docs["é"], rng.getrandbits(64)]
        for probe, matches in zip(probes, db.query_many(probes)):
            assert [tuple(m) for m in matches] == brute_force(docs, probe, 3)
            assert [type(m.key) for m in matches] == [type(k) for k, _, _ in
                                                     brute_force(docs, probe, 3)]
