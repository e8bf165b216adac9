"""What the py-lmdb backend's reads and writes share: the sub-databases' names,
a run's blocks written and read (coded by ``_ext`` as the native engine codes
them), when runs merge, a family of slots as one (the index, the key map),
recent's records read, the documents' records, counters and the errors for a
damaged file."""

import heapq
import itertools
import sys
from array import array
from typing import NamedTuple

from ... import _ext
from ...errors import DamagedError, DatabaseError
from .. import BANDS, band_entries
from . import format
from .format import (
    BAND_DIRECTORY,
    BAND_RATIO,
    BAND_RATIO_SPREAD,
    ID_BYTES,
    KEY_LENGTH_BYTES,
    RECENT_FINGERPRINTS,
    RUN_KEY_BYTES,
    RUN_RATIO,
    RUN_SLOTS,
    block_key,
    recent_groups,
)

META, RECORDS, RUNS = format.META.name(), format.RECORDS.name(), format.RUN_DIRECTORY.name()
RECORD_BLOCKS = format.RECORD_BLOCKS.name()
RECENT_WRITES = format.RECENT_WRITES.name()
OLD_DOCS, OLD_KEYS = format.OLD_DOCS.name(), format.OLD_KEYS.name()
BAND_SLOTS = [name for band in range(BANDS) for name in format.BAND_RUNS.names(band)]
slot_name = format.TABLE_RUNS.name
band_slot_name = format.BAND_RUNS.name
BAND_GROUP = 8  # bands a rewrite writes in one transaction (a pass over the documents)
MAX_VALUE = (1 << 64) - 1


def merge_width(runs, band):
    """How many of the newest ``runs`` the merge policy takes into one next
    (0: none). A table's (``band`` None; the ratio rule): the two newest,
    where the newest is over 1/RUN_RATIO of the one before. Band ``band``'s
    (a band search asks each run's filter, so runs cost it little): none
    until it has RUN_SLOTS - 2 runs, then the newest j (two at least) while
    together they are over 1/F of the run before them, F = BAND_RATIO + band
    / BAND_RATIO_SPREAD (the bands grow alike: each its own F keeps their
    largest merges apart). Either merges once the slots run short
    (RUN_SLOTS - 1 runs: a merge needs a free slot)."""
    if len(runs) < 2:
        return 0
    if band is None:
        return 2 if len(runs) >= RUN_SLOTS - 1 or runs[-1][2] * RUN_RATIO > runs[-2][2] else 0
    if len(runs) < RUN_SLOTS - 2:
        return 0
    width, merged = 2, runs[-1][2] + runs[-2][2]
    while width < len(runs) and merged * (BAND_RATIO * BAND_RATIO_SPREAD + band) > \
            runs[-1 - width][2] * BAND_RATIO_SPREAD:
        merged += runs[-1 - width][2]
        width += 1
    return width


def merge_due(runs, limit, band):
    """Whether a batch merges now (merge_width; ``band`` None for a table)
    within ``limit`` entries, or whatever their size where the slots run
    short (a run set never keeps more runs than the next batch leaves room
    for); with no limit, while any merges are left."""
    if limit is None:
        return merges_left(runs, band is not None)
    width = merge_width(runs, band)
    return bool(width) and (len(runs) >= RUN_SLOTS - 1
                            or sum(size for _, _, size in runs[-width:]) <= limit)


def settle_due(runs, settle):
    """Whether settling (``settle`` entries; 0: not) merges the two newest
    runs: they hold at most that many together."""
    return bool(settle) and len(runs) >= 2 and runs[-1][2] + runs[-2][2] <= settle


def merges_left(runs, lazy):
    """Whether some merge is due (for tidy): a table's run over 1/RUN_RATIO
    of the one before it, or the slots running short; a band's RUN_SLOTS -
    2 runs."""
    if lazy:
        return len(runs) >= RUN_SLOTS - 2
    return len(runs) >= RUN_SLOTS - 1 or any(
        newer[2] * RUN_RATIO > older[2] for older, newer in zip(runs, runs[1:]))


BROUGHT, TAKEN = 1, 2  # what a batch did with a band entry (note_bands)


def note_bands(bands, value, fingerprint, added):
    """Note the band entries of a document value as brought (``added``) or
    taken away: {(band, entry): BROUGHT, TAKEN or both}."""
    for band, entry in enumerate(band_entries(value, fingerprint)):
        bands[band, entry] = bands.get((band, entry), 0) | (BROUGHT if added else TAKEN)


class Slots:
    """A family of sub-databases of sorted duplicates (8 bytes -> a document
    id) kept in slots, each entry in one of them (the fingerprint index, the
    key map by key hash): ``names``, the slots a storage opened, from the
    first. This backend puts new entries into the first slot and leaves
    merging them to the native engine, so any slot may hold any entry."""

    def __init__(self, kind):
        self.kind, self.names = kind, []
        self.first = kind.name(0)

    def __len__(self):
        return len(self.names)


def slot_items(txn, storage, slots, start=None):
    """(key, value) of every entry of the family ``slots`` from key ``start``
    on, in order: the union of its slots."""
    found = []
    for name in slots.names:
        cursor = txn.cursor(storage._dbs[name])
        if cursor.set_range(start) if start is not None else cursor.first():
            found.append(cursor.iternext())
    return heapq.merge(*found)


def index_items(txn, storage, start=None):
    """(fingerprint bytes, document id bytes) of every entry of the index from
    ``start`` (8 bytes) on, in order."""
    return slot_items(txn, storage, storage._index, start)


class Recent(NamedTuple):
    """What recent holds: the tables' fingerprints (unpermuted) and each band's
    entries ({band: values}), each once, ascending; ``values``, what its
    records count (meta's ``recent``); ``records``, the (key, value) records
    it was read from, in order."""

    fingerprints: array
    bands: dict
    values: int
    records: tuple


