"""DB: the database of documents and their fingerprints, on any backend:
upserts, insert-if-new, text decisions, retention, queries, all pairs."""

from __future__ import annotations

import datetime
import itertools
import os
import sys
from array import array
from typing import Any, ContextManager, Iterable, Iterator, Literal, Optional, Union, overload

from . import _ext, _records, batches, check, pairs, params, results, rule
from .batches import (Writer, _batches, _check_batch_size, _text_record, exported_documents,
                      insert_arrays, store_if_new, upsert_batches)
from .errors import (
    DatabaseError,
    InvalidArgumentError,
    KeyNotFoundError,
    ParameterMismatchError,
)
from .fingerprint import RECIPE, RECIPES, Html, fingerprint_with_signature, recipe_named
from .params import FORMAT_VERSION  # noqa: F401 (simhashdb.db.FORMAT_VERSION, as before)
from .results import Decision, Key, Match, Pair, TextMatch, size_of
from .rule import text_rule as _threshold
from .records import (
    Record,
    decode,
    decode_key,
    encode_documents,
    encode_key,
    hit_arrays,
    signature as stored_signature,
    stored_at,
    whole_seconds,
    with_signature,
)
from .storage.registry import makes_files, open_storage

DEFAULT_BATCH_SIZE = 100_000

When = Union[datetime.datetime, int, float]
RecordLike = Union["tuple[Key, int]", "tuple[Key, int, Any]", "tuple[Key, int, Any, When]"]
Text = Union[str, bytes]
TextRecordLike = Union["tuple[Key, Text]", "tuple[Key, Text, Any]"]


