"""A database directory: its files, its locks, the registry of the
directories this process has open, a full disk told apart from other failed
writes, and compaction's atomic swap.

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
import threading
import weakref

from ...errors import DatabaseBusyError, DatabaseError, DatabaseNotFoundError, DiskFullError
from .datafile import inspect_data_file, inspect_while_written, wait_while_made

DATA_FILE, LOCK_FILE, COMPACT_SUFFIX = "data.mdb", "lock.mdb", ".compact"
MAX_READERS = 4096
# LMDB's lock file: 192 bytes of header, then 64 a reader slot (a larger file
# would give more slots than MAX_READERS)
LOCK_FILE_BYTES = 192 + 64 * (MAX_READERS - 1)
# what a database directory may hold besides its data file
OWN_FILES = {LOCK_FILE, "simhashdb.lock", "compact.lock", "write.lock", DATA_FILE + COMPACT_SUFFIX}
FULL_DISK_BYTES = 64 << 20  # a disk with less free is full as far as a failed write goes
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_open_paths = {}  # (pid, real path) -> weakref of the storage that has it open
open_paths_lock = threading.RLock()  # held while a handle opens or closes


class LmdbDirectory:
    """A database directory opened by ``owner``: registered, locked, checked.

    ``doubt`` is None, or why the data file may make LMDB fault (see
    :func:`inspect_data_file`): such a database opens read-only.
    """

    def __init__(self, path, readonly, create, owner):
        self.path = os.path.abspath(os.fspath(path))
        self.data = os.path.join(self.path, DATA_FILE)
        self.lock_mdb = os.path.join(self.path, LOCK_FILE)
        self.readonly = readonly
        if not os.fspath(path):
            raise DatabaseError("the database path is empty: name a directory")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise DatabaseError("%s is a file; a database is a directory: pass a new or "
                                "existing database directory" % self.path)
        if (readonly or not create) and not os.path.exists(self.data):
            raise DatabaseNotFoundError("no database at %s%s" % (
                self.path, " to open read-only" if readonly else ""))
        if not os.path.exists(self.data) and os.path.isdir(self.path) and \
                set(os.listdir(self.path)) - OWN_FILES - {DATA_FILE}:  # (made meanwhile)
            raise DatabaseError("%s holds other files and no database: name a new or empty "
                                "directory for a database" % self.path)
        self._register(owner)
        self._locks = []
        self._handle_lock = self._compact_lock = self._write_lock = None
        self._lock_identity = None
        self.new = not os.path.exists(self.data)
        self.created = []  # what opening made: removed by abandon()
        try:
            if not readonly and not os.path.isdir(self.path):
                parent = os.path.dirname(os.path.abspath(self.path))
                if not os.path.isdir(parent):  # a typo is an error, not a tree of directories
                    raise DatabaseError("cannot create a database at %s: there is no directory "
                                        "%s to make it in" % (self.path, parent))
                if self._disk_errors(_make_directory, self.path):
                    self.created.append(self.path)
            self._handle_lock = self._lock_file("simhashdb.lock")
            self._compact_lock = self._lock_file("compact.lock")
            self._write_lock = self._lock_file("write.lock")
            with self.alone() as alone:
                if alone and os.path.exists(self.data + COMPACT_SUFFIX) and not readonly:
                    os.unlink(self.data + COMPACT_SUFFIX)  # a compaction that died
                if not alone:
                    wait_while_made(self.data)
                self.doubt, full_size = (inspect_data_file(self.data) if alone
                                         else inspect_while_written(self.data))
                if alone and full_size and not readonly:  # so that the next open need not look
                    os.truncate(self.data, full_size)
                if self.locked:
                    self._reserve_lock_file(alone)
        except BaseException:
            self.abandon()
            raise

    def _register(self, owner):
        key = path_key(self.path)
        with open_paths_lock:
            if open_storage(key) is not None:
                raise DatabaseError("%s is already open in this process: open it again with "
                                    "LmdbStorage.open() (as DB() does), which shares it "
                                    "(LMDB allows one environment per process)" % self.path)
            self._ref = _open_paths[key] = weakref.ref(owner)
        self._key = key

    def _lock_file(self, name):
        """Open a lock file; a read-only directory gets no locks (nothing can
        change under a reader there)."""
        path = os.path.join(self.path, name)
        existed = os.path.exists(path)
        try:
            handle = open(path, "a+b")
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise self.full_disk_error(exc, "open") or DatabaseError(
                    "cannot open %s: %s" % (self.path, exc.strerror)) from None
            if self.readonly:
                return None
            raise DatabaseError("cannot write in %s (%s): fix its permissions, or open it "
                                "read-only" % (self.path, exc.strerror)) from None
        if not existed:
            self.created.append(path)
        self._locks.append(handle)
        if name == "simhashdb.lock":
            fcntl.flock(handle, fcntl.LOCK_SH)
        return handle

    def _reserve_lock_file(self, alone):
        """Give LMDB's lock file its disk blocks before LMDB maps it: LMDB sizes
        it with ftruncate and writes it through the map, where a full disk is
        a SIGBUS. The first handle reserves what LMDB will use; later ones
        only fill in the holes of what is there."""
        existed = os.path.exists(self.lock_mdb)
        with self._disk_errors(open, self.lock_mdb, "a+b") as f:
            if not existed:
                self.created.append(self.lock_mdb)
            size = os.fstat(f.fileno()).st_size
            wanted = max(size, LOCK_FILE_BYTES) if alone else size
            if wanted:
                self._disk_errors(os.posix_fallocate, f.fileno(), 0, wanted)

    def _disk_errors(self, call, *args, **kwargs):
        """``call(*args)``, an OSError of it a DatabaseError (DiskFullError
        where the disk is full)."""
        try:
            return call(*args, **kwargs)
        except OSError as exc:
            raise self.full_disk_error(exc, "open") or DatabaseError(
                "cannot open %s: %s" % (self.path, exc.strerror or exc)) from None

    def full_disk_error(self, exc, doing):
        """A DiskFullError for ``exc`` (an OSError, or an LMDB error as a
        DatabaseError) met while ``doing`` the database, if a write failed for
        space: no space left, or an I/O error (LMDB's report of a write that
        ran out of space part way) while the disk is full; else None."""
        said = str(exc)
        if getattr(exc, "errno", None) in _NO_SPACE or \
                any(os.strerror(code) in said for code in _NO_SPACE) or \
                (getattr(exc, "errno", None) == errno.EIO or os.strerror(errno.EIO) in said) \
                and self.disk_is_full():
            return DiskFullError("cannot %s %s: the disk is full (%s free): free some space, "
                                 "then retry; nothing of this was written"
                                 % (doing, self.path, _bytes(self.free_bytes())))
        return None

    def free_bytes(self):
        """Bytes free to this user on the directory's disk (of its parent while
        it does not exist)."""
        path = self.path
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        stat = os.statvfs(path)
        return stat.f_bavail * stat.f_frsize

    def disk_is_full(self):
        """Whether too little is free for a write to land: LMDB reports a write
        that ran out of space part way as an I/O error, not as a full disk."""
        try:
            return self.free_bytes() < FULL_DISK_BYTES
        except OSError:
            return False

    def note_lock_file(self):
        """Remember which file LMDB's lock file is, once LMDB has opened it."""
        if self.locked:
            self._lock_identity = _identity(self.lock_mdb)

    @contextlib.contextmanager
    def writing(self):
        """Hold the directory's write lock for one write transaction (writers of
        every process take turns here even if LMDB's lock file is replaced);
        :meth:`check_lock_file` before committing."""
        if not self.locked:
            yield
            return
        fcntl.flock(self._write_lock, fcntl.LOCK_EX)
        try:
            self.check_lock_file()
            yield
        finally:
            fcntl.flock(self._write_lock, fcntl.LOCK_UN)

    def check_lock_file(self):
        """Raise DatabaseError if LMDB's lock file is gone or another file now:
        a handle opened since then does not see this one's readers and writer."""
        if self._lock_identity is not None and _identity(self.lock_mdb) != self._lock_identity:
            raise DatabaseError(
                "%s was removed or replaced while this handle had the database open (by a "
                "clean-up script?): a handle opened since then cannot see this one, so this "
                "handle writes no more and this batch was not written; close every handle of "
                "the database and open it again" % self.lock_mdb)

    @property
    def locked(self):
        """Whether the directory has lock files (a read-only one may not)."""
        return None not in (self._handle_lock, self._compact_lock, self._write_lock)

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
    def compaction(self, doing="compact"):
        """Yield the path to write a compacted copy to; on success it replaces
        the data file atomically (written, synced, renamed, directory synced).

        :raises DatabaseBusyError: another process or handle has it open.
        """
        copy = self.data + COMPACT_SUFFIX
        with self.alone() as alone:
            if not alone:
                raise DatabaseBusyError(
                    "cannot %s %s while another process or handle has it open; close "
                    "the others and retry" % (doing, self.path))
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

    def abandon(self):
        """Release a directory whose opening failed, first removing what the
        opening of a new database made there (a full disk leaves nothing)."""
        if self.new and self._locks:
            with self.alone() as alone:
                if alone:
                    for path in [self.data] + self.created[::-1]:
                        with contextlib.suppress(OSError):
                            os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
        self.release()

    def release(self):
        """Unlock and unregister."""
        for handle in self._locks:
            handle.close()
        self._locks = []
        with open_paths_lock:
            if _open_paths.get(self._key) is self._ref:
                del _open_paths[self._key]


def path_key(path):
    """The key of a database directory in :data:`_open_paths`."""
    return os.getpid(), os.path.realpath(os.fspath(path))


def open_storage(key):
    """The storage that has the directory of ``key`` open, or None."""
    holder = _open_paths.get(key)
    return None if holder is None else holder()


def _make_directory(path):
    """Make the directory ``path``; False where another process made it first."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return False
    return True


def _identity(path):
    """(device, inode) of ``path``, or None if it is gone."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _bytes(n):
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return "%d %s" % (n, unit) if unit == "bytes" else "%.1f %s" % (n, unit)
        n /= 1024


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
