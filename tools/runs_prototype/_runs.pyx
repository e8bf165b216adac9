# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Compressed sorted runs in LMDB: the prototype of issue 22's tables (RUNS.md).

A run is a sorted set of distinct uint64s (a table's permuted fingerprints).
A run is a sequence of blocks, one LMDB item each, keyed by the run id (4
bytes, big-endian) and the block's first value (8 bytes, big-endian); the
item's value holds the rest of the block, Elias-Fano coded
(``encode_block``). Each run sits in a slot sub-database of its own, so a
merge frees its sources with mdb_drop, without reading their leaves. A run is
written in order with MDB_APPEND; a range scan seeks the block that holds
its first value and decodes from the bucket of that value on; a batch of
sorted ranges sweeps forward. Every LMDB call goes through guard.h, as in
_lmdb.

Beside the runs, today's table (a dupsort sub-database: the top 2 bytes of
a value as key, its other 6 as fixed-size duplicates) for comparison.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.string cimport memcpy, memmove, memset
from bits cimport read_be, write_be
from clmdb cimport (
    g_cursor_get, g_cursor_open, g_cursor_put, g_dbi_open, g_drop, g_stat, g_txn_begin,
    g_txn_commit, guard_install, MDB_APPEND, MDB_APPENDDUP, MDB_CREATE, MDB_cursor,
    mdb_cursor_close, MDB_dbi, MDB_DUPFIXED, MDB_DUPSORT, MDB_env, mdb_env_close, mdb_env_create,
    mdb_env_open, mdb_env_set_mapsize, mdb_env_set_maxdbs, MDB_GET_BOTH_RANGE, MDB_KEYEXIST,
    MDB_NEXT, MDB_NODUPDATA, MDB_NORDAHEAD, MDB_NOSYNC, MDB_NOTFOUND, MDB_NOTLS, MDB_RDONLY,
    MDB_SET_RANGE, MDB_stat, mdb_strerror, MDB_txn, mdb_txn_abort, MDB_val,
)

from simhashdb.errors import DatabaseError

cdef int NO_MEMORY = -29999

if guard_install() != 0:
    raise ImportError("simhashdb._runs could not install its fault handlers")


cdef inline double now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


include "_format.pxi"
include "_hash.pxi"  # the prefix filters' mixing
include "_runs.pxi"


# Today's table: a dupsort sub-database, the top 2 bytes of a value its key
# and the other 6 a fixed-size duplicate

cdef inline void table_entry(uint64_t x, uint8_t* kb, uint8_t* vb, MDB_val* k,
                             MDB_val* v) noexcept nogil:
    """Point ``k`` and ``v`` at ``x`` as today's table keeps it: its top 2
    bytes in ``kb``, the other 6 in ``vb``."""
    write_be(kb, x >> 48, 2)
    write_be(vb, x, 6)
    k.mv_size, k.mv_data = 2, kb
    v.mv_size, v.mv_data = 6, vb


cdef int table_put(MDB_cursor* cursor, uint64_t x, bint append, uint64_t* last,
                   bint* have_last) noexcept nogil:
    cdef uint8_t kb[2]
    cdef uint8_t vb[6]
    cdef MDB_val k, v
    cdef int rc
    table_entry(x, kb, vb, &k, &v)
    if not append:
        rc = g_cursor_put(cursor, &k, &v, MDB_NODUPDATA)
        return 0 if rc == MDB_KEYEXIST else rc
    rc = g_cursor_put(cursor, &k, &v, MDB_APPENDDUP if have_last[0] and
                      (last[0] >> 48) == (x >> 48) else MDB_APPEND)
    last[0], have_last[0] = x, True
    return rc


cdef int scan_table(MDB_cursor* cursor, uint64_t lo, uint64_t hi, size_t* count) noexcept nogil:
    """Count the table's entries in [lo, hi], as _lmdb.scan_range walks them."""
    cdef uint8_t kb[2]
    cdef uint8_t vb[6]
    cdef MDB_val k, v
    cdef uint64_t x
    table_entry(lo, kb, vb, &k, &v)
    cdef int rc = g_cursor_get(cursor, &k, &v, MDB_GET_BOTH_RANGE)
    if rc == MDB_NOTFOUND:
        if (lo >> 48) == (hi >> 48):
            return 0
        write_be(kb, (lo >> 48) + 1, 2)
        k.mv_size, k.mv_data = 2, kb
        rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 2 or v.mv_size != 6:
            return CORRUPTED
        x = (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6)
        if x > hi:
            return 0
        count[0] += 1
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef enum:
    SLOTS = 32  # the sub-databases of runs: run r in slot r % SLOTS

