"""What both LMDB backends share: the storage logic around the database
directory (:mod:`.directory`, with its locks and compaction's atomic swap)
and the check of its data file (:mod:`.datafile`): the gate that keeps
environment changes apart from running transactions, one writer at a time,
map growth and closing (:class:`LmdbStorage`).

LMDB allows one environment handle per path per process: every handle a
process opens on a path (:meth:`LmdbStorage.open`, as ``DB(path)`` does) shares
one :class:`LmdbStorage`, which closes with the last of them; a storage
dropped without ``close()`` or inherited across ``fork()`` does not count.
"""

import contextlib
import os
import threading
import time
import warnings
import weakref

from ... import _ext
from ...errors import (DamagedDatabaseWarning, DatabaseBusyError, DatabaseError,
                        MaintenanceWarning)
from .. import BANDS, Storage, check_process
from .directory import MAX_READERS, LmdbDirectory, open_paths_lock, open_storage, path_key
from .format import RECENT_LIMIT

VERIFY_TRIES = 3  # walks of the data file check() makes while other processes commit

# The map a batch may take a document: its document, index entry and copied
# pages, and an entry a table (twice what a large batch into an empty
# database takes: ~112 bytes a document with 10 tables)
MAP_A_DOCUMENT, MAP_A_TABLE_ENTRY = 128, 16
_open_storages = weakref.WeakSet()


# The most entries a settling merge makes. A 100M load in batches of 10M,
# its runs merged into one a table, took 707 s against 505 and left the file
# 25.2 GB against 22.1, then answered query_many at 50k q/s against 29k and
# insert_if_new_many at 2.3k docs/s against 1.35k; past 2^27 entries (0.7 GB a
# table's run) the merges of a load of a billion would read and write a file
# several times the memory, for hours.
SETTLE_MOST = 1 << 27


