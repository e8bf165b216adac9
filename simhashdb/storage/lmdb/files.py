"""What both LMDB backends share: the database directory, its locks, the
check of the data file before LMDB maps it, compaction's atomic swap, the
gate that keeps environment changes apart from running transactions, and
the storage logic around them (:class:`LmdbStorage`).

LMDB allows one environment handle per path per process: every handle a
process opens on a path (:meth:`LmdbStorage.open`, as ``DB(path)`` does) shares
one :class:`LmdbStorage`, which closes with the last of them; a storage
dropped without ``close()`` or inherited across ``fork()`` does not count.

Locks (``flock`` on two files in the directory): every handle holds a shared
lock on ``simhashdb.lock`` while it is open; whoever wants to know it is alone
(compaction, removing a dead compaction's copy) first takes ``compact.lock``
exclusively, then trades its shared lock for a non-blocking exclusive try and,
failing, takes its shared lock back. Only a holder of ``compact.lock`` ever
drops its shared lock, so no handle is ever unlocked while a compaction could
replace the file under it.
"""

import array
import contextlib
import errno
import fcntl
import os
import struct
import threading
import time
import warnings
import weakref

from ... import _ext
from ...errors import (
    DamagedDatabaseWarning,
    DatabaseBusyError,
    DatabaseError,
    DatabaseNotFoundError,
    DiskFullError,
    MaintenanceWarning,
)
from .. import BANDS, Storage, check_process
from .format import INDEX_SLOTS, META, RUN_DIRECTORY

DATA_FILE, LOCK_FILE, COMPACT_SUFFIX = "data.mdb", "lock.mdb", ".compact"
MAX_READERS = 4096
# LMDB's lock file: 192 bytes of header, then 64 a reader slot (a larger file
# would give more slots than MAX_READERS)
LOCK_FILE_BYTES = 192 + 64 * (MAX_READERS - 1)
# what a database directory may hold besides its data file
OWN_FILES = {LOCK_FILE, "simhashdb.lock", "compact.lock", "write.lock", DATA_FILE + COMPACT_SUFFIX}
# The map a batch may take a document: its document, index entry and copied
# pages, and an entry a table (twice what a large batch into an empty
# database takes: ~112 bytes a document with 10 tables)
MAP_A_DOCUMENT, MAP_A_TABLE_ENTRY = 128, 16
INSPECT_TRIES = 5  # inspections of a file other handles write to, for a finding that holds
MAKING_SECONDS = 10  # how long an open waits for another handle to write a new file's first pages
FULL_DISK_BYTES = 64 << 20  # a disk with less free is full as far as a failed write goes
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_META_MAGIC = 0xBEEFC0DE
_open_paths = {}  # (pid, real path) -> weakref of the storage that has it open
_open_paths_lock = threading.RLock()  # held while a handle opens or closes
_open_storages = weakref.WeakSet()


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
                    _wait_while_made(self.data)
                self.doubt, full_size = (inspect_data_file(self.data) if alone
                                         else _inspect_while_written(self.data))
                if alone and full_size and not readonly:  # so that the next open need not look
                    os.truncate(self.data, full_size)
                if self.locked:
                    self._reserve_lock_file(alone)
        except BaseException:
            self.abandon()
            raise

    def _register(self, owner):
        key = _path_key(self.path)
        with _open_paths_lock:
            if _open_storage(key) is not None:
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
        with _open_paths_lock:
            if _open_paths.get(self._key) is self._ref:
                del _open_paths[self._key]


def _path_key(path):
    """The key of a database directory in :data:`_open_paths`."""
    return os.getpid(), os.path.realpath(os.fspath(path))


def _open_storage(key):
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


