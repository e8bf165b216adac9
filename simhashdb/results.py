"""What :class:`simhashdb.DB`'s calls return: Matches, Pairs and Decisions,
made from the (key, fingerprint, distance[, resemblance]) hits of the
storage, their keys decoded and ordered."""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

from . import _ext
from .errors import (InvalidArgumentError, InvalidFingerprintError, InvalidKeyError,
                     InvalidMetadataError)
from .records import Record, decode_key, is_digest

Key = Union[str, bytes, int]


class Match(NamedTuple):
    """A stored document near a query: its key, fingerprint, and Hamming
    distance from the query's fingerprint."""

    key: Key
    fingerprint: int
    distance: int

    @property
    def resemblance(self) -> Optional[float]:
        """How alike a text match's texts are (estimated word 5-shingle
        Jaccard similarity, :func:`resemblance`); None for a fingerprint match."""
        return getattr(self, "_resemblance", None)


class TextMatch(Match):
    """A :class:`Match` found by the text rule: it also has its ``resemblance``
    (it is still a (key, fingerprint, distance) tuple)."""

    def __new__(cls, key: Key, fingerprint: int, distance: int,
                resemblance: Optional[float] = None) -> "TextMatch":
        match = super().__new__(cls, key, fingerprint, distance)
        match._resemblance = resemblance
        return match

    def __reduce__(self):
        return TextMatch, (*self, self.resemblance)

    def __repr__(self):
        return "TextMatch(key=%r, fingerprint=%r, distance=%r, resemblance=%.3f)" % (
            *self, self.resemblance)


class Pair(NamedTuple):
    """Two stored documents near each other (:meth:`DB.find_all`): their keys,
    in key order, and the Hamming distance of their fingerprints."""

    key_a: Key
    key_b: Key
    distance: int

    @property
    def resemblance(self) -> Optional[float]:
        """How alike a text pair's texts are (see :attr:`Match.resemblance`);
        None for a fingerprint pair."""
        return getattr(self, "_resemblance", None)


class TextPair(Pair):
    """A :class:`Pair` found by the text rule: it also has its ``resemblance``."""

    def __new__(cls, key_a: Key, key_b: Key, distance: int,
                resemblance: Optional[float] = None) -> "TextPair":
        pair = super().__new__(cls, key_a, key_b, distance)
        pair._resemblance = resemblance
        return pair

    def __reduce__(self):
        return TextPair, (*self, self.resemblance)

    def __repr__(self):
        return "TextPair(key_a=%r, key_b=%r, distance=%r, resemblance=%.3f)" % (
            *self, self.resemblance)


class Decision(list):
    """What an ``*_if_new`` call decided for one document: the list of the
    near-duplicates it found (Matches; TextMatches for texts), sorted by
    (distance, key), with the document's ``key``, its ``status`` and the
    ``reason`` of an invalid one (else None):

    - ``"stored"``: no near-duplicate; the document was written (the list is empty);
    - ``"unchanged"``: the document stored under the same key is a near-duplicate
      of it, and either the only one or identical (distance 0): nothing was
      written (with ``refresh``, its time only);
    - ``"duplicate"``: near-duplicates of other keys (the list): nothing written;
    - ``"invalid"``: the record cannot be stored (``reason`` says why); nothing
      written (the list is empty).

    ``replaced`` is the Record a stored document replaced under its key, or None.
    """

    def __init__(self, matches=(), key: Optional[Key] = None, status: str = "stored",
                 reason: Optional[str] = None, replaced: Optional[Record] = None) -> None:
        super().__init__(matches)
        self.key, self.status, self.reason, self.replaced = key, status, reason, replaced

    def __repr__(self):
        return "Decision(key=%r, status=%r, %s%s)" % (
            self.key, self.status, list.__repr__(self),
            "" if self.reason is None else ", reason=%r" % self.reason)


def names(view, found):
    """{stored key: key} of the keys of ``found`` (lists of hits): a long key's
    digest is read from its document in ``view`` (None where none is stored)."""
    keys = dict.fromkeys(hit[0] for hits in found for hit in hits)
    digests = [key for key in keys if is_digest(key)]
    named = {key: decode_key(key) for key in keys if not is_digest(key)}
    for key, value in zip(digests, view.get_many(digests) if digests else ()):
        named[key] = None if value is None else decode_key(key, value)
    return named


def matches(hits, names):
    """Matches of (key, fingerprint, distance) hits, or TextMatches of (key,
    fingerprint, distance, resemblance or None) ones, their keys as ``names``
    says, sorted by (distance, key)."""
    by_distance = sorted((hit[2], *key_order(names[hit[0]]), hit) for hit in hits)
    made = []
    for *_, key, hit in by_distance:
        if len(hit) == 3 or hit[3] is None:
            made.append(_new_tuple(Match, (key, hit[1], hit[2])))
        else:
            match = _new_tuple(TextMatch, (key, hit[1], hit[2]))
            match._resemblance = hit[3]
            made.append(match)
    return made


_new_tuple = tuple.__new__  # a Match without NamedTuple's __new__: the hot path of queries


INVALID_RECORD = (InvalidArgumentError, InvalidFingerprintError, InvalidKeyError,
                   InvalidMetadataError)


def check_invalid(invalid):
    if invalid not in ("raise", "report"):
        raise InvalidArgumentError('invalid must be "raise" or "report", got %s'
                                   % _ext.shown(invalid))


def each_valid(records, encode, invalid):
    """([(position, encode(record))] of the records ``encode`` takes, {position:
    reason} of those it refuses); with ``invalid="raise"``, the first refusal
    raises, naming the record's key."""
    valid, refused = [], {}
    for i, record in enumerate(records):
        try:
            valid.append((i, encode(record)))
        except INVALID_RECORD as exc:
            if invalid == "raise":
                raise type(exc)("record %d of the batch (key %s): %s"
                                % (i, _ext.shown(record_key(record)), exc)) from None
            refused[i] = str(exc)
    return valid, refused


def in_order(records, valid, refused, decided):
    """The Decisions of a batch's ``records``, in order: the ``decided``
    (matches, status, replaced) of the ``valid`` ones, and the ``refused``."""
    decisions = [None] * len(records)
    for (i, _), (hits, status, replaced) in zip(valid, decided):
        decisions[i] = Decision(hits, records[i][0], status, replaced=replaced)
    for i, reason in refused.items():
        decisions[i] = Decision((), record_key(records[i]), "invalid", reason)
    return decisions


def record_key(record):
    """A record's key, or None for a record that is not a tuple or list."""
    return record[0] if isinstance(record, (tuple, list)) and record else None


def status(key, hits):
    """The status of the encoded ``key`` whose near-duplicates are ``hits``."""
    if not hits:
        return "stored"
    own = [hit for hit in hits if hit[0] == key]
    if own and (len(hits) == 1 or own[0][2] == 0):
        return "unchanged"
    return "duplicate"


def key_order(key):
    return (isinstance(key, bytes), isinstance(key, str), key)


def sorted_keys(view, encoded_keys):
    return sorted((decode_key(k, view.get(k) if is_digest(k) else None) for k in encoded_keys),
                  key=key_order)


def ordered(a, b):
    return (a, b) if key_order(a) <= key_order(b) else (b, a)


def size_of(stats):
    """The ``<where>_bytes`` item of :meth:`DB.stats` (or of a backend's info):
    (its name, the bytes the database takes where its backend keeps it)."""
    return next((name, value) for name, value in stats.items() if name.endswith("_bytes"))
