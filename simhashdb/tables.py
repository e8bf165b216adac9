"""Permutation tables and their storage.

:class:`Layout` is the math: m blocks over the 64 bits, one table for each
choice of m-k leading blocks. :class:`Store` is the only LMDB code in the
package: documents, the fingerprint index and one sorted sub-database per
table, behind a small interface (put, delete, range scan, snapshot) that a
second backend could provide.

On disk (one LMDB environment, a directory):

- ``meta``: ``b"params"`` -> msgpack dict of the layout and format version;
- ``docs``: msgpack(key) -> msgpack([fingerprint, meta]);
- ``fingerprints`` (sorted duplicates): 8-byte fingerprint -> msgpack(key),
  one entry per document;
- ``table:NNN`` (sorted, fixed-size duplicates): the 8-byte big-endian
  permuted fingerprint split into a 2-byte key and a 6-byte value, one entry
  per *distinct* fingerprint. Key-then-value order is the order of the
  permuted fingerprint, so a range scan works as on 8-byte keys, while LMDB
  packs the 6-byte values of one key side by side: about 8 bytes an entry
  where 8-byte keys with empty values cost 18 (node header and page pointer)
  before page slack.
"""

import contextlib
import fcntl
import itertools
import math
import os
import threading
from array import array

import lmdb

from . import _ext
from .errors import DatabaseBusyError, DatabaseError, InvalidArgumentError

MAX_TABLES = 1024
DEFAULT_EXPECTED_SIZE = 10_000_000
_INITIAL_MAP_SIZE = 1 << 30
_COMPACT_SUFFIX = ".compact"


