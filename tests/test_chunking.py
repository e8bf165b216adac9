from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st
from samecode import chunking as samecode_chunking

from simhashdb import InvalidArgumentError
from simhashdb.chunking import ngrams, select_ngrams

SEED_NGRAMS = [(2, 1, 3), (1, 1, 3), (5, 1, 3), (2, 6, 1), (7, 3, 4)]


def test_seed_003_ngram_examples():
    assert list(ngrams([1, 2, 3, 4, 5], 2)) == [(1, 2), (2, 3), (3, 4), (4, 5)]
    assert list(ngrams([1, 2, 3, 4, 5], 4)) == [(1, 2, 3, 4), (2, 3, 4, 5)]
    assert list(ngrams([1, 2, 3, 4], 2)) == [(1, 2), (2, 3), (3, 4)]
    assert list(ngrams([1, 2, 3], 2)) == [(1, 2), (2, 3)]
    assert list(ngrams([1, 2], 2)) == [(1, 2)]
    assert list(ngrams([1], 2)) == []
    assert list(ngrams(array("h", [1, 2, 3, 4, 5]), 2)) == [(1, 2), (2, 3), (3, 4), (4, 5)]
    assert list(ngrams(tuple([1, 2, 3, 4, 5]), 2)) == [(1, 2), (2, 3), (3, 4), (4, 5)]


def test_seed_003_select_ngrams_examples():
    assert list(select_ngrams(SEED_NGRAMS)) == SEED_NGRAMS
    assert list(select_ngrams(SEED_NGRAMS, with_pos=True)) == list(enumerate(SEED_NGRAMS))
    assert list(select_ngrams(x for x in SEED_NGRAMS)) == SEED_NGRAMS


def test_empty_input_and_generators():
    assert list(select_ngrams([])) == []
    assert list(select_ngrams([], with_pos=True)) == []
    assert list(ngrams([], 3)) == []
    assert list(ngrams(iter([1, 2, 3]), 2)) == [(1, 2), (2, 3)]
    with pytest.raises(InvalidArgumentError, match="ngram_length"):
        ngrams([1, 2], 0)


items = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.binary(max_size=2))


@given(st.lists(items, max_size=30), st.integers(1, 5), st.booleans())
def test_matches_samecode(tokens, n, with_pos):
    grams = list(ngrams(tokens, n))
    assert grams == list(samecode_chunking.ngrams(tokens, n))
    if grams:
        assert list(select_ngrams(grams, with_pos)) == \
            list(samecode_chunking.select_ngrams(grams, with_pos))
