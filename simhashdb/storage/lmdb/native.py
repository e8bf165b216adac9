"""The native LMDB backend: :mod:`simhashdb._lmdb` on the LMDB C API.

Searches, upserts, removals and insert-if-new run as whole batches in native
code without the GIL; a fault on a damaged file becomes DatabaseError. The
files are the same as the py-lmdb backend's.
"""

import concurrent.futures
import os
import threading
from array import array

from ... import _ext, _lmdb
from ...errors import DatabaseError, MapFullError, MapResizedError
from .. import Txn, View
from .files import LmdbStorage
from .format import INDEX_SLOTS, PARAMS

ITEMS_PER_READ = 4096
PARALLEL_PROBES = 4096  # a query_many this large is split over the cores
THREADS = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1, 8)  # the cores this process may run on
_threads = None


def _pool():
    global _threads
    if _threads is None:
        _threads = concurrent.futures.ThreadPoolExecutor(THREADS, "simhashdb-search")
    return _threads


def _forget_pool():
    """A fork child has none of the parent's threads: it starts its own pool."""
    global _threads
    _threads = None


os.register_at_fork(after_in_child=_forget_pool)


class _Part:
    """A part of a search split over the cores: run once, by whichever thread
    claims it first."""

    def __init__(self, txn, probes, distance, flips):
        self._search = lambda: txn.search(probes, distance, flips)
        self._claim, self._done = threading.Lock(), threading.Event()
        self._found = self._error = None

    def run(self):
        """Search, unless another thread has claimed the part."""
        if self._claim.acquire(blocking=False):
            try:
                self._found = self._search()
            except BaseException as exc:
                self._error = exc
            finally:
                self._done.set()

    def result(self):
        """The part's hits: searched here if no thread has claimed it."""
        self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._found

    def close(self):
        """Wait for the thread that claimed the part, or claim it, so none will."""
        if self._claim.acquire(blocking=False):
            self._done.set()
        self._done.wait()


