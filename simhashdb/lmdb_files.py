"""What both LMDB backends share: the database directory, its locks, the
check of the data file before LMDB maps it, compaction's atomic swap, the
gate that keeps environment changes apart from running transactions, and
the storage logic around them (:class:`LmdbStorage`).

LMDB allows one environment handle per path per process; opening a path
twice here raises DatabaseError, and a handle dropped without ``close()`` or
inherited across ``fork()`` does not count.

Locks (``flock`` on two files in the directory): every handle holds a shared
lock on ``simhashdb.lock`` while it is open; whoever wants to know it is alone
(compaction, removing a dead compaction's copy) first takes ``compact.lock``
exclusively, then trades its shared lock for a non-blocking exclusive try and,
failing, takes its shared lock back. Only a holder of ``compact.lock`` ever
drops its shared lock, so no handle is ever unlocked while a compaction could
replace the file under it.
"""

import contextlib
import errno
import fcntl
import os
import struct
import threading
import time
import warnings
import weakref

from .errors import DatabaseBusyError, DatabaseError
from .storage import Storage

DATA_FILE = "data.mdb"
COMPACT_SUFFIX = ".compact"
_META_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<IIQQ")  # magic, version, address, map size
_open_paths = {}  # (pid, path) -> weakref of the storage that has it open
_open_paths_lock = threading.Lock()
_open_storages = weakref.WeakSet()


