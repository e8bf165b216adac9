"""The LMDB file format, the one place it is declared: both backends, the
native engine (through ``ext/_format.pxi``, which ``tools/write_format_pxi.py``
writes from this module) and the tests take it from here.

A database's sub-databases (:data:`SUB_DATABASES`):

- ``meta``: ``params`` -> the parameters (bytes the DB stores), and the
  counters (8 bytes big-endian each): ``distinct`` (the distinct
  fingerprints), ``next id`` (the id the next new document takes; none: 0),
  ``stale`` (fingerprints removed since the tables were last
  written whole), ``removed`` (documents removed since the records were last
  written whole), ``run ids`` (the highest run id a rewrite
  dropped) and, while the tables are being written again, ``rewrite`` (the
  next table, and the stale count the rewrite began with);
- ``blocks``: the documents, as records in blocks of consecutive ids. A
  record is the encoded key's length (2 bytes big-endian,
  :data:`KEY_LENGTH_BYTES`), the encoded key, then the document value
  (:mod:`simhashdb.records`). A block is keyed by the lowest id it was
  written with (8 bytes big-endian, :data:`ID_BYTES`), and its ids lie below
  the next block's key; its value is a zstd frame (its size and a checksum in
  the frame) of the block's body (:func:`block_body`): the count of records,
  each id as its difference from the one before (the first from the key),
  each record's size (all unsigned LEB128), then the records. A batch's new
  keys take the next ids (meta's ``next id``) in key order
  (:func:`key_order`) and are appended as blocks of at most
  :data:`RECORD_BLOCK_BYTES` stored (the last block, while under :data:`TAKEN_IN`,
  taken into the first of them); a key written again keeps its id and its
  record is replaced in its block, a removed one taken out of it (a block
  that outgrows RECORD_BLOCK_BYTES is split in two); an id is never given twice.
  A file of format 8 to 10 has ``records`` instead (:data:`RECORDS`): a
  record each under its id, read and written as it is until ``upgrade``
  copies it into blocks;
- the key map (sorted duplicates: the encoded key's hash, 8 bytes big-endian
  (:func:`key_hash`) -> the document id, 8 bytes big-endian; one entry per
  document), kept in :data:`KEY_SLOTS` slots as the index is: ``hashes``, then
  ``hashes:01`` to ``hashes:07``, each document's entry in exactly one of them.
  The key is stored once, in its record: a lookup reads the records of the
  ids under the key's hash and keeps the one holding the key (two keys may
  share a hash; a record whose key has another hash is damage). Documents
  are listed in key order: by key hash, then key;
- the fingerprint index (sorted duplicates: 8-byte big-endian fingerprint ->
  document id, 8 bytes big-endian, one entry per document), kept in
  :data:`INDEX_SLOTS` slots: ``fingerprints``, then ``index:01`` to
  ``index:07``. A write transaction puts its new entries of the key map and
  of the index into a slot of its own, which takes them in few pages whatever
  the database holds; a deletion goes to the slot that holds the entry; merges
  (the smallest slots in use into a free one, appended in order) keep about
  log_RUN_RATIO(N / batch) slots in use;
- ``runs``: the directory of live runs of each permutation table (keyed by
  the table) and of each band (keyed by :data:`BAND_DIRECTORY` + the band),
  :data:`TABLE_KEY_BYTES` bytes big-endian: a record of
  :data:`RUN_RECORD_BYTES` a run (run id 4, slot 1, entries 8), oldest first;
- ``runs:NNN:SS``: slot SS of table NNN, holding at most one run: the table's
  permuted fingerprints in order, in blocks coded by their differences
  (Elias-Fano), each keyed by the run id (4 bytes) and its first value (8):
  :data:`RUN_KEY_BYTES`. Every run has bit :data:`CHECKSUM_BIT` set in its
  id (a live run without it is damage) and ends each block with a checksum
  of the block's first value and bytes (:data:`SUM_BYTES`). A batch
  appends a run; the newest is merged into the one before while newest *
  :data:`RUN_RATIO` > previous (or the slots run short); once the entries
  removals left behind could reach 1/RUN_RATIO of the table, every table is
  written again from the index;
- ``band:BB:SS``: slot SS of band BB of the text documents' band index, runs
  as a table's: the entries ``band key << 32 | the fingerprint's top 32
  bits`` of the stored texts. A removal leaves its entries (``band stale``
  counts them; a search confirms what it finds by the signatures); once they
  could reach 1/RUN_RATIO of the bands' entries, the bands are written again
  from the documents (``band rewrite``: the next band, and the stale count
  it began with);
- ``recent``: the run entries of the latest small writes, kept together in
  one sub-database until they are many, so that a write of a few documents
  copies a few pages, not a page of every table and band. A record per write
  (key: a sequence number, 8 bytes big-endian, one above the last record's,
  the first 0; appended) holds its groups in ascending order of their 2-byte
  group key: :data:`RECENT_FINGERPRINTS` for the new fingerprints the tables
  would take (unpermuted), :func:`band_directory_key` of a band for that
  band's new entries; each group is its key (2 bytes big-endian), its count
  (4 bytes big-endian, at least 1) and that many 8-byte big-endian values,
  strictly ascending (:func:`recent_record`, :func:`recent_groups`). Meta's
  ``recent`` (:data:`RECENT`) counts the values recent holds. A write that
  would add runs (an upsert, or an insert-if-new, storing fingerprints or
  band entries the runs lack) appends its values to recent as one record
  while recent's values and its own stay within :data:`RECENT_LIMIT`;
  otherwise every run set takes one run of recent's values and the write's
  own (sorted, each once) and recent is emptied (its counter 0). Recent is
  also written out as runs and emptied before a step of a rewrite of the
  tables or the bands, and by compaction and the copy (a copy's target
  holds none). A recent value is a run entry in every respect: a search
  compares a probe with every recent fingerprint (within the distance, any
  prefix), a band search finds the recent entries under its keys, a removal
  leaves recent's entries as it leaves the runs' (stale, counted as such),
  and listings and checks of a table or band include them. A format-8 file
  (none) reads as an empty recent; opened writable it takes format 9 and
  ``recent`` is created.

Databases of format 6 and earlier (simhashdb 0.7 and earlier) keep the
documents as ``docs`` (:data:`OLD_DOCS`: encoded key -> document value) and
the index's keys in place of ids; those of format 7 (0.8) keep the records as
this format does but the key map by key (``keys``, :data:`OLD_KEYS`: encoded
key -> id). ``upgrade`` copies either into this form, and nothing else reads
them. The copy reads the old file's ``meta`` (the parameters and counters)
and its documents alone (from ``docs``, or from the records in id order), and
builds the key map, the index, the tables and the bands again, so it never
reads the old tables or bands, whatever their form: runs (with checksums or,
written before them, without), each table as ``table:NNN`` in simhashdb 0.3
and earlier (:data:`OLD_TABLE`: sorted, fixed-size duplicates, the permuted
fingerprint's top 2 bytes as key, the other 6 as value), each band as
``band:NN`` in 0.5 and earlier (:data:`OLD_BAND`, in the same form), or none
in 0.2. (The tests write such files to convert.)

A new kind of sub-database is one more :class:`SubDatabase` in
:data:`SUB_DATABASES`: :func:`max_dbs` and the names follow from it.
"""

