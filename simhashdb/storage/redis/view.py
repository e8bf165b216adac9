"""Reads of a Redis database: each call sees whole batches (a batch may land
between two calls: Redis keeps no snapshots)."""

from .. import View


class RedisView(View):
    """Reads of committed data; each call sees whole batches (a batch may land
    between two calls: Redis keeps no snapshots)."""

    def __init__(self, db):
        self._db = db

    def _read(self, read):
        return self._db.protocol.consistent(lambda epoch: read())

    def params(self):
        return self._db.protocol.consistent(self._db.stored_params)

    def count(self):
        return self._counter(self._db.keys.count)

    def distinct(self):
        return self._counter(self._db.keys.distinct)

    def _counter(self, key):
        return self._db.counter(self._read(lambda: self._db.meta("GET", key)), key)

    def get(self, key):
        return self.get_many([key])[0]

    def get_many(self, keys):
        """In one round (seeing whole batches)."""
        found = self._read(lambda: self._db.hash_fields(b"d", keys, False))
        return [found[key] for key in keys]

    def keys_of(self, fingerprint):
        return self._read(lambda: self._db.keys_of([fingerprint]))[fingerprint]

    def keys_of_many(self, fingerprints):
        """In one round (seeing whole batches)."""
        return self._read(lambda: self._db.keys_of(fingerprints))

    def documents(self, after=None):
        """In the order (shard, key), a shard being a CRC of the key: each round
        of a few thousand documents sees whole batches, but batches may land
        between rounds (Redis keeps no snapshots): a document not changed
        meanwhile comes once, one written meanwhile may come or not."""
        return (doc[1:] for doc in self._db.documents(after))

    def fingerprint_groups(self):
        """In fingerprint order, each round seeing whole batches (as :meth:`documents`)."""
        return self._db.fingerprint_groups()

    def search(self, probes, distance):
        return self._db.search(probes, distance)

    def table_fingerprints(self, table):
        return self._db.protocol.consistent(
            lambda epoch: self._db.table_fingerprints(table, epoch))

    def band_search(self, keys):
        """Every document whose fingerprint's top 32 bits a band entry of a
        query's keys names, in fingerprint order: one round for the bands'
        buckets, one for the fingerprint index (seeing whole batches)."""
        return self._db.protocol.consistent(lambda epoch: self._db.band_search_committed(keys))

    def band_entries(self, band):
        return self._db.protocol.consistent(lambda epoch: self._db.band_entries(band, epoch))