EMPTY_RECENT = Recent(array("Q"), {}, 0, ())


def read_recent(cursor, counted, path, known=EMPTY_RECENT):
    """What recent holds, from a cursor on it and meta's count of its values
    (``counted``); the records of ``known`` (an earlier read) that lead it
    are not parsed again (they only grow until recent is emptied).

    :raises DamagedError: a record is not one (a key not ID_BYTES long, no
        groups, a group's length off or out of order), or their values are not
        ``counted``.
    """
    records = tuple(cursor.iternext())
    if records[:len(known.records)] != known.records:
        known = EMPTY_RECENT
    fps, bands, values = set(), {}, known.values
    for key, raw in records[len(known.records):]:
        groups = recent_groups(raw) if len(key) == ID_BYTES else None
        if not groups:
            raise recent_damaged_error(path, "recent's record %s is not one" % key.hex())
        for group, held in groups.items():
            values += len(held)
            if group == RECENT_FINGERPRINTS:
                fps.update(held)
            else:
                bands.setdefault(group - BAND_DIRECTORY, set()).update(held)
    if values != counted:
        raise recent_damaged_error(path, "meta's %r counts %d values, recent holds %d"
                                   % (format.RECENT.decode(), counted, values))
    if len(records) == len(known.records):
        return known
    return Recent(_ext.merge_unique(known.fingerprints, sorted(fps)), {
        band: _ext.merge_unique(known.bands.get(band, ()), sorted(bands.get(band, ())))
        for band in sorted(bands.keys() | known.bands.keys())}, values, records)


def record_bytes(key, value):
    """A document's record: its key's length, the key, the value."""
    return len(key).to_bytes(KEY_LENGTH_BYTES, "big") + key + value


def record_parts(raw, path, doc_id):
    """(key, value) of the record ``raw`` of document ``doc_id`` (its id's bytes).

    :raises DatabaseError: its key's length runs past it, or the id is not
        ID_BYTES long (damage).
    """
    end = KEY_LENGTH_BYTES + int.from_bytes(raw[:KEY_LENGTH_BYTES], "big")
    if len(raw) < end or len(doc_id) != ID_BYTES:
        raise damaged_error(path, "the record of document id %s" % doc_id.hex())
    return raw[KEY_LENGTH_BYTES:end], raw[end:]


def id_bytes(number):
    return number.to_bytes(ID_BYTES, "big")


def old_documents_error(path):
    return DatabaseError("%s keeps its documents in the form of simhashdb 0.8 and earlier, "
                         "which this version does not read: convert it with `simhashdb-cli "
                         "upgrade %s` (or simhashdb.upgrade(path))" % (path, path))


def distinct_fingerprints(items):
    """The distinct fingerprints of sorted index ``items``."""
    return [_ext.unpack_key(fp_bytes) for fp_bytes, _ in itertools.groupby(items,
                                                                          key=lambda i: i[0])]


def fill_empty(cursor, items, dupsort):
    """Put sorted ``items`` into an empty sub-database, every one of them;
    returns how many. Appends only where there are no duplicates: py-lmdb
    before 3.0 appends duplicates with MDB_APPEND, which refuses each value
    after a key's first and putmulti counts it as not added instead of
    failing."""
    consumed, added = cursor.putmulti(items, dupdata=dupsort, append=not dupsort)
    if added != consumed:
        raise DatabaseError("a copy wrote %d of %d entries; the database is unchanged"
                            % (added, consumed))
    return consumed


def read_counter(raw, path, name):
    """A counter in meta, read (u64 big-endian; 0 where absent)."""
    if raw is not None and len(raw) != 8:
        raise damaged_error(path, "meta's %r" % name.decode())
    return int.from_bytes(raw, "big") if raw else 0


def count_bytes(value):
    return value.to_bytes(8, "big")


def write_run(txn, db, run, values):
    """Write ascending ``values`` into the empty slot ``db`` as run ``run``: a
    block an item, keyed by the run id and the block's first value."""
    try:
        blocks = _ext.encode_run(values)
    except ValueError:
        raise DatabaseError("a run's values out of order: the database is damaged; "
                            "restore it from a backup") from None
    items = [(block_key(run, first), block) for first, block in blocks]
    if txn.cursor(db).putmulti(items, append=True)[1] != len(items):
        raise DatabaseError("a slot for a new run was not empty: the database is damaged; "
                            "restore it from a backup")


def read_block(storage, table, key, value):
    """The values of the block item (``key``, ``value``) of a run of run set ``table``."""
    try:
        if len(key) != RUN_KEY_BYTES:
            raise ValueError
        return _ext.decode_block(int.from_bytes(key[4:], "big"), value)
    except ValueError as exc:
        raise run_damaged_error(storage.path, storage._set_named(table), str(exc)) from None


def run_damaged_error(path, named, why):
    """The error for a block of a run of ``named`` (a table or band) that is
    damaged, ``why``: compact() writes every run again."""
    return DamagedError("%s is damaged: a block of %s is unreadable (%s); db.check() lists "
                         "the damage, and compact() writes the tables again from the "
                         "fingerprint index and the bands from the documents" % (path, named, why))


def recent_damaged_error(path, what):
    """The error for a recent that is not as written, ``what``: compact() mends it."""
    return DamagedError("%s is damaged: %s; compact() writes the tables again from the "
                        "fingerprint index and the bands from the documents" % (path, what))


def damaged_error(path, what):
    return DamagedError("%s is damaged (%s is unreadable): restore it from a backup"
                         % (path, what))


def big_endian(values):
    """A uint64 array as concatenated 8-byte big-endian values."""
    if sys.byteorder == "little":
        values.byteswap()
    return values.tobytes()