class LmdbDirectory:
    """A database directory opened by ``owner``: registered, locked, checked."""

    def __init__(self, path, readonly, owner):
        self.path = os.path.abspath(os.fspath(path))
        self.data = os.path.join(self.path, DATA_FILE)
        self.readonly = readonly
        if not os.fspath(path):
            raise DatabaseError("the database path is empty: name a directory")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise DatabaseError("%s is a file; a database is a directory: pass a new or "
                                "existing database directory" % self.path)
        if readonly and not os.path.exists(self.data):
            raise DatabaseError("no database at %s to open read-only" % self.path)
        self._register(owner)
        self._locks = []
        try:
            if not readonly:
                os.makedirs(self.path, exist_ok=True)
            self._handle_lock = self._lock_file("simhashdb.lock")
            self._compact_lock = self._lock_file("compact.lock")
            with self.alone() as alone:
                if alone and os.path.exists(self.data + COMPACT_SUFFIX) and not readonly:
                    os.unlink(self.data + COMPACT_SUFFIX)  # a compaction that died
            check_data_file(self.data)
        except BaseException:
            self.release()
            raise

    def _register(self, owner):
        key = (os.getpid(), self.path)
        with _open_paths_lock:
            holder = _open_paths.get(key)
            if holder is not None and holder() is not None:
                raise DatabaseError("%s is already open in this process; share that DB "
                                    "object (LMDB allows one handle per process)" % self.path)
            self._ref = _open_paths[key] = weakref.ref(owner)
        self._key = key

    def _lock_file(self, name):
        """Open a lock file; a read-only directory gets no locks (nothing can
        change under a reader there)."""
        try:
            handle = open(os.path.join(self.path, name), "a+b")
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise DatabaseError("cannot open %s: %s" % (self.path, exc.strerror)) from None
            if self.readonly:
                return None
            raise DatabaseError("cannot write in %s: open it with readonly=True or fix its "
                                "permissions" % self.path) from None
        self._locks.append(handle)
        if name == "simhashdb.lock":
            fcntl.flock(handle, fcntl.LOCK_SH)
        return handle

    @property
    def locked(self):
        """Whether the directory has lock files (a read-only one may not)."""
        return self._handle_lock is not None

    @contextlib.contextmanager
    def alone(self):
        """Yield whether this is the only handle on the database; while True,
        no other handle can open it."""
        if not self.locked:
            yield False
            return
        fcntl.flock(self._compact_lock, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._handle_lock, fcntl.LOCK_UN)
            try:
                fcntl.flock(self._handle_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            try:
                yield alone
            finally:
                fcntl.flock(self._handle_lock, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._compact_lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def compaction(self):
        """Yield the path to write a compacted copy to; on success it replaces
        the data file atomically (written, synced, renamed, directory synced).

        :raises DatabaseBusyError: another process or handle has it open.
        """
        copy = self.data + COMPACT_SUFFIX
        with self.alone() as alone:
            if not alone:
                raise DatabaseBusyError(
                    "cannot compact %s while another process or handle has it open; close "
                    "the others and retry" % self.path)
            try:
                yield copy
                _fsync_path(copy)
                os.replace(copy, self.data)
                _fsync_path(self.path)
            finally:
                if os.path.exists(copy):
                    os.unlink(copy)

    def disk_bytes(self):
        """Size of the database's files."""
        return sum(os.path.getsize(os.path.join(self.path, name))
                   for name in (DATA_FILE, "lock.mdb")
                   if os.path.exists(os.path.join(self.path, name)))

    def release(self):
        """Unlock and unregister."""
        for handle in self._locks:
            handle.close()
        self._locks = []
        with _open_paths_lock:
            if _open_paths.get(self._key) is self._ref:
                del _open_paths[self._key]


def check_data_file(data):
    """Raise DatabaseError if the data file is shorter than its own meta pages
    say (LMDB would fault reading past its end) or not an LMDB file."""
    if not os.path.exists(data):
        return
    size = os.path.getsize(data)
    damaged = "%s is damaged (%%s): LMDB cannot read it safely; restore it from a backup" % data
    with open(data, "rb") as f:
        head = f.read(8192)
    if size == 0 or len(head) < 16 + _META.size + 8:
        raise DatabaseError(damaged % ("%d bytes long" % size))
    metas = []
    page_size = struct.unpack_from("<I", head, 16 + _META.size)[0]  # the free DB's md_pad
    if page_size < 512 or page_size & (page_size - 1) or page_size > 65536:
        raise DatabaseError(damaged % "its page size is unreadable")
    with open(data, "rb") as f:
        pages = f.read(2 * page_size)
    for offset in (0, page_size):
        page = pages[offset:offset + page_size]
        if len(page) < 160:
            continue
        magic, version = struct.unpack_from("<II", page, 16)
        if magic == _META_MAGIC and version == 1:
            last_page, txnid = struct.unpack_from("<QQ", page, 136)
            metas.append((txnid, last_page))
    if not metas:
        raise DatabaseError(damaged % "no valid LMDB meta page")
    # LMDB writes the meta of transaction t to page t % 2, so after the first
    # commit the two hold consecutive ids, each on its own page: a damaged id
    # would otherwise make LMDB open an older commit without a word.
    # The newer one never names a smaller file than the older.
    txnids = [txnid for txnid, _ in metas]
    if txnids != [0, 0] and (len(metas) < 2 or txnids[0] % 2 or txnids[1] % 2 != 1
                             or abs(txnids[0] - txnids[1]) != 1
                             or max(metas)[1] < min(metas)[1]):
        raise DatabaseError(damaged % ("its meta pages disagree (transactions %s)"
                                       % " and ".join(map(str, txnids))))
    txnid, last_page = max(metas)
    if size < (last_page + 1) * page_size:
        raise DatabaseError(damaged % ("%d bytes, but its last page ends at byte %d"
                                       % (size, (last_page + 1) * page_size)))


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Gate:
    """Lets transactions run together, or one change of the environment itself
    (growing the map, compacting, closing) run alone, as LMDB requires."""

    def __init__(self):
        self._changed = threading.Condition(threading.Lock())
        self._running = 0
        self._exclusive = False
        self._held = threading.local()

    def enter(self):
        """Begin a transaction's turn (shared with other transactions)."""
        with self._changed:
            while self._exclusive:
                self._changed.wait()
            self._running += 1
        self._held.count = getattr(self._held, "count", 0) + 1

    def leave(self):
        """End a transaction's turn."""
        self._held.count -= 1
        with self._changed:
            self._running -= 1
            if self._exclusive and not self._running:
                self._changed.notify_all()

    @contextlib.contextmanager
    def shared(self):
        self.enter()
        try:
            yield
        finally:
            self.leave()

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


class LmdbStorage(Storage):
    """What both LMDB backends share: the directory, the gate, one writer at a
    time, reader-slot sweeps, map growth, compaction and closing. A backend
    adds how it opens, reads, writes and copies an environment."""

    max_key_bytes = 511
    initial_map_size = 1 << 30
    max_readers = 4096
    reader_check_seconds = 1.0

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
        _open_storages.add(self)

    @contextlib.contextmanager
    def read(self):
        while True:
            with self._gate.shared():
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

    def write(self, body):
        self._check_writable()
        with self._write_lock:
            while True:
                failed = None
                try:
                    with self._gate.shared():
                        self._check_usable()
                        self._clear_stale_readers()
                        with self._errors("write to"):
                            txn = self._env.begin(write=True)
                            try:
                                result = body(self._writer(txn))
                            except BaseException:
                                failed = txn
                                raise
                            txn.commit()
                        return result
                except self.map_resized:
                    self._resize(0)  # another process grew the map: adopt its size
                except self.map_full:
                    self._abort(failed)
                    self._grow()
                except BaseException:
                    self._abort(failed)
                    raise

    def _abort(self, txn):
        """Abort a failed write transaction."""
        if txn is not None:
            txn.abort()

    def _errors(self, doing):
        """A context that turns the backend's own errors into DatabaseError."""
        return contextlib.nullcontext()

    def _map_size_to_open(self):
        size = os.path.getsize(self._dir.data) if os.path.exists(self._dir.data) else 0
        return max(self.initial_map_size, 2 * size)

    def _check_usable(self):
        if os.getpid() != self._pid:
            raise DatabaseError("this DB was opened in process %d before a fork; open a new "
                                "DB in the child process" % self._pid)
        if self._env is None:
            raise DatabaseError("the database at %s is closed" % self.path)

    def _forget_after_fork(self):
        """In a fork child: let go of the parent's environment (never used here),
        so that the child can open its own."""

    def _check_writable(self):
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)

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
        size, readers = self._map_size(), self._live_readers()
        if readers > 1:
            warnings.warn("%s: growing the map to %d bytes while %d snapshots are open; pages "
                          "freed since the oldest began cannot be reused until it ends"
                          % (self.path, 2 * size, readers - 1), ResourceWarning, stacklevel=4)
        self._resize(2 * size)

    def _resize(self, map_size):
        """Set the map size (0: adopt another process's), with no transaction running."""
        with self._gate.exclusive("grow the map"):
            self._check_usable()
            self._set_mapsize(map_size)

    def compact(self):
        self._check_writable()
        with self._write_lock, self._gate.exclusive("compact"):
            self._check_usable()
            with self._dir.compaction() as copy:
                self._copy_to(copy)
                self._close_env()
            self._open_env()

    def info(self):
        self._check_usable()
        return {"backend": self.backend, "disk_bytes": self._dir.disk_bytes(),
                "map_size": self._map_size()}

    def close(self):
        with self._write_lock, self._gate.exclusive("close the database"):
            if self._env is not None:
                self._close_env()
            self._dir.release()


def _forget_inherited_storages():
    for storage in list(_open_storages):
        storage._forget_after_fork()


os.register_at_fork(after_in_child=_forget_inherited_storages)