SLOT_COUNT = SLOTS  # a merge into the slot of one of its sources is refused


cdef class Study:
    """An LMDB environment with runs in slot sub-databases (``runs:0`` to
    ``runs:31``, emptied whole with mdb_drop when their run is merged) and one
    of today's tables (``table``); each write method is one transaction,
    durable unless ``sync`` is false (then the commit does not fsync)."""

    cdef MDB_env* env
    cdef MDB_dbi slots[SLOTS]
    cdef MDB_dbi table

    def __cinit__(self, bytes path, size_t map_size, bint sync=True):
        cdef MDB_txn* txn
        cdef int slot
        cdef int rc = mdb_env_create(&self.env)
        if rc == 0:
            mdb_env_set_maxdbs(self.env, SLOTS + 1)
            mdb_env_set_mapsize(self.env, map_size)
            rc = mdb_env_open(self.env, path, MDB_NOTLS | MDB_NORDAHEAD | (0 if sync else MDB_NOSYNC),
                               0o644)
        if rc == 0:
            rc = g_txn_begin(self.env, NULL, 0, &txn)
            if rc == 0:
                for slot in range(SLOTS):
                    if rc == 0:
                        rc = g_dbi_open(txn, b"runs:%d" % slot, MDB_CREATE, &self.slots[slot])
                if rc == 0:
                    rc = g_dbi_open(txn, b"table", MDB_CREATE | MDB_DUPSORT | MDB_DUPFIXED,
                                    &self.table)
                if rc == 0:
                    rc = g_txn_commit(txn)
                else:
                    mdb_txn_abort(txn)
        self.check(rc)

    def __dealloc__(self):
        if self.env != NULL:
            mdb_env_close(self.env)

    cdef int check(self, int rc) except -1:
        if rc == NO_MEMORY:
            raise MemoryError()
        if rc:
            raise DatabaseError("LMDB: %s" % mdb_strerror(rc).decode(errors="replace"))
        return 0

    cdef int begin(self, bint write, MDB_dbi dbi, MDB_txn** txn, MDB_cursor** cursor) except -1:
        cdef int rc = g_txn_begin(self.env, NULL, 0 if write else MDB_RDONLY, txn)
        if rc == 0:
            rc = g_cursor_open(txn[0], dbi, cursor)
            if rc:
                mdb_txn_abort(txn[0])
        return self.check(rc)

    cdef int end(self, bint write, int rc, MDB_txn* txn, MDB_cursor* cursor) except -1:
        mdb_cursor_close(cursor)
        if write and rc == 0:
            rc = g_txn_commit(txn)
        else:
            mdb_txn_abort(txn)
        return self.check(rc)

    cdef MDB_dbi slot(self, uint32_t run) noexcept nogil:
        return self.slots[run % SLOTS]

    def stat(self, str which):
        """{entries, depth, pages, bytes} of the runs (all slots) or ``table``."""
        cdef MDB_txn* txn
        cdef MDB_stat s
        cdef int rc = g_txn_begin(self.env, NULL, MDB_RDONLY, &txn)
        self.check(rc)
        out = dict.fromkeys(("entries", "depth", "pages", "bytes"), 0)
        for dbi in (self.slots if which == "runs" else [self.table]):
            rc = g_stat(txn, dbi, &s)
            if rc:
                break
            pages = s.ms_branch_pages + s.ms_leaf_pages + s.ms_overflow_pages
            out["entries"] += s.ms_entries
            out["depth"] = max(out["depth"], s.ms_depth)
            out["pages"] += pages
            out["bytes"] += pages * s.ms_psize
        mdb_txn_abort(txn)
        self.check(rc)
        return out

    def write_run(self, uint32_t run, const uint64_t[::1] values):
        """Write sorted ``values`` as run ``run`` (above every stored run); returns its blocks."""
        return self.merge([], run, values)["blocks"]

    def merge(self, list sources, uint32_t run, const uint64_t[::1] extra=None,
              const uint64_t[::1] drop=None):
        """Write as run ``run`` the union of the runs ``sources`` and the sorted
        ``extra`` values, less the sorted ``drop`` values, and drop the
        sources' slots: one transaction. Returns the new run's blocks and the
        seconds spent merging (reads, encoding, puts), dropping and committing."""
        cdef size_t m = len(sources), s, blocks = 0, entries = 0
        cdef size_t n_extra = extra.shape[0] if extra is not None else 0
        cdef size_t n_drop = drop.shape[0] if drop is not None else 0
        cdef const uint64_t* extras = &extra[0] if n_extra else NULL
        cdef const uint64_t* drops = &drop[0] if n_drop else NULL
        cdef uint32_t ids[64]
        cdef MDB_dbi dbis[64]
        cdef MDB_txn* txn
        cdef int rc
        cdef double t0, t1, t2
        if m >= 64:
            raise ValueError("at most 63 runs are merged at once")
        if any(self.slot(r) == self.slot(run) for r in sources):
            raise ValueError("run %d would go to a source's slot" % run)
        for s in range(m):
            ids[s] = sources[s]
            dbis[s] = self.slot(ids[s])
        self.check(g_txn_begin(self.env, NULL, 0, &txn))
        with nogil:
            t0 = now()
            rc = merge_runs(txn, dbis, ids, m, extras, n_extra, drops, n_drop, self.slot(run), run,
                            &blocks, &entries)
            t1 = now()
            for s in range(m):
                if rc == 0:
                    rc = g_drop(txn, dbis[s], 0)  # frees the pages, reading no leaf
            t2 = now()
            if rc == 0:
                rc = g_txn_commit(txn)
            else:
                mdb_txn_abort(txn)
        self.check(rc)
        return {"blocks": blocks, "merge_s": t1 - t0, "drop_s": t2 - t1, "commit_s": now() - t2}

    def values(self, uint32_t run):
        """Every entry of run ``run``, in order: an ``array('Q')``."""
        from array import array
        out = array("Q")
        cdef MDB_txn* txn
        cdef RunIter it
        cdef uint64_t x
        cdef int rc
        it.run, it.dir = run, NULL
        self.begin(False, self.slot(run), &txn, &it.cursor)
        rc = iter_seek(&it, 0)
        while rc == 0:
            rc = iter_next(&it, &x)
            if rc == 0:
                out.append(x)
        self.end(False, 0 if rc == MDB_NOTFOUND else rc, txn, it.cursor)
        return out

    def sweep(self, uint32_t run, const uint64_t[::1] los, const uint64_t[::1] his):
        """As ``scan`` for ranges sorted by their start (``run`` > 0), as a sweep."""
        from array import array
        cdef Py_ssize_t n = los.shape[0], i
        out = array("Q", bytes(8 * n))
        cdef uint64_t[::1] counts = out
        cdef MDB_txn* txn
        cdef Sweep sw
        cdef RunIter rest
        cdef size_t c
        cdef int rc = 0
        for i in range(1, n):
            if los[i] < los[i - 1]:
                raise ValueError("the ranges must be sorted by their start")
        sw.it.run, sw.kept, sw.has_next, rest.run, rest.cursor = run, False, False, run, NULL
        sw.it.dir = rest.dir = NULL
        self.begin(False, self.slot(run), &txn, &sw.it.cursor)
        with nogil:
            rc = g_cursor_open(txn, self.slot(run), &rest.cursor)
            if rc == 0 and n:
                rc = sweep_to(&sw, los[0])
            for i in range(n if rc == 0 else 0):
                c = 0
                rc = sweep_count(&sw, &rest, los[i], his[i], &c)
                counts[i] = c
                if rc:
                    break
        if rest.cursor != NULL:
            mdb_cursor_close(rest.cursor)
        self.end(False, rc, txn, sw.it.cursor)
        return out

    def scan(self, uint32_t run, const uint64_t[::1] los, const uint64_t[::1] his):
        """The count of run ``run``'s entries in each range [los[i], his[i]]
        (``run`` 0: today's table), in one snapshot: an ``array('Q')``."""
        from array import array
        cdef Py_ssize_t n = los.shape[0], i
        out = array("Q", bytes(8 * n))
        cdef uint64_t[::1] counts = out
        cdef MDB_txn* txn
        cdef RunIter it
        cdef size_t c
        cdef int rc = 0
        it.run, it.dir = run, NULL
        self.begin(False, self.slot(run) if run else self.table, &txn, &it.cursor)
        with nogil:
            for i in range(n):
                c = 0
                rc = scan_run(&it, los[i], his[i], &c) if run else \
                    scan_table(it.cursor, los[i], his[i], &c)
                counts[i] = c
                if rc:
                    break
        self.end(False, rc, txn, it.cursor)
        return out

    def write_table(self, const uint64_t[::1] values, bint append):
        """Put ``values`` into today's table: appended (sorted, after what is
        stored, as a bulk load into an empty table) or each where it goes."""
        cdef MDB_txn* txn
        cdef MDB_cursor* cursor
        cdef Py_ssize_t i
        cdef uint64_t last = 0
        cdef bint have_last = False
        cdef int rc = 0
        self.begin(True, self.table, &txn, &cursor)
        with nogil:
            for i in range(values.shape[0]):
                rc = table_put(cursor, values[i], append, &last, &have_last)
                if rc:
                    break
        self.end(True, rc, txn, cursor)
