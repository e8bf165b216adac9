"""What :meth:`simhashdb.DB.check` verifies of a database's contents: that
its fingerprint index, its permutation tables and its band index agree with
its documents (the backend checks its own files first)."""

from __future__ import annotations

import itertools
from array import array

from .errors import DatabaseError
from .records import decode_key, document_items, is_digest
from .storage import BANDS, band_entries

CHUNK = 1000  # documents whose index entries are read at once


def contents(view, tables, with_bands):
    """The disagreements in ``view`` (a storage View) of a database of
    ``tables`` permutation tables (and, ``with_bands``, a band index) with its
    documents, as messages: empty for a sound database."""
    problems = []
    docs, shared = 0, {}  # shared: the keys of fingerprints of more documents than a chunk
    banded = [array("Q") for _ in range(BANDS)] if with_bands else []
    documents = view.documents()
    while chunk := list(itertools.islice(documents, CHUNK)):  # the index read a chunk at a time
        docs += len(chunk)
        fps = []  # a list: a damaged key may repeat another's
        for key_bytes, value in chunk:
            try:
                fps.append(document_items(value)[0])
            except DatabaseError as exc:
                problems.append("document %r has a damaged record (%s)"
                                % (_shown_key(key_bytes), getattr(exc, "why", exc)))
                fps.append(None)
                continue
            for entries, entry in zip(banded, band_entries(value, fps[-1])):
                entries.append(entry)
        indexed = {fp: set(keys) for fp, keys in
                   view.keys_of_many(set(fps) - {None} - shared.keys()).items()}
        shared.update((fp, keys) for fp, keys in indexed.items() if len(keys) > CHUNK)
        indexed.update(shared)  # (a fingerprint of many documents is read once, not a chunk)
        for (key_bytes, value), fp in zip(chunk, fps):
            if fp is not None and key_bytes not in indexed[fp]:
                problems.append("document %r (fingerprint %d) is missing from the "
                                "fingerprint index" % (decode_key(key_bytes, value), fp))
    distinct, indexed = array("Q"), 0
    for fp, keys in view.fingerprint_groups():
        distinct.append(fp)
        indexed += len(keys)
    if indexed != docs:
        problems.append("the fingerprint index has %d entries for %d documents"
                        % (indexed, docs))
    expected = set(distinct)
    for table in range(tables):
        stored = view.table_fingerprints(table)
        if len(stored) != len(expected) or set(stored) != expected:
            missing = len(expected - set(stored))
            extra = len(set(stored) - expected)
            problems.append("table %d has %d entries for %d distinct fingerprints "
                            "(%d missing, %d extra)"
                            % (table, len(stored), len(expected), missing, extra))
    for band, entries in enumerate(banded):
        expected, stored = set(entries), set(view.band_entries(band))
        banded[band] = None
        if stored != expected:
            problems.append("band %d has %d entries for the %d of the text documents "
                            "(%d missing, %d extra)"
                            % (band, len(stored), len(expected),
                               len(expected - stored), len(stored - expected)))
    return problems


def _shown_key(key_bytes):
    """A stored key as a message shows it: decoded where it can be."""
    try:
        return decode_key(key_bytes) if not is_digest(key_bytes) else key_bytes
    except DatabaseError:
        return key_bytes
