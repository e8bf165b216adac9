"""DB's writes in batches: records cut into batches and checked, upserted
from records or arrays of keys and fingerprints, the insert-if-new
transaction (with its restamps of the hits), the time documents are stored
at, and the settling of what a call or a bulk load wrote in many batches."""

from __future__ import annotations

import contextlib
import threading
import time

from . import _ext, _records, results
from .errors import InvalidArgumentError
from .fingerprint import SIGNATURE_SIZES
from .results import Match
from .storage import no_cyclic_gc
from .records import (
    decode,
    decode_key,
    encode_documents,
    int_arrays,
    restamped,
    value_fingerprint,
    with_signature,
)


def _signed(value, signature, source, bits):
    """A document value with the text's ``signature`` (None: none) read from
    ``source``, in a database of signatures of ``bits``-bit bins (one of
    16-bit bins is narrowed to 8 where the database has 8)."""
    if signature is None:
        return value
    if not isinstance(signature, bytes) or len(signature) not in SIGNATURE_SIZES.values():
        raise InvalidArgumentError(
            "%s has signatures of other values than resemblance signatures (%d or %d bytes, "
            "from simhashdb.fingerprint_with_signature): rename that column or field"
            % (source, _ext.SIGNATURE_BYTES, _ext.WIDE_SIGNATURE_BYTES))
    if len(signature) < SIGNATURE_SIZES[bits]:
        raise InvalidArgumentError(
            "%s has signatures of 8-bit bins, and the database keeps those of 16 (it was "
            "made before simhashdb 0.15): import them into a new database" % source)
    return with_signature(value, _ext.narrow(signature) if bits == 8 else signature)


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
    With ``settle`` (the :class:`Writer` the batches are written through), once
    two or more have been written, it settles them."""
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


class Writer(threading.local):
    """The writes of DB's storing calls to ``storage``, counted for
    :meth:`DB.bulk_load`: a call of many batches settles what it wrote
    (Storage.settle) at its end, unless it is inside a bulk load of its
    thread, which settles what it counted once, at the end of its outermost
    block."""

    def __init__(self, storage):
        self.storage = storage
        self.depth = self.documents = self.transactions = 0

    def write(self, body, documents):
        """``storage.write(body, documents)``, counted, Python's cyclic GC
        paused (:func:`storage.no_cyclic_gc`)."""
        with no_cyclic_gc():
            result = self.storage.write(body, documents)
        self.documents += documents
        self.transactions += 1
        return result

    def settle(self, documents):
        """The end of a call that wrote ``documents`` in many batches."""
        if not self.depth:
            self.storage.settle(documents)

    @contextlib.contextmanager
    def bulk_load(self):
        """:meth:`DB.bulk_load`'s block."""
        if not self.depth:
            self.documents = self.transactions = 0
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if not self.depth and self.transactions > 1:
            self.storage.settle(self.documents)


def upsert_batches(writer, records, batch_size, encode):
    """Store ``records`` a batch of ``batch_size`` a transaction, each batch
    encoded by ``encode(batch, now)`` into (key, fingerprint, value)
    documents; returns how many were written."""
    written = 0
    for batch in _batches(records, batch_size, writer):
        documents = encode(batch, _now())
        writer.write(lambda txn: txn.upsert(documents), len(documents))
        written += len(documents)
    return written


def exported_documents(batch, max_key_bytes, now, source, check_recipe, signature_bits):
    """The documents of records as :meth:`DB.export_records` gives them (a
    fifth item: a text's signature, or None), for a database of signatures of
    ``signature_bits``-bit bins; ``check_recipe()`` is called once the
    signatures are checked, before any is kept."""
    whole = [isinstance(record, (tuple, list)) and len(record) == 5 for record in batch]
    signatures = [record[4] if five else None for record, five in zip(batch, whole)]
    documents = encode_documents([record[:4] if five else record
                                  for record, five in zip(batch, whole)], max_key_bytes, now)
    if not any(signatures):
        return documents
    signed = [(key, fp, _signed(value, theirs, source, signature_bits))
              for (key, fp, value), theirs in zip(documents, signatures)]
    check_recipe()
    return signed


def _restamp(txn, keys, now):
    """Record the documents of the encoded ``keys`` as stored ``now``, each as
    it is now (a hit found early in a batch may have been replaced since)."""
    keys = sorted(keys)
    documents = [(key, value_fingerprint(value), restamped(value, now))
                 for key, value in zip(keys, txn.get_many(keys)) if value is not None]
    if documents:
        txn.upsert(documents)


def insert_arrays(writer, records, batch_size, keys, fingerprints):
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
        writer.write(lambda txn: txn.upsert(batch), stop - start)
    if n > batch_size:
        writer.settle(n)
    return n


def store_if_new(writer, documents, store_new, refresh, now):
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

    replaced, statuses, found = writer.write(body, len(documents))
    return [(hits, status, old and decode(decode_key(key, old), old))
            for (key, _, _), hits, status, old in zip(documents, found, statuses, replaced)]
