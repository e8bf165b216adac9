"""The keys of a Redis database: their names, and how the tables' buckets,
the documents and the fingerprint index are cut into them (the module
docstring of :mod:`simhashdb.storage.redis` lists them)."""

import binascii
import uuid

import msgpack

from ...errors import DatabaseError
from ...layout import MAX_TABLES, Layout
from .. import BANDS
from .cluster import slot_tags

assert MAX_TABLES <= 0xB00  # a table's key never looks like a band's (N:b..)


class Keys:
    """The names of database ``name``'s keys (bytes). Those of one slot are
    attributes: ``params``, ``layout``, ``count``, ``distinct``, ``lock``,
    ``pending``, ``epoch``, ``hold``, ``queued``. Those of the tables and
    hashes follow the layout, once :meth:`use` gives it."""

    def __init__(self, name):
        self.name = name
        meta = b"{" + name + b"}:"
        (self.params, self.layout, self.count, self.distinct, self.lock, self.pending,
         self.epoch, self.hold, self.queued) = (meta + k for k in (
             b"params", b"layout", b"count", b"distinct", b"lock", b"pending", b"epoch",
             b"hold", b"queued"))

    def use(self, bits, tables):
        """Name the buckets of ``tables`` tables by their leading ``bits`` bits;
        an entry is then the remaining ``width`` bytes."""
        self.bits, self.width = bits, 8 - bits // 8
        # an eighth as many hashes of documents as buckets a table: most stay under
        # Redis's 128 fields, kept compact (a listpack), when the buckets hold ~16
        self.shard_bits = max(0, bits - 3)
        self.tables = [self.name + b":%03x" % t for t in range(tables)]
        # the bands' buckets are cut as the tables' are, under keys of the same
        # length (so that one MERGE call takes both); a band key's "b" never
        # starts a table's 3 hex digits, the tables being fewer than 0xb00
        self.bands = [self.name + b":b%02x" % b for b in range(BANDS)]
        self.key_length = len(self.tables[0]) + bits // 4

    def bucket(self, table, perm):
        """The bucket of the permuted fingerprint ``perm`` in ``table``."""
        if not self.bits:
            return self.tables[table]
        return self.tables[table] + b"%0*x" % (self.bits // 4, perm >> (64 - self.bits))

    def band_bucket(self, band, entry):
        """The bucket of band entry ``entry`` in band ``band``."""
        if not self.bits:
            return self.bands[band]
        return self.bands[band] + b"%0*x" % (self.bits // 4, entry >> (64 - self.bits))

    @staticmethod
    def bucket_kind(suffix):
        """(b"t", table) or (b"b", band) of the bucket key whose name ends in
        ``suffix`` after ``N:``."""
        if suffix[:1] == b"b":
            return b"b", int(suffix[1:3], 16)
        return b"t", int(suffix[:3], 16)

    def doc_shard(self, key):
        """The shard of the hash that holds document ``key``."""
        return binascii.crc32(key) >> (32 - self.shard_bits)

    def hash(self, kind, shard):
        """A hash of documents (``kind`` b"d") or of the fingerprint index (b"f")."""
        return self.name + b":" + kind + b":%x" % shard

    def fence(self, slot):
        """The fence of cluster slot ``slot``: the epoch of the last batch that wrote there."""
        return self.name + b":fence{" + slot_tags()[slot] + b"}"

    @staticmethod
    def new_record(layout):
        """The layout record of a new database: its layout, bucket bits and a
        token that tells this database from a later one of the same name."""
        bits = min(24, 8 * max(0, (min(layout.prefix_bits) - 6) // 8))
        return msgpack.packb({"bucket_bits": bits, "blocks": layout.blocks,
                              "distance": layout.distance, "instance": uuid.uuid4().hex}), bits

    @staticmethod
    def read_record(raw, path):
        """The (Layout, bucket bits) of a stored layout record, checked."""
        try:
            record = msgpack.unpackb(raw)
            layout, bits = Layout(record["blocks"], record["distance"]), record["bucket_bits"]
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            layout = bits = None
        if layout is None or bits not in (0, 8, 16, 24) or bits > min(layout.prefix_bits):
            raise DatabaseError("the layout record of %s is damaged" % path)
        return layout, bits