def _wait_while_made(data, seconds=MAKING_SECONDS):
    """Wait (up to ``seconds``) while the data file is too short to hold its
    meta pages: another handle that makes the database writes them in LMDB's
    open, after it made the file and under a lock of LMDB's."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.path.getsize(data) >= _META_END:
                return
        except FileNotFoundError:
            return
        time.sleep(0.002)


def _inspect_while_written(data, tries=INSPECT_TRIES):
    """inspect_data_file where other handles may commit meanwhile: a finding
    counts once an inspection made it in a file no write changed meanwhile
    (a commit rewrites a meta page and the pages it names); none counts where
    every one of ``tries`` overlapped a write (the writer reads the file well)."""
    for _ in range(tries):
        before = _written_state(data)
        try:
            found = inspect_data_file(data)
        except DatabaseError as exc:
            found = exc
        if not isinstance(found, DatabaseError) and found[0] is None or \
                _written_state(data) == before:
            break
        time.sleep(0.02)
    else:  # a writer committed during every look: what each found may have been its commit
        return None, None
    if isinstance(found, DatabaseError):
        raise found
    return found


def _written_state(data):
    try:
        stat = os.stat(data)
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def inspect_data_file(data):
    """What the data file's own meta pages say of it, before LMDB maps it.

    Raises DatabaseError where the meta pages themselves are damaged (no valid
    one, or two that disagree). Returns ``(doubt, full_size)``: ``doubt`` is
    None for a sound file, else why LMDB could fault reading it (pages in use
    lie past its end); ``full_size`` is the size the newest meta page's last
    page gives, where the file is shorter but every page past its end is free
    (LMDB never writes a page it allocated and freed in the same transaction,
    so a sound file may end before its last page), else None.
    """
    if not os.path.exists(data):
        return None, None
    with open(data, "rb") as f:
        return _inspect(f, data)


def _inspect(f, data):
    """inspect_data_file on the open data file ``f``."""
    damaged = "%s is damaged (%%s): LMDB cannot read it safely; restore it from a backup" % data
    pages = os.pread(f.fileno(), 2 * 65536, 0)  # the meta pages, before the size: a commit
    size = os.fstat(f.fileno()).st_size         # writes its pages before the meta naming them
    head = pages[:8192]
    if size == 0 or len(head) < _META_END:
        raise DatabaseError(damaged % ("%d bytes long" % size))
    page_size = struct.unpack_from("<I", head, _FREE_DB)[0]  # the free DB's md_pad
    if page_size < 512 or page_size & (page_size - 1) or page_size > 65536:
        raise DatabaseError(damaged % "its page size is unreadable")
    pages = pages[:2 * page_size]
    metas = []
    for offset in (0, page_size):
        page = pages[offset:offset + page_size]
        if len(page) < _META_END:
            continue
        magic, version = struct.unpack_from("<II", page, 16)
        if magic == _META_MAGIC and version == 1:
            # LMDB takes the page size from the newer meta page: another size
            # than page 0's would map the file wrongly (a SIGBUS)
            if struct.unpack_from("<I", page, _FREE_DB)[0] != page_size:
                raise DatabaseError(damaged % "its meta pages disagree on the page size")
            free_root, = struct.unpack_from("<Q", page, _FREE_DB + 40)
            main_root, = struct.unpack_from("<Q", page, _FREE_DB + 48 + 40)
            last_page, txnid = struct.unpack_from("<QQ", page, _META_END - 16)
            metas.append((txnid, last_page, free_root, main_root))
    if not metas:
        raise DatabaseError(damaged % "no valid LMDB meta page")
    # LMDB writes the meta of transaction t to page t % 2, so after the first
    # commit the two hold consecutive ids, each on its own page: a damaged id
    # would otherwise make LMDB open an older commit without a word.
    # The newer one never names a smaller file than the older.
    txnids = [meta[0] for meta in metas]
    if txnids != [0, 0] and (len(metas) < 2 or txnids[0] % 2 or txnids[1] % 2 != 1
                             or abs(txnids[0] - txnids[1]) != 1
                             or max(metas)[1] < min(metas)[1]):
        raise DatabaseError(damaged % ("its meta pages disagree (transactions %s)"
                                       % " and ".join(map(str, txnids))))
    _, last_page, free_root, main_root = max(metas)
    file_pages = size // page_size
    trees = [("LMDB's list of sub-databases", main_root), ("LMDB's list of free pages", free_root)]
    for what, root in trees:
        bad = _damaged_page(f, page_size, root, file_pages)
        if bad is not None:
            return ("page %d of %s is damaged: a write would copy it past its end"
                    % (bad, what)), None
        if root == main_root:  # then the small sub-databases every batch writes
            trees += [("the sub-database %r" % name.decode(), root) for name, root in
                      _sub_database_roots(f, page_size, main_root, file_pages, WRITTEN_EACH_BATCH)]
    full_size = (last_page + 1) * page_size
    if size >= full_size:
        return None, None
    free = _free_pages(f, page_size, free_root, file_pages)
    missing = range(file_pages, last_page + 1)
    if free is None or any(page not in free for page in missing):
        return ("its data file ends at byte %d, but pages in use run to byte %d: it was cut "
                "short (a copy that did not finish?)" % (size, full_size)), None
    return None, full_size


# LMDB's layout (lmdb.h, mdb.c; 64-bit builds): a page starts with its number,
# 2 unused bytes, its flags and the ends of its node pointers and nodes; a meta
# page holds, after that header, magic, version, address and map size, the
# free and the main DB's records, the last page and the transaction id.
_PAGE = struct.Struct("<QHHHH")  # number, pad, flags, lower, upper (a page's header)
_NODE = struct.Struct("<HHHH")  # low and high 16 bits of a size or page, flags, key size
_FREE_DB = 16 + 24  # the free DB's record in a meta page: md_pad (the page size) first
_META_END = _FREE_DB + 2 * 48 + 16
_BRANCH, _LEAF, _BIG_DATA = 0x01, 0x02, 0x01
_NO_PAGE = 2**64 - 1
WRITTEN_EACH_BATCH = (META.name(), RUN_DIRECTORY.name())  # small B-trees a write copies


class _Damaged(Exception):
    """A page of an LMDB B-tree that is not the page it should be."""


def _tree_pages(f, page_size, root, file_pages):
    """Each page of the B-tree at ``root`` that lies inside the file, as
    (number, page bytes, flags, lower, upper), branches before their children.
    Raises _Damaged where a page does not carry its own number, is neither a
    branch nor a leaf, has its node bounds out of order or out of the page, or
    the tree has more pages than the file."""
    todo, visited = [] if root == _NO_PAGE else [root], 0
    while todo:
        number = todo.pop()
        visited += 1
        if visited > file_pages:
            raise _Damaged(number)
        if number >= file_pages:
            continue
        page = os.pread(f.fileno(), page_size, number * page_size)
        if len(page) < page_size:
            raise _Damaged(number)
        pgno, _, flags, lower, upper = _PAGE.unpack_from(page)
        if (pgno != number or not flags & (_BRANCH | _LEAF) or (lower - _PAGE.size) % 2
                or not _PAGE.size <= lower <= upper <= page_size):
            raise _Damaged(number)
        yield number, page, flags, lower, upper
        for _, low, high, node_flags, _ in _nodes(page, lower) if flags & _BRANCH else ():
            todo.append(low | high << 16 | node_flags << 32)


def _nodes(page, lower):
    """Each node of a page as (offset, low, high, flags, key size)."""
    for i in range((lower - _PAGE.size) // 2):
        at, = struct.unpack_from("<H", page, _PAGE.size + 2 * i)
        if at + _NODE.size > len(page):
            raise _Damaged(_PAGE.unpack_from(page)[0])
        yield (at, *_NODE.unpack_from(page, at))


def _sub_database_roots(f, page_size, main_root, file_pages, names):
    """(name, root page) of the sub-databases ``names`` that the main B-tree
    (at ``main_root``, found sound) lists."""
    for _, page, flags, lower, _ in _tree_pages(f, page_size, main_root, file_pages):
        for at, low, high, _, key_size in _nodes(page, lower) if flags & _LEAF else ():
            name = page[at + _NODE.size:at + _NODE.size + key_size]
            record = page[at + _NODE.size + key_size:at + _NODE.size + key_size + 48]
            if name in names and (low | high << 16) == 48 and len(record) == 48:
                yield name, struct.unpack_from("<Q", record, 40)[0]


def _damaged_page(f, page_size, root, file_pages):
    """The first page of the B-tree at ``root`` whose header LMDB 0.9 would
    trust to its harm (every write copies the pages of these two small trees
    by their node bounds), or None. Pages past the end of the file are left
    to the check of a file cut short."""
    try:
        for _ in _tree_pages(f, page_size, root, file_pages):
            pass
    except _Damaged as bad:
        return bad.args[0]
    return None


def _free_pages(f, page_size, root, file_pages):
    """The page numbers on LMDB's free list (the free DB: transaction id ->
    [count, page, ...]) of the tree at ``root``, or None where a page of it
    is damaged. Pages of the tree past the end of the file are left out: the
    pages they list count as in use."""
    free = set()
    try:
        for _, page, flags, lower, _ in _tree_pages(f, page_size, root, file_pages):
            for at, low, high, node_flags, key_size in _nodes(page, lower) if flags & _LEAF else ():
                size, start = low | high << 16, at + _NODE.size + key_size
                if node_flags & _BIG_DATA:  # the list is on overflow pages of its own
                    first, = struct.unpack_from("<Q", page, start)
                    if first >= file_pages:
                        return None
                    big = os.pread(f.fileno(), _PAGE.size + size, first * page_size)
                    if len(big) < _PAGE.size + size or _PAGE.unpack_from(big)[0] != first:
                        return None
                    ids = big[_PAGE.size:]
                else:
                    ids = page[start:start + size]
                ids = array.array("Q", ids[:len(ids) // 8 * 8])
                if ids:
                    free.update(ids[1:1 + ids[0]])
    except _Damaged:
        return None
    return free


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
        with _open_paths_lock:
            shared = _open_storage(_path_key(path)) if os.fspath(path) else None
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
        the tables), in transactions of about a table's entries each, so the
        file needs room for the tables and about one table more. A failure here
        loses nothing: it warns, and the next batch tries again."""
        try:  # a rewrite takes a call a table, merges about one; more waits for the next batch
            for _ in range(2 * self._layout.tables + 2):
                if not self._transact(lambda txn: txn.tidy())[0]:
                    break
        except (DatabaseError, MemoryError) as exc:
            then = "the next write tries again" if self._env is not None else \
                "the file could not be mapped again: open the database again"
            warnings.warn("%s: the batch is stored, but merging the tables' runs after it "
                          "failed (%s); %s" % (self.path, exc, then),
                          MaintenanceWarning, stacklevel=4)

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

    def format_stored(self):
        """Add the fingerprint index's slots to a database that has fewer (one,
        made at format 3; some, where an earlier py-lmdb's creation of them was
        cut short), only while no other handle is open: a
        writer of an earlier version, opened before the format was stored,
        reads and writes the first slot alone (and its stale rewrite would drop
        the tables' entries of the others). Until then every entry goes into
        the first slot, which is slower: it warns."""
        if self.readonly or self._index_slots() == INDEX_SLOTS:
            return
        with self._dir.alone() as alone:
            if alone:  # no other handle, so no other writer to wait for
                self._add_index_slots()
        if self._index_slots() < INDEX_SLOTS:
            warnings.warn("%s keeps its fingerprint index in one slot while another handle has "
                          "it open (a writer of simhashdb before format 4 would not see the "
                          "others); writes are slower until it is opened writable with no other "
                          "handle open" % self.path, MaintenanceWarning, stacklevel=4)

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
        return [self._dir.doubt] if self._dir.doubt else []

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
        self._rewrite(self._layout, None)

    def relayout(self, layout, params):
        if self._handles > 1:  # their DB objects hold the layout they opened with
            raise DatabaseBusyError(
                "cannot build the tables of %s again while other handles in this process "
                "have it open; close them and retry" % self.path)
        self._rewrite(layout, params)

    def _rewrite(self, layout, params):
        """Write the database, compacted, into a copy whose tables are in
        ``layout`` (and whose stored parameters are ``params``, where given),
        and put the copy in its place."""
        self._check_writable()
        with self._write_lock, self._gate.exclusive("compact"):
            self._check_usable()
            try:
                with self._dir.compaction() as copy:
                    try:
                        with self._errors("compact"):
                            self._copy_to(copy, layout, params)
                    except (OSError, DatabaseError) as exc:  # (the copy still takes space)
                        raise self._dir.full_disk_error(exc, "compact") or exc
                    self._close_env()
                self._layout = layout
            finally:
                if self._env is None:  # replaced or not, the data file is whole: open it again
                    self._open_env()

    def convert_tables(self, tables, progress=None):
        """Rewrite tables kept in simhashdb 0.3's form (dupsort ``table:NNN``),
        then bands kept in 0.5's (dupsort ``band:NN``), as runs, one a
        transaction: a crash leaves each whole in one form or the other, and
        the next call goes on where it stopped. ``progress`` is called with
        (tables and bands done, tables + bands)."""
        self._check_writable()
        steps = ([("convert_table", table) for table in range(tables)]
                 + [("convert_band", band) for band in range(BANDS)])
        for done, (convert, number) in enumerate(steps, 1):
            self.write(lambda txn: getattr(txn, convert)(number))
            if progress is not None:
                progress(done, len(steps))

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
        with _open_paths_lock:
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
        with _open_paths_lock:  # (once: opening them again would race the other handles' use)
            if shared._layout is None or shared._layout.spec != layout.spec:
                shared.open_tables(layout)

    def format_stored(self):
        if not self.readonly:
            self._open().format_stored()

    def read(self):
        return self._open().read()

    def write(self, body, documents=0):
        return self._writable().write(body, documents)

    def search(self, probes, distance):
        return self._open().search(probes, distance)

    def compact(self):
        self._writable().compact()

    def relayout(self, layout, params):
        self._writable().relayout(layout, params)

    def convert_tables(self, tables, progress=None):
        self._writable().convert_tables(tables, progress)

    def check(self):
        return self.shared.check()

    def info(self):
        return self._open().info()

    def close(self):
        with _open_paths_lock:
            if not self._closed:
                self._closed = True
                self.shared.release_handle()


def old_tables_error(path, converting=False, bands=False):
    """The error for a database whose tables are in simhashdb 0.3's form (or
    whose ``bands`` are in 0.5's), opened to write, or opened at all while a
    conversion is unfinished (``converting``)."""
    if converting:
        return DatabaseError("%s was being converted to this version's format when the "
                             "conversion stopped: finish it with `simhashdb-cli upgrade %s` "
                             "(or simhashdb.upgrade(path))" % (path, path))
    return DatabaseError(
        "%s keeps its %s, which this version reads but does not write: convert it with "
        "`simhashdb-cli upgrade %s` (or simhashdb.upgrade(path)), or open it read-only"
        % (path, "band index in the form of simhashdb 0.5 and earlier" if bands else
           "tables in the form of simhashdb 0.3 and earlier", path))


def _forget_inherited_storages():
    for storage in list(_open_storages):
        storage._forget_after_fork()


os.register_at_fork(after_in_child=_forget_inherited_storages)
