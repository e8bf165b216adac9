"""The native LMDB backend: :mod:`simhashdb._lmdb` on the LMDB C API.

Searches, upserts, removals and insert-if-new run as whole batches in native
code without the GIL; a fault on a damaged file becomes DatabaseError. The
files are the same as the py-lmdb backend's.
"""

import concurrent.futures
import contextlib
import os
import threading
import time
import warnings
from array import array

from . import _ext, _lmdb
from .errors import DatabaseError
from .lmdb_files import Gate, LmdbDirectory
from .storage import Storage, Txn, View

INITIAL_MAP_SIZE = 1 << 30
MAX_READERS = 4096
READER_CHECK_SECONDS = 1.0
ITEMS_PER_READ = 4096
PARALLEL_PROBES = 4096  # a query_many this large is split over the cores
THREADS = min(os.cpu_count() or 1, 8)
_threads = None


def _pool():
    global _threads
    if _threads is None:
        _threads = concurrent.futures.ThreadPoolExecutor(THREADS, "simhashdb-search")
    return _threads


class NativeStorage(Storage):
    """An LMDB environment in the directory ``path``, owned by native code."""

    max_key_bytes = 511
    backend = "lmdb"

    def __init__(self, path, readonly=False):
        self._dir = LmdbDirectory(path, readonly, self)
        self.path, self.readonly = self._dir.path, readonly
        self._gate = Gate()
        self._write_lock = threading.Lock()
        self._pid = os.getpid()
        self._layout = None
        self._env = None
        self._readers_checked = 0.0
        try:
            self._open_env()
        except BaseException:
            self._dir.release()
            raise

    def _open_env(self):
        size = os.path.getsize(self._dir.data) if os.path.exists(self._dir.data) else 0
        self._env = _lmdb.Env(self.path.encode(), self.readonly, max(INITIAL_MAP_SIZE, 2 * size),
                              MAX_READERS, not self._dir.locked)
        self._open_dbs()

    def _open_dbs(self):
        layout = self._layout
        if layout is None:
            self._env.open_dbs(array("l"), array("Q"), [], not self.readonly)
        else:
            self._env.open_dbs(layout.spec, layout.prefixes, layout.prefix_bits, not self.readonly)

    def open_tables(self, layout):
        self._layout = layout
        self._open_dbs()

    def _check_usable(self):
        if self._env is None:
            raise DatabaseError("the database at %s is closed" % self.path)
        if os.getpid() != self._pid:
            raise DatabaseError("this DB was opened in process %d before a fork; open a new "
                                "DB in the child process" % self._pid)

    @contextlib.contextmanager
    def read(self):
        while True:
            with self._gate.shared():
                self._check_usable()
                try:
                    txn = self._env.begin()
                except _lmdb.MapResizedError:
                    txn = None
                if txn is not None:
                    try:
                        yield NativeView(self, txn)
                    finally:
                        txn.abort()
                    return
            self._resize(0)  # another process grew the map: adopt its size

    def search(self, probes, distance):
        """Search in a snapshot of its own, split over the cores for large batches."""
        flips = self._layout.prefix_flips(distance)
        if len(probes) < PARALLEL_PROBES or THREADS < 2:
            return self._search(probes, distance, flips)
        step = -(-len(probes) // THREADS)
        parts = [probes[i:i + step] for i in range(0, len(probes), step)]
        results = []
        for part in _pool().map(lambda part: self._search(part, distance, flips), parts):
            results += part
        return results

    def _search(self, probes, distance, flips):
        gate = self._gate
        while True:
            gate.enter()
            try:
                self._check_usable()
                txn = self._env.begin()
                try:
                    return txn.search(probes, distance, flips)
                finally:
                    txn.abort()
            except _lmdb.MapResizedError:
                pass
            finally:
                gate.leave()
            self._resize(0)  # another process grew the map: adopt its size

    def write(self, body):
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock:
            while True:
                try:
                    with self._gate.shared():
                        self._check_usable()
                        self._clear_stale_readers()
                        txn = self._env.begin(write=True)
                        try:
                            result = body(NativeTxn(self, txn))
                            txn.commit()
                            return result
                        finally:
                            txn.abort()  # after a commit: nothing to do
                except _lmdb.MapResizedError:
                    self._resize(0)
                except _lmdb.MapFullError:
                    self._grow()

    def _clear_stale_readers(self, now=None):
        """Free the reader slots of dead processes (at most once a second): a
        dead reader's snapshot would keep every later freed page from reuse."""
        now = time.monotonic() if now is None else now
        if now - self._readers_checked >= READER_CHECK_SECONDS:
            self._readers_checked = now
            self._env.reader_check()

    def _grow(self):
        self._clear_stale_readers(now=float("inf"))
        info = self._env.info()
        if info["readers"] > 1:
            warnings.warn("%s: growing the map to %d bytes while %d snapshots are open; pages "
                          "freed since the oldest began cannot be reused until it ends"
                          % (self.path, 2 * info["map_size"], info["readers"] - 1),
                          ResourceWarning, stacklevel=4)
        self._resize(2 * info["map_size"])

    def _resize(self, map_size):
        with self._gate.exclusive("grow the map"):
            self._check_usable()
            self._env.set_mapsize(map_size)

    def compact(self):
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._write_lock, self._gate.exclusive("compact"):
            self._check_usable()
            with self._dir.compaction() as copy:
                map_size = max(INITIAL_MAP_SIZE, 2 * os.path.getsize(self._dir.data))
                while True:
                    try:
                        self._copy_to(copy, map_size)
                        break
                    except _lmdb.MapFullError:
                        map_size *= 2
                self._env.close()
                self._env = None
            self._open_env()

    def _copy_to(self, copy, map_size):
        """Write the database, compacted, into the new file ``copy``."""
        if os.path.exists(copy):
            os.unlink(copy)
        target = _lmdb.Env(copy.encode(), False, map_size, 1, True, False)
        try:
            layout = self._layout
            target.open_dbs(layout.spec, layout.prefixes, layout.prefix_bits, True)
            source, written = self._env.begin(), target.begin(write=True)
            try:
                source.copy_into(written)
                written.commit()
            finally:
                source.abort()
                written.abort()
        finally:
            target.close()

    def info(self):
        self._check_usable()
        return {"backend": self.backend, "disk_bytes": self._dir.disk_bytes(),
                "map_size": self._env.info()["map_size"]}

    def close(self):
        with self._write_lock, self._gate.exclusive("close the database"):
            if self._env is not None:
                self._env.close()
                self._env = None
            self._dir.release()


class NativeView(View):
    """Reads over one native LMDB transaction."""

    def __init__(self, storage, txn):
        self._storage, self._txn = storage, txn

    def params(self):
        return self._txn.get(b"params", True)

    def count(self):
        return self._txn.entries("docs")

    def distinct(self):
        return self._txn.entries("table:000")

    def get(self, key):
        return self._txn.get(key)

    def documents(self):
        return self._items("docs")

    def _items(self, which):
        after = None
        while True:
            chunk = self._txn.items(which, after, ITEMS_PER_READ)
            yield from chunk
            if len(chunk) < ITEMS_PER_READ:
                return
            after = chunk[-1][0] + (chunk[-1][1] if which == "fingerprints" else b"")

    def keys_of(self, fingerprint):
        return self._txn.keys_of(fingerprint)

    def fingerprint_groups(self):
        group, keys = None, []
        for fp_bytes, key in self._items("fingerprints"):
            if fp_bytes != group:
                if keys:
                    yield _ext.unpack_key(group), keys
                group, keys = fp_bytes, []
            keys.append(key)
        if keys:
            yield _ext.unpack_key(group), keys

    def search(self, probes, distance):
        return self._txn.search(probes, distance, self._storage._layout.prefix_flips(distance))

    def table_fingerprints(self, table):
        return self._txn.table_values(table)


class NativeTxn(NativeView, Txn):
    """Reads and writes over the native LMDB write transaction."""

    def set_params(self, raw):
        self._txn.put_meta(b"params", raw)

    def upsert(self, documents):
        self._txn.upsert(documents)

    def remove(self, keys):
        return self._txn.remove(keys)

    def insert_if_new(self, documents, distance):
        return self._txn.insert_if_new(documents, distance,
                                       self._storage._layout.prefix_flips(distance))