from typing import NamedTuple

import zstandard

from ... import _text
from .. import BANDS


class SubDatabase(NamedTuple):
    """A family of sub-databases: ``count`` of them (per table where
    ``per_table``, per band where ``per_band``), named by ``pattern`` and
    their numbers (``first``: the name of number 0, where it has its own)."""

    pattern: bytes
    count: int = 1
    per_table: bool = False
    per_band: bool = False
    dupsort: bool = False
    dupfixed: bool = False
    first: bytes = b""

    def name(self, *numbers):
        """The name of the sub-database of ``numbers`` (table, then slot)."""
        if self.first and not numbers[-1]:
            return self.first
        return self.pattern % numbers if numbers else self.pattern

    def names(self, table=None):
        """The names of all of them (of ``table`` or band, for one per table
        or band)."""
        prefix = () if table is None else (table,)
        if self.count == 1 and not (self.per_table or self.per_band):
            return [self.pattern]
        return [self.name(*prefix, number) for number in range(self.count)]


RUN_SLOTS, RUN_RATIO = 8, 4  # a table's slots (one live run each); the merge ratio
# the bands' lazier merges: band b's ratio is BAND_RATIO + b / BAND_RATIO_SPREAD (3 to 4), so
# that the bands, which grow alike, do not merge their largest runs in the same batches
BAND_RATIO, BAND_RATIO_SPREAD = 3, 31  # see pyruns.merge_width
INDEX_SLOTS = 8  # the fingerprint index's slots (RUNS.md, "The index as runs")
KEY_SLOTS = INDEX_SLOTS  # the key map's slots, kept as the index's
ID_BYTES = 8  # a document id, big-endian: a record's key, a value of the key map and of the index
KEY_LENGTH_BYTES = 2  # a record's first bytes: its encoded key's length, big-endian
# the most bytes a block of records takes stored: two fill a 4 KiB page (LMDB gives a value of
# over 2,022 bytes pages of its own); a lone record over it makes a block of its own
RECORD_BLOCK_BYTES = 2022
RECORD_BLOCK_LEVEL = 3  # the blocks' zstd level
# a block's body is at most MAX_BODY, and at most MOST_EXPANDED times its stored bytes (past
# any zstd frame's expansion): a larger size in its frame is damage, refused before room is made
MAX_BODY, MOST_EXPANDED = 1 << 32, 1 << 16
TAKEN_IN = RECORD_BLOCK_BYTES * 7 // 8  # a last block under this takes a write's new records in

