"""What both LMDB backends share: the database directory, its locks, the
check of the data file before LMDB maps it, compaction's atomic swap, and the
gate that keeps environment changes apart from running transactions.

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
import weakref

from .errors import DatabaseBusyError, DatabaseError

DATA_FILE = "data.mdb"
COMPACT_SUFFIX = ".compact"
_META_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<IIQQ")  # magic, version, address, map size
_open_paths = {}  # (pid, path) -> weakref of the storage that has it open
_open_paths_lock = threading.Lock()


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
    damaged = ("%s is damaged (%%s): restore it from a backup, or open it read-only and "
               "`export` what is readable" % data)
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
