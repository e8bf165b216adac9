"""Bit-average halo hashes of 32 to 512 bits, compatible with samecode 0.5.1.

Usage::

    >>> a = BitAverageHaloHash(b"the quick brown fox".split(), size_in_bits=64)
    >>> b = BitAverageHaloHash(b"the quick brown cat".split(), size_in_bits=64)
    >>> a.distance(b) <= 64
    True

Each feature is hashed (truncated MD5 up to 128 bits, SHA-1 for 160, SHA-2
above); column i gains +1 where bit i of that hash is 0 and -1 where it is 1,
and the digest has bit i set where column i is positive.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from array import array
from typing import Any, Iterable, Sequence, Union

from bitarray import bitarray
from bitarray.util import count_xor

from . import _text
from .errors import InvalidArgumentError

_HASHERS = {
    32: hashlib.md5,
    64: hashlib.md5,
    128: hashlib.md5,
    160: hashlib.sha1,
    256: hashlib.sha256,
    384: hashlib.sha384,
    512: hashlib.sha512,
}


class BitAverageHaloHash:
    """A bit matrix averaging hash; ``msg`` is bytes or a list/tuple of bytes."""

    def __init__(self, msg: Union[bytes, list[bytes], tuple[bytes, ...], None] = None,
                 size_in_bits: int = 128) -> None:
        if size_in_bits not in _HASHERS:
            raise InvalidArgumentError(
                "size_in_bits must be one of %s, got %r" % (sorted(_HASHERS), size_in_bits))
        self.size_in_bits = size_in_bits
        self.columns = array("q", bytes(8 * size_in_bits))
        self.elements_count = 0
        self._hasher = _HASHERS[size_in_bits]
        self.update(msg)

    @property
    def digest_size(self) -> int:
        """Digest size in bytes."""
        return self.size_in_bits // 8

    def update(self, msg: Union[bytes, list[bytes], tuple[bytes, ...], None]) -> None:
        """Add a bytestring, or each bytestring of a list or tuple; empty ones add nothing."""
        if not msg:
            return
        for item in msg if isinstance(msg, (list, tuple)) else (msg,):
            if not isinstance(item, (bytes, bytearray)):
                raise InvalidArgumentError(
                    "halo hash features must be bytes, got %s %r" % (type(item).__name__, item))
            if item:
                _text.halo_add(self.columns, self._hasher(item).digest())
                self.elements_count += 1

    def digest(self) -> bytes:
        """The hash as bytes."""
        return _text.halo_digest(self.columns)

    def hexdigest(self) -> bytes:
        """The hash as hex-encoded bytes."""
        return binascii.hexlify(self.digest())

    def b64digest(self) -> bytes:
        """The hash as URL-safe base64 bytes."""
        return base64.urlsafe_b64encode(self.digest())

    def distance(self, other: BitAverageHaloHash) -> int:
        """Hamming distance, in bits, to another halo hash of the same size."""
        if not isinstance(other, BitAverageHaloHash) or other.size_in_bits != self.size_in_bits:
            raise InvalidArgumentError(
                "expected a BitAverageHaloHash of %d bits, got %r" % (self.size_in_bits, other))
        return int.from_bytes(self.digest(), "big").__xor__(
            int.from_bytes(other.digest(), "big")).bit_count()

    def hash(self) -> bitarray:
        """The hash as a bitarray."""
        return bitarray_from_bytes(self.digest())

    @classmethod
    def combine(cls, hashes: Iterable[BitAverageHaloHash]) -> BitAverageHaloHash:
        """A new hash whose columns are the sums of the columns of ``hashes``."""
        hashes = list(hashes)
        if not hashes or not all(isinstance(h, cls) for h in hashes):
            raise InvalidArgumentError("combine expects a non-empty list of BitAverageHaloHash")
        size = hashes[0].size_in_bits
        if any(h.size_in_bits != size for h in hashes):
            raise InvalidArgumentError(
                "cannot combine hashes of sizes %s" % sorted({h.size_in_bits for h in hashes}))
        combined = cls(size_in_bits=size)
        for h in hashes:
            for i, column in enumerate(h.columns):
                combined.columns[i] += column
            combined.elements_count += h.elements_count
        return combined


def bitarray_from_bytes(b: bytes) -> bitarray:
    """A bitarray of the bits of bytes ``b``, most significant first."""
    bits = bitarray()
    bits.frombytes(bytes(b))
    return bits


def byte_hamming_distance(b1: Union[bytes, str], b2: Union[bytes, str]) -> int:
    """Hamming distance between two hex-encoded byte strings."""
    return hamming_distance(bitarray_from_bytes(binascii.unhexlify(b1)),
                            bitarray_from_bytes(binascii.unhexlify(b2)))


def hamming_distance(bv1: Union[bitarray, BitAverageHaloHash],
                     bv2: Union[bitarray, BitAverageHaloHash]) -> int:
    """Hamming distance between two bitarrays of equal length, or two halo hashes."""
    if isinstance(bv1, BitAverageHaloHash):
        bv1 = bv1.hash()
    if isinstance(bv2, BitAverageHaloHash):
        bv2 = bv2.hash()
    if len(bv1) != len(bv2):
        raise InvalidArgumentError(
            "bit vectors differ in length: %d and %d" % (len(bv1), len(bv2)))
    return int(count_xor(bv1, bv2))


def slices(s: Sequence[Any], size: int) -> list[tuple[Any, ...]]:
    """Non-overlapping tuples of ``size`` items of sequence ``s``.

    :raises InvalidArgumentError: where ``len(s)`` is not a multiple of ``size``
        (samecode raises AssertionError, which ``python -O`` would skip).
    """
    if not isinstance(size, int) or size < 1 or len(s) % size:
        raise InvalidArgumentError(
            "slice size %r does not divide a sequence of length %d" % (size, len(s)))
    return list(zip(*[iter(s)] * size))


def common_chunks_from_hexdigest(h1: Union[bytes, str], h2: Union[bytes, str],
                                 chunk_bytes_length: int = 4) -> int:
    """Count the equal chunks of ``chunk_bytes_length`` bits (samecode's unit,
    despite the name) of two hex digests."""
    h1 = slices(bitarray_from_bytes(binascii.unhexlify(h1)), chunk_bytes_length)
    h2 = slices(bitarray_from_bytes(binascii.unhexlify(h2)), chunk_bytes_length)
    return sum(1 for a, b in zip(h1, h2) if a == b)


def common_chunks(h1: BitAverageHaloHash, h2: BitAverageHaloHash,
                  chunk_bytes_length: int = 4) -> int:
    """Count the equal chunks of ``chunk_bytes_length`` bytes of two halo hashes."""
    h1 = slices(h1.digest(), chunk_bytes_length)
    h2 = slices(h2.digest(), chunk_bytes_length)
    return sum(1 for a, b in zip(h1, h2) if a == b)


def bit_to_num(bits: bitarray) -> int:
    """The int whose binary digits are the bitarray ``bits``."""
    return int(bits.to01() or "0", 2)


def decode_vector(b64_str: Union[bytes, str]) -> bitarray:
    """The bitarray of a URL-safe (or standard) base64 string."""
    if isinstance(b64_str, str):
        b64_str = b64_str.encode("ascii")
    return bitarray_from_bytes(base64.standard_b64decode(
        b64_str.replace(b"-", b"+").replace(b"_", b"/")))