META = SubDatabase(b"meta")
RECORD_BLOCKS = SubDatabase(b"blocks")
RECORDS = SubDatabase(b"records")  # the documents of format 7 to 10: a record an id
KEYS = SubDatabase(b"hashes:%02d", KEY_SLOTS, dupsort=True, first=b"hashes")
INDEX = SubDatabase(b"index:%02d", INDEX_SLOTS, dupsort=True, first=b"fingerprints")
OLD_DOCS = SubDatabase(b"docs")
OLD_KEYS = SubDatabase(b"keys")  # format 7's key map: its presence marks a file of format 7
RECENT_WRITES = SubDatabase(b"recent")
RUN_DIRECTORY = SubDatabase(b"runs")
TABLE_RUNS = SubDatabase(b"runs:%03d:%02d", RUN_SLOTS, per_table=True)
BAND_RUNS = SubDatabase(b"band:%02d:%02d", RUN_SLOTS, per_band=True)
OLD_TABLE = SubDatabase(b"table:%03d", per_table=True, dupsort=True, dupfixed=True)
OLD_BAND = SubDatabase(b"band:%02d", BANDS, dupsort=True, dupfixed=True)

SUB_DATABASES = (META, RECORD_BLOCKS, RECORDS, KEYS, INDEX, RUN_DIRECTORY, TABLE_RUNS, BAND_RUNS, RECENT_WRITES)
SPARE_DBS = 1  # room for one more: the documents of format 6 being copied

# meta's keys
PARAMS, DISTINCT, STALE, REMOVED = b"params", b"distinct", b"stale", b"removed"
NEXT_ID = b"next id"
RUN_IDS, REWRITE = b"run ids", b"rewrite"
BAND_STALE, BAND_REWRITE = b"band stale", b"band rewrite"
RECENT = b"recent"  # the values recent holds