class LmdbStorage(Storage):
    """What both LMDB backends share: the directory, the gate, one writer at a
    time, reader-slot sweeps, map growth, compaction and closing. A backend
    adds how it opens, reads, writes and copies an environment."""

    initial_map_size = 1 << 30
    max_readers = MAX_READERS
    reader_check_seconds = 1.0
    # the most entries a batch's own merges take (format.RUN_SLOTS; read on open); bigger ones, and
    # the rewrite of every table from the index, follow its commit in transactions of about
    # a table's entries each (tidy)
    batch_merge = 1 << 18
    recent_limit = RECENT_LIMIT  # the most values recent holds (a test may set fewer)

    opens_damaged_files = True  # reads of a damaged file fail with an error, not a signal

    def __init__(self, path, readonly=False, create=True):
        self._dir = LmdbDirectory(path, readonly, create, self)
        if self._dir.doubt and not self.opens_damaged_files:
            self._dir.release()
            raise DatabaseError("%s: %s; the %s backend could crash reading it: open it with "
                                "the native backend to check and export what is readable, or "
                                "restore it from a backup"
                                % (self._dir.data, self._dir.doubt, self.backend))
        if self._dir.doubt and not readonly:
            warnings.warn("%s opens read-only: %s; check() and export what is readable, or "
                          "restore it from a backup" % (self._dir.path, self._dir.doubt),
                          DamagedDatabaseWarning, stacklevel=4)
            readonly = True
        self.path, self.readonly = self._dir.path, readonly
        self._gate = _ext.Gate()
        self._write_lock = threading.Lock()
        self._pid = os.getpid()
        self._layout = None
        self._env = None
        self._readers_checked = 0.0
        self._handles = 0  # the LmdbHandles open on it
        self._written = False  # whether a write transaction of this storage committed
        try:
            self._open_env()
            self._dir.note_lock_file()
        except BaseException as exc:
            if self._env is not None:
                self._close_env()
            self._dir.abandon()
            if isinstance(exc, DatabaseError):
                raise self._open_error(exc) from None
            raise
        _open_storages.add(self)

    @classmethod
    def open(cls, path, readonly=False, create=True):
        """A handle on the database at ``path``: every handle of this process
        on it shares one storage (one LMDB environment), which closes with the
        last of them.

        :raises DatabaseError: the database is open here with another backend,
            or read-only and this handle is to write.
        """
        with open_paths_lock:
            shared = open_storage(path_key(path)) if os.fspath(path) else None
            if shared is None:
                shared = cls(path, readonly=readonly, create=create)
            elif shared._env is None:
                raise DatabaseError("%s could not be mapped again after a failure: close its "
                                    "other handles in this process, then open it again"
                                    % shared.path)
            elif type(shared) is not cls:
                raise DatabaseError("%s is open in this process with the %s backend: open it "
                                    "with that backend too" % (shared.path, shared.backend))
            elif shared.readonly and not readonly and not shared._dir.doubt:
                raise DatabaseError("%s is open read-only in this process: open this handle "
                                    "read-only too, or close the read-only ones first"
                                    % shared.path)
            shared._handles += 1
            return LmdbHandle(shared, readonly or shared.readonly)

    def _open_error(self, exc):
        """The error an open that failed with ``exc`` (a DatabaseError) raises:
        named by what is wrong with the file where its check found that."""
        if self._dir.doubt:
            return DatabaseError("cannot open %s: %s; restore it from a backup"
                                 % (self._dir.data, self._dir.doubt))
        return self._dir.full_disk_error(exc, "open") or exc

    @contextlib.contextmanager
    def read(self):
        while True:
            with self._gate:
                self._check_usable()
                try:
                    txn = self._begin_read()
                except self.map_resized:
                    txn = None
                if txn is not None:
                    try:
                        with self._errors("read"):
                            yield self._view(txn)
                    finally:
                        txn.abort()  # a read transaction: no wait
                    return
            self._resize(0)  # another process grew the map: adopt its size

    def write(self, body, documents=0):
        self._check_writable()
        with self._write_lock:
            self._make_room(documents)
            result, untidy = self._transact(body)
            if untidy:
                self._tidy()
            return result

    def _transact(self, body):
        """Run ``body`` in a write transaction and commit it; returns its result
        and whether it left work for :meth:`_tidy`."""
        while True:
            failed = None
            try:
                with self._gate:
                    self._check_usable()
                    self._clear_stale_readers()
                    with self._dir.writing(), self._errors("write to"):
                        txn = self._env.begin(write=True)
                        try:
                            writer = self._writer(txn)
                            result = body(writer)
                            self._dir.check_lock_file()
                        except BaseException:
                            failed = txn
                            raise
                        txn.commit()
                    self._written = True
                    return result, writer.untidy
            except self.map_resized:
                self._resize(0)  # another process grew the map: adopt its size
            except self.map_full:
                self._abort(failed)
                self._grow()
            except BaseException as exc:
                self._abort(failed)
                if isinstance(exc, DatabaseError):
                    raise self._dir.full_disk_error(exc, "write to") or exc
                raise

    def _make_room(self, documents):
        """Grow the map ahead of a batch of ``documents`` (written, or
        removed: removals may write the documents and the index whole) that
        may not fit in what is left of it, with half the data's size to spare
        for the merges that follow it: a transaction that fills the map is
        undone and run again, which costs a large batch (or merge) its whole
        time once more. (Not while this thread holds a snapshot: growing would
        wait for it; nor where the map cannot grow now, such as under a limit
        of address space. The batch may fit.)"""
        if not documents or self._layout is None or self._gate.held_here():
            return
        need = documents * (MAP_A_DOCUMENT + MAP_A_TABLE_ENTRY * self._layout.tables)
        while True:
            with self._gate:
                self._check_usable()
                used, size = self._map_used(), self._map_size()
            if used + used // 2 + need <= size:
                return
            try:
                self._grow()
            except DatabaseError:
                if self._env is None:  # not even the map it had could be mapped again
                    raise
                return

    def _tidy(self):
        """The merges and the rewrites a committed batch left (of the
        documents and the index once removals passed a quarter of them, then of
        the tables, and the bands' merges, which come due together), in
        transactions of about a table's entries each, so the file needs room
        for the tables and about one table more."""
        self._maintain(lambda txn: txn.tidy(), 2 * self._layout.tables + BANDS + 2,
                       "the batch is stored, but merging the tables' runs after it",
                       "the next write tries again")

    def settle(self, documents):
        self._check_writable()
        most = min(documents, SETTLE_MOST)
        with self._write_lock:  # a transaction a table or band at most, and two for the slots
            self._maintain(lambda txn: txn.settle(most), self._layout.tables + BANDS + 3,
                           "every batch is stored, but merging their runs after them",
                           "compact() merges them")

    def _maintain(self, step, most, stored, then):
        """``step`` in a transaction each until it has no more, at most ``most``
        times. A failure here loses nothing: it warns that what was ``stored``
        failed, and what ``then`` mends it."""
        try:
            for _ in range(most):
                if not self._transact(step)[0]:
                    break
        except (DatabaseError, MemoryError) as exc:
            if self._env is None:
                then = "the file could not be mapped again: open the database again"
            warnings.warn("%s: %s failed (%s); %s" % (self.path, stored, exc, then),
                          MaintenanceWarning, stacklevel=5)

    def _writer(self, txn):
        """The backend's Txn over the write transaction ``txn``: where the file
        grew since the last look, dead readers' slots are cleared first."""
        used = self._map_used()
        if used > self._used_when_readers_checked:  # a dead reader's snapshot may be why
            self._reader_check()
            self._used_when_readers_checked = used
        return self._txn(txn)

    _used_when_readers_checked = 0  # the file's size when the writer last cleared dead readers

    def _abort(self, txn):
        """Abort a failed write transaction."""
        if txn is not None:
            txn.abort()

    def _errors(self, doing):
        """A context that turns the backend's own errors into DatabaseError."""
        return contextlib.nullcontext()

    def _room_for_tables(self):
        """How many tables an environment opened now has room for: 256, or the
        layout's where it has more (each table takes RUN_SLOTS sub-databases,
        and every transaction's setup grows with the room)."""
        return max(256, self._layout.tables if self._layout is not None else 0)

    def _map_size_to_open(self):
        size = os.path.getsize(self._dir.data) if os.path.exists(self._dir.data) else 0
        return max(self.initial_map_size, 2 * size)

    def _check_usable(self):
        check_process(self._pid)
        if self._env is None:
            raise DatabaseError("the database at %s is closed" % self.path)

    def _forget_after_fork(self):
        """In a fork child: let go of the parent's environment (never used here),
        so that the child can open its own."""

    def _check_writable(self):
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only%s" % (
                self.path, ": " + self._dir.doubt if self._dir.doubt else ""))

    def check(self):
        """The directory's problems, and the damage py-lmdb's verifier finds in
        the data file."""
        problems = [self._dir.doubt] if self._dir.doubt else []
        found = self._damage_found()
        if found is None:
            return problems + ["%s changed while it was verified (another process writes to "
                               "it): check it again" % self._dir.data]
        return problems + ["%s is damaged: %s" % (self._dir.data, why) for why in found]

    def _damage_found(self):
        """What py-lmdb's verifier (py-lmdb 3 and later) finds in the data file,
        which it reads without LMDB, in a walk no commit came during; None
        where a commit came during every walk (what it found may be that
        commit's new pages: it reads the file's size before its meta pages)."""
        try:
            from lmdb.verify import VerifyError, verify
        except ImportError:  # an earlier py-lmdb
            return []
        if self._env is None:  # closed: the check of the contents says so
            return []
        for _ in range(VERIFY_TRIES):
            before = self._file_state()
            try:
                found = verify(self._dir.data)
            except (VerifyError, OSError) as exc:
                found = [str(exc)]
            if not found or self._file_state() == before:
                return found
        return None

    def _file_state(self):
        """The last commit's id and the data file's size."""
        return self._env.info()["last_txnid"], os.path.getsize(self._dir.data)

    def _clear_stale_readers(self, now=None):
        """Free the reader slots of dead processes (at most once a second): a
        dead reader's snapshot would keep every later freed page from reuse."""
        now = time.monotonic() if now is None else now
        if now - self._readers_checked >= self.reader_check_seconds:
            self._readers_checked = now
            self._reader_check()

    def _grow(self):
        """Double the map, after freeing dead readers' slots; warn when live
        snapshots hold pages back."""
        self._clear_stale_readers(now=float("inf"))
        with self._gate:
            self._check_usable()
            size, snapshots = self._map_size(), self._open_snapshots()
        if snapshots:
            warnings.warn("%s: growing the map to %d bytes while %d snapshots are open; pages "
                          "freed since the oldest began cannot be reused until it ends"
                          % (self.path, 2 * size, snapshots), ResourceWarning, stacklevel=4)
        self._resize(2 * size)

    def _open_snapshots(self):
        """Snapshots open in every process: the reader slots that hold a
        transaction (LMDB counts the slots kept for later queries too)."""
        return sum(1 for line in self._env.readers().splitlines()[1:]
                   if line.split()[-1:] != ["-"])

    def _resize(self, map_size):
        """Set the map size (0: adopt another process's), with no transaction
        running. LMDB keeps no map after a failed growth (no address space
        for it): the file is opened again at the size it had (a larger one
        may not fit either)."""
        with self._gate.exclusive("grow the map"):
            self._check_usable()
            had = self._map_size()
            try:
                self._set_mapsize(map_size)
            except DatabaseError:
                self._close_env()
                self._open_env(had)
                raise

    def compact(self):
        self._rewrite(self._layout, None, "compact")

    def relayout(self, layout, params):
        if self._handles > 1:  # their DB objects hold the layout they opened with
            raise DatabaseBusyError(
                "cannot build the tables of %s again while other handles in this process "
                "have it open; close them and retry" % self.path)
        self._rewrite(layout, params, "relayout")

    def _rewrite(self, layout, params, doing):
        """Write the database, compacted, into a copy whose tables are in
        ``layout`` (and whose stored parameters are ``params``, where given),
        and put the copy in its place."""
        self._check_writable()
        with self._write_lock, self._gate.exclusive(doing):
            self._check_usable()
            try:
                with self._dir.compaction(doing) as copy:
                    try:
                        with self._errors(doing):
                            self._copy_to(copy, layout, params)
                    except (OSError, DatabaseError) as exc:  # (the copy still takes space)
                        raise self._dir.full_disk_error(exc, doing) or exc
                    self._close_env()
                self._layout = layout
            finally:
                if self._env is None:  # replaced or not, the data file is whole: open it again
                    self._open_env()

    def info(self):
        self._check_usable()
        return {"backend": self.backend, "disk_bytes": self._dir.disk_bytes(),
                "map_size": self._map_size(),
                "lmdb_version": ".".join(map(str, self.lmdb_version()))}

    def close(self):
        """Close the environment and release the directory; a database this
        storage made and that no process committed its parameters to (its
        making failed) is removed, so that nothing is left of it."""
        with self._write_lock, self._gate.exclusive("close the database"):
            made = not (self._written or self.readonly or self._has_params())
            if self._env is not None:
                self._close_env()
            if made:
                self._dir.abandon()
            else:
                self._dir.release()

    def _has_params(self):
        """Whether the file holds parameters that some process committed (this
        one may have found them stored by another and written nothing): such a
        database is never removed. True where it cannot be read now."""
        if self._env is None:
            return False
        try:
            txn = self._begin_read()
        except Exception:  # whatever the backend raises: keep the files
            return True
        try:
            return self._view(txn).params() is not None
        except Exception:
            return True
        finally:
            txn.abort()

    def release_handle(self):
        """An :class:`LmdbHandle` of it closed: close it with the last one."""
        with open_paths_lock:
            self._handles -= 1
            if not self._handles:
                self.close()


