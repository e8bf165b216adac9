"""The fingerprint database."""

import collections
import itertools
from array import array

import msgpack

from . import _ext
from .errors import (
    DatabaseError,
    FormatVersionError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidMetadataError,
    ParameterMismatchError,
)
from .layout import DEFAULT_EXPECTED_SIZE, Layout
from .matching import components, pair_chunks
from .storage import open_storage

FORMAT_VERSION = 1
DEFAULT_DISTANCE = 3
DEFAULT_BATCH_SIZE = 100_000
MAX_KEY_BYTES = 511  # the largest encoded key every backend takes

Record = collections.namedtuple("Record", "key fingerprint meta")
Match = collections.namedtuple("Match", "key fingerprint distance")


class DB:
    """A persistent store of documents' 64-bit fingerprints, queried by Hamming distance.

    Usage::

        with simhashdb.DB("crawl.db", distance=3) as db:
            db.insert("https://example.com/", fingerprint)
            db.query(other_fingerprint)   # [Match(key, fingerprint, distance), ...]

    A new database stores its parameters; reopening uses them.

    :param path: the database directory; created if missing.
    :param int distance: the distance the tables are built for: queries up to
        it cost one range scan per table, beyond it more (default: 3 for a new
        database, the stored value for an existing one).
    :param int blocks: blocks per fingerprint, more than ``distance``
        (default: chosen from ``distance`` and ``expected_size``, see
        :meth:`Layout.choose_blocks`).
    :param bool readonly: open without write access (default: False).
    :param int expected_size: documents you expect, to choose ``blocks``
        (default: 10,000,000).
    :param str recipe: the name of the recipe that made the fingerprints, e.g.
        ``simhashdb.RECIPE`` for :func:`fingerprint`'s defaults; stored, and
        checked on every later open that names one, so that fingerprints of
        different recipes are never mixed (default: None, unnamed).
    :param backend: ``"lmdb"`` (native, the default where built), ``"py-lmdb"``,
        or a :class:`simhashdb.storage.Storage` (default: ``$SIMHASHDB_BACKEND``).
    :raises ParameterMismatchError: explicit parameters (or recipe) differ from
        the stored ones.
    :raises FormatVersionError: the database was written by a newer simhashdb.
    :raises DatabaseError: the path is a file, or is not a simhashdb database.
    """

    def __init__(self, path, distance=None, blocks=None, readonly=False, expected_size=None,
                 recipe=None, backend=None):
        self._storage = open_storage(path, readonly=readonly, backend=backend)
        try:
            self._layout, self.recipe = self._open_params(distance, blocks, expected_size, recipe)
        except BaseException:
            self._storage.close()
            raise
        self.path = self._storage.path

    def _open_params(self, distance, blocks, expected_size, recipe):
        storage = self._storage
        with storage.read() as view:
            raw = view.params()
        if raw is None:
            if storage.readonly:
                raise DatabaseError("%s is not a simhashdb database" % storage.path)
            k = DEFAULT_DISTANCE if distance is None else distance
            Layout(k + 1, k)  # validates distance before choose_blocks uses it
            m = Layout.choose_blocks(k, expected_size or DEFAULT_EXPECTED_SIZE) \
                if blocks is None else blocks
            layout = Layout(m, k)
            storage.open_tables(layout)
            params = msgpack.packb({"format": FORMAT_VERSION, "distance": k, "blocks": m,
                                    "widths": layout.widths, "recipe": recipe})

            def store_params(txn):  # unless a concurrent creator stored its own first
                existing = txn.params()
                if existing is None:
                    txn.set_params(params)
                return existing or params

            raw = storage.write(store_params)
        try:
            params = msgpack.unpackb(raw)
            stored_layout = (params["blocks"], params["distance"])
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            raise DatabaseError("%s has damaged parameters: restore it from a backup"
                                % storage.path) from None
        if params["format"] > FORMAT_VERSION:
            raise FormatVersionError(
                "%s has format version %d; this simhashdb reads up to %d: upgrade simhashdb"
                % (storage.path, params["format"], FORMAT_VERSION))
        for name, given in (("distance", distance), ("blocks", blocks)):
            if given is not None and given != params[name]:
                raise ParameterMismatchError(
                    "%s was created with %s=%d, not %r; open it without %s= or with %s=%d"
                    % (storage.path, name, params[name], given, name, name, params[name]))
        layout = Layout(*stored_layout)
        storage.open_tables(layout)
        stored = params.get("recipe")
        if recipe is not None and recipe != stored:
            if stored is not None or storage.readonly or len(self):
                raise ParameterMismatchError(
                    "%s holds fingerprints made %s, not with %r: fingerprints of different "
                    "recipes cannot be compared; use another database"
                    % (storage.path, "with %r" % stored if stored else "by an unnamed "
                       "recipe", recipe))
            params["recipe"] = stored = recipe  # an empty database takes the recipe
            storage.write(lambda txn: txn.set_params(msgpack.packb(params)))
        return layout, stored

    @property
    def distance(self):
        """The distance the tables are built for (queries may ask for more, at a cost)."""
        return self._layout.distance

    @property
    def blocks(self):
        """Blocks per fingerprint."""
        return self._layout.blocks

    @property
    def backend(self):
        """The name of the storage backend."""
        return self._storage.backend

    # Writes

    def insert(self, key, fingerprint, meta=None):
        """Store a document; an existing ``key`` is replaced (upsert)."""
        self.insert_many([(key, fingerprint, meta)])

    def insert_many(self, records, batch_size=DEFAULT_BATCH_SIZE):
        """Store ``(key, fingerprint)`` or ``(key, fingerprint, meta)`` records.

        Each batch of ``batch_size`` records is one transaction: it lands
        whole or not at all. A key repeated in the input keeps its last record.
        A bulk load into an empty database is fastest in one large batch.

        :returns: the number of records written.
        :raises InvalidKeyError, InvalidFingerprintError, InvalidMetadataError:
            for a bad record; its batch and later ones are not written.
        """
        written = 0
        for batch in _batches(records, batch_size):
            encoded = _encode_records(batch, self._storage.max_key_bytes)
            self._storage.write(lambda txn: txn.upsert(encoded))
            written += len(encoded)
        return written

    def delete(self, key):
        """Remove the document ``key``; True if it was there."""
        return self.delete_many([key]) == 1

    def delete_many(self, keys, batch_size=DEFAULT_BATCH_SIZE):
        """Remove documents by key, one transaction per batch; returns how many were there."""
        deleted = 0
        for batch in _batches(keys, batch_size):
            encoded = [_encode_key(k) for k in batch]
            deleted += self._storage.write(lambda txn: txn.remove(encoded))
        return deleted

    def insert_if_new(self, key, fingerprint, meta=None, distance=None):
        """Atomically: find stored documents within ``distance`` of ``fingerprint``
        and store this one only if there are none (the crawler's dedupe step).

        :returns: the near-duplicates found (empty when the document was stored).
        """
        return self.insert_if_new_many([(key, fingerprint, meta)], distance)[0]

    def insert_if_new_many(self, records, distance=None, batch_size=DEFAULT_BATCH_SIZE):
        """:meth:`insert_if_new` for each record, in order, one transaction per
        batch; a record is also checked against the records stored before it.

        :returns: one list of matches per record.
        """
        d = self._query_distance(distance)
        results = []
        for batch in _batches(records, batch_size):
            encoded = _encode_records(batch, self._storage.max_key_bytes)
            results += map(_matches, self._storage.write(
                lambda txn: txn.insert_if_new(encoded, d)))
        return results

    def compact(self):
        """Rewrite the database without the space freed by deletes.

        The compacted copy is written beside the data, synced, then renamed
        over it, so a crash at any moment leaves one complete database.

        :raises DatabaseBusyError: another process or handle has it open.
        """
        self._storage.compact()

    # Reads

    def query(self, fingerprint, distance=None):
        """Stored documents within ``distance`` bits (default: the DB's distance)
        of ``fingerprint``, as Matches sorted by (distance, key)."""
        return self.query_many([fingerprint], distance)[0]

    def query_many(self, fingerprints, distance=None):
        """:meth:`query` for each fingerprint (ints or a uint64 buffer), over one snapshot.

        Any distance is exact. Up to the database's own, a query scans one
        range per table; above it, one per prefix within a few bits of the
        probe's (see README: queries above the built distance)."""
        d = self._query_distance(distance)
        return [_matches(hits) for hits in
                self._storage.search(_ext.as_fingerprints(fingerprints), d)]

    def get(self, key):
        """The Record of ``key``, or None."""
        key_bytes = _encode_key(key)
        with self._storage.read() as view:
            value = view.get(key_bytes)
        return None if value is None else Record(key, *_unpack(value)[:2])

    def __contains__(self, key):
        return self.get(key) is not None

    def __len__(self):
        with self._storage.read() as view:
            return view.count()

    def __iter__(self):
        """Records in key-encoding order, from one snapshot held until the loop ends."""
        with self._storage.read() as view:
            for key_bytes, value in view.documents():
                yield Record(_unpack(key_bytes), *_unpack(value)[:2])

    def find_all(self, distance=None):
        """Every pair of stored documents within ``distance`` bits (default: the
        DB's distance, at most it), as ``(key_a, key_b, distance)`` tuples, each
        pair once.

        A generator over one snapshot: it streams pairs (it never holds them
        all), sees none of the writes made while it runs, and blocks no writer.
        """
        d = self._scan_distance(distance)
        with self._storage.read() as view:
            values = array("Q")
            for fp, keys in view.fingerprint_groups():
                values.append(fp)
                for key_a, key_b in itertools.combinations(_sorted_keys(keys), 2):
                    yield key_a, key_b, 0
            for chunk in pair_chunks(values, self._layout, d):
                for p in range(0, len(chunk), 2):
                    a, b = values[chunk[p]], values[chunk[p + 1]]
                    between = _ext.num_differing_bits(a, b)
                    for key_a in _sorted_keys(view.keys_of(a)):
                        for key_b in _sorted_keys(view.keys_of(b)):
                            yield _ordered(key_a, key_b) + (between,)

    def clusters(self, distance=None):
        """Connected components of the match graph over documents: lists of keys
        whose fingerprints link within ``distance`` bits, from one snapshot.
        Each cluster is sorted by key; clusters come in fingerprint order."""
        d = self._scan_distance(distance)
        with self._storage.read() as view:
            values, multiple = array("Q"), set()
            for fp, keys in view.fingerprint_groups():
                if len(keys) > 1:
                    multiple.add(len(values))
                values.append(fp)
            labels = components(len(values), pair_chunks(values, self._layout, d))
            members = collections.defaultdict(list)
            for i, label in enumerate(labels):
                if label != i or i in multiple:
                    members[label].append(i)
            for label in sorted(members):
                group = members[label]
                if group[0] != label:
                    group.insert(0, label)
                yield _sorted_keys([k for i in group for k in view.keys_of(values[i])])

    def stats(self):
        """Counts, parameters and sizes of the database."""
        with self._storage.read() as view:
            count, distinct = view.count(), view.distinct()
        info = self._storage.info()
        tables = self._layout.tables
        return dict({
            "path": self.path,
            "count": count,
            "distinct_fingerprints": distinct,
            "distance": self.distance,
            "blocks": self.blocks,
            "block_widths": list(self._layout.widths),
            "tables": tables,
            "format": FORMAT_VERSION,
            "recipe": self.recipe,
            "bytes_per_fingerprint_per_table":
                info["disk_bytes"] / (distinct * tables) if distinct else 0.0,
        }, **info)

    def check(self):
        """Verify that the index and every table agree with the documents.

        :returns: a list of the disagreements found, empty for a sound database.
        """
        problems = []
        with self._storage.read() as view:
            docs = 0
            for key_bytes, value in view.documents():
                docs += 1
                try:
                    fp = _unpack(value)[0]
                except (ValueError, TypeError, IndexError, msgpack.UnpackException):
                    problems.append("document %r has a damaged record" % (key_bytes,))
                    continue
                if key_bytes not in view.keys_of(fp):
                    problems.append("document %r (fingerprint %d) is missing from the "
                                    "fingerprint index" % (_unpack(key_bytes), fp))
            distinct, indexed = array("Q"), 0
            for fp, keys in view.fingerprint_groups():
                distinct.append(fp)
                indexed += len(keys)
            if indexed != docs:
                problems.append("the fingerprint index has %d entries for %d documents"
                                % (indexed, docs))
            expected = set(distinct)
            for table in range(self._layout.tables):
                stored = view.table_fingerprints(table)
                if len(stored) != len(expected) or set(stored) != expected:
                    missing = len(expected - set(stored))
                    extra = len(set(stored) - expected)
                    problems.append("table %d has %d entries for %d distinct fingerprints "
                                    "(%d missing, %d extra)"
                                    % (table, len(stored), len(expected), missing, extra))
        return problems

    # Parquet, to and from batch tools (simhashdb.spark); needs pyarrow

    def export_parquet(self, path):
        """Write every document, from one snapshot, to the Parquet file ``path``
        (see :mod:`simhashdb.parquet`); returns how many."""
        from . import parquet
        return parquet.export(self, path)

    def import_parquet(self, path, key="key", fingerprint="fingerprint",
                       batch_size=DEFAULT_BATCH_SIZE):
        """:meth:`insert_many` the documents of a Parquet file or directory;
        returns how many."""
        from . import parquet
        return self.insert_many(parquet.records(path, key, fingerprint), batch_size)

    def close(self):
        """Close the database; using it afterwards raises DatabaseError."""
        self._storage.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "DB(%r, distance=%d, blocks=%d)" % (self.path, self.distance, self.blocks)

    def _query_distance(self, distance):
        """A query's distance: any, where the layout can answer it exactly."""
        return self.distance if distance is None else self._layout.check_query_distance(distance)

    def _scan_distance(self, distance):
        """An all-pairs scan's distance: at most the built one."""
        if distance is None:
            return self.distance
        if not isinstance(distance, int) or not 0 <= distance <= self.distance:
            raise InvalidArgumentError(
                "find_all and clusters take a distance in [0, %d] (the database's distance), "
                "got %r" % (self.distance, distance))
        return distance


