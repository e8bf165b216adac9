"""N-grams and hailstorm n-gram selection, compatible with samecode 0.5.1."""

from __future__ import annotations

from binascii import crc32
from itertools import islice
from typing import Any, Iterable, Iterator, Union

from .errors import InvalidArgumentError


def ngrams(iterable: Iterable[Any], ngram_length: int) -> Iterator[tuple[Any, ...]]:
    """Tuples of each ``ngram_length`` consecutive items; none if there are fewer items.

    Unlike samecode, an iterator or generator input works too.
    """
    if not isinstance(ngram_length, int) or ngram_length < 1:
        raise InvalidArgumentError("ngram_length must be an int >= 1, got %r" % (ngram_length,))
    items = iterable if hasattr(iterable, "__getitem__") else list(iterable)
    return zip(*(islice(items, i, None) for i in range(ngram_length)))


def select_ngrams(ngrams: Iterable[tuple[Any, ...]], with_pos: bool = False
                  ) -> Iterator[Union[tuple[Any, ...], tuple[int, tuple[Any, ...]]]]:
    """Yield the ngrams the hailstorm algorithm selects.

    An ngram is selected where the smallest CRC32 of its items (``str`` items
    as UTF-8, others as the UTF-8 of ``str(item)``) is at its first or last
    position; the first and the last ngram are always selected. With
    ``with_pos``, yield ``(position, ngram)``. An empty input yields nothing.
    """
    last_selected = None
    item = None
    for pos, ngram in enumerate(ngrams):
        hashes = [crc32((g if isinstance(g, str) else str(g)).encode("utf-8")) for g in ngram]
        if not hashes:
            raise InvalidArgumentError("ngram %d is empty" % pos)
        item = (pos, ngram) if with_pos else ngram
        lowest = min(hashes)
        if pos == 0 or lowest in (hashes[0], hashes[-1]):
            yield item
            last_selected = item
    if item is not None and last_selected != item:
        yield item