TABLE_KEY_BYTES = 2  # a key of the run directory: the table, or BAND_DIRECTORY + the band
BAND_DIRECTORY = 0x8000  # the directory key of band 0 (tables are fewer)
RUN_RECORD_BYTES = 13  # a run in the directory: id 4, slot 1, entries 8
RUN_KEY_BYTES = 12  # a block's key: run id 4, first value 8
CHECKSUM_BIT = 31  # set in the id of a run whose blocks end in their checksum
CHECKSUMMED = 1 << CHECKSUM_BIT
SUM_BYTES = 4  # a checksummed block's last bytes: its checksum, little-endian (the codec's)
RECENT_LIMIT = 8192  # the most values recent holds (about 250 texts, or 8,192 fingerprints)
RECENT_FINGERPRINTS = 0xFFFF  # recent's group key of the tables' new fingerprints
RECENT_GROUP_BYTES = 6  # a recent group's head: its key 2, its count 4

# the integer constants ext/_format.pxi declares for the native engine
NATIVE_CONSTANTS = ("RUN_SLOTS", "RUN_RATIO", "BAND_RATIO", "BAND_RATIO_SPREAD", "INDEX_SLOTS", "KEY_SLOTS", "ID_BYTES",
                    "KEY_LENGTH_BYTES", "RECORD_BLOCK_BYTES", "RECORD_BLOCK_LEVEL", "TABLE_KEY_BYTES",
                    "BAND_DIRECTORY", "RUN_RECORD_BYTES", "RUN_KEY_BYTES", "CHECKSUM_BIT",
                    "RECENT_LIMIT", "RECENT_FINGERPRINTS", "RECENT_GROUP_BYTES")


def max_dbs(tables):
    """The sub-databases an environment with room for ``tables`` tables opens."""
    return SPARE_DBS + sum(sub.count * (tables if sub.per_table else BANDS if sub.per_band else 1)
                           for sub in SUB_DATABASES)


def native_constants():
    """The text of ``ext/_format.pxi``: :data:`NATIVE_CONSTANTS` as a Cython enum."""
    lines = ["# Written by tools/write_format_pxi.py from simhashdb/storage/lmdb/format.py: change that, not this",
             "", "cdef enum:"]
    lines += ["    %s = %d" % (name, globals()[name]) for name in NATIVE_CONSTANTS]
    return "\n".join(lines) + "\n"


def key_hash(key):
    """The key map's key of encoded key ``key``: its 64-bit hash
    (:func:`simhashdb.fast_hash`, natively ``hash_bytes`` of ``ext/_hash.pxi``),
    8 bytes big-endian."""
    return _text.fast_hash(key).to_bytes(ID_BYTES, "big")


def key_order(key):
    """The sort key of encoded key ``key`` in the key order: its hash, then itself."""
    return key_hash(key), key


def directory_key(table):
    """The key of table ``table``'s directory of runs."""
    return table.to_bytes(TABLE_KEY_BYTES, "big")


def band_directory_key(band):
    """The key of band ``band``'s directory of runs."""
    return directory_key(BAND_DIRECTORY + band)


def directory_record(runs):
    """A directory of runs, [(run id, slot, entries)], as stored."""
    return b"".join(run.to_bytes(4, "big") + bytes([slot]) + entries.to_bytes(8, "big")
                    for run, slot, entries in runs)


def directory_runs(raw):
    """The runs [(run id, slot, entries)] of a stored directory; None where it
    is not a directory (a length off, a slot twice or out of range)."""
    runs = [(int.from_bytes(raw[i:i + 4], "big"), raw[i + 4], int.from_bytes(raw[i + 5:i + 13], "big"))
            for i in range(0, len(raw) - RUN_RECORD_BYTES + 1, RUN_RECORD_BYTES)]
    slots = {slot for _, slot, _ in runs}
    if len(raw) % RUN_RECORD_BYTES or len(slots) != len(runs) or any(s >= RUN_SLOTS for s in slots):
        return None
    return runs


def block_entries(value):
    """The entries of a run's block, from its stored value: its header counts
    those after the first (2 bytes, little-endian)."""
    return 1 + (value[0] | value[1] << 8) if len(value) >= 2 else 0


