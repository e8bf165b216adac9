"""The LMDB data file checked before LMDB maps it: its meta pages, the small
B-trees every write copies and the free list, read with plain file reads (a
damaged page there would make LMDB fault, where this finds it and says so)."""

import array
import os
import struct
import time

from ...errors import DamagedPageError, DatabaseError
from .format import META, RUN_DIRECTORY

INSPECT_TRIES = 5  # inspections of a file other handles write to, for a finding that holds
MAKING_SECONDS = 10  # how long an open waits for another handle to write a new file's first pages
_META_MAGIC = 0xBEEFC0DE


def wait_while_made(data, seconds=MAKING_SECONDS):
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


def inspect_while_written(data, tries=INSPECT_TRIES):
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


def _tree_pages(f, page_size, root, file_pages):
    """Each page of the B-tree at ``root`` that lies inside the file, as
    (page bytes, flags, its nodes as _nodes reads them), branches before their
    children.
    Raises DamagedPageError where a page does not carry its own number, is neither a
    branch nor a leaf, has its node bounds out of order or out of the page, a
    node outside them, or the tree has more pages than the file."""
    todo, visited = [] if root == _NO_PAGE else [root], 0
    while todo:
        number = todo.pop()
        visited += 1
        if visited > file_pages:
            raise DamagedPageError(number)
        if number >= file_pages:
            continue
        page = os.pread(f.fileno(), page_size, number * page_size)
        if len(page) < page_size:
            raise DamagedPageError(number)
        pgno, _, flags, lower, upper = _PAGE.unpack_from(page)
        if (pgno != number or not flags & (_BRANCH | _LEAF) or (lower - _PAGE.size) % 2
                or not _PAGE.size <= lower <= upper <= page_size):
            raise DamagedPageError(number)
        nodes = list(_nodes(page, lower, upper))
        yield page, flags, nodes
        for _, low, high, node_flags, _ in nodes if flags & _BRANCH else ():
            todo.append(low | high << 16 | node_flags << 32)


def _nodes(page, lower, upper):
    """Each node of a page as (offset, low, high, flags, key size). Raises
    DamagedPageError where one lies below the upper bound or past the end."""
    for i in range((lower - _PAGE.size) // 2):
        at, = struct.unpack_from("<H", page, _PAGE.size + 2 * i)
        if at < upper or at + _NODE.size > len(page):
            raise DamagedPageError(_PAGE.unpack_from(page)[0])
        yield (at, *_NODE.unpack_from(page, at))


def _sub_database_roots(f, page_size, main_root, file_pages, names):
    """(name, root page) of the sub-databases ``names`` that the main B-tree
    (at ``main_root``, found sound) lists."""
    for page, flags, nodes in _tree_pages(f, page_size, main_root, file_pages):
        for at, low, high, _, key_size in nodes if flags & _LEAF else ():
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
    except DamagedPageError as bad:
        return bad.args[0]
    return None


def _free_pages(f, page_size, root, file_pages):
    """The page numbers on LMDB's free list (the free DB: transaction id ->
    [count, page, ...]) of the tree at ``root``, or None where a page of it
    is damaged. Pages of the tree past the end of the file are left out: the
    pages they list count as in use."""
    free = set()
    try:
        for page, flags, nodes in _tree_pages(f, page_size, root, file_pages):
            for at, low, high, node_flags, key_size in nodes if flags & _LEAF else ():
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
    except DamagedPageError:
        return None
    return free
