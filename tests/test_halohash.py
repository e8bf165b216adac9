import pytest
from bitarray import bitarray
from hypothesis import given
from hypothesis import strategies as st
from samecode import halohash as samecode_halo

from simhashdb import InvalidArgumentError
from simhashdb.halohash import (
    BitAverageHaloHash,
    bit_to_num,
    bitarray_from_bytes,
    byte_hamming_distance,
    common_chunks,
    common_chunks_from_hexdigest,
    decode_vector,
    hamming_distance,
    slices,
)

SIZES = [32, 64, 128, 160, 256, 384, 512]
AT = b"""The value specified for size must be at
least as large as for the smallest bit vector possible for intVal""".split()
NO = b"""The value specified for size must be no
more larger than the smallest bit vector possible for intVal""".split()
BY = b"""The value specified for size must be at
least as large as for the smallest bit vector possible by intVal""".split()


def updated(words, size):
    h = BitAverageHaloHash(size_in_bits=size)
    for w in words:
        h.update(w)
    return h


def test_seed_003_doctest_values():
    a = BitAverageHaloHash(AT, size_in_bits=256)
    assert len(a.digest()) == 32
    b = BitAverageHaloHash(NO, size_in_bits=256)
    assert a.distance(b) == 57 and b.distance(a) == 57
    a, b = updated(AT, 160), updated(NO, 160)
    assert a.hexdigest() == b"2c10223104c43470e10b1157e6415b2f730057d0"
    assert b.hexdigest() == b"2c912433c4c624e0b03b34576641df8fe00017d0"
    assert a.distance(b) == 29
    a, b = updated(AT, 128), updated(NO, 128)
    assert a.hexdigest() == b"028b1699c0c5310cd1b566a893d12f10"
    assert b.hexdigest() == b"0002969060d5b344d1b7602cd9e127b0"
    assert a.distance(b) == 27
    a, b = updated(AT, 64), updated(NO, 64)
    assert a.hexdigest() == b"028b1699c0c5310c"
    assert b.hexdigest() == b"0002969060d5b344"
    assert a.distance(b) == 14
    assert updated(AT, 32).distance(updated(BY, 32)) == 5
    assert updated(AT, 512).distance(updated(BY, 512)) == 46


def test_seed_003_helper_examples():
    assert hamming_distance(bitarray("0001010111100001111"), bitarray("0001010111100001111")) == 0
    assert hamming_distance(bitarray("11110000"), bitarray("00001111")) == 8
    assert hamming_distance(bitarray("11110000"), bitarray("00110011")) == 4
    assert slices([1, 2, 3, 4, 5, 6], 2) == [(1, 2), (3, 4), (5, 6)]
    assert slices([1, 2, 3, 4, 5, 6], 3) == [(1, 2, 3), (4, 5, 6)]
    with pytest.raises(InvalidArgumentError):
        slices([1, 2, 3, 4, 5, 6], 4)
    a, b = "1f22c2c871cd70521211b138cd76fc04", "1f22c2c871cd7852121bbd38c576bc84"
    assert common_chunks_from_hexdigest(a, b, 32) == 1
    assert byte_hamming_distance(a, b) == 8
    m1 = b"The value specified for size must be at least as large".split()
    m2 = b"The value specific for size must be at least as large".split()
    a = BitAverageHaloHash(msg=m1, size_in_bits=256)
    b = BitAverageHaloHash(msg=m2, size_in_bits=256)
    assert common_chunks(a, b, 2) == 1
    assert byte_hamming_distance(a.hexdigest(), b.hexdigest()) == 32


features = st.lists(st.binary(min_size=1, max_size=12), max_size=25)


@given(features, st.sampled_from(SIZES))
def test_matches_samecode(msg, size):
    ours = BitAverageHaloHash(msg, size_in_bits=size)
    theirs = samecode_halo.BitAverageHaloHash(msg, size_in_bits=size)
    assert ours.digest() == theirs.digest()
    assert ours.hexdigest() == theirs.hexdigest()
    assert ours.b64digest() == theirs.b64digest()
    assert ours.hash() == theirs.hash()
    assert list(ours.columns) == theirs.columns
    assert ours.digest_size == theirs.digest_size
    assert bit_to_num(ours.hash()) == samecode_halo.bit_to_num(theirs.hash())
    assert decode_vector(ours.b64digest()) == samecode_halo.decode_vector(theirs.b64digest())


@given(features, features, st.sampled_from(SIZES), st.sampled_from([1, 2, 4]))
def test_distances_and_chunks_match_samecode(m1, m2, size, chunk):
    a, b = BitAverageHaloHash(m1, size_in_bits=size), BitAverageHaloHash(m2, size_in_bits=size)
    sa = samecode_halo.BitAverageHaloHash(m1, size_in_bits=size)
    sb = samecode_halo.BitAverageHaloHash(m2, size_in_bits=size)
    assert a.distance(b) == sa.distance(sb) == hamming_distance(a, b)
    assert common_chunks(a, b, chunk) == samecode_halo.common_chunks(sa, sb, chunk)
    assert common_chunks_from_hexdigest(a.hexdigest(), b.hexdigest(), 8 * chunk) == \
        samecode_halo.common_chunks_from_hexdigest(sa.hexdigest(), sb.hexdigest(), 8 * chunk)
    assert byte_hamming_distance(a.hexdigest(), b.hexdigest()) == \
        samecode_halo.byte_hamming_distance(sa.hexdigest(), sb.hexdigest())


@given(st.lists(features, min_size=1, max_size=5), st.sampled_from(SIZES))
def test_combine_equals_hashing_everything_at_once(parts, size):
    combined = BitAverageHaloHash.combine([BitAverageHaloHash(p, size_in_bits=size) for p in parts])
    everything = BitAverageHaloHash([f for p in parts for f in p], size_in_bits=size)
    assert combined.digest() == everything.digest()
    assert combined.elements_count == everything.elements_count


def test_bad_input():
    with pytest.raises(InvalidArgumentError, match="size_in_bits"):
        BitAverageHaloHash(size_in_bits=100)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        BitAverageHaloHash(["text"])
    with pytest.raises(InvalidArgumentError, match="sizes"):
        BitAverageHaloHash.combine([BitAverageHaloHash(size_in_bits=32), BitAverageHaloHash()])
    with pytest.raises(InvalidArgumentError):
        BitAverageHaloHash.combine([])
    with pytest.raises(InvalidArgumentError, match="64 bits"):
        BitAverageHaloHash(size_in_bits=64).distance(BitAverageHaloHash(size_in_bits=32))
    assert bitarray_from_bytes(b"\x80").to01() == "10000000"