class Layout:
    """Blocks and permutation tables for ``blocks`` blocks and ``distance`` bits.

    Block widths differ by at most one bit, wider blocks first. Table t puts
    the t-th combination (in lexicographic order) of ``blocks - distance``
    blocks first, the other blocks after them in their original order.
    """

    def __init__(self, blocks, distance):
        if not isinstance(distance, int) or not 0 <= distance < 64:
            raise InvalidArgumentError("distance must be an int in [0, 64), got %r" % (distance,))
        if not isinstance(blocks, int) or not distance < blocks <= 64:
            raise InvalidArgumentError(
                "blocks must be an int with distance < blocks <= 64 (distance is %d), got %r"
                % (distance, blocks))
        count = math.comb(blocks, distance)
        if count > MAX_TABLES:
            raise InvalidArgumentError(
                "blocks=%d, distance=%d needs %d tables, more than %d; use fewer blocks"
                % (blocks, distance, count, MAX_TABLES))
        self.blocks, self.distance = blocks, distance
        self.widths = [64 // blocks + (i < 64 % blocks) for i in range(blocks)]
        shifts = [64 - sum(self.widths[:i + 1]) for i in range(blocks)]
        self.leading = list(itertools.combinations(range(blocks), blocks - distance))
        spec, prefixes = [], []
        for lead in self.leading:
            order = list(lead) + [b for b in range(blocks) if b not in lead]
            position = 64
            for b in order:
                position -= self.widths[b]
                spec += [shifts[b], self.widths[b], position]
            prefix_bits = sum(self.widths[b] for b in lead)
            prefixes.append(((1 << prefix_bits) - 1) << (64 - prefix_bits))
        self.spec = array("l", spec)
        self.prefixes = array("Q", prefixes)
        self.block_masks = array("Q", [((1 << w) - 1) << s for w, s in zip(self.widths, shifts)])
        self.leading_masks = array("Q", [sum(1 << b for b in lead) for lead in self.leading])

    @property
    def tables(self):
        """Number of permutation tables."""
        return len(self.leading)

    def scan_bounds(self, fp):
        """Per table, the permuted fp; and per table, (first, last) key of its candidate range."""
        return _ext.scan_bounds(fp, self.spec, self.prefixes)

    def table_items(self, fps, table):
        """Sorted (key, value) items of ``fps`` in ``table``."""
        return _ext.table_items(fps, self.spec, table, self.tables)

    def unpermute(self, perm, table):
        """The fingerprint stored as ``perm`` in ``table``."""
        return _ext.unpermute(perm, self.spec, table, self.tables)

    @staticmethod
    def choose_blocks(distance, expected_size=DEFAULT_EXPECTED_SIZE):
        """The block count m minimising C(m, k) * (2 + N / 2**prefix): a seek per
        table, plus the candidates a random corpus of N puts in its range."""
        def cost(m):
            prefix = (m - distance) * (64 // m)
            return math.comb(m, distance) * (2 + expected_size / 2.0 ** prefix)
        usable = [m for m in range(distance + 1, 65) if math.comb(m, distance) <= MAX_TABLES]
        return min(usable, key=cost)


class _Gate:
    """Lets transactions run together, or one change of the environment itself
    (growing the map, compacting, closing) run alone, as LMDB requires."""

    def __init__(self):
        self._changed = threading.Condition()
        self._running = 0
        self._exclusive = False
        self._held = threading.local()

    @contextlib.contextmanager
    def shared(self):
        with self._changed:
            while self._exclusive:
                self._changed.wait()
            self._running += 1
        self._held.count = getattr(self._held, "count", 0) + 1
        try:
            yield
        finally:
            self._held.count -= 1
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def held_here(self):
        """Whether this thread is inside a transaction of its own."""
        return getattr(self._held, "count", 0) > 0

    @contextlib.contextmanager
    def exclusive(self, what):
        if self.held_here():
            raise DatabaseError("cannot %s while this thread holds a read snapshot (an "
                                "unfinished iteration); finish or close it first" % what)
        with self._changed:
            while self._exclusive:
                self._changed.wait()
            self._exclusive = True
            while self._running:
                self._changed.wait()
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()


class Store:
    """The LMDB environment at ``path`` with its documents, fingerprint index
    and permutation tables. Snapshots and the writer run side by side; the
    writers of one process take turns."""

    _open_paths = set()
    _open_paths_lock = threading.Lock()

    def __init__(self, path, readonly=False):
        self.path = os.path.abspath(os.fspath(path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise DatabaseError("%s is a file; a database is a directory: pass a new or "
                                "existing database directory" % self.path)
        if readonly and not os.path.exists(os.path.join(self.path, "data.mdb")):
            raise DatabaseError("no database at %s to open read-only" % self.path)
        with Store._open_paths_lock:
            if self.path in Store._open_paths:
                raise DatabaseError("%s is already open in this process; share that DB "
                                    "object (LMDB allows one handle per process)" % self.path)
            Store._open_paths.add(self.path)
        self.readonly = readonly
        self._pid = os.getpid()
        self._write_lock = threading.Lock()
        self._gate = _Gate()
        self.env = None
        self._table_count = 0
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lockfile = open(os.path.join(self.path, "simhashdb.lock"), "a+b")
            fcntl.flock(self._lockfile, fcntl.LOCK_SH)
            self._open_env()
        except BaseException:
            self.close()
            raise

    def _open_env(self):
        data = os.path.join(self.path, "data.mdb")
        leftover = data + _COMPACT_SUFFIX
        if os.path.exists(leftover) and not self.readonly and self._try_exclusive():
            os.unlink(leftover)  # a compaction that died before its swap
            fcntl.flock(self._lockfile, fcntl.LOCK_SH)
        size = os.path.getsize(data) if os.path.exists(data) else 0
        try:
            self.env = lmdb.open(self.path, map_size=max(_INITIAL_MAP_SIZE, 2 * size),
                                 max_dbs=MAX_TABLES + 3, readonly=self.readonly,
                                 max_readers=512, subdir=True)
        except lmdb.Error as exc:
            raise DatabaseError("cannot open the database at %s: %s" % (self.path, exc)) from None
        self.env.reader_check()
        self._dbs = {name: self._open_db(name) for name in (b"meta", b"docs")}
        self._dbs[b"fingerprints"] = self._open_db(b"fingerprints", dupsort=True)
        self.open_tables(self._table_count)

    def _open_db(self, name, dupsort=False, dupfixed=False):
        try:
            return self.env.open_db(name, dupsort=dupsort, dupfixed=dupfixed,
                                    create=not self.readonly)
        except lmdb.NotFoundError:
            raise DatabaseError("%s has no %r sub-database: it is not a simhashdb database"
                                % (self.path, name.decode())) from None

    def open_tables(self, count):
        """Open (creating where writable) the sub-databases of ``count`` tables."""
        self._table_count = count
        for table in range(count):
            if table_name(table) not in self._dbs:
                self._dbs[table_name(table)] = self._open_db(
                    table_name(table), dupsort=True, dupfixed=True)

    def _try_exclusive(self):
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _check_usable(self):
        if self.env is None:
            raise DatabaseError("the database at %s is closed" % self.path)
        if os.getpid() != self._pid:
            raise DatabaseError("this DB was opened in process %d before a fork; open a new "
                                "DB in the child process" % self._pid)

    @contextlib.contextmanager
    def snapshot(self):
        """A read transaction: a consistent view that blocks no writer."""
        while True:
            with self._gate.shared():
                self._check_usable()
                try:
                    txn = self.env.begin()
                except lmdb.MapResizedError:
                    txn = None
                if txn is not None:
                    try:
                        yield Snapshot(self, txn)
                    finally:
                        txn.abort()  # a read transaction: no wait
                    return
            self._resize(0)  # another process grew the map: adopt its size

    def write(self, body):
        """Run ``body(writer)`` in one write transaction and commit it; it lands
        whole or not at all. A full map is grown and ``body`` run again."""
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock:
            while True:
                failed = None
                try:
                    with self._gate.shared():
                        self._check_usable()
                        txn = self.env.begin(write=True)
                        try:
                            result = body(Writer(self, txn))
                        except BaseException:
                            failed = txn
                            raise
                        txn.commit()
                        return result
                except lmdb.MapResizedError:
                    self._resize(0)  # another process grew the map: adopt its size
                except lmdb.MapFullError:
                    self._abort(failed)
                    self._resize(2 * self.env.info()["map_size"])
                except BaseException:
                    self._abort(failed)
                    raise

    def _abort(self, txn):
        """Abort a failed write transaction. py-lmdb 3 makes an abort wait until no
        other thread is inside LMDB, so readers are held off until it is done."""
        if txn is None:
            return
        if self._gate.held_here():
            txn.abort()
        else:
            with self._gate.exclusive("abort a write"):
                txn.abort()

    def _resize(self, map_size):
        """Set the map size (0: adopt another process's), with no transaction running."""
        with self._gate.exclusive("grow the map"):
            self._check_usable()
            self.env.set_mapsize(map_size)

    def compact(self):
        """Rewrite the data file without free pages, then swap it in atomically.

        :raises DatabaseBusyError: when another handle has the database open.
        """
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock, self._gate.exclusive("compact"):
            self._check_usable()
            if not self._try_exclusive():
                raise DatabaseBusyError(
                    "cannot compact %s while another process or handle has it open; close "
                    "the others and retry" % self.path)
            try:
                data = os.path.join(self.path, "data.mdb")
                with open(data + _COMPACT_SUFFIX, "wb") as copy:
                    self.env.copyfd(copy.fileno(), compact=True)
                    copy.flush()
                    os.fsync(copy.fileno())
                self.env.close()
                os.replace(data + _COMPACT_SUFFIX, data)
                directory = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
                self._open_env()
            finally:
                fcntl.flock(self._lockfile, fcntl.LOCK_SH)

    def disk_bytes(self):
        """Size of the data file in bytes."""
        return os.path.getsize(os.path.join(self.path, "data.mdb"))

    def close(self):
        """Close the environment; later calls raise DatabaseError."""
        with self._write_lock, self._gate.exclusive("close the database"):
            if self.env is not None:
                self.env.close()
                self.env = None
            lockfile = getattr(self, "_lockfile", None)
            if lockfile is not None and not lockfile.closed:
                lockfile.close()
            with Store._open_paths_lock:
                Store._open_paths.discard(self.path)


class Snapshot:
    """Reads over one transaction."""

    def __init__(self, store, txn):
        self.store, self.txn = store, txn
        self._cursors = {}
        self._table_cursors = None

    def _cursor(self, name):
        cursor = self._cursors.get(name)
        if cursor is None:
            cursor = self._cursors[name] = self.txn.cursor(self.store._dbs[name])
        return cursor

    def get(self, name, key):
        """The value of ``key`` in sub-database ``name``, or None."""
        return self._cursor(name).get(key)

    def items(self, name, keys=True, values=True):
        """Iterate a sub-database in key order."""
        cursor = self._cursor(name)
        if not cursor.first():
            return iter(())
        return cursor.iternext(keys=keys, values=values)

    def count(self, name):
        """Number of entries in sub-database ``name``."""
        return self.txn.stat(self.store._dbs[name])["entries"]

    def duplicates(self, key):
        """The values stored under ``key`` in the fingerprint index."""
        cursor = self._cursor(b"fingerprints")
        if not cursor.set_key(key):
            return []
        return list(cursor.iternext_dup())

    def fingerprint_groups(self):
        """(8-byte fingerprint, [encoded keys]) for each distinct fingerprint, in order."""
        for fp_key, entries in itertools.groupby(self.items(b"fingerprints"),
                                                 key=lambda item: item[0]):
            yield fp_key, [key for _, key in entries]

    def has(self, name, key):
        """Whether ``key`` is in sub-database ``name``."""
        return self._cursor(name).set_key(key)

    def has_any(self, name, keys):
        """Whether any of ``keys`` is in sub-database ``name`` (one call; sorted
        keys are looked up fastest)."""
        return bool(self._cursor(name).getmulti(keys))

    def scan(self, bounds):
        """Range-scan every table: for each (first, last) of ``bounds``, in table
        order, the 8-byte entries in [first, last] concatenated (b"" for none)."""
        cursors = self._table_cursors
        if cursors is None:
            cursors = self._table_cursors = [
                self._cursor(table_name(t)) for t in range(self.store._table_count)]
        return [_scan(cursor, first, last) for cursor, (first, last) in zip(cursors, bounds)]

    def table_entries(self, table):
        """Every 8-byte entry of ``table``, in order."""
        return (key + value for key, value in self.items(table_name(table)))


class Writer(Snapshot):
    """Reads and writes over one write transaction."""

    def put(self, name, key, value):
        """Store ``key`` -> ``value`` (in the fingerprint index: add a duplicate)."""
        self._cursor(name).put(key, value)

    def put_many(self, name, items):
        """Store (key, value) ``items`` (in a sorted-duplicates sub-database: add them)."""
        self._cursor(name).putmulti(items)

    def delete(self, name, key, value=None):
        """Remove ``key`` (in a sorted-duplicates sub-database, the pair ``key``, ``value``)."""
        cursor = self._cursor(name)
        found = cursor.set_key(key) if value is None else cursor.set_key_dup(key, value)
        return found and cursor.delete()


def _scan(cursor, first, last):
    if not cursor.set_range_dup(first[:2], first[2:]):
        following = (int.from_bytes(first[:2], "big") + 1).to_bytes(3, "big")[1:]
        if first[:2] == b"\xff\xff" or not cursor.set_range(following):
            return b""
    found = []
    for key, value in cursor.iternext():
        entry = key + value
        if entry > last:
            break
        found.append(entry)
    return b"".join(found)


def table_name(table):
    """The sub-database name of permutation table ``table``."""
    return b"table:%03d" % table
