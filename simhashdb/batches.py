"""DB's writes in batches: records cut into batches and checked, arrays of
keys and fingerprints upserted, the insert-if-new transaction (with its
restamps of the hits), and the time documents are stored at."""

from __future__ import annotations

import time

from . import _ext, _records, results
from .errors import InvalidArgumentError
from .results import Match
from .records import (
    decode,
    decode_key,
    int_arrays,
    restamped,
    value_fingerprint,
    with_signature,
)


def _signed(value, signature, source):
    """A document value with the text's ``signature`` (None: none) read from
    ``source``."""
    if signature is None:
        return value
    if not isinstance(signature, bytes) or len(signature) != _ext.SIGNATURE_BYTES:
        raise InvalidArgumentError(
            "%s has signatures of other values than resemblance signatures (%d bytes, from "
            "simhashdb.fingerprint_with_signature): rename that column or field"
            % (source, _ext.SIGNATURE_BYTES))
    return with_signature(value, signature)


def _text_record(record):
    if not isinstance(record, (tuple, list)) or len(record) not in (2, 3):
        raise InvalidArgumentError("expected a (key, text) or (key, text, meta) record, got %r"
                                   % (record,))
    return record[0], record[1], record[2] if len(record) == 3 else None


def _check_batch_size(size):
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise InvalidArgumentError("batch_size must be an int >= 1, got %s" % _ext.shown(size))


def _batches(items, size, settle=None):
    """Lists of ``size`` items (the last may be shorter); arguments checked now.
    With ``settle`` (a storage the batches are written to), once two or more
    have been written, it settles them (see Storage.settle)."""
    _check_batch_size(size)
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise InvalidArgumentError("expected an iterable of records or keys, got %s"
                                   % _ext.shown(items))
    return _chunks(items, size, settle)


def _chunks(items, size, settle):
    batch, given = [], 0
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch, given = [], given + size
    if batch:
        yield batch
    if settle is not None and given + len(batch) > size:
        settle.settle(given + len(batch))


def _now():
    return int(time.time())


def _restamp(txn, keys, now):
    """Record the documents of the encoded ``keys`` as stored ``now``, each as
    it is now (a hit found early in a batch may have been replaced since)."""
    keys = sorted(keys)
    documents = [(key, value_fingerprint(value), restamped(value, now))
                 for key, value in zip(keys, txn.get_many(keys)) if value is not None]
    if documents:
        txn.upsert(documents)


def insert_arrays(storage, records, batch_size, keys, fingerprints):
    if records is not None:
        raise InvalidArgumentError("insert_many takes records, or keys= and fingerprints=, "
                                   "not both (arrays hold no metadata: insert records with "
                                   "metadata as tuples)")
    if keys is None or fingerprints is None:
        raise InvalidArgumentError("insert_many takes keys= and fingerprints= together")
    _check_batch_size(batch_size)
    n, encode = int_arrays(keys, fingerprints)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        batch = encode(start, stop, _now())
        storage.write(lambda txn: txn.upsert(batch), stop - start)
    if n > batch_size:
        storage.settle(n)
    return n


def store_if_new(storage, documents, store_new, refresh, now):
    """In one transaction: ``store_new(txn)`` stores each of the encoded
    (key, fingerprint, value) ``documents`` that has no near-duplicate and
    returns the hits of each; with ``refresh``, the hits are recorded as
    stored ``now``. Returns (matches, status, the Record it replaced or
    None) per document."""
    if not documents:
        return []

    def body(txn):
        keys = [key for key, _, _ in documents]
        stored = dict(zip(keys, txn.get_many(keys)))  # before the batch
        found = store_new(txn)
        if refresh:
            _restamp(txn, {hit[0] for hits in found for hit in hits}, now)
        replaced, statuses = [], []
        for (key, _, value), hits in zip(documents, found):
            replaced.append(None if hits else stored[key])
            statuses.append(results.status(key, hits))
            if not hits:
                stored[key] = value
        matches = _records.matches(found, Match)
        if matches is None:  # long keys or text hits: names read in the transaction
            names = results.names(txn, found)
            matches = [results.matches(hits, names) for hits in found]
        return replaced, statuses, matches

    replaced, statuses, found = storage.write(body, len(documents))
    return [(hits, status, old and decode(decode_key(key, old), old))
            for (key, _, _), hits, status, old in zip(documents, found, statuses, replaced)]