class LmdbHandle(Storage):
    """One handle (a ``DB``'s) on an :class:`LmdbStorage` that every handle of
    this process on the database shares: it reads and writes through the
    shared one, and closing it closes only this handle. A read-only handle
    never writes, though others may."""

    def __init__(self, shared, readonly):
        self.shared, self.readonly = shared, readonly
        self.backend, self.path, self.max_key_bytes = shared.backend, shared.path, \
            shared.max_key_bytes
        self._closed = False

    def _open(self):
        """The shared storage, while this handle is open."""
        if self._closed:
            raise DatabaseError("the database at %s is closed" % self.path)
        return self.shared

    def _writable(self):
        """The shared storage, for a write through this handle (a read-only
        shared storage refuses it itself, saying why)."""
        shared = self._open()
        if self.readonly and not shared.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        return shared

    def open_tables(self, layout):
        shared = self._open()
        with open_paths_lock:  # (once: opening them again would race the other handles' use)
            if shared._layout is None or shared._layout.spec != layout.spec:
                shared.open_tables(layout)

    def read(self):
        return self._open().read()

    def write(self, body, documents=0):
        return self._writable().write(body, documents)

    def settle(self, documents):
        self._writable().settle(documents)

    def search(self, probes, distance):
        return self._open().search(probes, distance)

    def compact(self):
        self._writable().compact()

    def relayout(self, layout, params):
        self._writable().relayout(layout, params)

    def check(self):
        return self.shared.check()

    @property
    def old_documents(self):
        """Whether the file keeps its documents as format 7 or 6 did (its
        storage's ``old_documents``)."""
        return self._open().old_documents

    @property
    def record_blocks(self):
        """Whether the file keeps its documents in blocks (its storage's ``record_blocks``)."""
        return self._open().record_blocks

    @property
    def old_records(self):
        """Whether the file keeps its documents a record an id (its storage's
        ``old_records``)."""
        return self._open().old_records

    def info(self):
        return self._open().info()

    def statistics(self):
        return self._open().statistics()

    def close(self):
        with open_paths_lock:
            if not self._closed:
                self._closed = True
                self.shared.release_handle()


def _forget_inherited_storages():
    for storage in list(_open_storages):
        storage._forget_after_fork()


os.register_at_fork(after_in_child=_forget_inherited_storages)
