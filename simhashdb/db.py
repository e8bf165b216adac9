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
from .matching import components, pair_chunks
from .tables import DEFAULT_EXPECTED_SIZE, Layout, Store, table_name

FORMAT_VERSION = 1
DEFAULT_DISTANCE = 3
DEFAULT_BATCH_SIZE = 100_000
MAX_KEY_BYTES = 511  # LMDB's key size limit; encoded keys are also index values
META, DOCS, FINGERPRINTS = b"meta", b"docs", b"fingerprints"

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
    :param int distance: the largest distance queries may ask for (default: 3
        for a new database, the stored value for an existing one).
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
    :raises ParameterMismatchError: explicit parameters (or recipe) differ from
        the stored ones.
    :raises FormatVersionError: the database was written by a newer simhashdb.
    :raises DatabaseError: the path is a file, or is not a simhashdb database.
    """

    def __init__(self, path, distance=None, blocks=None, readonly=False, expected_size=None,
                 recipe=None):
        self._store = Store(path, readonly=readonly)
        try:
            self._layout, self.recipe = self._open_params(distance, blocks, expected_size, recipe)
        except BaseException:
            self._store.close()
            raise
        self.path = self._store.path

    def _open_params(self, distance, blocks, expected_size, recipe):
        with self._store.snapshot() as snap:
            raw = snap.get(META, b"params")
        if raw is None:
            if self._store.readonly:
                raise DatabaseError("%s is not a simhashdb database" % self._store.path)
            k = DEFAULT_DISTANCE if distance is None else distance
            Layout(k + 1, k)  # validates distance before choose_blocks uses it
            m = Layout.choose_blocks(k, expected_size or DEFAULT_EXPECTED_SIZE) \
                if blocks is None else blocks
            layout = Layout(m, k)
            self._store.open_tables(layout.tables)
            params = msgpack.packb({"format": FORMAT_VERSION, "distance": k, "blocks": m,
                                    "widths": layout.widths, "recipe": recipe})

            def store_params(w):  # unless a concurrent creator stored its own first
                existing = w.get(META, b"params")
                if existing is None:
                    w.put(META, b"params", params)
                return existing or params

            raw = self._store.write(store_params)
        params = msgpack.unpackb(raw)
        if params["format"] > FORMAT_VERSION:
            raise FormatVersionError(
                "%s has format version %d; this simhashdb reads up to %d: upgrade simhashdb"
                % (self._store.path, params["format"], FORMAT_VERSION))
        for name, given in (("distance", distance), ("blocks", blocks)):
            if given is not None and given != params[name]:
                raise ParameterMismatchError(
                    "%s was created with %s=%d, not %r; open it without %s= or with %s=%d"
                    % (self._store.path, name, params[name], given, name, name, params[name]))
        layout = Layout(params["blocks"], params["distance"])
        self._store.open_tables(layout.tables)
        stored = params.get("recipe")
        if recipe is not None and recipe != stored:
            if stored is not None or self._store.readonly or len(self):
                raise ParameterMismatchError(
                    "%s holds fingerprints made %s, not with %r: fingerprints of different "
                    "recipes cannot be compared; use another database"
                    % (self._store.path, "with %r" % stored if stored else "by an unnamed "
                       "recipe", recipe))
            params["recipe"] = stored = recipe  # an empty database takes the recipe
            self._store.write(lambda w: w.put(META, b"params", msgpack.packb(params)))
        return layout, stored

    @property
    def distance(self):
        """The largest distance a query may ask for."""
        return self._layout.distance

    @property
    def blocks(self):
        """Blocks per fingerprint."""
        return self._layout.blocks

    # Writes

    def insert(self, key, fingerprint, meta=None):
        """Store a document; an existing ``key`` is replaced (upsert)."""
        self.insert_many([(key, fingerprint, meta)])

    def insert_many(self, records, batch_size=DEFAULT_BATCH_SIZE):
        """Store ``(key, fingerprint)`` or ``(key, fingerprint, meta)`` records.

        Each batch of ``batch_size`` records is one transaction: it lands
        whole or not at all. A key repeated in the input keeps its last record.

        :returns: the number of records written.
        :raises InvalidKeyError, InvalidFingerprintError, InvalidMetadataError:
            for a bad record; its batch and later ones are not written.
        """
        written = 0
        for batch in _batches(records, batch_size):
            encoded = _encode_records(batch)
            self._store.write(lambda w: self._insert_batch(w, encoded))
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
            deleted += self._store.write(lambda w: self._remove(w, encoded))
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

        def body(w, encoded):
            found = []
            for record in encoded:
                matches = self._search(w, record[1], d)
                if not matches:
                    self._apply(w, [record])
                found.append(matches)
            return found

        for batch in _batches(records, batch_size):
            encoded = _encode_records(batch)
            results += self._store.write(lambda w: body(w, encoded))
        return results

    def compact(self):
        """Rewrite the database file without the space freed by deletes.

        The new file is written beside the old one, synced, then renamed over
        it, so a crash at any moment leaves one complete database.

        :raises DatabaseBusyError: another process or handle has it open.
        """
        self._store.compact()

    # Reads

    def query(self, fingerprint, distance=None):
        """Stored documents within ``distance`` bits (default: the DB's distance)
        of ``fingerprint``, as Matches sorted by (distance, key)."""
        return self.query_many([fingerprint], distance)[0]

    def query_many(self, fingerprints, distance=None):
        """:meth:`query` for each fingerprint (ints or a uint64 buffer), over one snapshot."""
        d = self._query_distance(distance)
        with self._store.snapshot() as snap:
            return [self._search(snap, fp, d) for fp in _ext.as_fingerprints(fingerprints)]

    def get(self, key):
        """The Record of ``key``, or None."""
        key_bytes = _encode_key(key)
        with self._store.snapshot() as snap:
            value = snap.get(DOCS, key_bytes)
        return None if value is None else Record(key, *_unpack(value))

    def __contains__(self, key):
        return self.get(key) is not None

    def __len__(self):
        with self._store.snapshot() as snap:
            return snap.count(DOCS)

    def __iter__(self):
        """Records in key-encoding order, from one snapshot held until the loop ends."""
        with self._store.snapshot() as snap:
            for key_bytes, value in snap.items(DOCS):
                yield Record(_unpack(key_bytes), *_unpack(value))

    def find_all(self, distance=None):
        """Every pair of stored documents within ``distance`` bits (default: the
        DB's distance), as ``(key_a, key_b, distance)`` tuples, each pair once.

        A generator over one snapshot: it streams pairs (it never holds them
        all), sees none of the writes made while it runs, and blocks no writer.
        """
        d = self._query_distance(distance)
        with self._store.snapshot() as snap:
            values = array("Q")
            for fp_key, keys in snap.fingerprint_groups():
                values.append(_ext.unpack_key(fp_key))
                for key_a, key_b in itertools.combinations(_sorted_keys(keys), 2):
                    yield key_a, key_b, 0
            for chunk in pair_chunks(values, self._layout, d):
                for p in range(0, len(chunk), 2):
                    a, b = values[chunk[p]], values[chunk[p + 1]]
                    between = _ext.num_differing_bits(a, b)
                    for key_a in _sorted_keys(snap.duplicates(_ext.pack_key(a))):
                        for key_b in _sorted_keys(snap.duplicates(_ext.pack_key(b))):
                            yield _ordered(key_a, key_b) + (between,)

    def clusters(self, distance=None):
        """Connected components of the match graph over documents: lists of keys
        whose fingerprints link within ``distance`` bits, from one snapshot.
        Each cluster is sorted by key; clusters come in fingerprint order."""
        d = self._query_distance(distance)
        with self._store.snapshot() as snap:
            values, multiple = array("Q"), set()
            for fp_key, keys in snap.fingerprint_groups():
                if len(keys) > 1:
                    multiple.add(len(values))
                values.append(_ext.unpack_key(fp_key))
            labels = components(len(values), pair_chunks(values, self._layout, d))
            members = collections.defaultdict(list)
            for i, label in enumerate(labels):
                if label != i or i in multiple:
                    members[label].append(i)
            for label in sorted(members):
                group = members[label]
                if group[0] != label:
                    group.insert(0, label)
                keys = [k for i in group for k in snap.duplicates(_ext.pack_key(values[i]))]
                yield _sorted_keys(keys)

    def stats(self):
        """Counts, parameters and sizes of the database."""
        with self._store.snapshot() as snap:
            count = snap.count(DOCS)
            distinct = snap.count(table_name(0))
        disk = self._store.disk_bytes()
        tables = self._layout.tables
        return {
            "path": self.path,
            "count": count,
            "distinct_fingerprints": distinct,
            "distance": self.distance,
            "blocks": self.blocks,
            "block_widths": list(self._layout.widths),
            "tables": tables,
            "format": FORMAT_VERSION,
            "recipe": self.recipe,
            "disk_bytes": disk,
            "bytes_per_fingerprint_per_table": disk / (distinct * tables) if distinct else 0.0,
            "map_size": self._store.env.info()["map_size"],
        }

    def check(self):
        """Verify that the index and every table agree with the documents.

        :returns: a list of the disagreements found, empty for a sound database.
        """
        problems = []
        with self._store.snapshot() as snap:
            docs = 0
            for key_bytes, value in snap.items(DOCS):
                docs += 1
                fp = _unpack(value)[0]
                if key_bytes not in snap.duplicates(_ext.pack_key(fp)):
                    problems.append("document %r (fingerprint %d) is missing from the "
                                    "fingerprint index" % (_unpack(key_bytes), fp))
            indexed = snap.count(FINGERPRINTS)
            if indexed != docs:
                problems.append("the fingerprint index has %d entries for %d documents"
                                % (indexed, docs))
            distinct = {_ext.unpack_key(k) for k in snap.items(FINGERPRINTS, values=False)}
            for table in range(self._layout.tables):
                stored = list(snap.table_entries(table))
                expected = [k + v for k, v in self._layout.table_items(distinct, table)]
                if stored != expected:
                    missing = len(set(expected) - set(stored))
                    extra = len(set(stored) - set(expected))
                    problems.append("table %d has %d entries for %d distinct fingerprints "
                                    "(%d missing, %d extra)"
                                    % (table, len(stored), len(distinct), missing, extra))
        return problems

    def close(self):
        """Close the database; using it afterwards raises DatabaseError."""
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "DB(%r, distance=%d, blocks=%d)" % (self.path, self.distance, self.blocks)

    # Internals: one transaction's work

    def _query_distance(self, distance):
        if distance is None:
            return self.distance
        if not isinstance(distance, int) or not 0 <= distance <= self.distance:
            raise InvalidArgumentError(
                "query distance must be an int in [0, %d] (the database's distance), got %r"
                % (self.distance, distance))
        return distance

    def _search(self, snap, fingerprint, distance):
        found = {}
        perms, bounds = self._layout.scan_bounds(fingerprint)
        for table, (perm, keys) in enumerate(zip(perms, snap.scan(bounds))):
            if keys:
                for candidate, d in _ext.verify(perm, keys, distance):
                    found[self._layout.unpermute(candidate, table)] = d
        matches = [Match(_unpack(key_bytes), fp, d) for fp, d in found.items()
                   for key_bytes in snap.duplicates(_ext.pack_key(fp))]
        matches.sort(key=lambda m: (m.distance, _key_order(m.key)))
        return matches

    def _insert_batch(self, w, encoded):
        """Store a batch; when every key is new, with one bulk put per sub-database."""
        docs = sorted((key_bytes, value) for key_bytes, _, value in encoded)
        keys = [key_bytes for key_bytes, _ in docs]
        repeated = any(a == b for a, b in zip(keys, keys[1:]))
        if repeated or (w.count(DOCS) and w.has_any(DOCS, keys)):
            return self._apply(w, encoded)  # upserts or repeated keys: the general path
        w.put_many(DOCS, docs)
        w.put_many(FINGERPRINTS, [(_ext.pack_key(fp), key_bytes) for key_bytes, fp, _ in encoded])
        self._update_tables(w, {fp for _, fp, _ in encoded}, ())

    def _apply(self, w, encoded):
        """Store encoded records one by one, replacing existing keys."""
        added, removed = set(), set()
        for key_bytes, fp, value in encoded:
            old = w.get(DOCS, key_bytes)
            if old is not None:
                old_fp = _unpack(old)[0]
                if old_fp == fp:
                    w.put(DOCS, key_bytes, value)
                    continue
                self._unlink(w, old_fp, key_bytes, added, removed)
            w.put(DOCS, key_bytes, value)
            fp_key = _ext.pack_key(fp)
            if not w.has(FINGERPRINTS, fp_key):
                if fp in removed:
                    removed.discard(fp)  # still in the tables: its removal is undone
                else:
                    added.add(fp)
            w.put(FINGERPRINTS, fp_key, key_bytes)
        self._update_tables(w, added, removed)

    def _remove(self, w, encoded):
        added, removed = set(), set()
        deleted = 0
        for key_bytes in encoded:
            old = w.get(DOCS, key_bytes)
            if old is not None:
                w.delete(DOCS, key_bytes)
                self._unlink(w, _unpack(old)[0], key_bytes, added, removed)
                deleted += 1
        self._update_tables(w, added, removed)
        return deleted

    def _unlink(self, w, fp, key_bytes, added, removed):
        """Drop one document's fingerprint-index entry; its last one leaves the tables."""
        fp_key = _ext.pack_key(fp)
        w.delete(FINGERPRINTS, fp_key, key_bytes)
        if not w.has(FINGERPRINTS, fp_key):
            if fp in added:
                added.discard(fp)
            else:
                removed.add(fp)

    def _update_tables(self, w, added, removed):
        """Add fingerprints new to the database to every table (adding one that
        is already there changes nothing); remove those no document has now."""
        for table in range(self._layout.tables):
            name = table_name(table)
            if added:
                w.put_many(name, self._layout.table_items(added, table))
            for key, value in self._layout.table_items(removed, table) if removed else ():
                w.delete(name, key, value)


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


def _encode_key(key, pack=msgpack.packb):
    if not isinstance(key, (str, bytes, int)) or isinstance(key, bool):
        raise InvalidKeyError("keys must be str, bytes or int, got %s %r"
                              % (type(key).__name__, key))
    try:
        encoded = pack(key)
    except OverflowError:
        raise InvalidKeyError("int keys must be in [-2**63, 2**64), got %d" % key) from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidKeyError("key is %d bytes encoded; the most is %d"
                              % (len(encoded), MAX_KEY_BYTES))
    return encoded


def _encode_records(records):
    """(encoded key, fingerprint, encoded [fingerprint, meta]) for each record."""
    pack = msgpack.Packer().pack
    encoded = []
    for record in records:
        if not isinstance(record, (tuple, list)) or len(record) not in (2, 3):
            raise InvalidArgumentError(
                "expected a (key, fingerprint) or (key, fingerprint, meta) record, got %r"
                % (record,))
        key, fp = _encode_key(record[0], pack), _ext.check_fingerprint(record[1])
        meta = record[2] if len(record) == 3 else None
        try:
            encoded.append((key, fp, pack([fp, meta])))
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidMetadataError("metadata of key %r cannot be stored: %s (use values "
                                       "msgpack can encode: None, bool, int, float, str, "
                                       "bytes, lists and dicts)" % (record[0], exc)) from None
    return encoded


def _unpack(data):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _key_order(key):
    return (isinstance(key, bytes), isinstance(key, str), key)


def _sorted_keys(encoded_keys):
    return sorted((_unpack(k) for k in encoded_keys), key=_key_order)


def _ordered(a, b):
    return (a, b) if _key_order(a) <= _key_order(b) else (b, a)