def new_run_id(last):
    """The id of a new run after id ``last`` (the table's newest live run's,
    or the highest a rewrite dropped; 0 for none): above it, and checksummed."""
    return (last + 1) | CHECKSUMMED


def checksummed(run):
    """Whether the blocks of run ``run`` end in their checksum."""
    return bool(run & CHECKSUMMED)


def block_key(run, first):
    """The key of run ``run``'s block whose first value is ``first``."""
    return run.to_bytes(4, "big") + first.to_bytes(8, "big")


def recent_record(groups):
    """A record of recent, as stored, from {group key: ascending values} (the
    empty groups left out)."""
    return b"".join(key.to_bytes(TABLE_KEY_BYTES, "big") + len(values).to_bytes(4, "big")
                    + b"".join(value.to_bytes(8, "big") for value in values)
                    for key, values in sorted(groups.items()) if values)


def recent_groups(raw):
    """{group key: [values]} of a stored record of recent; None where it is
    not one (a length off, groups out of order, an empty group, a group key
    that is neither RECENT_FINGERPRINTS nor a band's, values not ascending)."""
    groups, at, last = {}, 0, -1
    while at < len(raw):
        if at + RECENT_GROUP_BYTES > len(raw):
            return None
        key = int.from_bytes(raw[at:at + 2], "big")
        count = int.from_bytes(raw[at + 2:at + 6], "big")
        at += RECENT_GROUP_BYTES
        values = [int.from_bytes(raw[i:i + 8], "big") for i in range(at, at + 8 * count, 8)]
        at += 8 * count
        if (at > len(raw) or not count or key <= last
                or not (key == RECENT_FINGERPRINTS or BAND_DIRECTORY <= key < BAND_DIRECTORY + BANDS)
                or any(a >= b for a, b in zip(values, values[1:]))):
            return None
        groups[key], last = values, key
    return groups


def _leb128(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def block_body(key, records):
    """The body of a block keyed ``key`` holding ``records`` [(id, record)],
    ids ascending from ``key`` on."""
    head, last = [_leb128(len(records))], key
    for doc, _ in records:
        head.append(_leb128(doc - last))
        last = doc
    head += [_leb128(len(record)) for _, record in records]
    return b"".join(head) + b"".join(record for _, record in records)


def block_records(key, body):
    """[(id, record)] of the body of a block keyed ``key``; None where it is
    not one (a number past 64 bits or running past it, ids not ascending,
    sizes running past it or bytes left over)."""
    numbers, at = [], 0
    try:
        count = None
        while count is None or len(numbers) < 2 * count:
            n = shift = 0
            while True:
                byte = body[at]
                at += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80 or shift > 63:
                    break
            if byte >= 0x80 or n >> 64:
                return None
            if count is None:
                if not 0 < n <= len(body):
                    return None
                count = n
            else:
                numbers.append(n)
    except IndexError:
        return None
    records, doc = [], key
    for i, (step, size) in enumerate(zip(numbers[:count], numbers[count:])):
        if i and not step:
            return None
        doc += step
        records.append((doc, body[at:at + size]))
        at += size
    return records if at == len(body) and doc < 1 << 64 else None


_compressor = zstandard.ZstdCompressor(level=RECORD_BLOCK_LEVEL, write_checksum=True)


def pack_block(key, records):
    """A block as stored (a zstd frame of its body)."""
    return _compressor.compress(block_body(key, records))


def unpack_block(key, raw):
    """[(id, record)] of a stored block keyed ``key``; None where it is damaged."""
    try:
        if not 0 < zstandard.frame_content_size(raw) <= min(MAX_BODY,
                                                            MOST_EXPANDED * (len(raw) + 1)):
            return None
        reader = zstandard.ZstdDecompressor().decompressobj()
        body = reader.decompress(raw)
    except zstandard.ZstdError:
        return None
    return block_records(key, body) if reader.eof and not reader.unused_data else None