def _matches(hits):
    """Matches of (key, fingerprint, distance) hits, sorted by (distance, key)."""
    matches = [Match(_unpack(key), fp, d) for key, fp, d in hits]
    matches.sort(key=lambda m: (m.distance, _key_order(m.key)))
    return matches


def check_record(record):
    """Raise the error :meth:`DB.insert_many` would raise for ``record``, if any:
    to find the bad record of a batch before writing it."""
    _encode_records([record])


def _batches(items, size):
    if not isinstance(size, int) or size < 1:
        raise InvalidArgumentError("batch_size must be an int >= 1, got %r" % (size,))
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode_key(key, pack=msgpack.packb, limit=MAX_KEY_BYTES):
    if not isinstance(key, (str, bytes, int)) or isinstance(key, bool):
        raise InvalidKeyError("keys must be str, bytes or int, got %s %r"
                              % (type(key).__name__, key))
    try:
        encoded = pack(key)
    except OverflowError:
        raise InvalidKeyError("int keys must be in [-2**63, 2**64), got %d" % key) from None
    if len(encoded) > limit:
        raise InvalidKeyError("key is %d bytes encoded; the most is %d"
                              % (len(encoded), limit))
    return encoded


def _encode_records(records, limit=MAX_KEY_BYTES):
    """(encoded key, fingerprint, encoded [fingerprint, meta]) for each record
    (natively where every record is plain: see ``_ext.encode_plain_documents``)."""
    plain = _ext.encode_plain_documents(records, limit) if isinstance(records, list) else None
    if plain is not None:
        return plain
    pack = msgpack.Packer().pack
    encoded = []
    for record in records:
        if not isinstance(record, (tuple, list)) or len(record) not in (2, 3):
            raise InvalidArgumentError(
                "expected a (key, fingerprint) or (key, fingerprint, meta) record, got %r"
                % (record,))
        key, fp = _encode_key(record[0], pack, limit), _ext.check_fingerprint(record[1])
        meta = record[2] if len(record) == 3 else None
        try:
            encoded.append((key, fp, pack([fp, meta])))
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidMetadataError("metadata of key %r cannot be stored: %s (use values "
                                       "msgpack can encode: None, bool, int, float, str, "
                                       "bytes, lists and dicts)" % (record[0], exc)) from None
    return encoded


def _unpack(data):
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DatabaseError("a stored record is damaged (%s): restore the database from a "
                            "backup, or `export` what is readable" % exc) from None


def _key_order(key):
    return (isinstance(key, bytes), isinstance(key, str), key)


def _sorted_keys(encoded_keys):
    return sorted((_unpack(k) for k in encoded_keys), key=_key_order)


def _ordered(a, b):
    return (a, b) if _key_order(a) <= _key_order(b) else (b, a)