class DB:
    """A persistent store of documents' 64-bit fingerprints, queried by Hamming distance.

    Dict-like where it reads like a dict: ``db[key]`` (a :class:`Record`, or
    KeyNotFoundError), ``key in db``, ``len(db)``; iterating gives Records.

    Usage::

        with simhashdb.DB("crawl.db", distance=3) as db:
            db.insert("https://example.com/", fingerprint)
            db.query(other_fingerprint)   # [Match(key, fingerprint, distance), ...]

    A new database stores its parameters; reopening uses them.

    :param path: the database directory; created if missing (in a directory that exists).
    :param int distance: the most bits a near-duplicate's fingerprint differs
        in, the default of :meth:`insert_if_new` and queries, which may ask for
        more (default: 3 for a new database, the stored value for an existing one).
    :param int blocks: blocks per fingerprint, more than ``table_distance``
        (default: chosen with ``table_distance`` from ``distance``,
        ``expected_size`` and this machine's memory, see :meth:`Layout.choose`).
    :param int table_distance: the distance the tables are built for, at most
        ``distance``: a query within it costs one range scan a table, one
        beyond it scans each table at every prefix within the bits left
        (default: ``distance`` where ``blocks`` is given, else chosen).
    :param bool readonly: open without write access (default: False).
    :param int expected_size: documents you expect, to choose the layout
        (default: 10,000,000).
    :param str recipe: the name of the recipe that made the fingerprints, e.g.
        ``simhashdb.RECIPE`` for :func:`fingerprint`'s defaults (simhashdb's
        recipes may be named by their first part, ``"simhashdb-3"``); stored, and
        checked on every later open that names one, so that fingerprints of
        different recipes are never mixed (default: None, unnamed).
    :param backend: ``"lmdb"`` (native, the default where built), ``"py-lmdb"``,
        or a :class:`simhashdb.storage.Storage` (default: ``$SIMHASHDB_BACKEND``).
    :param bool create: make the database if there is none (default: True);
        with False, a missing database is a DatabaseNotFoundError.
    :raises ParameterMismatchError: explicit parameters (or recipe) differ from
        the stored ones.
    :raises FormatVersionError: the database was written by a newer simhashdb.
    :raises DatabaseNotFoundError: no database at ``path`` (``readonly`` or not ``create``).
    :raises DatabaseError: the path is a file, or is not a simhashdb database.
    """

    def __init__(self, path: Union[str, bytes, os.PathLike], distance: Optional[int] = None,
                 blocks: Optional[int] = None, readonly: bool = False,
                 expected_size: Optional[int] = None, recipe: Optional[str] = None,
                 backend: Any = None, create: bool = True,
                 table_distance: Optional[int] = None) -> None:
        try:
            path = os.fsdecode(path)  # str, bytes or os.PathLike: a str, as os.listdir names it
        except TypeError:
            raise InvalidArgumentError("path must be a directory's path (str, bytes or "
                                       "os.PathLike) or a URL, got %s" % _ext.shown(path)) from None
        if "\0" in path:
            raise InvalidArgumentError("path %r holds a NUL character" % path)
        params.check_layout_arguments(distance=distance, blocks=blocks,
                                      expected_size=expected_size, table_distance=table_distance)
        if recipe is not None and not isinstance(recipe, str):
            raise InvalidArgumentError("recipe must be a str (a recipe's name), got %s"
                                       % _ext.shown(recipe))
        if recipe is not None:
            recipe = recipe_named(recipe)
        if create and not readonly and makes_files(path):
            # refused before any file is made:
            params.new_layout(distance, blocks, expected_size, table_distance)
        self._storage = open_storage(path, readonly=readonly, create=create, backend=backend)
        try:
            self._distance, self._layout, self.recipe, self._format, self._signature_bits = \
                params.open_params(self._storage, distance, blocks, expected_size, recipe,
                                   table_distance)
        except BaseException:
            self._storage.close()
            raise
        self.path = self._storage.path
        self._writer = Writer(self._storage)  # the storing calls' writes

    @property
    def distance(self) -> int:
        """The most bits a near-duplicate's fingerprint differs in (queries
        may ask for more, at a cost)."""
        return self._distance

    @property
    def table_distance(self) -> int:
        """The distance the tables are built for: at most :attr:`distance`;
        below it, a query scans each table at several prefixes."""
        return self._layout.distance

    @property
    def blocks(self) -> int:
        """Blocks per fingerprint."""
        return self._layout.blocks

    @property
    def tables(self) -> int:
        """Permutation tables: C(blocks, table_distance); each holds every distinct
        fingerprint."""
        return self._layout.tables

    @property
    def backend(self) -> str:
        """The name of the storage backend."""
        return self._storage.backend

    # Writes

    def insert(self, key: Key, fingerprint: int, meta: Any = None) -> None:
        """Store a document; an existing ``key`` is replaced (upsert)."""
        self.insert_many([(key, fingerprint, meta)])

    def insert_many(self, records: Optional[Iterable[RecordLike]] = None,
                    batch_size: int = DEFAULT_BATCH_SIZE, *, keys: Any = None,
                    fingerprints: Any = None) -> int:
        """Store ``(key, fingerprint)``, ``(key, fingerprint, meta)`` or
        ``(key, fingerprint, meta, stored_at)`` records (``stored_at``: a UNIX
        time or datetime, as :class:`Record` gives it; default: now).

        Or, in place of ``records``, ``keys=`` (a 1-d integer array, numpy or
        array.array, of keys in [0, 2**64)) and ``fingerprints=`` (a uint64
        array) of the same length: stored as the records ``zip(keys,
        fingerprints)`` would be, encoded natively into flat buffers, with no
        Python object a record (see docs/database.md: Arrays in, arrays out).

        Each batch of ``batch_size`` records is one transaction: it lands
        whole or not at all. A key repeated in the input keeps its last record.
        A bulk load into an empty database is fastest in one large batch; a
        call of many batches merges what they wrote once the last commits (a
        loop of calls does so in :meth:`bulk_load`). A bad record raises, and
        its batch and later ones are not written.

        :returns: the number of records written.
        :raises InvalidKeyError: a record's key is bad.
        :raises InvalidFingerprintError: a record's fingerprint is bad.
        :raises InvalidMetadataError: a record's metadata is not what msgpack
            writes and reads back.
        :raises InvalidArgumentError: both records and arrays, or neither;
            arrays of different lengths.
        """
        if keys is not None or fingerprints is not None:
            return insert_arrays(self._writer, records, batch_size, keys, fingerprints)
        if records is None:
            raise InvalidArgumentError("insert_many takes records, or keys= and fingerprints=")
        return upsert_batches(self._writer, records, batch_size, lambda batch, now:
                              encode_documents(batch, self._storage.max_key_bytes, now))

    def bulk_load(self) -> ContextManager[None]:
        """A block whose writes are one load, settled as one call of many
        batches settles its own::

            with db.bulk_load():
                for chunk in source:
                    db.insert_many(chunk)

        The storing calls (inserts, insert-if-new, :meth:`import_records`)
        that this thread makes on this DB inside it are counted; when the
        outermost block ends without an exception, what they wrote in more
        than one transaction is merged once, into about one run a table (see
        docs/database.md). Calls of many batches inside it leave their
        merging to it. On an exception the committed batches stay, unmerged.
        Blocks nest; other threads' calls are not counted."""
        return self._writer.bulk_load()

    def delete(self, key: Key) -> bool:
        """Remove the document ``key``; True if it was there."""
        return self.delete_many([key]) == 1

    def delete_many(self, keys: Iterable[Key], batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Remove documents by key, one transaction per batch; returns how many were there."""
        deleted = 0
        for batch in _batches(keys, batch_size):
            encoded = [encode_key(k, self._storage.max_key_bytes) for k in batch]
            deleted += self._storage.write(lambda txn: txn.remove(encoded), len(encoded))
        return deleted

    def insert_if_new(self, key: Key, fingerprint: int, meta: Any = None,
                      distance: Optional[int] = None, refresh: bool = False) -> Decision:
        """Atomically: find stored documents within ``distance`` of ``fingerprint``
        and store this one only if there are none (the crawler's dedupe step).

        A document already stored under ``key`` is a candidate like any other:
        if it is within ``distance`` (unchanged, or changed a little), it is
        among the matches and nothing is written (use :meth:`insert` to update
        it anyway); if no document is near, the new one is stored and replaces
        it, and the result's ``replaced`` is the Record it replaced.

        :param bool refresh: when near-duplicates are found, record them as
            stored now (so that :meth:`expire` keeps what is still being seen).
        :returns: a :class:`Decision`: its ``status`` ("stored", "unchanged" or
            "duplicate"), and the near-duplicates found sorted by (distance, key).
        :raises InvalidFingerprintError: for a bad fingerprint (the message
            names the key); InvalidKeyError, InvalidMetadataError likewise.
        """
        return self.insert_if_new_many([(key, fingerprint, meta)], distance,
                                       refresh=refresh, invalid="raise")[0]

    def insert_if_new_many(self, records: Iterable[RecordLike], distance: Optional[int] = None,
                           batch_size: int = DEFAULT_BATCH_SIZE, refresh: bool = False, *,
                           invalid: Literal["report", "raise"] = "report") -> list[Decision]:
        """:meth:`insert_if_new` for each record, in order, one transaction per
        batch of ``batch_size`` records; a record is also checked against the
        records stored before it.

        :param str invalid: what a bad record does: ``"report"`` (default: its
            Decision is ``"invalid"`` with the ``reason``, and the other records
            of its batch are decided and stored as if it were not there) or
            ``"raise"`` (its error, naming its key; nothing of its batch is
            written, and earlier batches stay).
        :returns: one :class:`Decision` per record, in order.
        """
        d = self._query_distance(distance)
        results.check_invalid(invalid)
        limit, decisions = self._storage.max_key_bytes, []
        for batch in _batches(records, batch_size, self._writer):
            now = batches._now()  # the one clock of every write
            try:
                valid, refused = list(enumerate(encode_documents(batch, limit, now))), {}
            except results.INVALID_RECORD:
                valid, refused = results.each_valid(
                    batch, lambda record: encode_documents([record], limit, now)[0], invalid)
            encoded = [document for _, document in valid]
            decisions += results.in_order(batch, valid, refused, store_if_new(
                self._writer, encoded, lambda txn: txn.insert_if_new(encoded, d), refresh, now))
        return decisions

    # Text in, decisions out

    def insert_text(self, key: Key, text: Text, meta: Any = None, *, html: Html = False) -> None:
        """Fingerprint ``text`` (str or UTF-8 bytes; with ``html``, its markup
        stripped; with ``html="main"``, its main content only, without menus,
        banners, footers and sidebars: :func:`main_content`) by the database's
        recipe and store it under ``key`` (upsert), with its resemblance
        signature (see :meth:`insert_text_if_new`)."""
        self.insert_text_many([(key, text, meta)], html=html)

    def insert_text_many(self, records: Iterable[TextRecordLike], *, html: Html = False,
                         batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """:meth:`insert_text` for each ``(key, text)`` or ``(key, text, meta)``
        record, one transaction per batch; returns the number written."""
        return upsert_batches(self._writer, records, batch_size, lambda batch, now: [
            self._text_document(*_text_record(r), html, now)[0] for r in batch])

    def insert_text_if_new(self, key: Key, text: Text, meta: Any = None, *,
                           html: Html = False, threshold: Optional[float] = None,
                           short_words: Optional[int] = None, refresh: bool = False) -> Decision:
        """Atomically: store ``text`` as :meth:`insert_text` does unless a stored
        document is a near-duplicate of it (the crawler's dedupe step).

        The text rule: the candidates are the stored documents that share a
        band of the text's resemblance signature (32 bands of 4 of its 128
        MinHash bins) or whose fingerprint is within the database's distance;
        a candidate is a near-duplicate when the estimated resemblance of the
        two texts' word 5-shingles (:func:`resemblance`) is at least
        ``threshold``; a document stored without a signature (by
        :meth:`insert`), when its fingerprint is within the distance. The same
        rule decides :meth:`query_text`, :meth:`find_all` and :meth:`clusters`
        on documents stored as text, the CLI and :mod:`simhashdb.spark`.

        As :meth:`insert_if_new`, the document stored under ``key`` is a
        candidate like any other, and the result's ``replaced`` is the Record
        the text replaced.

        :param float threshold: the least resemblance of a near-duplicate, in
            [0, 1] (default: 0.45; docs/database.md, Text in, decisions out, says why).
        :param int short_words: a text of fewer words (read from its signature)
            and its candidates are near-duplicates only at a resemblance of
            ``rule.NEAR_EXACT`` (0.8) or more (default: 0, none; docs/crawlers.md,
            Short pages, says when to set it).
        :param bool refresh: when near-duplicates are found, record them as
            stored now (so that :meth:`expire` keeps what is still being seen).
        :raises InvalidArgumentError: for a text with nothing to fingerprint
            (the message names its key).
        :returns: a :class:`Decision`: its ``status``, and the near-duplicates
            sorted by (distance, key), each with its ``resemblance``.
        """
        return self.insert_text_if_new_many([(key, text, meta)], html=html, threshold=threshold,
                                            short_words=short_words, refresh=refresh,
                                            invalid="raise")[0]

    def insert_text_if_new_many(self, records: Iterable[TextRecordLike], *, html: Html = False,
                                threshold: Optional[float] = None,
                                short_words: Optional[int] = None, refresh: bool = False,
                                batch_size: int = DEFAULT_BATCH_SIZE,
                                invalid: Literal["report", "raise"] = "report") -> list[Decision]:
        """:meth:`insert_text_if_new` for each ``(key, text)`` or ``(key, text,
        meta)`` record, in order, one transaction per batch of ``batch_size``
        records; a record is also checked against the records stored before it.

        :param str invalid: what a bad record (such as a text with no words)
            does: ``"report"`` (default: its Decision is ``"invalid"`` with the
            ``reason``, and the other records of its batch are decided and
            stored) or ``"raise"`` (its error, naming its key; nothing of its
            batch is written, and earlier batches stay).
        :returns: one :class:`Decision` per record, in order.
        """
        least = _threshold(threshold, short_words)
        results.check_invalid(invalid)
        decisions = []
        for batch in _batches(records, batch_size, self._writer):
            now = batches._now()  # the one clock of every write
            decisions += self._texts_if_new(batch, self._prepared_texts(batch, html, now, invalid),
                                            least, refresh, now)
        return decisions

    def _prepared_texts(self, batch, html, now, invalid):
        """The fingerprinted, encoded text records of ``batch``: ([(position,
        (document, signature))] of the valid ones, {position: reason} of the
        others), for :meth:`_texts_if_new` (the part that needs no transaction)."""
        return results.each_valid(
            batch, lambda record: self._text_document(*_text_record(record), html, now), invalid)

    def _texts_if_new(self, batch, prepared, least, refresh, now):
        """The Decisions of ``batch``, its ``prepared`` texts decided (and the
        new ones stored) in one transaction."""
        valid, refused = prepared
        texts = [text for _, text in valid]
        return results.in_order(batch, valid, refused, store_if_new(
            self._writer, [document for document, _ in texts],
            lambda txn: rule.decide(txn, texts, self.distance, least), refresh, now))

    def query_text(self, text: Text, *, html: Html = False,
                   threshold: Optional[float] = None,
                   short_words: Optional[int] = None) -> list[TextMatch]:
        """The stored near-duplicates of ``text`` (as :meth:`insert_text_if_new`
        decides), as Matches sorted by (distance, key), each with its
        ``resemblance``."""
        return self.query_text_many([text], html=html, threshold=threshold,
                                    short_words=short_words)[0]

    def query_text_many(self, texts: Iterable[Text], *, html: Html = False,
                        threshold: Optional[float] = None,
                        short_words: Optional[int] = None) -> list[list[TextMatch]]:
        """:meth:`query_text` for each of ``texts``, over one snapshot."""
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):
            raise InvalidArgumentError("expected an iterable of texts, got %s"
                                       % _ext.shown(texts))
        least = _threshold(threshold, short_words)
        prints = [self._text_fingerprint(text, html) for text in texts]
        def read(view):
            found = rule.search(view, [fp for fp, _ in prints], [s for _, s in prints],
                                self.distance, least)
            return found, results.names(view, found)
        found, names = self._storage.read_whole(read)
        return [results.matches(hits, names) for hits in found]

    def _text_fingerprint(self, text, html):
        """(fingerprint by the database's recipe, resemblance signature)."""
        recipe = self.recipe or self._adopt_recipe()
        if recipe not in RECIPES:
            raise ParameterMismatchError(
                "%s holds fingerprints made with %r, a recipe this simhashdb cannot "
                "fingerprint text with" % (self.path, recipe))
        fp, signature = fingerprint_with_signature(
            text, html=html, signature_bits=self._signature_bits, **RECIPES[recipe])
        if fp == 0:  # the fingerprint of nothing would match every other empty document
            raise InvalidArgumentError("the text has no words to fingerprint; leave empty "
                                       "documents out")
        return fp, signature

    def _adopt_recipe(self, recipe=RECIPE):
        """An unnamed database takes ``recipe`` while empty and writable."""
        self.recipe = params.adopt_recipe(self._storage, recipe)
        return recipe

    def _text_document(self, key, text, meta, html, now):
        """(the encoded (key, fingerprint, value), the signature) of a text: the
        value [fingerprint, meta, stored_at, signature]."""
        fp, signature = self._text_fingerprint(text, html)
        key_bytes, fp, value = encode_documents([(key, fp, meta)],
                                                        self._storage.max_key_bytes, now)[0]
        return (key_bytes, fp, with_signature(value, signature)), signature

    def expire(self, before: When, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Remove every document stored before ``before`` (a datetime, naive
        ones in local time, or a UNIX time). Times are whole seconds, so a
        document stored in the second just before ``before`` may stay; one
        stored at or after it never goes. Documents stored by a simhashdb that
        did not record the time are kept.

        Each transaction looks at ``batch_size`` documents, so writers and
        readers get their turns during a long expiry.

        :returns: the number of documents removed.
        """
        cutoff = whole_seconds(before, "before")
        _check_batch_size(batch_size)

        def expire_batch(txn):
            old, last = [], None
            for last, value in itertools.islice(txn.documents(after), min(batch_size, sys.maxsize)):
                when = stored_at(value)
                if when is not None and when < cutoff:
                    old.append(last)
            return (txn.remove(old) if old else 0), last

        removed, after = 0, None
        while True:
            count, after = self._storage.write(expire_batch)
            removed += count
            if after is None:
                return removed

    def compact(self) -> None:
        """Rewrite the database without the space freed by deletes.

        The compacted copy is written beside the data, synced, then renamed
        over it, so a crash at any moment leaves one complete database.

        :raises DatabaseBusyError: another process or handle has it open.
        """
        self._format = params.compact(self._storage, self._format)

    # Reads

    def query(self, fingerprint: int, distance: Optional[int] = None) -> list[Match]:
        """Stored documents within ``distance`` bits (default: the DB's distance)
        of ``fingerprint``, as Matches sorted by (distance, key)."""
        return self.query_many([fingerprint], distance)[0]

    @overload
    def query_many(self, fingerprints: Any, distance: Optional[int] = None, *,
                   arrays: Literal[False] = False) -> list[list[Match]]: ...

    @overload
    def query_many(self, fingerprints: Any, distance: Optional[int] = None, *,
                   arrays: Literal[True]) -> tuple[array[int], array[int], array[int]]: ...

    def query_many(self, fingerprints: Any, distance: Optional[int] = None, *,
                   arrays: bool = False) -> Any:
        """:meth:`query` for each fingerprint (ints or a uint64 buffer), over one snapshot.

        Any distance is exact. Up to :attr:`table_distance`, a query scans one
        range per table; above it, one per prefix within a few bits of the
        probe's (see docs/database.md: Queries above the built distance).

        With ``arrays=True``, every match as three flat ``array.array`` of one
        length: ``(probe indexes 'q', keys 'Q', distances 'B')``, sorted by
        (probe index, distance, key); for databases whose keys are ints in
        [0, 2**64), else InvalidKeyError."""
        d = self._query_distance(distance)
        probes = _ext.as_fingerprints(fingerprints)
        found = self._storage.search(probes, d)
        if arrays:
            return hit_arrays(found)
        matches = _records.matches(found, Match)
        if matches is not None:
            return matches
        def read(view):  # long keys are in their documents: searched again, in
            found = view.search(probes, d)  # the state that names them
            return found, results.names(view, found)
        found, names = self._storage.read_whole(read)
        return [results.matches(hits, names) for hits in found]

    def get(self, key: Key) -> Optional[Record]:
        """The Record of ``key``, or None."""
        key_bytes = encode_key(key, self._storage.max_key_bytes)
        with self._storage.read() as view:
            value = view.get(key_bytes)
        record = None if value is None else decode(key, value)
        return record if record is None or record.key == key else None  # a digest's other key

    def __getitem__(self, key: Key) -> Record:
        """The Record of ``key``; KeyNotFoundError (a KeyError) if there is none."""
        record = self.get(key)
        if record is None:
            raise KeyNotFoundError("no document with key %s" % _ext.shown(key))
        return record

    def __contains__(self, key: object) -> bool:
        """Whether a document is stored under ``key``."""
        return self.get(key) is not None

    def __len__(self) -> int:
        with self._storage.read() as view:
            return view.count()

    def __iter__(self) -> Iterator[Record]:
        """Records (not keys: a DB is a store of documents, as a table is of
        rows) in an order fixed by the backend: on LMDB by the key's hash,
        then the key, from one snapshot held until the loop ends; on Redis, which keeps no
        snapshots, by a hash of the key, streamed in rounds that each see
        whole batches (a record not written meanwhile comes once; one written
        meanwhile may come or not)."""
        with self._storage.read() as view:
            for key_bytes, value in view.documents():
                yield decode(decode_key(key_bytes, value), value)

    def find_all(self, distance: Optional[int] = None, *,
                 threshold: Optional[float] = None,
                 short_words: Optional[int] = None) -> Iterator[Pair]:
        """Every pair of stored documents near each other, each pair once, as
        :class:`Pair` (key_a, key_b, distance) tuples.

        In a database of fingerprints (no recipe), the pairs within
        ``distance`` bits (default: the DB's distance, at most it). In a
        database of a recipe, its texts are paired by the text rule (see
        :meth:`insert_text_if_new`; ``threshold`` and ``short_words`` as there), as
        :class:`TextPair` with their ``resemblance``; a document stored without
        text, by its distance.

        A generator over one snapshot that sees none of the writes made while
        it runs, and blocks no writer (Redis keeps no snapshots: there each of
        its reads sees whole batches, but a batch written meanwhile may be seen
        by later reads only). It streams the pairs of a database of
        fingerprints; the text rule reads every document's signature first
        (128 bytes a document in memory). Bad arguments raise at the call.
        """
        return pairs.find_all(self._storage, self._layout, self.recipe,
                              self._scan_distance(distance), _threshold(threshold, short_words))

    def clusters(self, distance: Optional[int] = None, *,
                 threshold: Optional[float] = None,
                 short_words: Optional[int] = None) -> Iterator[list[Key]]:
        """Connected components of the graph of :meth:`find_all`'s pairs (the
        text rule in a database of a recipe): lists of keys, each sorted, the
        clusters in the order of their least fingerprint, from one snapshot
        (on Redis, reads that each see whole batches, as :meth:`find_all`).
        Bad arguments raise at the call."""
        return pairs.clusters(self._storage, self._layout, self.recipe,
                              self._scan_distance(distance), _threshold(threshold, short_words))

    def stats(self) -> dict[str, Any]:
        """Counts, parameters and sizes of the database, with the backend's own
        facts (on LMDB ``disk_bytes``, its files; on Redis ``memory_bytes``,
        its RAM on the primaries) and ``bytes_per_fingerprint_per_table`` of
        whichever it is."""
        with self._storage.read() as view:
            count, distinct = view.count(), view.distinct()
        info = self._storage.info()
        size = size_of(info)[1]
        tables = self._layout.tables
        return dict({
            "path": self.path,
            "count": count,
            "distinct_fingerprints": distinct,
            "distance": self.distance,
            "table_distance": self.table_distance,
            "blocks": self.blocks,
            "block_widths": list(self._layout.widths),
            "tables": tables,
            "format": self._format,
            "recipe": self.recipe, "signature_bits": self._signature_bits,
            "bytes_per_fingerprint_per_table":
                size / (distinct * tables) if distinct else 0.0,
        }, **info)

    def check(self) -> list[str]:
        """Verify that the index and every table agree with the documents
        (on Redis, check a database no one writes to meanwhile: its reads
        each see whole batches, but not all the same ones).

        :returns: a list of the disagreements found, empty for a sound database.
        """
        problems = self._storage.check()
        try:
            with self._storage.read() as view:
                problems += check.contents(view, self._layout.tables, self._format >= 2)
        except DatabaseError as exc:  # a damaged file LMDB faulted on
            problems.append(str(exc))
        return problems

    # Parquet, to and from batch tools (simhashdb.spark); needs pyarrow

    def export_parquet(self, path):
        """Write every document, from one snapshot, to the Parquet file ``path``
        (see :mod:`simhashdb.parquet`); returns how many. A database of texts
        (one with a recipe) writes their signatures too."""
        from . import parquet
        if self.recipe is None:
            return parquet.export(self, path)
        return parquet.export(self.export_records(), path, self.recipe)

    def export_records(self) -> Iterator[tuple]:
        """Every document, from one snapshot, as a ``(key, fingerprint, meta,
        stored_at, signature)`` record (``signature``: a text's resemblance
        signature, else None), which :meth:`import_records` stores back whole."""
        with self._storage.read() as view:
            for key_bytes, value in view.documents():
                yield decode(decode_key(key_bytes, value), value) + (stored_signature(value),)

    def import_parquet(self, path, key="key", fingerprint="fingerprint",
                       batch_size=DEFAULT_BATCH_SIZE):
        """:meth:`insert_many` the documents of a Parquet file or directory;
        returns how many. Texts' signatures (a ``signature`` column, as
        :meth:`export_parquet` and ``simhashdb.spark`` write it) are kept, so
        the texts are found by the text rule, in a database of their recipe.

        :raises ParameterMismatchError: the file's texts were made by another
            recipe than the database's.
        """
        from . import parquet
        recipe, records = parquet.read(path, key, fingerprint)
        return self.import_records(records, recipe, batch_size, source=path)

    def import_records(self, records: Iterable[tuple], recipe: Optional[str] = None,
                       batch_size: int = DEFAULT_BATCH_SIZE, source: str = "the records") -> int:
        """:meth:`insert_many` records as :meth:`export_records` gives them;
        returns how many. A record's fifth item, a text's signature (or None),
        is kept, so that the text is found by the text rule, in a database of
        ``recipe``, the recipe of the texts (default: :data:`RECIPE`); an
        empty database without one takes it.

        :raises ParameterMismatchError: the database is of another recipe.
        :raises InvalidArgumentError: a signature is not one (``source`` names
            where the records come from).
        """
        if recipe is not None:  # known: checked (or taken) before anything is written
            self._check_recipe(recipe, source)
        recipe = recipe or RECIPE
        return upsert_batches(self._writer, records, batch_size, lambda batch, now:
                              exported_documents(batch, self._storage.max_key_bytes, now, source,
                                                 lambda: self._check_recipe(recipe, source),
                                                 self._signature_bits))

    def _check_recipe(self, recipe, source):
        """Refuse texts of ``recipe`` from ``source`` unless the database is of
        it (an empty one without a recipe takes it)."""
        if recipe != (self.recipe or self._adopt_recipe(recipe)):
            raise ParameterMismatchError(
                "%s holds texts fingerprinted by recipe %r, and %s is of recipe %r: "
                "import them into a database of theirs" % (source, recipe, self.path,
                                                            self.recipe))

    def close(self) -> None:
        """Close the database; using it afterwards raises DatabaseError."""
        self._storage.close()

    def __enter__(self) -> DB:
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "DB(%r, distance=%d, blocks=%d, table_distance=%d)" % (
            self.path, self.distance, self.blocks, self.table_distance)

    def _query_distance(self, distance):
        """A query's distance: any, where the layout can answer it exactly."""
        return self.distance if distance is None else self._layout.check_query_distance(distance)

    def _scan_distance(self, distance):
        """An all-pairs scan's distance: at most the database's."""
        if distance is None:
            return self.distance
        if not isinstance(distance, int) or isinstance(distance, bool) or \
                not 0 <= distance <= self.distance:
            raise InvalidArgumentError(
                "find_all and clusters take a distance in [0, %d] (the database's distance), "
                "got %s" % (self.distance, _ext.shown(distance)))
        return distance