class NativeStorage(LmdbStorage):
    """An LMDB environment in the directory ``path``, owned by native code."""

    backend = "lmdb"
    # The largest run a search gives a block directory (a seek without a B-tree
    # descent). Building one reads the whole run once (~90 MB at 2**24 entries),
    # which must stay small next to the seeks it saves even when the file is
    # larger than memory; a larger run is searched through the B-tree until its
    # searches have made entries / directory_rent seeks there (then its
    # directory, read once, costs about what those seeks cost without it).
    directory_entries, directory_rent = 1 << 24, 256
    # Each directory also holds a filter of its run's prefixes, of this many
    # bits an entry (0: none; for the directories built after it is set): a
    # search skips the ranges it rules out (about 19 in 20 of those with no
    # entry there) without reading their blocks. Building it decodes the run,
    # a few ns an entry more than the directory's rent above counts.
    filter_bits = 8
    # A merge of committed runs of at least this many entries is cut into
    # ranges of values merged on THREADS threads at once; an index merge of
    # committed slots of 65,536 entries or more (fewer where this is lower)
    # has a thread read its sources.
    threaded_merge = 1 << 18

    def _open_env(self, map_size=0):
        self._env = _lmdb.Env(os.fsencode(self.path), self.readonly,
                              map_size or self._map_size_to_open(),
                              self.max_readers, not self._dir.locked,
                              max_tables=self._room_for_tables())
        self._env.damage = self._dir.doubt
        self._env.batch_merge, self._env.recent_limit = self.batch_merge, self.recent_limit
        self._env.directory_entries = self.directory_entries
        self._env.directory_rent = self.directory_rent
        self._env.filter_bits = self.filter_bits
        self._env.merge_threads, self._env.threaded_merge = THREADS, self.threaded_merge
        if self._layout is None and not self._dir.new and self._open_found() and self.readonly:
            return
        self._open_dbs()

    def _open_found(self):
        """Open the sub-databases the file has, making none (a writable handle
        then opens them again, making what this version adds); whether it has
        them (if not, another process is making it, or it is not simhashdb's)."""
        try:
            self._env.open_dbs(array("l"), array("Q"), [], False)
            return True
        except DatabaseError:
            return False

    def _open_dbs(self):
        layout = self._layout
        tables = (array("l"), array("Q"), []) if layout is None else (
            layout.spec, layout.prefixes, layout.prefix_bits)
        try:
            self._env.open_dbs(*tables, not self.readonly)
        except DatabaseError as exc:
            raise self._open_error(exc) from None

    def _close_env(self):
        self._env.close()
        self._env = None

    def _reader_check(self):
        self._env.reader_check()

    def _map_size(self):
        return self._env.info()["map_size"]

    def _map_used(self):
        return self._env.info()["used"]

    def lmdb_version(self):
        return _lmdb.version()

    @property
    def old_documents(self):
        """Whether the file keeps its documents as format 6 did (``docs``) or
        7 (a key map by key): only a copy (:meth:`compact`, :meth:`relayout`)
        reads them, writing them in this format."""
        self._check_usable()
        return self._env.old_documents

    @property
    def record_blocks(self):
        """Whether the file keeps its documents in blocks (format 11)."""
        self._check_usable()
        return self._env.record_blocks

    @property
    def old_records(self):
        """Whether the file keeps its documents a record an id (format 8 to 10)."""
        self._check_usable()
        return not self._env.old_documents and not self._env.record_blocks

    def statistics(self):
        """``threaded_merges``: merges cut among the worker threads;
        ``fed_merges``: merges of the fingerprint index whose sources a
        reading thread fed; ``shared_lookups``: batches whose index lookups a
        thread shared; ``directories_built``: block directories of runs that
        searches built; ``filter_bytes``: the memory their prefix filters
        take now; ``ranges_skipped``: the ranges searches skipped, ruled out
        by a filter; ``slot_filter_entries``: the entries of the index's and
        the key map's slots that writes read to build their filters."""
        self._check_usable()
        return {name: getattr(self._env, name) for name in
                ("threaded_merges", "fed_merges", "shared_lookups", "directories_built",
                 "filter_bytes", "ranges_skipped", "slot_filter_entries")}

    def _set_mapsize(self, map_size):
        self._env.set_mapsize(map_size)
        if self.readonly and (self._env.index_slots < INDEX_SLOTS or not self._env.has_recent):
            self._open_dbs()  # another process may have added them

    def open_tables(self, layout):
        self._layout = layout
        if layout.tables > self._env.max_tables:  # an environment with room for them
            self._close_env()
            self._open_env()
        else:
            self._open_dbs()

    def _begin_read(self):
        return self._env.begin()

    def _view(self, txn):
        return NativeView(self, txn)

    def search(self, probes, distance):
        """Search in a snapshot of its own, split over the cores for large
        batches: a transaction a part, all of one commit."""
        flips = self._layout.prefix_flips(distance)
        split = THREADS > 1 and len(probes) >= PARALLEL_PROBES
        while True:
            with self._gate:
                self._check_usable()
                try:
                    if split:
                        return self._search_parts(probes, distance, flips)
                    txn = self._env.begin()
                    try:
                        return txn.search(probes, distance, flips)
                    finally:
                        txn.abort()
                except self.map_resized:
                    pass
            self._resize(0)  # another process grew the map: adopt its size

    def _search_parts(self, probes, distance, flips):
        """A part of the probes a core, each in a transaction of its own, all of
        one commit (MDB_NOTLS: a transaction may run on any thread): the pool's
        threads and this one take parts as they come, and this one takes every
        part no thread could (no address space or threads left, or at exit)."""
        step = -(-len(probes) // THREADS)
        chunks = [probes[i:i + step] for i in range(0, len(probes), step)]
        while True:
            txns, parts = [], []
            try:
                txns = [self._env.begin() for _ in chunks]
                if len({txn.snapshot for txn in txns}) == 1:  # else a commit came between
                    parts = [_Part(txn, chunk, distance, flips) for txn, chunk in zip(txns, chunks)]
                    try:
                        for part in parts[1:]:
                            _pool().submit(part.run)
                    except RuntimeError:
                        pass
                    return [hits for part in parts for hits in part.result()]
            finally:
                for part in parts:
                    part.close()  # no thread searches a transaction after it ends
                for txn in txns:
                    txn.abort()

    map_resized, map_full = MapResizedError, MapFullError

    def _txn(self, txn):
        return NativeTxn(self, txn)

    def _copy_to(self, copy, layout, params):
        """Write the database, compacted, into the new file ``copy``: its
        tables in ``layout``, its parameters ``params`` (None: as they are)."""
        map_size = self._map_size_to_open()
        while True:
            if os.path.exists(copy):
                os.unlink(copy)
            target = _lmdb.Env(os.fsencode(copy), False, map_size, 1, True, False,
                               max_tables=max(self._room_for_tables(), layout.tables))
            try:
                target.open_dbs(layout.spec, layout.prefixes, layout.prefix_bits, True)
                source, written = self._env.begin(), target.begin(write=True)
                try:
                    source.copy_into(written)
                    if params is not None:
                        written.put_meta(PARAMS, params)
                    written.commit()
                    return
                finally:
                    source.abort()
                    written.abort()
            except MapFullError:
                map_size *= 2
            finally:
                target.close()


def _paged(read, after, position):
    """Every item of ``read(after, limit)``'s pages, in order, from the first
    after ``after``: each page goes on from ``position(*its last item)``."""
    while True:
        chunk = read(after, ITEMS_PER_READ)
        yield from chunk
        if len(chunk) < ITEMS_PER_READ:
            return
        after = position(*chunk[-1])


class NativeView(View):
    """Reads over one native LMDB transaction."""

    def __init__(self, storage, txn):
        self._storage, self._txn = storage, txn

    def params(self):
        return self._txn.get(PARAMS, True)

    def count(self):
        return self._txn.count()

    def distinct(self):
        return self._txn.distinct()

    def get(self, key):
        return self._txn.get(key)

    def get_many(self, keys):
        return self._txn.get_many(keys)

    def documents(self, after=None):
        return _paged(self._txn.documents, after, lambda key, value: key)

    def _index_entries(self):
        """The index's (fingerprint, id) entries in order, as bytes."""
        return _paged(self._txn.index_items, None,
                      lambda fp_bytes, id_bytes: fp_bytes + id_bytes)

    def keys_of(self, fingerprint):
        return self._txn.keys_of(fingerprint)

    def fingerprint_groups(self):
        groups, entries = [], 0  # [(fingerprint, [ids])], their keys read together
        for fp_bytes, id_bytes in self._index_entries():
            if not groups or groups[-1][0] != fp_bytes:
                if entries >= ITEMS_PER_READ:
                    yield from self._with_keys(groups)
                    groups, entries = [], 0
                groups.append((fp_bytes, []))
            groups[-1][1].append(int.from_bytes(id_bytes, "big"))
            entries += 1
        yield from self._with_keys(groups)

    def _with_keys(self, groups):
        """(fingerprint, [keys]) of each (fingerprint bytes, [ids]) of ``groups``:
        the records read once, in id order."""
        ids = sorted(i for _, group in groups for i in group)
        keys = dict(zip(ids, self._txn.keys_of_ids(ids)))
        for fp_bytes, group in groups:
            yield _ext.unpack_key(fp_bytes), sorted(keys[i] for i in group)

    def search(self, probes, distance):
        return self._txn.search(probes, distance, self._storage._layout.prefix_flips(distance))

    def table_fingerprints(self, table):
        return self._txn.table_values(table)

    def band_search(self, keys):
        return self._txn.band_search(keys)

    def band_entries(self, band):
        return self._txn.band_values(band)


class NativeTxn(NativeView, Txn):
    """Reads and writes over the native LMDB write transaction."""

    def set_params(self, raw):
        self._txn.put_meta(PARAMS, raw)

    def upsert(self, documents):
        self._txn.upsert(documents)

    def remove(self, keys):
        return self._txn.remove(keys)

    @property
    def untidy(self):
        return self._txn.untidy

    def tidy(self):
        return self._txn.tidy()

    def settle(self, documents):
        return self._txn.settle(documents)

    def insert_if_new(self, documents, distance):
        return self._txn.insert_if_new(documents, distance,
                                       self._storage._layout.prefix_flips(distance))
