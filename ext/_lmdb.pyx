# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The native LMDB backend's kernels, on the LMDB C API.

One environment: ``meta``, ``docs`` (key -> value), the fingerprint index
(8-byte big-endian fingerprint -> key, sorted duplicates, kept in slots:
``_index.pxi``) and each permutation table kept as compressed sorted runs
(issue 22, RUNS.md, ``_runs.pxi``): a run a batch, merged by size, scanned
run by run, hits checked against the index. A search permutes, seeks, scans and verifies every table for a batch
of probes in one call without the GIL; upserts and removals keep the index
and the tables in step. Every LMDB call goes through a guard (guard.h) that
turns a fault on a damaged file into an error; the environment is then
marked broken.

A database of simhashdb 0.3 keeps each table as one sorted-duplicates
sub-database (the permuted fingerprint's top 2 bytes as key, the other 6 as
value); an Env that finds tables of that form reads them (its ``runs`` is
then false), and converts them table by table (convert_table).
"""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort, realloc
from libc.string cimport memcmp, memcpy, memmove, memset, strlen
from posix.stdlib cimport posix_memalign
from posix.types cimport pid_t
from posix.unistd cimport getpid
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
    int PyGC_Disable()
    int PyGC_Enable()

from simhashdb.errors import DatabaseError
from simhashdb.storage.lmdb import format as lmdb_format

include "_format.pxi"  # the file format's constants (simhashdb/storage/lmdb/format.py)

cdef bytes META_NAME = lmdb_format.META.name(), DOCS_NAME = lmdb_format.DOCS.name()
cdef bytes RUN_DIRECTORY_NAME = lmdb_format.RUN_DIRECTORY.name()
cdef bytes INDEX_NAME = lmdb_format.INDEX.name(0)  # (the index's first slot)
index_name, band_name = lmdb_format.INDEX.name, lmdb_format.BAND.name
run_slot_name, old_table_name = lmdb_format.TABLE_RUNS.name, lmdb_format.OLD_TABLE.name

cdef extern from "pthread.h" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t* m, const void* attr)
    int pthread_mutex_destroy(pthread_mutex_t* m)
    int pthread_mutex_lock(pthread_mutex_t* m)
    int pthread_mutex_unlock(pthread_mutex_t* m)
    ctypedef struct pthread_cond_t:
        pass
    int pthread_cond_init(pthread_cond_t* c, const void* attr)
    int pthread_cond_destroy(pthread_cond_t* c)
    int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m)
    int pthread_cond_broadcast(pthread_cond_t* c)
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* thread, const void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_join(pthread_t thread, void** result)

cdef extern from *:
    void __builtin_prefetch(const void* p) nogil
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    int clz64 "__builtin_clzll"(unsigned long long) nogil

cdef extern from "lmdb.h" nogil:
    ctypedef struct MDB_env:
        pass
    ctypedef struct MDB_txn:
        pass
    ctypedef struct MDB_cursor:
        pass
    ctypedef unsigned int MDB_dbi
    ctypedef struct MDB_val:
        size_t mv_size
        void* mv_data
    ctypedef struct MDB_stat:
        unsigned int ms_psize
        size_t ms_entries
    ctypedef struct MDB_envinfo:
        size_t me_mapsize
        size_t me_last_pgno
        size_t me_last_txnid
        unsigned int me_maxreaders
        unsigned int me_numreaders
    ctypedef enum MDB_cursor_op:
        MDB_FIRST, MDB_GET_BOTH, MDB_GET_BOTH_RANGE, MDB_GET_CURRENT, MDB_LAST, MDB_NEXT,
        MDB_NEXT_DUP, MDB_NEXT_NODUP, MDB_PREV, MDB_SET, MDB_SET_KEY, MDB_SET_RANGE
    ctypedef void MDB_assert_func(MDB_env* env, const char* msg)
    enum:
        MDB_NOSUBDIR, MDB_RDONLY, MDB_NOTLS, MDB_NOLOCK, MDB_NORDAHEAD, MDB_CREATE,
        MDB_DUPSORT, MDB_DUPFIXED, MDB_APPEND, MDB_APPENDDUP, MDB_NODUPDATA, MDB_NOOVERWRITE,
        MDB_MULTIPLE,
        MDB_NOTFOUND, MDB_KEYEXIST, MDB_MAP_FULL, MDB_MAP_RESIZED, MDB_READERS_FULL,
        MDB_TXN_FULL
    int mdb_env_create(MDB_env** env)
    int mdb_env_open(MDB_env* env, const char* path, unsigned int flags, unsigned int mode)
    void mdb_env_close(MDB_env* env)
    int mdb_env_set_mapsize(MDB_env* env, size_t size)
    int mdb_env_set_maxreaders(MDB_env* env, unsigned int readers)
    int mdb_env_set_maxdbs(MDB_env* env, MDB_dbi dbs)
    int mdb_env_info(MDB_env* env, MDB_envinfo* info)
    int mdb_env_stat(MDB_env* env, MDB_stat* stat)
    int mdb_env_set_assert(MDB_env* env, MDB_assert_func* func)
    int mdb_env_sync(MDB_env* env, int force)
    int mdb_reader_check(MDB_env* env, int* dead)
    ctypedef int (*MDB_msg_func)(const char* msg, void* ctx)
    int mdb_reader_list(MDB_env* env, MDB_msg_func func, void* ctx)
    char* mdb_strerror(int err)
    char* mdb_version(int* major, int* minor, int* patch)
    void mdb_txn_abort(MDB_txn* txn)
    void mdb_txn_reset(MDB_txn* txn)
    int mdb_txn_renew(MDB_txn* txn)
    size_t mdb_txn_id(MDB_txn* txn)
    MDB_env* mdb_txn_env(MDB_txn* txn)
    void mdb_cursor_close(MDB_cursor* cursor)
    MDB_txn* mdb_cursor_txn(MDB_cursor* cursor)
    MDB_dbi mdb_cursor_dbi(MDB_cursor* cursor)

cdef extern from "guard.h" nogil:
    int GUARD_FAULT
    void guard_assert(MDB_env* env, const char* msg)
    int guard_install()
    int guard_last_signal()
    int g_get(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v)
    int g_put(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v, unsigned int f)
    int g_del(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v)
    int g_cursor_get(MDB_cursor* c, MDB_val* k, MDB_val* v, MDB_cursor_op op)
    int g_cursor_put(MDB_cursor* c, MDB_val* k, MDB_val* v, unsigned int f)
    int g_cursor_del(MDB_cursor* c, unsigned int f)
    int g_stat(MDB_txn* t, MDB_dbi d, MDB_stat* s)
    int g_drop(MDB_txn* t, MDB_dbi d, int delete)
    int g_txn_commit(MDB_txn* t)
    int g_dbi_open(MDB_txn* t, const char* name, unsigned int f, MDB_dbi* d)
    int g_cursor_open(MDB_txn* t, MDB_dbi d, MDB_cursor** c)
    int g_txn_begin(MDB_env* e, MDB_txn* parent, unsigned int f, MDB_txn** t)
    int g_copy(void* dst, const void* src, size_t n)

cdef enum:
    MAIN_DBI = 1        # LMDB's main database: the sub-databases' names and records
    MAX_TABLES = 1024
    SPARE_READS = 8     # ended read transactions an Env keeps to renew (Env.begin)
cdef int NO_MEMORY = -29999


class MapFullError(DatabaseError):
    """The map is full: grow it and run the transaction again."""


class MapResizedError(DatabaseError):
    """Another process grew the map: adopt its size and begin again."""


class OldTablesError(DatabaseError):
    """A database whose tables are in simhashdb 0.3's form (dupsort ``table:NNN``),
    opened to write, or whose conversion (convert_table) stopped part way
    (its argument: whether it did)."""


class DamagedError(DatabaseError):
    """The data file is damaged: LMDB faulted or found it corrupt."""


cdef object lmdb_error(int rc, str what):
    if rc == GUARD_FAULT:
        return DamagedError("%s: LMDB faulted (signal %d) reading the data file, which is "
                            "damaged; restore it from a backup, or open it read-only and "
                            "`export` what is readable" % (what, guard_last_signal()))
    if rc == NO_MEMORY:
        return MemoryError("%s: out of memory" % what)
    if rc == MDB_MAP_FULL or rc == MDB_TXN_FULL:
        return MapFullError("%s: %s" % (what, mdb_strerror(rc).decode()))
    if rc == MDB_MAP_RESIZED:
        return MapResizedError("%s: %s" % (what, mdb_strerror(rc).decode()))
    if rc == MDB_READERS_FULL:
        return DatabaseError("%s: too many open snapshots (unfinished iterations over the "
                             "database); finish or close them" % what)
    return DatabaseError("%s: %s" % (what, mdb_strerror(rc).decode(errors="replace")))


if guard_install() != 0:
    raise ImportError("simhashdb._lmdb could not install its fault handlers")


def version():
    """The (major, minor, patch) version of the LMDB library this module runs on."""
    cdef int major, minor, patch
    mdb_version(&major, &minor, &patch)
    return major, minor, patch


# Fixed-width encodings and the permutations

include "_values.pxi"


cdef inline void write_be(uint8_t* p, uint64_t x, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        p[n - 1 - i] = x & 0xFF
        x >>= 8


include "_tables.pxi"
include "_signature.pxi"
include "_runs.pxi"


cdef int value_fingerprint(const MDB_val* value, uint64_t* fp) noexcept nogil:
    """The fingerprint leading a document value (a msgpack array of an uint first)."""
    cdef const uint8_t* p = <const uint8_t*>value.mv_data
    cdef size_t n = value.mv_size, at
    cdef int width
    if n < 2:
        return -1
    at = 3 if p[0] == 0xdc else 5 if p[0] == 0xdd else 1
    if at >= n:
        return -1
    if p[at] < 0x80:
        fp[0] = p[at]
        return 0
    width = 1 if p[at] == 0xcc else 2 if p[at] == 0xcd else 4 if p[at] == 0xce else \
        8 if p[at] == 0xcf else 0
    if width == 0 or at + 1 + width > n:
        return -1
    fp[0] = read_be(p + at + 1, width)
    return 0


# Growable buffers and sorting

cdef struct U64s:
    uint64_t* data
    size_t size, cap


cdef int make_room(void** data, size_t* cap, size_t size, size_t item) noexcept nogil:
    """Double the capacity of a full growable array (``size == cap``)."""
    cdef size_t wanted
    cdef void* grown
    if size < cap[0]:
        return 0
    wanted = cap[0] * 2 if cap[0] else 64
    grown = realloc(data[0], wanted * item)
    if grown == NULL:
        return NO_MEMORY
    data[0] = grown
    cap[0] = wanted
    return 0


cdef int u64_push(U64s* v, uint64_t x) noexcept nogil:
    if make_room(<void**>&v.data, &v.cap, v.size, sizeof(uint64_t)):
        return NO_MEMORY
    v.data[v.size] = x
    v.size += 1
    return 0


cdef int sort_records(uint64_t* data, size_t n, size_t stride) noexcept nogil:
    """Sort ``n`` records of ``stride`` uint64s by their first, stably."""
    cdef uint64_t* scratch
    cdef size_t i = 1
    while i < n and data[(i - 1) * stride] <= data[i * stride]:
        i += 1
    if i >= n:  # already in order (an import's notes, often)
        return 0
    scratch = <uint64_t*>malloc(n * stride * sizeof(uint64_t))
    if scratch == NULL:
        return NO_MEMORY
    radix_sort(data, scratch, n, stride)
    free(scratch)
    return 0


cdef struct Doc:
    const uint8_t* key
    size_t key_size
    const uint8_t* value
    size_t value_size
    uint64_t fp
    size_t seq


cdef inline int cmp_bytes(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) noexcept nogil:
    """LMDB's default order: bytes compared, then the shorter first."""
    cdef int c = memcmp(a, b, na if na < nb else nb)
    if c:
        return c
    return (na > nb) - (na < nb)


cdef int cmp_doc_key(const void* a, const void* b) noexcept nogil:
    cdef const Doc* x = <const Doc*>a
    cdef const Doc* y = <const Doc*>b
    cdef int c = cmp_bytes(x.key, x.key_size, y.key, y.key_size)
    if c:
        return c
    return (x.seq > y.seq) - (x.seq < y.seq)


# The layout of the tables, and what one transaction works with

# An Env's block directories (BlockDir), one a run slot of each table: built
# by a search from a snapshot that holds only committed runs, kept while the
# run is live and the map stays where it is (set_mapsize clears them), and
# shared by the Env's threads. A directory is matched by its run's id, slot and
# entries: run ids are never given twice in a table (add_run).
#
# The cache also keeps the last read snapshot's runs (a RunsView: every
# table's runs, each with its directory), so that the searches of later read
# snapshots of the same committed transaction (the same txn id) read no run
# directory from the file and take no directory lock a run.

cdef struct RunsView


cdef struct DirCache:
    pthread_mutex_t lock
    BlockDir* dirs[MAX_TABLES * RUN_SLOTS]
    RunsView* view


cdef void dir_free(BlockDir* d) noexcept nogil:
    free(d.firsts)
    free(d.data)
    free(d.sizes)
    free(d.tops)
    free(d)


cdef inline bint dir_unref(BlockDir* d) noexcept nogil:
    """Drop one reference to ``d`` (the cache's lock held): whether it was the last."""
    d.refs -= 1
    return d.refs == 0


cdef void dir_release(DirCache* cache, BlockDir* d) noexcept nogil:
    """Drop one holder's reference to ``d``; the last frees it."""
    pthread_mutex_lock(&cache.lock)
    cdef bint last = dir_unref(d)
    pthread_mutex_unlock(&cache.lock)
    if last:
        dir_free(d)


cdef BlockDir* dir_acquire(DirCache* cache, size_t at, uint32_t run,
                          uint64_t entries) noexcept nogil:
    """The cached directory of run ``run`` (with ``entries``) in slot ``at``
    (table * RUN_SLOTS + slot), referenced for the caller, or NULL."""
    pthread_mutex_lock(&cache.lock)
    cdef BlockDir* d = cache.dirs[at]
    if d != NULL and d.run == run and d.entries == entries:
        d.refs += 1
    else:
        d = NULL
    pthread_mutex_unlock(&cache.lock)
    return d


cdef void dir_publish(DirCache* cache, size_t at, BlockDir* d) noexcept nogil:
    """Cache ``d`` (held by the caller) for slot ``at``, in place of the last."""
    pthread_mutex_lock(&cache.lock)
    cdef BlockDir* old = cache.dirs[at]
    cache.dirs[at] = d
    d.refs += 1
    cdef bint last = old != NULL and dir_unref(old)
    pthread_mutex_unlock(&cache.lock)
    if last:
        dir_free(old)


cdef void dir_clear(DirCache* cache, bint last) noexcept nogil:
    """Drop every cached directory and the cached view (their holders keep
    theirs). ``last``: the cache's end, when nothing else holds one, and a fork
    child's lock may have been taken by a thread it does not have: no lock then."""
    cdef BlockDir* d
    cdef size_t at
    if not last:
        pthread_mutex_lock(&cache.lock)
    for at in range(MAX_TABLES * RUN_SLOTS):
        d = cache.dirs[at]
        cache.dirs[at] = NULL
        if d != NULL and dir_unref(d):
            dir_free(d)
    cdef RunsView* view = cache.view
    cache.view = NULL
    if view != NULL and view_unref(view):
        view_free(view)
    if not last:
        pthread_mutex_unlock(&cache.lock)


cdef inline bint view_unref(RunsView* v) noexcept nogil:
    """Drop one reference to ``v`` (the cache's lock held): whether it was the last."""
    v.refs -= 1
    return v.refs == 0


cdef void view_free(RunsView* v) noexcept nogil:
    """Free ``v`` and its references to directories (the cache's lock held,
    or at the cache's end)."""
    cdef Py_ssize_t t
    cdef size_t i
    for t in range(v.tables):
        for i in range(v.runs[t].n):
            if dir_unref(v.runs[t].dir[i]):
                dir_free(v.runs[t].dir[i])
    free(v.runs)
    free(v)


cdef RunsView* view_acquire(DirCache* cache, size_t txnid) noexcept nogil:
    """The cached view of transaction ``txnid``'s runs, referenced for the caller, or NULL."""
    pthread_mutex_lock(&cache.lock)
    cdef RunsView* v = cache.view
    if v != NULL and v.txnid == txnid:
        v.refs += 1
    else:
        v = NULL
    pthread_mutex_unlock(&cache.lock)
    return v


cdef void view_release(DirCache* cache, RunsView* v) noexcept nogil:
    pthread_mutex_lock(&cache.lock)
    if view_unref(v):
        view_free(v)
    pthread_mutex_unlock(&cache.lock)


cdef void view_offer(DirCache* cache, size_t txnid, TableRuns* runs, Py_ssize_t tables) noexcept nogil:
    """Cache a view of ``runs`` (a read snapshot's, of transaction ``txnid``)
    in place of the last, where every run has its directory."""
    cdef Py_ssize_t t
    cdef size_t i
    for t in range(tables):
        for i in range(runs[t].n):
            if runs[t].dir[i] == NULL:
                return
    cdef RunsView* v = <RunsView*>malloc(sizeof(RunsView))
    cdef TableRuns* copy = <TableRuns*>malloc(tables * sizeof(TableRuns) + 1)
    if v == NULL or copy == NULL:
        free(v)
        free(copy)
        return  # no view: searches read the runs as before
    memcpy(copy, runs, tables * sizeof(TableRuns))
    v.txnid, v.refs, v.tables, v.runs = txnid, 1, tables, copy
    pthread_mutex_lock(&cache.lock)
    for t in range(tables):
        for i in range(runs[t].n):
            runs[t].dir[i].refs += 1
            copy[t].cursor[i] = NULL  # the snapshot's, closed with it
    cdef RunsView* old = cache.view
    cache.view = v
    if old != NULL and view_unref(old):
        view_free(old)
    pthread_mutex_unlock(&cache.lock)


cdef int dir_grow(BlockDir* d) noexcept nogil:
    """Double the room of a full directory."""
    cdef size_t cap = 2 * d.cap if d.cap else 64
    cdef void* firsts = realloc(d.firsts, cap * sizeof(uint64_t))
    if firsts != NULL:
        d.firsts = <uint64_t*>firsts
    cdef void* data = realloc(d.data, cap * sizeof(uint8_t*)) if firsts != NULL else NULL
    if data != NULL:
        d.data = <const uint8_t**>data
    cdef void* sizes = realloc(d.sizes, cap * sizeof(uint16_t)) if data != NULL else NULL
    if sizes == NULL:
        return NO_MEMORY
    d.sizes, d.cap = <uint16_t*>sizes, cap
    return 0


cdef int dir_build(MDB_cursor* cursor, uint32_t run, uint64_t entries,
                   BlockDir** out) noexcept nogil:
    """Read run ``run``'s directory with ``cursor`` (on its slot): each block's
    first value, and where its value lies in the map."""
    cdef BlockDir* d = <BlockDir*>calloc(1, sizeof(BlockDir))
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef uint64_t first
    cdef int rc = NO_MEMORY if d == NULL else 0
    out[0] = d
    if rc:
        return rc
    d.run, d.entries, d.refs = run, entries, 1
    write_be(key, run, 4)
    memset(key + 4, 0, 8)
    k.mv_size, k.mv_data = RUN_KEY_BYTES, key
    rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
    while rc == 0 and in_run(&k, run):
        first = read_be(<const uint8_t*>k.mv_data + 4, 8)
        if v.mv_size < 3 or v.mv_size > BLOCK_BYTES or (d.n and first <= d.firsts[d.n - 1]):
            rc = CORRUPTED
            break
        if d.n == d.cap:
            rc = dir_grow(d)
            if rc:
                break
        d.firsts[d.n], d.data[d.n], d.sizes[d.n] = first, <const uint8_t*>v.mv_data, v.mv_size
        d.n += 1
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    if rc and rc != MDB_NOTFOUND:  # (an item of another run ends this one, as for a cursor)
        return rc
    cdef size_t j
    cdef void* lines = NULL  # firsts again, a stretch of DIR_STRIDE to a cache line
    if posix_memalign(&lines, 64, d.n * sizeof(uint64_t) + 1):
        return NO_MEMORY
    memcpy(lines, d.firsts, d.n * sizeof(uint64_t))
    free(d.firsts)
    d.firsts, d.cap = <uint64_t*>lines, d.n
    d.tops = <uint64_t*>malloc(((d.n + DIR_STRIDE - 1) // DIR_STRIDE + 1) * sizeof(uint64_t))
    if d.tops == NULL:
        return NO_MEMORY
    for j in range((d.n + DIR_STRIDE - 1) // DIR_STRIDE):
        d.tops[j] = d.firsts[j * DIR_STRIDE]
    return 0


cdef struct Layout:
    Py_ssize_t tables, blocks
    long* spec              # (source shift, width, destination shift) per block per table
    uint64_t* prefixes      # each table's leading-block mask
    int* prefix_bits        # each table's leading-block width


cdef struct TableRuns:
    size_t n                # live runs, oldest first (ids ascending)
    uint32_t id[RUN_SLOTS]
    uint8_t slot[RUN_SLOTS]
    uint64_t entries[RUN_SLOTS]
    MDB_cursor* cursor[RUN_SLOTS]  # on each run's slot, where it has no directory
    BlockDir* dir[RUN_SLOTS]       # each run's block directory, or NULL
    DirCache* cache            # where the directories are held
    uint32_t written_from      # the first run id this call wrote into the table (0: none)


cdef struct RunsView:
    size_t txnid            # the committed transaction whose runs these are
    size_t refs             # its holders: the cache and the searches using it
    Py_ssize_t tables
    TableRuns* runs         # per table; every run with its directory, no cursors


cdef struct Index:
    bint opened
    int n                            # sub-cursors open: on each slot in use, and the transaction's own
    int slot[INDEX_SLOTS]
    MDB_cursor* cursor[INDEX_SLOTS]
    bint on[INDEX_SLOTS]             # positioned on an entry (merged reads)
    int at                           # the sub-cursor of the merged position (-1: none)
    MDB_cursor* put                  # on the transaction's own slot (upsert's puts)


cdef struct Work:
    MDB_txn* txn
    MDB_dbi meta, docs
    MDB_dbi* index_dbis     # the fingerprint index's slots (_index.pxi)
    int index_slots         # how many the database has (1 where an older one is read)
    int put_slot            # the slot the transaction puts new index entries into (-1: none yet)
    Index ix
    MDB_dbi* tables
    bint runs               # the tables are kept as runs (RUNS.md), not dupsort tables
    MDB_dbi run_dir         # every table's directory of runs, keyed by the table (u16 BE)
    MDB_dbi* run_slots      # per table: RUN_SLOTS slot sub-databases
    TableRuns* table_runs   # per table: its live runs, loaded by open_cursors
    U64s* pending           # insert_if_new on runs: fingerprints added, not yet in a run
    MDB_dbi* bands          # the band tables (NULL where the database has none)
    Layout* layout
    MDB_cursor* doc_cursor
    MDB_cursor** table_cursors
    MDB_cursor* band_cursors[SIGNATURE_BANDS]
    U64s* band_changes      # per band: (entry, 1 if added else 0) of the batch's text documents
    bint index_was_empty    # the fingerprint index was empty when the batch began
    bint unlinked           # the batch took documents out of the index
    uint64_t merge_limit    # the most entries a merge may take (0: any; a batch: Env.batch_merge)
    uint64_t merged         # the entries this transaction's merges have taken
    bint untidy             # the batch left merges or a rewrite of the tables for tidy
    DirCache* dirs          # where a search finds and leaves block directories (NULL: none)
    bint snapshot           # a read transaction: its runs may be cached as a view
    RunsView* view          # the cached view table_runs points into, or NULL (table_runs is its own)
    uint64_t directory_entries  # the largest run a search gives a directory
    bint runs_written       # the transaction wrote runs (only committed runs get directories)
    bint index_committed    # no earlier call of the transaction changed the index
    size_t merge_threads    # the threads a large merge of committed runs is cut among
    uint64_t threaded_merge  # the least entries a merge takes to be cut so
    uint64_t* threaded_merges  # the Env's count of merges cut so
    uint64_t* shared_lookups  # the Env's count of batches whose lookups a thread shared
    uint64_t* fed_merges    # the Env's count of index merges whose sources a thread read


cdef int open_cursors(Work* w) noexcept nogil:
    cdef Py_ssize_t t
    cdef int rc
    for t in range(SIGNATURE_BANDS):  # opened by what uses them (open_band_cursors)
        w.band_cursors[t] = NULL
    rc = g_cursor_open(w.txn, w.docs, &w.doc_cursor)
    w.table_cursors = <MDB_cursor**>malloc((w.layout.tables + 1) * sizeof(MDB_cursor*))
    if w.table_cursors == NULL:
        return NO_MEMORY
    for t in range(w.layout.tables):
        w.table_cursors[t] = NULL
        if rc == 0 and not w.runs:
            rc = g_cursor_open(w.txn, w.tables[t], &w.table_cursors[t])
    if not w.runs or rc:
        return rc
    cdef bint viewed = w.snapshot and w.dirs != NULL
    if viewed:
        w.view = view_acquire(w.dirs, mdb_txn_id(w.txn))
        if w.view != NULL:
            w.table_runs = w.view.runs
            return 0
    w.table_runs = <TableRuns*>calloc(w.layout.tables + 1, sizeof(TableRuns))
    if w.table_runs == NULL:
        return NO_MEMORY
    for t in range(w.layout.tables):
        if rc == 0:
            rc = load_runs(w, t)
    if rc == 0 and viewed:
        view_offer(w.dirs, mdb_txn_id(w.txn), w.table_runs, w.layout.tables)
    return rc


cdef int open_band_cursors(Work* w) noexcept nogil:
    """Open the band tables' cursors once: a fingerprint search needs none, and
    each sub-database's first use in a snapshot costs a lookup."""
    cdef int b, rc = 0
    for b in range(SIGNATURE_BANDS if w.bands != NULL else 0):
        if rc == 0 and w.band_cursors[b] == NULL:
            rc = g_cursor_open(w.txn, w.bands[b], &w.band_cursors[b])
    return rc


cdef void close_cursors(Work* w) noexcept nogil:
    cdef Py_ssize_t t
    if w.doc_cursor != NULL:
        mdb_cursor_close(w.doc_cursor)
    index_close(w)
    if w.table_cursors != NULL:
        for t in range(w.layout.tables):
            if w.table_cursors[t] != NULL:
                mdb_cursor_close(w.table_cursors[t])
        free(w.table_cursors)
        for t in range(SIGNATURE_BANDS):
            if w.band_cursors[t] != NULL:
                mdb_cursor_close(w.band_cursors[t])
    if w.view != NULL:
        view_release(w.dirs, w.view)
    elif w.table_runs != NULL:
        for t in range(w.layout.tables):
            close_runs(&w.table_runs[t])
        free(w.table_runs)


# Search: every stored fingerprint within a distance of each probe

cdef struct Hit:
    uint64_t probe, fp, distance


cdef struct Hits:
    Hit* data
    size_t size, cap


cdef int hit_push(Hits* h, uint64_t probe, uint64_t fp, uint64_t distance) noexcept nogil:
    if make_room(<void**>&h.data, &h.cap, h.size, sizeof(Hit)):
        return NO_MEMORY
    h.data[h.size].probe = probe
    h.data[h.size].fp = fp
    h.data[h.size].distance = distance
    h.size += 1
    return 0


cdef int cmp_hit(const void* a, const void* b) noexcept nogil:
    cdef const Hit* x = <const Hit*>a
    cdef const Hit* y = <const Hit*>b
    if x.probe != y.probe:
        return (x.probe > y.probe) - (x.probe < y.probe)
    return (x.fp > y.fp) - (x.fp < y.fp)


cdef int scan_range(MDB_cursor* cursor, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                    const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """Verify every entry of one table in [lo, hi] against the permuted probe."""
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef uint64_t entry
    cdef int rc, d
    write_be(key_bytes, lo >> 48, 2)
    write_be(value_bytes, lo, 6)
    k.mv_size, k.mv_data = 2, key_bytes
    v.mv_size, v.mv_data = 6, value_bytes
    rc = g_cursor_get(cursor, &k, &v, MDB_GET_BOTH_RANGE)
    if rc == MDB_NOTFOUND:
        if (lo >> 48) == (hi >> 48):
            return 0
        write_be(key_bytes, (lo >> 48) + 1, 2)
        k.mv_size, k.mv_data = 2, key_bytes
        rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 2 or v.mv_size != 6:
            return -30796  # MDB_CORRUPTED
        entry = (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6)
        if entry > hi:
            return 0
        d = popcount64(entry ^ perm)
        if d <= distance:
            rc = hit_push(out, probe, unpermute_one(entry, spec, blocks), d)
            if rc:
                return rc
        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int scan_variants(Work* w, Py_ssize_t t, uint64_t base, uint64_t perm, int first_bit,
                       int flips, int distance, uint64_t probe, Hits* out) noexcept nogil:
    """Scan the prefix ``base`` and every prefix that differs from it in up to
    ``flips`` more of its bits below ``first_bit``."""
    cdef uint64_t mask = w.layout.prefixes[t]
    cdef long* spec = w.layout.spec + 3 * w.layout.blocks * t
    cdef int rc = scan_runs(&w.table_runs[t], base, base | ~mask, perm, distance, spec,
                            w.layout.blocks, probe, out) if w.runs else \
        scan_range(w.table_cursors[t], base, base | ~mask, perm, distance, spec,
                   w.layout.blocks, probe, out)
    cdef int bit
    if rc or flips == 0:
        return rc
    for bit in range(64 - w.layout.prefix_bits[t], first_bit):
        rc = scan_variants(w, t, base ^ ((<uint64_t>1) << bit), perm, bit, flips - 1, distance,
                           probe, out)
        if rc:
            return rc
    return 0


cdef void sort_by_fp(Hit* hits, size_t n) noexcept nogil:
    """Sort one probe's hits by fingerprint (insertion: a probe has few)."""
    cdef size_t i, j
    cdef Hit h
    if n > 32:
        qsort(hits, n, sizeof(Hit), cmp_hit)
        return
    for i in range(1, n):
        h, j = hits[i], i
        while j and hits[j - 1].fp > h.fp:
            hits[j] = hits[j - 1]
            j -= 1
        hits[j] = h


cdef int sort_hits(Hits* hits) noexcept nogil:
    """Sort the hits by (probe, fingerprint): counted out by probe, then each
    probe's (few) by fingerprint."""
    cdef size_t n = hits.size, i, begin = 0
    cdef size_t low = hits.data[0].probe if n else 0, top = low
    for i in range(n):
        low, top = min(low, hits.data[i].probe), max(top, hits.data[i].probe)
    if n < 64 or low == top:  # few, or one probe's (search_pending)
        qsort(hits.data, n, sizeof(Hit), cmp_hit)
        return 0
    cdef size_t* ends = <size_t*>calloc(top + 2, sizeof(size_t))
    cdef Hit* by_probe = <Hit*>malloc(n * sizeof(Hit))
    if ends == NULL or by_probe == NULL:
        free(by_probe)
        free(ends)
        return NO_MEMORY
    for i in range(n):
        ends[hits.data[i].probe + 1] += 1
    for i in range(top + 1):
        ends[i + 1] += ends[i]
    for i in range(n):  # ends[p] moves from the start of p's hits to their end
        by_probe[ends[hits.data[i].probe]] = hits.data[i]
        ends[hits.data[i].probe] += 1
    for i in range(top + 1):
        sort_by_fp(by_probe + begin, ends[i] - begin)
        begin = ends[i]
    memcpy(hits.data, by_probe, n * sizeof(Hit))
    free(by_probe)
    free(ends)
    return 0


cdef int dedupe_hits(Hits* hits) noexcept nogil:
    """Sort the hits by (probe, fingerprint), keeping each once."""
    cdef size_t i, kept = 0
    cdef int rc = sort_hits(hits)
    if rc:
        return rc
    for i in range(hits.size):
        if kept == 0 or hits.data[i].probe != hits.data[kept - 1].probe or \
                hits.data[i].fp != hits.data[kept - 1].fp:
            hits.data[kept] = hits.data[i]
            kept += 1
    hits.size = kept
    return 0


cdef int search_pending(Work* w, uint64_t fp, int distance, uint64_t probe, bint replaced,
                        Hits* out) noexcept nogil:
    """To the hits from ``out``'s start, found in the tables before
    insert_if_new stored anything, add its pending fingerprints within
    ``distance`` of ``fp`` (compared one by one), keep each once, and keep
    only those the index still has where the call ``replaced`` documents."""
    cdef size_t i
    cdef int rc
    for i in range(w.pending.size):
        if popcount64(w.pending.data[i] ^ fp) <= distance:
            rc = hit_push(out, probe, w.pending.data[i], popcount64(w.pending.data[i] ^ fp))
            if rc:
                return rc
    rc = dedupe_hits(out)
    return drop_stale(w, out) if replaced and rc == 0 else rc


cdef int search_many(Work* w, const uint64_t* probes, size_t n, int distance, int flips,
                     Hits* out) noexcept nogil:
    """The distinct fingerprints the tables hold within ``distance`` of each
    probe (removed ones too: drop_stale), as hits sorted by (probe,
    fingerprint): table by table in the order of the permuted
    probes, so that neighbouring seeks share the pages on their way down."""
    if w.runs and n > 1:  # one probe: a seek a range costs less than setting up sweeps
        return sweep_tables(w, probes, n, distance, flips, out)
    cdef uint64_t* order = <uint64_t*>malloc((2 * n + 1) * sizeof(uint64_t))
    cdef Py_ssize_t t
    cdef size_t i
    cdef int rc = 0
    cdef long* spec
    if order == NULL:
        return NO_MEMORY
    for t in range(w.layout.tables):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        for i in range(n):
            order[2 * i], order[2 * i + 1] = permute_one(probes[i], spec, w.layout.blocks), i
        rc = sort_records(order, n, 2)
        i = 0
        while rc == 0 and i < n:
            rc = scan_variants(w, t, order[2 * i] & w.layout.prefixes[t], order[2 * i], 64,
                               flips, distance, order[2 * i + 1], out)
            i += 1
        if rc:
            break
    free(order)
    return rc if rc else dedupe_hits(out)


cdef int sweep_tables(Work* w, const uint64_t* probes, size_t n, int distance, int flips,
                      Hits* out) noexcept nogil:
    """search_many over tables kept as runs: each table's ranges sorted by
    their start and swept over each run (sweep_runs)."""
    cdef U64s ranges
    cdef Py_ssize_t t
    cdef size_t i
    cdef uint64_t perm
    cdef long* spec
    cdef int rc = 0
    ranges.data, ranges.size, ranges.cap = NULL, 0, 0
    for t in range(w.layout.tables):
        spec = w.layout.spec + 3 * w.layout.blocks * t
        ranges.size = 0
        for i in range(n):
            perm = permute_one(probes[i], spec, w.layout.blocks)
            rc = push_ranges(w, t, perm & w.layout.prefixes[t], perm, 64, flips, i, &ranges)
            if rc:
                break
        if rc == 0:
            rc = sort_records(ranges.data, ranges.size // 4, 4)
        if rc == 0:
            rc = sweep_runs(&w.table_runs[t], ranges.data, ranges.size // 4, distance, spec,
                            w.layout.blocks, out)
        if rc:
            break
    free(ranges.data)
    return rc if rc else dedupe_hits(out)


include "_index.pxi"


# Tables kept as runs (RUNS.md): per table a directory of live runs, each run
# in a slot sub-database of its own; a batch appends a run, merges keep few;
# removals leave stale entries, which hits drop by the fingerprint index

cdef int load_runs(Work* w, Py_ssize_t t) noexcept nogil:
    """Read table ``t``'s directory ((id u32, slot u8, entries u64) a run,
    big-endian, oldest first) and open a cursor on each live run's slot."""
    cdef TableRuns* r = &w.table_runs[t]
    cdef uint8_t buf[RUN_RECORD_BYTES * RUN_SLOTS]
    cdef uint8_t key[TABLE_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t i, j
    cdef int rc
    close_runs(r)
    write_be(key, t, TABLE_KEY_BYTES)
    k.mv_size, k.mv_data = TABLE_KEY_BYTES, key
    rc = g_get(w.txn, w.run_dir, &k, &v)
    if rc == MDB_NOTFOUND:
        return 0
    if rc == 0 and (v.mv_size % RUN_RECORD_BYTES or v.mv_size > RUN_RECORD_BYTES * RUN_SLOTS):
        rc = CORRUPTED
    if rc == 0 and g_copy(buf, v.mv_data, v.mv_size):
        rc = CORRUPTED
    r.cache = NULL if w.runs_written else w.dirs
    for i in range(v.mv_size // RUN_RECORD_BYTES if rc == 0 else 0):
        r.id[i], r.slot[i] = read_be(buf + RUN_RECORD_BYTES * i, 4), buf[RUN_RECORD_BYTES * i + 4]
        r.entries[i] = read_be(buf + RUN_RECORD_BYTES * i + 5, 8)
        if r.slot[i] >= RUN_SLOTS:
            return CORRUPTED
        for j in range(i):  # a slot named twice (a merge drops its sources' slots)
            if r.slot[j] == r.slot[i]:
                return CORRUPTED
        r.n = i + 1
        r.cursor[i], r.dir[i] = NULL, NULL
        if r.cache != NULL:
            r.dir[i] = dir_acquire(r.cache, t * RUN_SLOTS + r.slot[i], r.id[i], r.entries[i])
        if r.dir[i] != NULL:
            continue
        rc = g_cursor_open(w.txn, w.run_slots[t * RUN_SLOTS + r.slot[i]], &r.cursor[i])
        if rc == 0 and r.cache != NULL and r.entries[i] <= w.directory_entries:
            rc = dir_build(r.cursor[i], r.id[i], r.entries[i], &r.dir[i])
            if rc == 0:
                dir_publish(r.cache, t * RUN_SLOTS + r.slot[i], r.dir[i])
            else:  # a damaged run: the cursor finds the damage if a search goes there
                if r.dir[i] != NULL:
                    dir_free(r.dir[i])
                    r.dir[i] = NULL
                rc = rc if rc == GUARD_FAULT or rc == NO_MEMORY else 0
        if rc:
            break
    return rc


cdef void close_runs(TableRuns* r) noexcept nogil:
    cdef size_t i
    for i in range(r.n):
        if r.cursor[i] != NULL:
            mdb_cursor_close(r.cursor[i])
            r.cursor[i] = NULL
        if r.dir[i] != NULL:
            dir_release(r.cache, r.dir[i])
            r.dir[i] = NULL
    r.n = 0


cdef int save_runs(Work* w, Py_ssize_t t, TableRuns* r) noexcept nogil:
    """Write ``r`` as table ``t``'s directory, then load it back (with cursors)."""
    cdef uint8_t buf[RUN_RECORD_BYTES * RUN_SLOTS]
    cdef uint8_t key[TABLE_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t i
    for i in range(r.n):
        write_be(buf + RUN_RECORD_BYTES * i, r.id[i], 4)
        buf[RUN_RECORD_BYTES * i + 4] = r.slot[i]
        write_be(buf + RUN_RECORD_BYTES * i + 5, r.entries[i], 8)
    write_be(key, t, TABLE_KEY_BYTES)
    k.mv_size, k.mv_data = TABLE_KEY_BYTES, key
    v.mv_size, v.mv_data = RUN_RECORD_BYTES * r.n, buf
    w.runs_written = True
    cdef int rc = g_put(w.txn, w.run_dir, &k, &v, 0)
    return rc if rc else load_runs(w, t)


cdef int emit_hits(RunIter* it, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                   const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """The run's entries from where ``it`` stands up to ``hi`` that are at least
    ``lo`` and within ``distance`` of ``perm``, as hits."""
    cdef uint64_t x
    cdef int rc
    while True:
        rc = iter_next(it, &x)
        if rc or x > hi:
            return 0 if rc == MDB_NOTFOUND else rc
        if x >= lo and popcount64(x ^ perm) <= distance:
            rc = hit_push(out, probe, unpermute_one(x, spec, blocks), popcount64(x ^ perm))
            if rc:
                return rc


cdef int scan_runs(TableRuns* r, uint64_t lo, uint64_t hi, uint64_t perm, int distance,
                   const long* spec, Py_ssize_t blocks, uint64_t probe, Hits* out) noexcept nogil:
    """scan_range over every live run of a table (a fingerprint may come from two)."""
    cdef RunIter it
    cdef size_t i
    cdef int rc = 0
    for i in range(r.n):
        it.cursor, it.dir, it.run = r.cursor[i], r.dir[i], r.id[i]
        rc = iter_seek(&it, lo)
        if rc == 0:
            rc = emit_hits(&it, lo, hi, perm, distance, spec, blocks, probe, out)
        if rc:
            return rc
    return 0


cdef int push_ranges(Work* w, Py_ssize_t t, uint64_t base, uint64_t perm, int first_bit,
                     int flips, uint64_t probe, U64s* ranges) noexcept nogil:
    """As scan_variants, but note each range as (lo, hi, permuted probe, probe)."""
    cdef uint64_t mask = w.layout.prefixes[t]
    cdef int bit, rc = u64_push(ranges, base)
    if rc == 0:
        rc = u64_push(ranges, base | ~mask)
    if rc == 0:
        rc = u64_push(ranges, perm)
    if rc == 0:
        rc = u64_push(ranges, probe)
    if rc or flips == 0:
        return rc
    for bit in range(64 - w.layout.prefix_bits[t], first_bit):
        rc = push_ranges(w, t, base ^ ((<uint64_t>1) << bit), perm, bit, flips - 1, probe, ranges)
        if rc:
            return rc
    return 0


cdef int block_hits(RunIter* it, const uint64_t* q, int distance, const long* spec,
                    Py_ssize_t blocks, Hits* out) noexcept nogil:
    """emit_hits for the range ``q`` (lo, hi, perm, probe) inside the block
    ``it`` holds, from the bucket of lo (select_zero), leaving its cursor."""
    cdef bint more = it.more
    start_at(it, q[0])
    it.more = False
    cdef int rc = emit_hits(it, q[0], q[1], q[2], distance, spec, blocks, q[3], out)
    it.more = more
    return rc


cdef int sweep_runs(TableRuns* r, const uint64_t* q, size_t n, int distance, const long* spec,
                    Py_ssize_t blocks, Hits* out) noexcept nogil:
    """scan_runs for ``n`` ranges (lo, hi, perm, probe) sorted by lo, each run
    swept once: the block that holds a range's start is kept while the next
    ranges start in it, and the cursor steps on before it seeks."""
    cdef Sweep sw
    cdef RunIter rest
    cdef size_t i, j
    cdef int rc = 0
    for i in range(r.n):
        sw.it.cursor, sw.it.dir, sw.it.run, sw.kept, sw.has_next = \
            r.cursor[i], r.dir[i], r.id[i], False, False
        rest.run, rest.dir, rest.cursor = r.id[i], r.dir[i], NULL
        if rest.dir == NULL:
            rc = g_cursor_open(mdb_cursor_txn(r.cursor[i]), mdb_cursor_dbi(r.cursor[i]),
                                 &rest.cursor)
        if rc:
            return rc
        rc = sweep_to(&sw, q[0]) if n else 0
        j = 0
        while rc == 0 and j < n:
            if sw.has_next and q[4 * j] >= sw.next_first:
                rc = sweep_to(&sw, q[4 * j])
            if rc == 0 and sw.kept:
                rc = block_hits(&sw.it, q + 4 * j, distance, spec, blocks, out)
            if rc == 0 and sw.has_next and q[4 * j + 1] >= sw.next_first:  # on past the block
                rc = scan_runs_one(&rest, sw.next_first, q + 4 * j, distance, spec, blocks, out)
            j += 1
        if rest.cursor != NULL:
            mdb_cursor_close(rest.cursor)
        if rc:
            return rc
    return 0


cdef int scan_runs_one(RunIter* it, uint64_t lo, const uint64_t* q, int distance,
                       const long* spec, Py_ssize_t blocks, Hits* out) noexcept nogil:
    """The hits of the range ``q`` in one run from ``lo`` on (a seek)."""
    cdef int rc = iter_seek(it, lo)
    return rc if rc else emit_hits(it, lo, q[1], q[2], distance, spec, blocks, q[3], out)


cdef int drop_stale(Work* w, Hits* hits) noexcept nogil:
    """Keep the hits whose fingerprint the index has (a run keeps the entries
    of removed fingerprints until the tables are written again:
    rewrite_tables)."""
    cdef size_t i, kept = 0
    cdef int rc
    for i in range(hits.size):
        rc = index_has(w, hits.data[i].fp)
        if rc < 0:
            return rc
        if rc:
            hits.data[kept] = hits.data[i]
            kept += 1
    hits.size = kept
    return 0


cdef struct Keyed:  # one document of a hit: its key at bytes[at:at + size]
    size_t hit, at, size


cdef struct KeyedHits:
    Keyed* data
    size_t size, cap
    uint8_t* bytes
    size_t used, room


cdef int read_keys(Work* w, const Hits* hits, KeyedHits* out) noexcept nogil:
    """The keys of the documents that have each hit's fingerprint now (none for
    a removed one), read from the index and copied into ``out``."""
    cdef uint8_t fp_bytes[8]
    cdef MDB_val k, v
    cdef size_t i
    cdef int rc
    out.size, out.used = 0, 0
    for i in range(hits.size):
        write_be(fp_bytes, hits.data[i].fp, 8)
        k.mv_size, k.mv_data = 8, fp_bytes
        rc = index_get(w, &k, &v, MDB_SET)
        while rc == 0:
            while out.used + v.mv_size > out.room:  # doubled until the key fits
                if make_room(<void**>&out.bytes, &out.room, out.room, 1):
                    return NO_MEMORY
            if make_room(<void**>&out.data, &out.cap, out.size, sizeof(Keyed)):
                return NO_MEMORY
            if g_copy(out.bytes + out.used, v.mv_data, v.mv_size):
                return CORRUPTED
            out.data[out.size].hit, out.data[out.size].at = i, out.used
            out.data[out.size].size = v.mv_size
            out.size += 1
            out.used += v.mv_size
            rc = index_get(w, &k, &v, MDB_NEXT_DUP)
        if rc != MDB_NOTFOUND:
            return rc
    return 0


cdef int free_slot(TableRuns* r) noexcept nogil:
    """A slot no live run holds (one is free while r.n < RUN_SLOTS)."""
    cdef int s
    cdef size_t i
    cdef bint held
    for s in range(RUN_SLOTS):
        held = False
        for i in range(r.n):
            held = held or r.slot[i] == s
        if not held:
            return s
    return -1


cdef bint merge_due(const TableRuns* r, uint64_t limit) noexcept nogil:
    """Whether to merge the two newest runs now: the newest is over 1/RUN_RATIO of
    the one before and the two hold at most ``limit`` entries (0: any number),
    or the slots run short."""
    if r.n < 2:
        return False
    return r.n >= RUN_SLOTS - 1 or (r.entries[r.n - 1] * RUN_RATIO > r.entries[r.n - 2] and (
        limit == 0 or r.entries[r.n - 1] + r.entries[r.n - 2] <= limit))


cdef bint merges_left(const TableRuns* r) noexcept nogil:
    """Whether some run is over 1/RUN_RATIO of the one before it (a merge a batch
    left for tidy, which merges the newest runs until there is none)."""
    cdef size_t i
    for i in range(1, r.n):
        if r.entries[i] * RUN_RATIO > r.entries[i - 1]:
            return True
    return r.n >= RUN_SLOTS - 1


# A large merge of committed runs in parts: ranges of values, each merged on a
# thread of its own from the runs' block directories (the pages of a committed
# run stay put in the map while the transaction lasts: LMDB writes its new pages
# elsewhere, and frees the run's only when the transaction commits), the first
# put as it goes, the others kept in memory and appended after it

cdef enum:
    MAX_PARTS = 16


cdef struct Part:
    const BlockDir** dirs   # the runs merged
    size_t m
    uint64_t lo, hi         # the part's values: from lo, below hi if bounded
    bint bounded
    uint32_t run
    MDB_cursor* cursor      # where the first part puts its blocks (NULL: into sink)
    Blocks sink
    size_t blocks, entries
    int rc


cdef int merge_part(Part* p) noexcept nogil:
    """Merge the part's values of its runs into a run's blocks."""
    cdef Source* src = <Source*>calloc(p.m + 1, sizeof(Source))
    cdef RunWriter wr
    cdef size_t s
    cdef const BlockDir* d
    cdef int rc = NO_MEMORY if src == NULL else 0
    memset(&wr, 0, sizeof(RunWriter))
    wr.run, wr.guess, wr.cursor, wr.sink = p.run, 2, p.cursor, &p.sink
    for s in range(p.m if rc == 0 else 0):
        d = p.dirs[s]
        src[s].dir, src[s].run, src[s].lo, src[s].hi, src[s].bounded = d, d.run, p.lo, p.hi, p.bounded
        src[s].at = dir_seek(d, p.lo) if d.n else 0
        src[s].end = upper_bound(d.firsts, d.n, p.hi - 1) if p.bounded else d.n
        src[s].buf = <uint64_t*>malloc(MOST * sizeof(uint64_t))
        src[s].vals = src[s].buf
        rc = NO_MEMORY if src[s].buf == NULL else source_next_block(&src[s])
        if rc:
            break
    if rc == 0:
        rc = merge_sources(src, p.m + 1, &wr)
    for s in range(p.m if src != NULL else 0):
        free(src[s].buf)
    free(src)
    p.blocks, p.entries = wr.blocks, wr.entries
    return rc


cdef void* merge_part_thread(void* part) noexcept nogil:
    (<Part*>part).rc = merge_part(<Part*>part)
    return NULL


cdef int merge_in_parts(Work* w, const MDB_dbi* dbis, const uint32_t* runs,
                        const uint64_t* entries, size_t m, MDB_dbi out, uint32_t run,
                        size_t* blocks, size_t* written) noexcept nogil:
    """merge_runs of the ``m`` committed runs ``runs`` (no extra values, none
    dropped), cut into up to ``w.merge_threads`` parts of about equal size."""
    cdef BlockDir* dirs[RUN_SLOTS]
    cdef Part parts[MAX_PARTS]
    cdef pthread_t threads[MAX_PARTS]
    cdef bint started[MAX_PARTS]
    cdef MDB_cursor* cursor = NULL
    cdef uint8_t key[RUN_KEY_BYTES]
    cdef MDB_val k, v
    cdef size_t s, i, at, largest = 0, n = min(w.merge_threads, <size_t>MAX_PARTS)
    cdef uint64_t first
    cdef uint16_t size
    cdef int rc = 0
    memset(dirs, 0, sizeof(dirs))
    memset(parts, 0, sizeof(parts))
    memset(started, 0, sizeof(started))
    for s in range(m):
        rc = g_cursor_open(w.txn, dbis[s], &cursor)
        if rc == 0:
            rc = dir_build(cursor, runs[s], entries[s], &dirs[s])
        if cursor != NULL:
            mdb_cursor_close(cursor)
            cursor = NULL
        if rc:
            break
        if dirs[s].n > dirs[largest].n:
            largest = s
    if rc == 0:  # the parts' bounds: blocks of the largest run, evenly spaced
        n = max(1, min(n, dirs[largest].n))
        for i in range(n):
            parts[i].dirs, parts[i].m, parts[i].run = <const BlockDir**>dirs, m, run
            parts[i].lo = dirs[largest].firsts[dirs[largest].n * i // n] if i else 0
            if i:
                parts[i - 1].hi, parts[i - 1].bounded = parts[i].lo, True
        rc = g_cursor_open(w.txn, out, &parts[0].cursor)
    for i in range(1, n if rc == 0 else 0):
        started[i] = pthread_create(&threads[i], NULL, merge_part_thread, &parts[i]) == 0
    if rc == 0:
        rc = merge_part(&parts[0])
    for i in range(1, n):
        if started[i]:
            pthread_join(threads[i], NULL)
        elif rc == 0:
            parts[i].rc = merge_part(&parts[i])
        rc = rc if rc else parts[i].rc
    blocks[0] = written[0] = 0
    for i in range(n):
        blocks[0] += parts[i].blocks
        written[0] += parts[i].entries
        at = 0
        while rc == 0 and i and at < parts[i].sink.size:
            memcpy(&first, parts[i].sink.data + at, 8)
            memcpy(&size, parts[i].sink.data + at + 8, 2)
            write_be(key, run, 4)
            write_be(key + 4, first, 8)
            k.mv_size, k.mv_data = RUN_KEY_BYTES, key
            v.mv_size, v.mv_data = size, parts[i].sink.data + at + 10
            rc = g_cursor_put(parts[0].cursor, &k, &v, MDB_APPEND)
            at += 10 + size
        free(parts[i].sink.data)
    if parts[0].cursor != NULL:
        mdb_cursor_close(parts[0].cursor)
    for s in range(m):
        if dirs[s] != NULL:
            dir_free(dirs[s])
    if rc == 0 and n > 1:
        w.threaded_merges[0] += 1
    return rc


cdef size_t cascade(const TableRuns* r) noexcept nogil:
    """How many of the newest runs (two at least) merging the two newest while
    merges_left would make one, the sizes taken as sums."""
    cdef uint64_t merged = r.entries[r.n - 1]
    cdef size_t i, k = r.n
    cdef bint left = True
    while left and k >= 2:
        merged += r.entries[k - 2]
        k -= 1
        left = k >= RUN_SLOTS - 1 or (k >= 2 and merged * RUN_RATIO > r.entries[k - 2])
        for i in range(1, k - 1):
            left = left or r.entries[i] * RUN_RATIO > r.entries[i - 1]
    return r.n - k + 1


cdef int add_run(Work* w, Py_ssize_t t, const uint64_t* perms, size_t n) noexcept nogil:
    """Append sorted ``perms`` (if ``n``) to table ``t`` as a new run, then merge
    the two newest runs while merge_due within ``w.merge_limit``, so a table
    keeps about log_RATIO(N / batch) runs; bigger merges are noted for tidy.
    Where the runs those merges would take are committed and hold
    ``w.threaded_merge`` entries or more, they are merged at once, in parts."""
    cdef TableRuns r = w.table_runs[t]
    cdef uint32_t ids[RUN_SLOTS]
    cdef MDB_dbi dbis[RUN_SLOTS]
    cdef MDB_dbi out
    cdef size_t blocks, entries, i, m
    cdef uint32_t id
    cdef uint64_t dropped = 0, taken
    cdef bint threaded
    cdef int slot, rc = 0 if r.n else read_counter(w, RUN_IDS, &dropped)
    memset(r.cursor, 0, sizeof(r.cursor))  # the table's cursors and block
    memset(r.dir, 0, sizeof(r.dir))        # directories stay with w until save_runs
    w.runs_written = True  # before any slot changes, whatever happens next
    while rc == 0 and (n or (merges_left(&r) if w.merge_limit == 0 else
                             merge_due(&r, w.merge_limit))):
        # a run id is never given twice in a table (so a block directory cached
        # for one can be trusted): each new run's is above every live one's, and
        # an emptied table's first is above those a rewrite dropped
        slot, id = free_slot(&r), r.id[r.n - 1] + 1 if r.n else <uint32_t>(dropped + 1)
        if slot < 0:  # a directory of more runs than merges leave
            rc = CORRUPTED
            break
        if w.table_runs[t].written_from == 0:
            w.table_runs[t].written_from = id
        out = w.run_slots[t * RUN_SLOTS + slot]
        if n:  # the batch's run
            rc = merge_runs(w.txn, NULL, NULL, 0, perms, n, NULL, 0, out, id, &blocks, &entries)
            n = 0
            r.id[r.n], r.slot[r.n], r.entries[r.n] = id, slot, entries
            r.n += 1
            continue
        # the newest into one: two, or, in parts, as many as the merges of two would take
        threaded = w.merge_threads > 1 and r.id[r.n - 1] < w.table_runs[t].written_from
        m = cascade(&r) if threaded else 2
        taken = 0
        for i in range(r.n - m, r.n):
            taken += r.entries[i]
        if threaded and taken < w.threaded_merge:
            m, threaded, taken = 2, False, r.entries[r.n - 2] + r.entries[r.n - 1]
        for i in range(m):
            ids[i], dbis[i] = r.id[r.n - m + i], w.run_slots[t * RUN_SLOTS + r.slot[r.n - m + i]]
        if threaded:
            rc = merge_in_parts(w, dbis, ids, r.entries + r.n - m, m, out, id, &blocks, &entries)
            if rc == NO_MEMORY:  # the parts held in memory: streamed instead
                rc, threaded = g_drop(w.txn, out, 0), False
        if rc == 0 and not threaded:
            rc = merge_runs(w.txn, dbis, ids, m, NULL, 0, NULL, 0, out, id, &blocks, &entries)
        for i in range(m):
            if rc == 0:
                rc = g_drop(w.txn, dbis[i], 0)
        w.merged += taken
        r.n -= m
        r.id[r.n], r.slot[r.n], r.entries[r.n] = id, slot, entries
        r.n += 1
    w.untidy = w.untidy or merges_left(&r)
    return rc if rc else save_runs(w, t, &r)


# The band tables: table b holds an entry (the text's band key b << 32 | its
# fingerprint's top 32 bits) while a stored text document has it

cdef long IDENTITY_SPEC[3]  # a one-block "permutation" that leaves an entry as it is
IDENTITY_SPEC[0], IDENTITY_SPEC[1], IDENTITY_SPEC[2] = 0, 64, 0


cdef int note_bands(Work* w, const uint8_t* value, size_t size, uint64_t fp,
                    bint added) noexcept nogil:
    """Note the band entries of a document value (none for a document without
    a signature) as added to or taken from the band tables."""
    cdef const uint8_t* signature
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef int b, rc = 0
    if w.bands == NULL:
        return 0
    signature = value_signature(value, size, 2 * MINHASH_BINS)
    if signature == NULL or signature_bands(signature, keys) == 0:
        return 0
    for b in range(SIGNATURE_BANDS):
        rc = u64_push(&w.band_changes[b], ((<uint64_t>keys[b]) << 32) | (fp >> 32))
        if rc == 0:
            rc = u64_push(&w.band_changes[b], added)
        if rc:
            return rc
    return 0


cdef int entry_held(Work* w, int band, uint64_t entry) noexcept nogil:
    """1 if a stored document (as the index is now) has band entry ``entry`` in
    band table ``band``, 0 if none, or an LMDB error."""
    cdef uint8_t start[8]
    cdef MDB_val k, v, value
    cdef uint32_t keys[SIGNATURE_BANDS]
    cdef const uint8_t* signature
    cdef int rc
    write_be(start, (entry & 0xFFFFFFFFULL) << 32, 8)
    k.mv_size, k.mv_data = 8, start
    rc = index_get(w, &k, &v, MDB_SET_RANGE)
    while rc == 0:
        if k.mv_size != 8:
            return -30796  # MDB_CORRUPTED
        if (read_be(<uint8_t*>k.mv_data, 8) >> 32) != (entry & 0xFFFFFFFFULL):
            return 0
        rc = g_get(w.txn, w.docs, &v, &value)
        if rc == 0:
            signature = value_signature(<uint8_t*>value.mv_data, value.mv_size,
                                        2 * MINHASH_BINS)
            if signature != NULL and signature_bands(signature, keys) and \
                    keys[band] == (entry >> 32):
                return 1
        elif rc != MDB_NOTFOUND:
            return rc
        rc = index_get(w, &k, &v, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int update_bands(Work* w) noexcept nogil:
    """Put into the band tables the entries the batch's documents brought, and
    take out those it took away that no stored document has any more."""
    cdef U64s* changes
    cdef size_t n, i, j, added
    cdef uint64_t entry
    cdef bint adding
    cdef int b, rc = open_band_cursors(w), held
    if w.bands == NULL or rc:
        return rc
    for b in range(SIGNATURE_BANDS):
        changes = &w.band_changes[b]
        n = changes.size // 2
        if n:
            rc = sort_records(changes.data, n, 2)
        i = added = 0
        while rc == 0 and i < n:
            entry, adding, j = changes.data[2 * i], False, i
            while j < n and changes.data[2 * j] == entry:
                adding = adding or changes.data[2 * j + 1]
                j += 1
            if adding:  # gathered at the front (written behind what is read)
                changes.data[added] = entry
                added += 1
            else:
                held = entry_held(w, b, entry)
                if held < 0:
                    rc = held
                elif held == 0:
                    rc = delete_table_entries(w.band_cursors[b], &entry, 1)
            i = j
        if rc == 0 and added:
            rc = put_table_entries(w.band_cursors[b], changes.data, added)
        changes.size = 0
        if rc:
            return rc
    return 0


# Writes: documents, the fingerprint index and the tables in step

cdef int touch(Work* w, U64s* touched, uint64_t fp) noexcept nogil:
    """Note ``fp`` as changed, with whether the index had it before this batch
    (the first note of a fingerprint is taken before any of its changes)."""
    cdef int had = 0 if w.index_was_empty else index_has(w, fp)
    return had if had < 0 else note_touched(touched, fp, had)


cdef int note_touched(U64s* touched, uint64_t fp, bint had) noexcept nogil:
    """Note ``fp`` as changed, with whether the index ``had`` it before this batch."""
    cdef int rc = u64_push(touched, fp)
    return rc if rc else u64_push(touched, <uint64_t>had)


cdef int put_table_entries(MDB_cursor* cursor, uint64_t* perms, size_t n) noexcept nogil:
    """Add sorted permuted fingerprints to a table: where they come after what
    is stored, all the values of one key in one append (MDB_MULTIPLE)."""
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef MDB_val run[2]
    cdef uint64_t last = 0
    cdef bint have_last
    cdef size_t i, j, end
    cdef uint8_t* values
    cdef int rc = g_cursor_get(cursor, &k, &v, MDB_LAST)
    if rc and rc != MDB_NOTFOUND:
        return rc
    have_last = rc == 0
    if have_last:
        last = (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6)
    if n == 0 or not have_last or perms[0] > last:
        values = <uint8_t*>malloc(6 * n)
        if values == NULL:
            return NO_MEMORY
        i = rc = 0
        while rc == 0 and i < n:
            end = i + 1
            while end < n and (perms[end] >> 48) == (perms[i] >> 48):
                end += 1
            for j in range(i, end):
                write_be(values + 6 * (j - i), perms[j], 6)
            write_be(key_bytes, perms[i] >> 48, 2)
            k.mv_size, k.mv_data = 2, key_bytes
            run[0].mv_size, run[0].mv_data = 6, values
            run[1].mv_size, run[1].mv_data = end - i, NULL
            rc = g_cursor_put(cursor, &k, run, MDB_MULTIPLE | (
                MDB_APPENDDUP if have_last and (perms[i] >> 48) == (last >> 48) else MDB_APPEND))
            i = end
        free(values)
        return rc
    for i in range(n):
        write_be(key_bytes, perms[i] >> 48, 2)
        write_be(value_bytes, perms[i], 6)
        k.mv_size, k.mv_data = 2, key_bytes
        v.mv_size, v.mv_data = 6, value_bytes
        rc = g_cursor_put(cursor, &k, &v, MDB_NODUPDATA)
        if rc and rc != MDB_KEYEXIST:
            return rc
    return 0


cdef int delete_table_entries(MDB_cursor* cursor, uint64_t* perms, size_t n) noexcept nogil:
    cdef uint8_t key_bytes[2]
    cdef uint8_t value_bytes[6]
    cdef MDB_val k, v
    cdef size_t i
    cdef int rc
    for i in range(n):
        write_be(key_bytes, perms[i] >> 48, 2)
        write_be(value_bytes, perms[i], 6)
        k.mv_size, k.mv_data = 2, key_bytes
        v.mv_size, v.mv_data = 6, value_bytes
        rc = g_cursor_get(cursor, &k, &v, MDB_GET_BOTH)
        if rc == 0:
            rc = g_cursor_del(cursor, 0)
        if rc and rc != MDB_NOTFOUND:
            return rc
    return 0


cdef int update_tables(Work* w, U64s* touched) noexcept nogil:
    """Put the touched fingerprints the index has gained into every table, and
    take out those it has lost."""
    cdef size_t n = touched.size // 2, i, added = 0, removed = 0
    cdef uint64_t* pairs = touched.data
    cdef uint64_t* add
    cdef uint64_t* rem
    cdef uint64_t* perms
    cdef Py_ssize_t t
    cdef int rc = 0, now
    cdef bint had
    if n == 0:
        return 0
    rc = sort_records(pairs, n, 2)  # stable: each fingerprint's first note first
    add = <uint64_t*>malloc(n * sizeof(uint64_t))
    rem = <uint64_t*>malloc(n * sizeof(uint64_t))
    perms = <uint64_t*>malloc(n * sizeof(uint64_t))
    if add == NULL or rem == NULL or perms == NULL:
        rc = NO_MEMORY
    i = 0
    while rc == 0 and i < n:
        had = pairs[2 * i + 1]
        now = index_has(w, pairs[2 * i]) if w.unlinked else 1
        if now < 0:
            rc = now
        elif now and not had:
            add[added] = pairs[2 * i]
            added += 1
        elif had and not now:
            rem[removed] = pairs[2 * i]
            removed += 1
        i += 1
        while i < n and pairs[2 * i] == pairs[2 * i - 2]:
            i += 1
    if rc == 0 and added:  # removals leave stale entries (see drop_stale)
        if w.pending == NULL:
            rc = append_runs(w, add, added, perms)
        for i in range(added if w.pending != NULL else 0):
            if rc == 0:
                rc = u64_push(w.pending, add[i])
    if rc == 0 and added != removed:
        rc = add_to_counter(w, DISTINCT, <int64_t>added - <int64_t>removed)
    if rc == 0 and removed:
        rc = add_to_counter(w, STALE, removed)
    if rc == 0 and w.pending == NULL:
        rc = note_if_stale(w)
    free(add)
    free(rem)
    free(perms)
    touched.size = 0
    return rc


cdef struct TableSort:  # one table's new run, permuted and sorted (sort_table)
    const uint64_t* fps
    size_t n
    const long* spec
    Py_ssize_t blocks
    uint64_t* perms
    int rc


cdef void* sort_table(void* arg) noexcept nogil:
    cdef TableSort* job = <TableSort*>arg
    cdef size_t i
    for i in range(job.n):
        job.perms[i] = permute_one(job.fps[i], job.spec, job.blocks)
    job.rc = sort_records(job.perms, job.n, 1)
    return NULL


cdef size_t SORT_AHEAD_FROM = 65536  # entries from which a thread sorts the next table


cdef int append_runs(Work* w, const uint64_t* fps, size_t n, uint64_t* perms) noexcept nogil:
    """Append ``fps`` to every table as a new run (add_run); ``perms`` holds
    ``n``. For a large run, another thread permutes and sorts the next table's
    while this one writes a table's (LMDB's writes stay on this thread)."""
    cdef TableSort jobs[2]
    cdef TableSort* cur
    cdef TableSort* nxt
    cdef pthread_t ahead
    cdef bint ahead_started, last, threaded = n >= SORT_AHEAD_FROM and w.layout.tables > 1
    cdef Py_ssize_t t
    cdef int rc = 0
    cdef uint64_t* spare = <uint64_t*>malloc(n * sizeof(uint64_t)) if threaded else NULL
    if threaded and spare == NULL:
        threaded = False
    for t in range(2):
        jobs[t].fps, jobs[t].n, jobs[t].blocks = fps, n, w.layout.blocks
        jobs[t].perms = spare if t == 1 and threaded else perms
    jobs[0].spec = w.layout.spec
    sort_table(&jobs[0])
    rc = jobs[0].rc
    for t in range(w.layout.tables):
        if rc:
            break
        cur, nxt = &jobs[t % 2], &jobs[(t + 1) % 2]
        last = t + 1 == w.layout.tables
        nxt.spec = w.layout.spec + 3 * w.layout.blocks * (t + 1)
        ahead_started = threaded and not last and \
            pthread_create(&ahead, NULL, sort_table, nxt) == 0
        rc = add_run(w, t, cur.perms, n)
        if ahead_started:
            pthread_join(ahead, NULL)
        elif rc == 0 and not last:
            sort_table(nxt)
        if rc == 0 and not last:
            rc = nxt.rc
    free(spare)
    return rc


cdef int flush_pending(Work* w) noexcept nogil:
    """Write the fingerprints insert_if_new added (still in the index) as one run a table."""
    cdef U64s* p = w.pending
    cdef size_t i, kept = 0
    cdef int rc = sort_records(p.data, p.size, 1)
    cdef uint64_t* perms
    for i in range(p.size if rc == 0 else 0):
        if kept and p.data[kept - 1] == p.data[i]:
            continue
        rc = index_has(w, p.data[i])
        if rc < 0:
            return rc
        if rc:
            p.data[kept] = p.data[i]
            kept += 1
        rc = 0
    if rc == 0 and kept:
        perms = <uint64_t*>malloc(kept * sizeof(uint64_t))
        if perms == NULL:
            return NO_MEMORY
        rc = append_runs(w, p.data, kept, perms)
        free(perms)
    return rc if rc or p.size == 0 else note_if_stale(w)


# meta's counters (read_counter), named in format.py
cdef bytes distinct_key = lmdb_format.DISTINCT, stale_key = lmdb_format.STALE
cdef bytes rewrite_key = lmdb_format.REWRITE, run_ids_key = lmdb_format.RUN_IDS
cdef bytes removed_key = lmdb_format.REMOVED
cdef const char* DISTINCT = distinct_key  # the distinct fingerprints
cdef const char* STALE = stale_key  # fingerprints removed since the tables were written whole
cdef const char* REWRITE = rewrite_key  # a rewrite of the tables under way (tidy)
cdef const char* RUN_IDS = run_ids_key  # the highest run id a rewrite dropped (see add_run)
cdef const char* REMOVED = removed_key  # documents removed since rewrite_sparse


cdef inline MDB_val meta_key(const char* name) noexcept nogil:
    cdef MDB_val k
    k.mv_size, k.mv_data = strlen(name), <char*>name
    return k


cdef int read_counter(Work* w, const char* name, uint64_t* value) noexcept nogil:
    """A counter in meta (8 bytes big-endian, 0 where absent): ``distinct``,
    the distinct fingerprints, and ``stale``, the fingerprints taken out of
    the index since the tables were last written whole (a bound on their
    stale entries)."""
    cdef uint8_t buf[8]
    cdef MDB_val k = meta_key(name), v
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    if rc == MDB_NOTFOUND:
        value[0] = 0
        return 0
    if rc == 0 and (v.mv_size != 8 or g_copy(buf, v.mv_data, 8)):
        return CORRUPTED
    value[0] = read_be(buf, 8)
    return rc


cdef int write_counter(Work* w, const char* name, uint64_t value) noexcept nogil:
    cdef uint8_t buf[8]
    cdef MDB_val k = meta_key(name), v
    write_be(buf, value, 8)
    v.mv_size, v.mv_data = 8, buf
    return g_put(w.txn, w.meta, &k, &v, 0)


cdef int add_to_counter(Work* w, const char* name, int64_t change) noexcept nogil:
    cdef uint64_t value
    cdef int rc = read_counter(w, name, &value)
    return rc if rc else write_counter(w, name, value + <uint64_t>change)


cdef int note_if_stale(Work* w) noexcept nogil:
    """Note for tidy a rewrite of the tables under way, or due (the stale
    entries may exceed 1/RUN_RATIO of the distinct fingerprints), or one of the
    documents (sparse_due)."""
    cdef uint64_t stale, distinct
    cdef bint sparse
    cdef MDB_val k = meta_key(REWRITE), v
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    if rc == 0:
        w.untidy = True
    if rc != MDB_NOTFOUND:
        return rc
    rc = read_counter(w, STALE, &stale)
    if rc == 0:
        rc = read_counter(w, DISTINCT, &distinct)
    if rc == 0:
        rc = sparse_due(w, &sparse)
    w.untidy = w.untidy or (rc == 0 and (sparse or stale * RUN_RATIO > distinct))
    return rc


cdef int rewrite_table(Work* w, Py_ssize_t t, const U64s* fps, uint64_t* perms) noexcept nogil:
    """Write table ``t`` as one run of the index's fingerprints ``fps``, dropping
    its runs; ``perms`` has room for them."""
    cdef uint8_t slots[RUN_SLOTS]
    cdef size_t i, n = w.table_runs[t].n
    cdef uint64_t dropped = 0
    cdef int rc = read_counter(w, RUN_IDS, &dropped) if n else 0
    if rc == 0 and n and w.table_runs[t].id[n - 1] > dropped:
        rc = write_counter(w, RUN_IDS, w.table_runs[t].id[n - 1])
    w.runs_written = True
    for i in range(n):
        slots[i] = w.table_runs[t].slot[i]
    close_runs(&w.table_runs[t])
    for i in range(n):
        if rc == 0:
            rc = g_drop(w.txn, w.run_slots[t * RUN_SLOTS + slots[i]], 0)
    for i in range(fps.size):
        perms[i] = permute_one(fps.data[i], w.layout.spec + 3 * w.layout.blocks * t,
                               w.layout.blocks)
    if rc == 0 and fps.size:
        rc = sort_records(perms, fps.size, 1)
    return rc if rc else add_run(w, t, perms, fps.size)


cdef int rewrite_tables(Work* w, Py_ssize_t first, Py_ssize_t end) noexcept nogil:
    """Rewrite tables ``first`` to ``end`` (rewrite_table) from the index."""
    cdef U64s fps
    fps.data, fps.size, fps.cap = NULL, 0, 0
    cdef uint64_t* perms = NULL
    cdef Py_ssize_t t
    cdef int rc = distinct_fingerprints(w, &fps)
    if rc == 0:
        perms = <uint64_t*>malloc((fps.size + 1) * sizeof(uint64_t))
        if perms == NULL:
            rc = NO_MEMORY
    for t in range(first, end):
        if rc == 0:
            rc = rewrite_table(w, t, &fps, perms)
    free(fps.data)
    free(perms)
    return rc


cdef int end_rewrite(Work* w, uint64_t stale) noexcept nogil:
    """Note the tables rewritten: no ``rewrite`` under way, ``stale`` left."""
    cdef MDB_val k = meta_key(REWRITE)
    cdef int rc = g_del(w.txn, w.meta, &k, NULL)
    return write_counter(w, STALE, stale) if rc == 0 or rc == MDB_NOTFOUND else rc


cdef int sparse_due(Work* w, bint* due) noexcept nogil:
    """Whether the documents removed since rewrite_sparse (meta ``removed``)
    are over 1/RUN_RATIO of the documents."""
    cdef uint64_t removed
    cdef MDB_stat docs
    cdef int rc = read_counter(w, REMOVED, &removed)
    if rc == 0:
        rc = g_stat(w.txn, w.docs, &docs)
    due[0] = rc == 0 and removed * RUN_RATIO > docs.ms_entries
    return rc


cdef int rewrite_dbi(MDB_txn* txn, MDB_txn* last, MDB_dbi dbi, bint dupsort) noexcept nogil:
    """Empty sub-database ``dbi`` and append to it, in order, what snapshot
    ``last`` holds in it."""
    cdef int rc = g_drop(txn, dbi, 0)
    return rc if rc else copy_dbi(last, dbi, txn, dbi, dupsort)


cdef int rewrite_sparse(Work* w, bint* done) noexcept nogil:
    """Once the documents removed reach 1/RUN_RATIO of the documents (sparse_due),
    write the documents, the index's slots and the band tables again, each
    emptied and appended in order from a snapshot of the last commit. LMDB
    merges a leaf only below a quarter full, so removals at random leave those
    B-trees' leaves sparse, and new documents made the file grow round after
    round. Only as a write transaction's first change, when it holds what that
    snapshot holds (tidy's). ``done``: whether it rewrote them."""
    cdef MDB_txn* last = NULL
    cdef bint due
    cdef int rc = sparse_due(w, &due)
    done[0] = False
    if rc or not due or g_txn_begin(mdb_txn_env(w.txn), NULL, MDB_RDONLY, &last):
        return rc  # (no reader slot for the snapshot: the next tidy tries again)
    if mdb_txn_id(last) + 1 == mdb_txn_id(w.txn):  # (always: the write lock is held)
        rc = write_without(w, last, NULL, NULL, 0)
        done[0] = rc == 0
    mdb_txn_abort(last)
    return rc


cdef int tidy(Work* w, bint* more) noexcept nogil:
    """One transaction's share of what batches left: the next table of a rewrite
    of the tables (begun once the stale entries may exceed 1/RUN_RATIO of the
    distinct fingerprints; meta ``rewrite`` holds the next table and the stale
    count it began with), else the tables' deferred merges until they have taken
    about a table's entries, so the file needs room for the tables and about one
    more, not two copies of them all. ``more``: whether to call again."""
    cdef uint8_t marker[16]
    cdef uint64_t stale, distinct, next_table = 0, began = 0
    cdef MDB_val k, v
    cdef Py_ssize_t t
    cdef bint rewriting = False
    more[0] = False
    if not w.runs:
        return 0
    k = meta_key(REWRITE)
    cdef int rc = g_get(w.txn, w.meta, &k, &v)
    if rc == 0:
        if v.mv_size != 16 or g_copy(marker, v.mv_data, 16):
            return CORRUPTED
        next_table, began, rewriting = read_be(marker, 8), read_be(marker + 8, 8), True
        if next_table >= <uint64_t>w.layout.tables:
            return CORRUPTED
    elif rc != MDB_NOTFOUND:
        return rc
    rc = read_counter(w, STALE, &stale)
    if rc == 0:
        rc = read_counter(w, DISTINCT, &distinct)
    if rc == 0 and not rewriting and stale * RUN_RATIO > distinct:
        rewriting, began = True, stale
    more[0] = rewriting
    if rc or rewriting:
        if rc == 0:
            rc = rewrite_tables(w, next_table, next_table + 1)
        next_table += 1
        if rc == 0 and next_table == <uint64_t>w.layout.tables:
            # removals since the rewrite began stay counted
            rc = end_rewrite(w, stale - began if stale > began else 0)
        elif rc == 0:
            write_be(marker, next_table, 8)
            write_be(marker + 8, began, 8)
            v.mv_size, v.mv_data = 16, marker
            rc = g_put(w.txn, w.meta, &k, &v, 0)
        return rc
    cdef uint64_t budget = distinct if distinct > w.merge_limit else w.merge_limit
    w.merge_limit = 0
    for t in range(w.layout.tables):
        if merges_left(&w.table_runs[t]):
            if w.merged >= budget:
                more[0] = True
                break
            rc = add_run(w, t, NULL, 0)
            if rc:
                break
    return rc


cdef int unlink(Work* w, const MDB_val* old_value, const uint8_t* key, size_t key_size,
                U64s* touched) noexcept nogil:
    """Drop a stored document's fingerprint-index entry."""
    cdef uint64_t old_fp
    cdef uint8_t fp_bytes[8]
    cdef MDB_val k, v
    cdef int rc
    if value_fingerprint(old_value, &old_fp) != 0:
        return -30796  # MDB_CORRUPTED
    w.unlinked = True
    rc = touch(w, touched, old_fp)
    if rc:
        return rc
    write_be(fp_bytes, old_fp, 8)
    k.mv_size, k.mv_data = 8, fp_bytes
    v.mv_size, v.mv_data = key_size, <void*>key
    return index_delete(w, &k, &v)


cdef size_t KEYS_AHEAD = 8  # index puts a long key is loaded ahead of (upsert)


# Whether a batch's new fingerprints were in the index before: a descent in
# each slot but the batch's own, about 250 ns a slot, nearly all of it waiting
# on memory. A large batch whose transaction changed no slot before it shares
# them with a thread reading the last commit (the same slots: the writer holds
# the lock), which begins while the writer puts the index entries.

cdef enum:
    LOOKUP_CHUNK = 512          # lookups taken at a time
    THREAD_SHARE = 4096         # the fewest new documents a thread shares the work of


cdef extern from *:
    """
    #define chunk_take(p, n) __atomic_fetch_add((p), (n), __ATOMIC_RELAXED)
    #define chunk_stop(p, n) __atomic_store_n((p), (n), __ATOMIC_RELAXED)
    """
    size_t chunk_take(size_t* p, size_t n) nogil
    void chunk_stop(size_t* p, size_t n) nogil


cdef struct Lookups:
    MDB_env* env
    MDB_dbi dbis[INDEX_SLOTS]   # the slots with entries, but the batch's own
    int slots
    const uint64_t* order       # the batch's index entries (fingerprint first), sorted
    size_t n
    uint8_t* had                # per entry: 1 if its fingerprint was there
    size_t next                 # the first entry no one has taken
    int rc                      # the thread's
    bint began                  # the thread began its snapshot


cdef int look_up(Lookups* l, MDB_txn* txn) noexcept nogil:
    """Take chunks of the entries and note whether each one's fingerprint
    (where it is the first entry of it) is in one of the slots, in ``txn``."""
    cdef MDB_cursor* cursors[INDEX_SLOTS]
    cdef uint8_t key_bytes[8]
    cdef MDB_val k, v
    cdef size_t i, end
    cdef int s, opened = 0, rc = 0
    while rc == 0 and opened < l.slots:
        rc = g_cursor_open(txn, l.dbis[opened], &cursors[opened])
        opened += rc == 0
    i = chunk_take(&l.next, LOOKUP_CHUNK) if rc == 0 else l.n
    while i < l.n:
        end = min(i + LOOKUP_CHUNK, l.n)
        while rc == 0 and i < end:
            if i == 0 or l.order[3 * i] != l.order[3 * i - 3]:
                write_be(key_bytes, l.order[3 * i], 8)
                for s in range(l.slots):
                    k.mv_size, k.mv_data = 8, key_bytes
                    rc = g_cursor_get(cursors[s], &k, &v, MDB_SET)
                    if rc != MDB_NOTFOUND:
                        l.had[i] = rc == 0
                        break
                rc = 0 if rc == MDB_NOTFOUND else rc
            i += 1
        i = chunk_take(&l.next, LOOKUP_CHUNK) if rc == 0 else l.n
    for s in range(opened):
        mdb_cursor_close(cursors[s])
    return rc


cdef int lookups_begin(Work* w, const uint64_t* order, size_t n, bint shared, Lookups* l,
                       pthread_t* thread, bint* started) noexcept nogil:
    """Set up the lookups of ``order``'s fingerprints in the slots with entries
    but the transaction's own (none where the index was empty), with room
    after ``l.had`` for the writer's notes of its own slot; where ``shared``
    and there are enough, start a thread that takes a share."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef int s, used, rc = 0
    l.env, l.order, l.n, l.next, l.rc, l.slots, l.began = mdb_txn_env(w.txn), order, n, 0, 0, 0, 0
    l.had = <uint8_t*>calloc(2 * n + 1, 1)
    if l.had == NULL:
        return NO_MEMORY
    if not w.index_was_empty:
        rc = index_sizes(w, entries, &used)
    for s in range(w.index_slots if rc == 0 and not w.index_was_empty else 0):
        if entries[s] and s != w.put_slot:
            l.dbis[l.slots] = w.index_dbis[s]
            l.slots += 1
    started[0] = rc == 0 and shared and l.slots > 0 and n >= THREAD_SHARE and \
        w.merge_threads > 1 and pthread_create(thread, NULL, look_up_thread, l) == 0
    return rc


cdef void* look_up_thread(void* lookups) noexcept nogil:
    cdef Lookups* l = <Lookups*>lookups
    cdef MDB_txn* txn
    cdef int rc = g_txn_begin(l.env, NULL, MDB_RDONLY, &txn)
    l.began = rc == 0
    if rc == 0:
        rc = look_up(l, txn)
        mdb_txn_abort(txn)
    if rc == GUARD_FAULT or (rc and l.began):  # (else, such as a full reader table: the writer's)
        l.rc = rc
        chunk_stop(&l.next, l.n)
    return NULL


cdef struct Entries:
    const Doc* docs
    size_t n
    uint64_t* order
    int rc


cdef int index_order(Entries* e) noexcept nogil:
    """The documents' index entries in (fingerprint, key) order, the documents
    being in key order and the radix sort by fingerprint stable. Each entry is
    (fingerprint, key, key size): a key of up to 8 bytes travels in it, so the
    puts read memory in order, not the documents at random; for a longer one
    it holds the address, loaded ahead of its put."""
    cdef size_t i
    for i in range(e.n):
        e.order[3 * i], e.order[3 * i + 2] = e.docs[i].fp, e.docs[i].key_size
        if e.docs[i].key_size <= 8:
            memcpy(&e.order[3 * i + 1], e.docs[i].key, e.docs[i].key_size)
        else:
            e.order[3 * i + 1] = <uint64_t>e.docs[i].key
    return sort_records(e.order, e.n, 3)


cdef void* index_order_thread(void* entries) noexcept nogil:
    (<Entries*>entries).rc = index_order(<Entries*>entries)
    return NULL


cdef int upsert(Work* w, Doc* docs, size_t n, U64s* touched) noexcept nogil:
    """Store documents (sorted by key, unique), replacing existing keys."""
    cdef MDB_val k, v, old
    cdef uint8_t fp_bytes[8]
    cdef size_t i, fresh = 0
    cdef int rc
    cdef uint64_t old_fp
    cdef bint appending = False, changed, first, had
    cdef uint64_t* order = NULL
    cdef MDB_cursor* put = NULL
    cdef const uint8_t* key
    cdef size_t key_size
    cdef uint64_t merged
    cdef Lookups lookups
    cdef pthread_t thread
    cdef bint started = False
    cdef uint8_t* own = NULL
    cdef Entries entries
    cdef pthread_t sorter
    cdef bint sorting = False
    cdef Doc* added = <Doc*>malloc((n + 1) * sizeof(Doc))
    memset(&lookups, 0, sizeof(Lookups))
    if added == NULL:
        return NO_MEMORY
    rc = index_empty(w)
    if rc < 0:
        free(added)
        return rc
    w.index_was_empty, w.unlinked = rc == 1, False
    rc = g_cursor_get(w.doc_cursor, &k, &v, MDB_LAST)
    if rc == MDB_NOTFOUND:
        appending, rc = True, 0
    elif rc == 0 and n:
        appending = cmp_bytes(docs[0].key, docs[0].key_size, <uint8_t*>k.mv_data,
                              k.mv_size) > 0
    if rc == 0 and appending and n >= THREAD_SHARE and w.merge_threads > 1:
        # every document is new: its index entries are sorted while it is put
        entries.docs, entries.n, entries.rc = docs, n, 0
        entries.order = order = <uint64_t*>malloc(3 * n * sizeof(uint64_t))
        sorting = order != NULL and pthread_create(&sorter, NULL, index_order_thread,
                                                   &entries) == 0
    i = 0
    while rc == 0 and i < n:
        k.mv_size, k.mv_data = docs[i].key_size, <void*>docs[i].key
        changed = True  # the document is new, or has another fingerprint now
        if not appending:
            rc = g_get(w.txn, w.docs, &k, &old)
            if rc == 0:
                if value_fingerprint(&old, &old_fp) != 0:
                    rc = -30796  # MDB_CORRUPTED
                else:
                    rc = note_bands(w, <uint8_t*>old.mv_data, old.mv_size, old_fp, False)
                if rc == 0 and old_fp == docs[i].fp:
                    changed = False
                elif rc == 0:
                    rc = unlink(w, &old, docs[i].key, docs[i].key_size, touched)
            elif rc == MDB_NOTFOUND:
                rc = 0
            if rc:
                break
        v.mv_size, v.mv_data = docs[i].value_size, <void*>docs[i].value
        rc = g_cursor_put(w.doc_cursor, &k, &v, MDB_APPEND if appending else 0)
        if rc == 0:
            rc = note_bands(w, docs[i].value, docs[i].value_size, docs[i].fp, True)
        if rc == 0 and changed:  # noted as its fingerprint goes into the index, below
            added[fresh] = docs[i]
            fresh += 1
        i += 1
    if sorting:
        pthread_join(sorter, NULL)
        rc = rc if rc else entries.rc
    if rc == 0 and fresh:
        # the index entries (index_order). A fingerprint's first put tells
        # whether the transaction's own slot had it, lookups whether the others
        # did (noted after the puts, and after the notes unlink took, so theirs
        # come first).
        if not sorting:  # (a buffer for a thread that did not start holds them too)
            entries.docs, entries.n = added, fresh
            if order == NULL:
                order = <uint64_t*>malloc(3 * fresh * sizeof(uint64_t))
            entries.order = order
            rc = NO_MEMORY if order == NULL else index_order(&entries)
        merged = w.merged
        if rc == 0:
            rc = index_put_cursor(w, &put)
        if rc == 0:
            rc = g_cursor_get(put, &k, &v, MDB_LAST)
        if rc == MDB_NOTFOUND:
            appending, rc = True, 0
        elif rc == 0:
            appending = order[0] > read_be(<uint8_t*>k.mv_data, 8)
        # the slots before the transaction's own, shared where they are as
        # committed. They are where no earlier call changed the index and no
        # merge freed a slot (every merge counts in w.merged): then the two
        # views differ only by the entries unlink took out, each of whose
        # fingerprints was noted first (touch, before the deletion, as it stood
        # before the batch), and the first note of a fingerprint counts
        if rc == 0:
            rc = lookups_begin(w, order, fresh, w.index_committed and merged == w.merged,
                               &lookups, &thread, &started)
        if rc == 0:
            own = lookups.had + fresh  # whether the transaction's own slot had it
        for i in range(fresh):
            if rc:
                break
            if i + KEYS_AHEAD < fresh and order[3 * (i + KEYS_AHEAD) + 2] > 8:
                __builtin_prefetch(<const void*>order[3 * (i + KEYS_AHEAD) + 1])
            key_size = order[3 * i + 2]
            key = <const uint8_t*>(order + 3 * i + 1)
            if key_size > 8:
                key = <const uint8_t*>order[3 * i + 1]
            first, had = i == 0 or order[3 * i] != order[3 * i - 3], False
            write_be(fp_bytes, order[3 * i], 8)
            k.mv_size, k.mv_data = 8, fp_bytes
            v.mv_size, v.mv_data = key_size, <void*>key
            if appending:
                rc = g_cursor_put(put, &k, &v, MDB_APPEND if first else MDB_APPENDDUP)
            else:
                if first:
                    rc = g_cursor_put(put, &k, &v, MDB_NOOVERWRITE)
                    had = rc == MDB_KEYEXIST
                    own[i] = had
                if had or not first:  # another document's entry of the fingerprint
                    k.mv_size, k.mv_data = 8, fp_bytes  # (a refused put points them at it)
                    v.mv_size, v.mv_data = key_size, <void*>key
                    rc = g_cursor_put(put, &k, &v, MDB_NODUPDATA)
                    if rc == MDB_KEYEXIST:
                        rc = 0
        if rc == 0 and lookups.slots:  # the writer's share
            rc = look_up(&lookups, w.txn)
        if rc:
            chunk_stop(&lookups.next, fresh)
        if started:
            pthread_join(thread, NULL)
            rc = rc if rc else lookups.rc
            w.shared_lookups[0] += lookups.began
        for i in range(fresh if rc == 0 else 0):
            if i == 0 or order[3 * i] != order[3 * i - 3]:
                rc = note_touched(touched, order[3 * i], own[i] or lookups.had[i])
                if rc:
                    break
        free(lookups.had)
    free(order)
    free(added)
    if rc == 0:
        rc = update_tables(w, touched)
    if rc == 0:
        rc = update_bands(w)
    return rc


cdef int copy_skipping(MDB_txn* last, MDB_txn* txn, MDB_dbi dbi, const MDB_val* keys,
                       const MDB_val* values, size_t n) noexcept nogil:
    """Empty sub-database ``dbi`` and append to it, in order, what snapshot
    ``last`` holds in it but the entries ``keys`` (with ``values`` where a
    sub-database of duplicates: the (key, value) pairs), sorted in its order."""
    cdef MDB_cursor* reader = NULL
    cdef MDB_cursor* writer = NULL
    cdef MDB_val k, v
    cdef uint8_t last_key[8]
    cdef bint have_last = False
    cdef size_t j = 0, walked = 0
    cdef int c = 1, rc = g_drop(txn, dbi, 0)
    if rc == 0:
        rc = g_cursor_open(last, dbi, &reader)
    if rc == 0:
        rc = g_cursor_open(txn, dbi, &writer)
    if rc == 0:
        rc = g_cursor_get(reader, &k, &v, MDB_FIRST)
    while rc == 0:
        while j < n:
            c = cmp_entry(&keys[j], &values[j], &k, &v) if values != NULL else \
                cmp_bytes(<const uint8_t*>keys[j].mv_data, keys[j].mv_size,
                          <const uint8_t*>k.mv_data, k.mv_size)
            if c >= 0:
                break
            j += 1
        if j < n and c == 0:
            j += 1
        elif values != NULL:
            rc = append_entry(writer, &k, &v, last_key, &have_last)
        else:
            rc = g_cursor_put(writer, &k, &v, MDB_APPEND)
        walked += 1
        if rc == 0:
            rc = g_cursor_get(reader, &k, &v, MDB_NEXT)
    if reader != NULL:
        mdb_cursor_close(reader)
    if writer != NULL:
        mdb_cursor_close(writer)
    return walked_whole(last, dbi, walked) if rc == MDB_NOTFOUND else rc


cdef int walked_whole(MDB_txn* txn, MDB_dbi dbi, size_t walked) noexcept nogil:
    """0 if a walk of ``dbi`` met as many entries as LMDB counts in it, else
    MDB_CORRUPTED: a damaged branch page can end a cursor's walk early, and a
    copy must not drop what it did not reach."""
    cdef MDB_stat stat
    cdef int rc = g_stat(txn, dbi, &stat)
    return rc if rc else (0 if stat.ms_entries == walked else CORRUPTED)


cdef int write_without(Work* w, MDB_txn* last, const Doc* docs, uint64_t* gone,
                       size_t found) noexcept nogil:
    """Write the documents and the index's slots again without the ``found``
    documents ``gone`` ((fingerprint, index in ``docs``) pairs, in key order),
    and the band tables whole, appended in order from ``last``, a snapshot
    holding what the transaction holds. Their leaves come out full, where
    removals in place copy leaves and leave them sparse."""
    cdef uint64_t entries[INDEX_SLOTS]
    cdef size_t i
    cdef int s, used, rc = index_sizes(w, entries, &used)
    cdef uint8_t* fp_bytes = <uint8_t*>malloc(8 * found + 1)
    cdef MDB_val* keys = <MDB_val*>malloc((2 * found + 1) * sizeof(MDB_val))
    if fp_bytes == NULL or keys == NULL:
        rc = NO_MEMORY
    index_close(w)  # the slots are written again below
    for i in range(found if rc == 0 else 0):
        keys[i].mv_size = docs[gone[2 * i + 1]].key_size
        keys[i].mv_data = <void*>docs[gone[2 * i + 1]].key
    if rc == 0:
        rc = copy_skipping(last, w.txn, w.docs, keys, NULL, found)
    if rc == 0:  # the index's entries in its order: by fingerprint, then key
        rc = sort_records(gone, found, 2)  # (stable: the documents came in key order)
    for i in range(found if rc == 0 else 0):
        write_be(fp_bytes + 8 * i, gone[2 * i], 8)
        keys[i].mv_size, keys[i].mv_data = 8, fp_bytes + 8 * i
        keys[found + i].mv_size = docs[gone[2 * i + 1]].key_size
        keys[found + i].mv_data = <void*>docs[gone[2 * i + 1]].key
    for s in range(w.index_slots):
        if rc == 0 and entries[s]:
            rc = copy_skipping(last, w.txn, w.index_dbis[s], keys, keys + found, found)
    for s in range(SIGNATURE_BANDS if w.bands != NULL else 0):
        if rc == 0:  # written whole too; update_bands then takes out what no document holds
            rc = rewrite_dbi(w.txn, last, w.bands[s], True)
    free(fp_bytes)
    free(keys)
    return rc if rc else write_counter(w, REMOVED, 0)


cdef int count_stored(Work* w, const Doc* docs, size_t n, size_t* stored) noexcept nogil:
    cdef MDB_val k, v
    cdef size_t i
    cdef int rc = 0
    stored[0] = 0
    for i in range(n):
        k.mv_size, k.mv_data = docs[i].key_size, <void*>docs[i].key
        rc = g_get(w.txn, w.docs, &k, &v)
        if rc == 0:
            stored[0] += 1
        elif rc != MDB_NOTFOUND:
            return rc
    return 0


cdef int remove(Work* w, Doc* docs, size_t n, U64s* touched, size_t* count,
                bint may_rewrite) noexcept nogil:
    """Remove documents (sorted by key, unique) that are stored: in place, or
    (``may_rewrite``: the transaction has changed nothing yet) by writing the
    documents and the index again without them (write_without), where the
    batch brings the documents removed since they were last written whole
    (meta ``removed``) over 1/RUN_RATIO of them (so each removal costs about RUN_RATIO
    entries written)."""
    cdef MDB_val k, old
    cdef MDB_stat docs_stat
    cdef MDB_txn* last = NULL
    cdef uint64_t old_fp, removed = 0
    cdef size_t stored = 0
    cdef uint64_t* gone = NULL  # (fingerprint, index in docs) of each one stored
    cdef size_t i
    cdef int rc = 0
    w.index_was_empty, w.unlinked = False, True
    if may_rewrite and n:
        rc = read_counter(w, REMOVED, &removed)
        if rc == 0:
            rc = g_stat(w.txn, w.docs, &docs_stat)
        if rc == 0 and (removed + n) * RUN_RATIO > docs_stat.ms_entries:
            rc = count_stored(w, docs, n, &stored)  # (absent keys count for nothing)
        if rc == 0 and (removed + stored) * RUN_RATIO > docs_stat.ms_entries and g_txn_begin(
                mdb_txn_env(w.txn), NULL, MDB_RDONLY, &last):
            last = NULL  # no reader slot for the snapshot: in place
        if last != NULL and mdb_txn_id(last) + 1 != mdb_txn_id(w.txn):
            mdb_txn_abort(last)  # (never: the write lock is held)
            last = NULL
        if last != NULL:
            gone = <uint64_t*>malloc((2 * n + 1) * sizeof(uint64_t))
            if gone == NULL:
                rc = NO_MEMORY
    for i in range(n if rc == 0 else 0):
        k.mv_size, k.mv_data = docs[i].key_size, <void*>docs[i].key
        rc = g_get(w.txn, w.docs, &k, &old)
        if rc == MDB_NOTFOUND:
            rc = 0
            continue
        if rc == 0 and value_fingerprint(&old, &old_fp) != 0:
            rc = -30796  # MDB_CORRUPTED
        if rc == 0:
            rc = note_bands(w, <uint8_t*>old.mv_data, old.mv_size, old_fp, False)
        if rc == 0 and last != NULL:
            rc = touch(w, touched, old_fp)
            gone[2 * count[0]], gone[2 * count[0] + 1] = old_fp, i
        elif rc == 0:
            rc = unlink(w, &old, docs[i].key, docs[i].key_size, touched)
            if rc == 0:
                rc = g_del(w.txn, w.docs, &k, NULL)
        if rc:
            break
        count[0] += 1
    if rc == 0 and last != NULL:
        rc = write_without(w, last, docs, gone, count[0])
    elif rc == 0 and count[0]:
        rc = add_to_counter(w, REMOVED, count[0])
    if last != NULL:
        mdb_txn_abort(last)
    free(gone)
    if rc == 0:
        rc = update_tables(w, touched)
    return rc if rc else update_bands(w)


cdef size_t sort_unique(Doc* docs, size_t n) noexcept nogil:
    """Sort documents by key, keeping the last of each key; returns the count kept."""
    cdef size_t i, kept = 0
    for i in range(1, n):  # input in key order (a bulk load, often) needs no sort
        if cmp_bytes(docs[i - 1].key, docs[i - 1].key_size, docs[i].key, docs[i].key_size) >= 0:
            break
    else:
        return n
    qsort(docs, n, sizeof(Doc), cmp_doc_key)
    for i in range(n):
        if i + 1 < n and cmp_bytes(docs[i].key, docs[i].key_size, docs[i + 1].key,
                                   docs[i + 1].key_size) == 0:
            continue
        docs[kept] = docs[i]
        kept += 1
    return kept


cdef Doc* load_packed(documents) except NULL:
    """Point Doc structs at the slots of a records.PackedDocuments (which the
    caller holds for as long as they are used)."""
    cdef const uint8_t[::1] keys = documents.keys
    cdef const uint8_t[::1] key_sizes = documents.key_sizes
    cdef const uint8_t[::1] values = documents.values
    cdef const uint8_t[::1] value_sizes = documents.value_sizes
    cdef const uint64_t[::1] fps = documents.fingerprints
    cdef size_t i, n = fps.shape[0]
    cdef Doc* docs = <Doc*>malloc((n + 1) * sizeof(Doc))
    if docs == NULL:
        raise MemoryError()
    for i in range(n):
        docs[i].key, docs[i].key_size = &keys[KEY_SLOT * i], key_sizes[i]
        docs[i].value, docs[i].value_size = &values[VALUE_SLOT * i], value_sizes[i]
        docs[i].fp, docs[i].seq = fps[i], i
    return docs


cdef Doc* load_docs(list documents, bint with_values) except NULL:
    """Point Doc structs at the bytes of (key, fingerprint, value) tuples (or keys)."""
    cdef size_t i, n = len(documents)
    cdef Doc* docs = <Doc*>malloc((n + 1) * sizeof(Doc))
    if docs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            item = documents[i]
            key = item[0] if with_values else item
            docs[i].key = <const uint8_t*>PyBytes_AS_STRING(key)
            docs[i].key_size = PyBytes_GET_SIZE(key)
            docs[i].seq = i
            if with_values:
                value = item[2]
                docs[i].fp = item[1]
                docs[i].value = <const uint8_t*>PyBytes_AS_STRING(value)
                docs[i].value_size = PyBytes_GET_SIZE(value)
    except BaseException:
        free(docs)
        raise
    return docs


cdef class Job:
    """One batch call's cursors, documents and results, freed when it ends."""

    cdef Work w
    cdef Doc* docs
    cdef size_t n
    cdef U64s touched
    cdef U64s pending
    cdef U64s band_changes[SIGNATURE_BANDS]
    cdef Hits hits
    cdef KeyedHits keyed

    def __dealloc__(self):
        close_cursors(&self.w)
        free(self.keyed.data)
        free(self.keyed.bytes)
        free(self.docs)
        free(self.touched.data)
        free(self.pending.data)
        for b in range(SIGNATURE_BANDS):
            free(self.band_changes[b].data)
        free(self.hits.data)


cdef int add_reader_line(const char* msg, void* lines) noexcept with gil:
    try:
        (<list>lines).append(msg.decode("ascii", "replace"))
        return 0
    except BaseException:  # (no memory): mdb_reader_list stops and returns this
        return -1


cdef class Env:
    """An LMDB environment with the simhashdb sub-databases."""

    cdef MDB_env* env
    cdef MDB_dbi meta, docs
    cdef MDB_dbi index[INDEX_SLOTS]  # the fingerprint index's slots (_index.pxi)
    cdef readonly int index_slots    # how many the database has (1: made before they were)
    cdef MDB_dbi tables[MAX_TABLES]
    cdef MDB_dbi bands[SIGNATURE_BANDS]
    cdef readonly bint has_bands  # a database of simhashdb before 0.3 opened read-only has none
    cdef readonly bint runs       # its tables are kept as runs (RUNS.md), not 0.3's dupsort tables
    cdef MDB_dbi run_dir
    cdef MDB_dbi run_slots[MAX_TABLES * RUN_SLOTS]
    cdef readonly Py_ssize_t max_tables  # the most tables it has room to open (maxdbs)
    cdef public uint64_t batch_merge  # the most entries a batch's merges take (0: any); tidy the rest
    cdef public uint64_t directory_entries  # the largest run a search gives a block directory
    cdef public size_t merge_threads     # the threads a large merge is cut among (1: none)
    cdef public uint64_t threaded_merge  # the least entries a merge takes to be cut so
    cdef readonly uint64_t threaded_merges  # merges cut so since it was opened
    cdef readonly uint64_t shared_lookups  # batches whose index lookups a thread shared
    cdef readonly uint64_t fed_merges  # index merges whose sources a thread read
    cdef Layout layout
    cdef DirCache* dirs  # the runs' block directories, for searches
    cdef MDB_txn* spare[SPARE_READS]  # read transactions reset by Txn.abort, for begin to renew
    cdef int spares
    cdef pid_t pid       # the process that opened it (a fork child must not end its readers)
    cdef readonly bint broken
    cdef public str damage  # why the file was found damaged before it was mapped, or None
    cdef bytes path

    def __cinit__(self, bytes path, bint readonly, size_t map_size, unsigned int max_readers,
                  bint nolock, bint subdir=True, Py_ssize_t max_tables=256):
        """``max_tables``: room for that many tables (each takes RUN_SLOTS
        sub-databases, and every transaction's setup grows with the room)."""
        self.path = path
        self.max_tables = min(max_tables, MAX_TABLES)
        self.dirs = <DirCache*>calloc(1, sizeof(DirCache))
        if self.dirs == NULL or pthread_mutex_init(&self.dirs.lock, NULL):
            free(self.dirs)
            self.dirs = NULL
            raise MemoryError()
        if guard_install() != 0:
            raise DatabaseError("cannot install the fault guard of the native LMDB backend")
        cdef int rc = mdb_env_create(&self.env)
        if rc:
            raise lmdb_error(rc, "cannot open the database at %s" % path.decode())
        mdb_env_set_assert(self.env, guard_assert)
        mdb_env_set_maxdbs(self.env, lmdb_format.max_dbs(self.max_tables))
        mdb_env_set_maxreaders(self.env, max_readers)
        mdb_env_set_mapsize(self.env, map_size)
        cdef unsigned int flags = MDB_NOTLS | MDB_NORDAHEAD
        if readonly:
            flags |= MDB_RDONLY
        if nolock:
            flags |= MDB_NOLOCK
        if not subdir:
            flags |= MDB_NOSUBDIR
        rc = mdb_env_open(self.env, path, flags, 0o644)
        if rc:
            mdb_env_close(self.env)
            self.env = NULL
            raise lmdb_error(rc, "cannot open the database at %s" % path.decode())
        cdef int dead
        mdb_reader_check(self.env, &dead)
        self.layout.tables = 0
        self.pid = getpid()

    def __dealloc__(self):
        self.drop_spares()
        if self.env != NULL and not self.broken:
            mdb_env_close(self.env)
        if self.dirs != NULL:  # every transaction, and so every holder, is gone
            dir_clear(self.dirs, True)
            pthread_mutex_destroy(&self.dirs.lock)
            free(self.dirs)
        free(self.layout.spec)
        free(self.layout.prefixes)
        free(self.layout.prefix_bits)

    cdef int check(self) except -1:
        if self.env == NULL:
            raise DatabaseError("the database at %s is closed" % self.path.decode())
        if self.broken:
            raise DamagedError("the database at %s faulted on a damaged file earlier; "
                               "restore it from a backup" % self.path.decode())
        return 0

    cdef void drop_spares(self):
        """End the kept read transactions, freeing their reader slots (not in
        a fork child: the slots are the parent's)."""
        cdef bint ours = self.env != NULL and not self.broken and getpid() == self.pid
        cdef int i
        for i in range(self.spares if ours else 0):
            mdb_txn_abort(self.spare[i])
        self.spares = 0

    cdef object fail(self, int rc, str what):
        if rc == GUARD_FAULT:
            self.broken = True
            if self.damage:  # the fault's cause, known: what it says is the way out
                return DamagedError("%s: LMDB faulted (signal %d) reading the data file, which "
                                    "is damaged: %s; restore it from a backup"
                                    % (what, guard_last_signal(), self.damage))
        return lmdb_error(rc, what)

    def open_dbs(self, long[::1] spec, uint64_t[::1] prefixes, list prefix_bits, bint create,
                 bint add_index_slots):
        """Open the sub-databases of a layout's tables (and the fixed ones); a
        database whose index has one slot gains the others only with
        ``add_index_slots`` (it writes to that slot alone until then)."""
        self.check()
        if self.dirs != NULL:
            dir_clear(self.dirs, False)  # a view holds the tables of the layout before
        cdef Py_ssize_t t, tables = prefixes.shape[0]
        cdef MDB_txn* txn
        cdef MDB_dbi main
        cdef MDB_stat stat
        cdef unsigned int create_flag = MDB_CREATE if create else 0
        cdef int rc = g_txn_begin(self.env, NULL, 0 if create else MDB_RDONLY, &txn)
        if rc:
            raise self.fail(rc, "cannot open the database at %s" % self.path.decode())
        rc = g_dbi_open(txn, META_NAME, 0, &self.meta)
        if rc == MDB_NOTFOUND and create:  # new, unless the file holds other data
            rc = g_dbi_open(txn, NULL, 0, &main)
            if rc == 0:
                rc = g_stat(txn, main, &stat)
            if rc == 0 and stat.ms_entries:
                mdb_txn_abort(txn)
                raise DatabaseError("%s holds an LMDB database that simhashdb did not make; "
                                    "use another directory" % self.path.decode())
            if rc == 0:
                rc = g_dbi_open(txn, META_NAME, MDB_CREATE, &self.meta)
                add_index_slots = True  # a new database has every slot from the start
        if rc == 0:
            rc = g_dbi_open(txn, DOCS_NAME, create_flag, &self.docs)
        self.index_slots = 0
        for slot in range(INDEX_SLOTS):
            if rc == 0 and self.index_slots == slot:
                rc = g_dbi_open(txn, index_name(slot), MDB_DUPSORT | (
                    create_flag if add_index_slots or slot == 0 else 0), &self.index[slot])
                if rc == MDB_NOTFOUND and slot:  # made before there were slots
                    rc = 0
                else:
                    self.index_slots += rc == 0
        cdef Py_ssize_t old = 0  # tables in simhashdb 0.3's form: read, not written
        for t in range(tables):
            if rc == 0:
                rc = g_dbi_open(txn, old_table_name(t), MDB_DUPSORT | MDB_DUPFIXED,
                                &self.tables[t])
                old += rc == 0
                rc = 0 if rc == MDB_NOTFOUND else rc
        self.runs = old == 0
        if rc == 0 and old and (create or old < tables):
            mdb_txn_abort(txn)
            raise OldTablesError(old < tables)
        if rc == 0 and tables > self.max_tables:
            mdb_txn_abort(txn)
            raise DatabaseError("this handle has room for %d tables, not %d"
                                % (self.max_tables, tables))
        if rc == 0 and self.runs:
            rc = g_dbi_open(txn, RUN_DIRECTORY_NAME, create_flag, &self.run_dir)
        for t in range(tables):
            if rc == 0 and self.runs:
                for slot in range(RUN_SLOTS):
                    if rc == 0:
                        rc = g_dbi_open(txn, run_slot_name(t, slot), create_flag,
                                        &self.run_slots[t * RUN_SLOTS + slot])
        self.has_bands = rc == 0
        for t in range(SIGNATURE_BANDS):
            if rc == 0 and self.has_bands:
                rc = g_dbi_open(txn, band_name(t), create_flag | MDB_DUPSORT | MDB_DUPFIXED,
                                &self.bands[t])
                if rc == MDB_NOTFOUND and not create:  # made before bands were
                    rc, self.has_bands = 0, False
        if rc == 0:
            rc = g_txn_commit(txn)
        else:
            mdb_txn_abort(txn)
        if rc == MDB_NOTFOUND:
            raise DatabaseError("%s is not a simhashdb database (a sub-database is missing)"
                                % self.path.decode())
        if rc:
            raise self.fail(rc, "cannot open the database at %s" % self.path.decode())
        free(self.layout.spec)
        free(self.layout.prefixes)
        free(self.layout.prefix_bits)
        self.layout.tables = tables
        self.layout.blocks = spec.shape[0] // (3 * tables) if tables else 0
        self.layout.spec = <long*>malloc((spec.shape[0] + 1) * sizeof(long))
        self.layout.prefixes = <uint64_t*>malloc((tables + 1) * sizeof(uint64_t))
        self.layout.prefix_bits = <int*>malloc((tables + 1) * sizeof(int))
        for t in range(spec.shape[0]):
            self.layout.spec[t] = spec[t]
        for t in range(tables):
            self.layout.prefixes[t] = prefixes[t]
            self.layout.prefix_bits[t] = prefix_bits[t]

    def info(self):
        """Map size, the bytes of it in use (up to the last page), last
        transaction id and reader slots in use."""
        self.check()
        cdef MDB_envinfo info
        cdef MDB_stat stat
        mdb_env_info(self.env, &info)
        mdb_env_stat(self.env, &stat)
        return {"map_size": info.me_mapsize, "used": (info.me_last_pgno + 1) * stat.ms_psize,
                "last_txnid": info.me_last_txnid, "readers": info.me_numreaders,
                "max_readers": info.me_maxreaders}

    def set_mapsize(self, size_t size):
        """Set the map size (0: adopt the size another process set); no
        transaction of this process may be running. Where it fails, LMDB
        keeps no map at all: close the environment."""
        self.check()
        dir_clear(self.dirs, False)  # the map may move: the directories point into it
        cdef int rc = mdb_env_set_mapsize(self.env, size)
        if rc:
            raise self.fail(rc, "cannot grow the map of %s" % self.path.decode())

    def readers(self):
        """LMDB's reader table as mdb_reader_list writes it (as py-lmdb's
        ``readers()``): a header, then a line a slot in use: its process,
        thread, and the transaction of its snapshot ("-" for a slot kept
        with none)."""
        self.check()
        lines = []
        if mdb_reader_list(self.env, add_reader_line, <void*>lines) < 0:
            raise MemoryError("no memory to list the reader slots of %s" % self.path.decode())
        return "".join(lines)

    def reader_check(self):
        """Clear the reader slots of dead processes; returns how many."""
        self.check()
        cdef int dead = 0
        mdb_reader_check(self.env, &dead)
        return dead

    def begin(self, bint write=False):
        """A transaction: a snapshot, or the one write transaction."""
        self.check()
        cdef Txn txn = Txn.__new__(Txn)
        cdef int rc
        if not write and self.spares:  # renewing one keeps its reader slot: no lock, no malloc
            self.spares -= 1
            txn.txn = self.spare[self.spares]
            rc = mdb_txn_renew(txn.txn)
            if rc:
                mdb_txn_abort(txn.txn)
                txn.txn = NULL
        else:
            with nogil:
                rc = g_txn_begin(self.env, NULL, 0 if write else MDB_RDONLY, &txn.txn)
        if rc:
            raise self.fail(rc, "cannot begin a transaction on %s" % self.path.decode())
        txn.env = self
        txn.write = write
        txn.put_slot = -1
        if 0 < self.index_slots < INDEX_SLOTS and sub_database_exists(
                txn.txn, index_name(self.index_slots)):
            txn.abort()  # the slots another process added must be read too
            raise MapResizedError("the fingerprint index of %s gained slots: open them and "
                                  "begin again" % self.path.decode())
        return txn

    def close(self):
        dir_clear(self.dirs, False)
        self.drop_spares()
        if self.env != NULL and not self.broken:
            mdb_env_close(self.env)
        self.env = NULL


cdef bint sub_database_exists(MDB_txn* txn, const char* name) noexcept nogil:
    """Whether the sub-database ``name`` exists in this snapshot (an index
    slot past those open was added by another process: to a database of
    format 3 read here with one slot, or one whose slots an interrupted open
    made in part)."""
    cdef MDB_val k, v
    k.mv_size, k.mv_data = strlen(name), <char*>name
    return g_get(txn, MAIN_DBI, &k, &v) == 0


cdef class Txn:
    """One LMDB transaction over an Env's sub-databases."""

    cdef Env env
    cdef MDB_txn* txn
    cdef bint write
    cdef readonly bint untidy  # a batch left merges or a rewrite of the tables for tidy()
    cdef bint runs_written     # a batch wrote runs: its searches take no block directories
    cdef int put_slot          # the index slot this transaction puts into (-1: none yet)
    cdef bint changed          # a batch call has changed its documents or index

    def __dealloc__(self):
        if self.txn != NULL and not self.env.broken:
            mdb_txn_abort(self.txn)

    cdef int check(self) except -1:
        if self.txn == NULL:
            raise DatabaseError("the transaction is finished")
        self.env.check()
        return 0

    cdef Work work(self):
        cdef Work w
        w.txn = self.txn
        w.meta, w.docs = self.env.meta, self.env.docs
        w.index_dbis, w.index_slots, w.put_slot = self.env.index, self.env.index_slots, self.put_slot
        memset(&w.ix, 0, sizeof(Index))
        w.tables = self.env.tables
        w.runs, w.run_dir, w.run_slots = self.env.runs, self.env.run_dir, self.env.run_slots
        w.table_runs, w.pending = NULL, NULL
        w.bands = self.env.bands if self.env.has_bands else NULL
        w.band_changes = NULL
        w.layout = &self.env.layout
        w.doc_cursor = NULL
        w.table_cursors = NULL
        w.merge_limit, w.merged, w.untidy = self.env.batch_merge, 0, False
        w.dirs, w.runs_written, w.index_committed = NULL, self.runs_written, False
        w.snapshot, w.view = not self.write, NULL
        w.directory_entries = self.env.directory_entries
        # runs below written_from are committed only if no earlier call of the
        # transaction wrote runs: only then may merges read them from other threads
        w.merge_threads = 1 if self.runs_written else self.env.merge_threads
        w.threaded_merge = self.env.threaded_merge
        w.threaded_merges = &self.env.threaded_merges
        w.shared_lookups = &self.env.shared_lookups
        w.fed_merges = &self.env.fed_merges
        return w

    def abort(self):
        """End the transaction; a read one is kept for Env.begin to renew."""
        if self.txn != NULL and not self.env.broken:
            if not self.write and self.env.env != NULL and self.env.spares < SPARE_READS:
                mdb_txn_reset(self.txn)
                self.env.spare[self.env.spares] = self.txn
                self.env.spares += 1
            else:
                mdb_txn_abort(self.txn)
        self.txn = NULL

    def commit(self):
        self.check()
        cdef int rc
        with nogil:
            rc = g_txn_commit(self.txn)
        self.txn = NULL
        if rc:
            raise self.env.fail(rc, "cannot commit to %s" % self.env.path.decode())

    def get(self, bytes key, bint meta=False):
        """The value of ``key`` in docs (or meta), or None."""
        self.check()
        cdef MDB_val k, v
        k.mv_size, k.mv_data = len(key), <char*>key
        cdef int rc = g_get(self.txn, self.env.meta if meta else self.env.docs, &k, &v)
        if rc == MDB_NOTFOUND:
            return None
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return self._copy(&v)

    def get_many(self, list keys):
        """get of each of ``keys`` (bytes) in docs, as a list."""
        self.check()
        cdef MDB_val k, v
        cdef int rc
        cdef list values = []
        cdef bytes key
        for key in keys:
            k.mv_size, k.mv_data = len(key), <char*>key
            rc = g_get(self.txn, self.env.docs, &k, &v)
            if rc and rc != MDB_NOTFOUND:
                raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
            values.append(None if rc else self._copy(&v))
        return values

    cdef bytes _copy(self, MDB_val* v):
        if v.mv_size >> 32:  # LMDB stores an item's size in 32 bits: a damaged page
            raise self.env.fail(CORRUPTED, "cannot read %s" % self.env.path.decode())
        out = PyBytes_FromStringAndSize(NULL, v.mv_size)
        cdef int rc = g_copy(PyBytes_AS_STRING(out), v.mv_data, v.mv_size)
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return out

    def put_meta(self, bytes key, bytes value):
        self.check()
        cdef MDB_val k, v
        k.mv_size, k.mv_data = len(key), <char*>key
        v.mv_size, v.mv_data = len(value), <char*>value
        cdef int rc = g_put(self.txn, self.env.meta, &k, &v, 0)
        if rc:
            raise self.env.fail(rc, "cannot write to %s" % self.env.path.decode())

    def distinct(self):
        """The number of distinct fingerprints (the entries of table 0, or the
        counter of a database whose tables are runs)."""
        if not self.env.runs:
            return self.entries(old_table_name(0))
        raw = self.get(DISTINCT, True)
        return int.from_bytes(raw, "big") if raw else 0

    def entries(self, bytes which):
        """Entries of the sub-database ``which`` (named as in format.py):
        documents, the index (its first slot's name: all its slots) or a table
        in 0.3's form."""
        self.check()
        cdef MDB_stat stat
        cdef int slot, rc = 0
        cdef size_t total = 0
        cdef bint index = which == INDEX_NAME
        if not index:
            rc = g_stat(self.txn, self._dbi(which), &stat)
            total = stat.ms_entries
        for slot in range(self.env.index_slots if index else 0):
            if rc == 0:
                rc = g_stat(self.txn, self.env.index[slot], &stat)
                total += stat.ms_entries
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return total

    cdef MDB_dbi _dbi(self, bytes which) except? 0:
        if which == DOCS_NAME:
            return self.env.docs
        return self.env.tables[int(which.split(b":")[1])]

    def items(self, bytes which, bytes after=None, Py_ssize_t limit=4096):
        """Up to ``limit`` (key, value) items of the documents or the index (as
        ``entries`` names them) in order, starting after the item (key)
        ``after`` (from the first: None)."""
        self.check()
        cdef MDB_cursor* cursor = NULL
        cdef MDB_val k, v, after_k, after_v
        cdef Work w = self.work()
        cdef bint index = which == INDEX_NAME
        cdef int rc = 0 if index else g_cursor_open(self.txn, self._dbi(which), &cursor)
        if rc:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        out = []
        try:
            if after is None:
                rc = index_get(&w, &k, &v, MDB_FIRST) if index else \
                    g_cursor_get(cursor, &k, &v, MDB_FIRST)
            elif index:  # the first entry past (fingerprint, key)
                after_k.mv_size, after_k.mv_data = 8, <char*>after
                after_v.mv_size, after_v.mv_data = len(after) - 8, <char*>after + 8
                k, v = after_k, after_v
                rc = index_seek(&w, &k, &v)
                if rc == 0 and cmp_entry(&k, &v, &after_k, &after_v) == 0:
                    rc = index_get(&w, &k, &v, MDB_NEXT)
            else:
                k.mv_size, k.mv_data = len(after), <char*>after
                rc = g_cursor_get(cursor, &k, &v, MDB_SET_RANGE)
                if rc == 0 and cmp_bytes(<uint8_t*>k.mv_data, k.mv_size, <uint8_t*>after,
                                         len(after)) == 0:
                    rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
            while rc == 0 and len(out) < limit:
                out.append((self._copy(&k), self._copy(&v)))
                rc = index_get(&w, &k, &v, MDB_NEXT) if index else \
                    g_cursor_get(cursor, &k, &v, MDB_NEXT)
        finally:
            if cursor != NULL:
                mdb_cursor_close(cursor)
            index_close(&w)
        if rc and rc != MDB_NOTFOUND:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return out

    def keys_of(self, uint64_t fp):
        """The keys indexed under ``fp``, in order."""
        self.check()
        cdef MDB_val k, v
        cdef uint8_t fp_bytes[8]
        write_be(fp_bytes, fp, 8)
        k.mv_size, k.mv_data = 8, fp_bytes
        cdef Work w = self.work()
        cdef int rc
        out = []
        try:
            rc = index_get(&w, &k, &v, MDB_SET)
            while rc == 0:
                out.append(self._copy(&v))
                rc = index_get(&w, &k, &v, MDB_NEXT_DUP)
        finally:
            index_close(&w)
        if rc and rc != MDB_NOTFOUND:
            raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
        return out

    def table_values(self, Py_ssize_t table):
        """Every fingerprint in permutation table ``table`` (unpermuted), in table order."""
        if self.env.runs:
            return self.run_values(table)
        return self.entries_of(self.env.tables[table],
                               self.env.layout.spec + 3 * self.env.layout.blocks * table,
                               self.env.layout.blocks)

    def band_values(self, Py_ssize_t band):
        """Every entry (band key << 32 | a fingerprint's top 32 bits) of band
        table ``band``, in order (none where the database has no band tables)."""
        from array import array
        if not self.env.has_bands:
            return array("Q")
        return self.entries_of(self.env.bands[band], IDENTITY_SPEC, 1)

    cdef object run_values(self, Py_ssize_t table):
        """The fingerprints of a table kept as runs: the union of its runs,
        less the stale entries (not in the index), unpermuted, in table order."""
        from array import array
        cdef Job job = self.job()
        cdef U64s values
        values.data, values.size, values.cap = NULL, 0, 0
        cdef TableRuns* r
        cdef RunIter it
        cdef uint64_t x
        cdef size_t i, kept = 0
        cdef const long* spec = self.env.layout.spec + 3 * self.env.layout.blocks * table
        cdef int rc
        try:
            with nogil:
                rc = open_cursors(&job.w)
                r = &job.w.table_runs[table]
                for i in range(r.n if rc == 0 else 0):
                    it.cursor, it.dir, it.run = r.cursor[i], r.dir[i], r.id[i]
                    rc = iter_seek(&it, 0)
                    while rc == 0:
                        rc = iter_next(&it, &x)
                        if rc == 0:
                            rc = u64_push(&values, x)
                    rc = 0 if rc == MDB_NOTFOUND else rc
                    if rc:
                        break
                if rc == 0 and r.n > 1:
                    rc = sort_records(values.data, values.size, 1)
                for i in range(values.size if rc == 0 else 0):
                    if kept and values.data[kept - 1] == values.data[i]:
                        continue
                    x = unpermute_one(values.data[i], spec, self.env.layout.blocks)
                    rc = index_has(&job.w, x)
                    if rc < 0:
                        break
                    if rc:
                        values.data[kept] = values.data[i]
                        kept += 1
                    rc = 0
                for i in range(kept):
                    values.data[i] = unpermute_one(values.data[i], spec, self.env.layout.blocks)
            self.done(rc, "read")
            out = array("Q")
            out.frombytes((<char*>values.data)[:kept * 8] if kept else b"")
            return out
        finally:
            free(values.data)

    cdef object entries_of(self, MDB_dbi dbi, const long* spec, Py_ssize_t blocks):
        """The entries of a table (2-byte keys, 6-byte values), unpermuted by
        ``spec``, in order: an ``array('Q')``."""
        self.check()
        from array import array
        out = array("Q")
        cdef U64s values
        values.data, values.size, values.cap = NULL, 0, 0
        cdef MDB_cursor* cursor
        cdef MDB_val k, v
        cdef int rc = g_cursor_open(self.txn, dbi, &cursor)
        if rc == 0:
            with nogil:
                rc = g_cursor_get(cursor, &k, &v, MDB_FIRST)
                while rc == 0:
                    if k.mv_size != 2 or v.mv_size != 6:
                        rc = -30796
                        break
                    rc = u64_push(&values, unpermute_one(
                        (read_be(<uint8_t*>k.mv_data, 2) << 48) | read_be(<uint8_t*>v.mv_data, 6),
                        spec, blocks))
                    if rc == 0:
                        rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
                mdb_cursor_close(cursor)
        try:
            if rc and rc != MDB_NOTFOUND:
                raise self.env.fail(rc, "cannot read %s" % self.env.path.decode())
            out.frombytes((<char*>values.data)[:values.size * 8] if values.size else b"")
        finally:
            free(values.data)
        return out

    cdef Job job(self, object items=None, bint with_values=False):
        """The working state of one batch call, freed with it (``items``: a
        list, or for upsert records.PackedDocuments)."""
        self.check()
        cdef Job job = Job.__new__(Job)
        job.w = self.work()
        job.w.band_changes = job.band_changes
        if items is not None:
            job.n = len(items)
            job.docs = load_docs(items, with_values) if isinstance(items, list) \
                else load_packed(items)
        return job

    cdef int done(self, int rc, str doing, Job job=None) except -1:
        if job is not None:
            self.put_slot = job.w.put_slot
            self.untidy = self.untidy or job.w.untidy
            self.runs_written = self.runs_written or job.w.runs_written
        if rc:
            raise self.env.fail(rc, "cannot %s %s" % (doing, self.env.path.decode()))
        return 0

    @property
    def snapshot(self):
        """The id of the commit this transaction reads (or, writing, follows)."""
        self.check()
        return mdb_txn_id(self.txn)

    def search(self, const uint64_t[::1] probes, int distance, int flips):
        """For each probe, [(key, fingerprint, distance)] of every document within
        ``distance``, probing prefixes within ``flips`` bits of the probe's."""
        cdef Job job = self.job()
        cdef Py_ssize_t n = probes.shape[0]
        cdef int rc
        job.w.dirs = self.env.dirs
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0 and n:
                rc = search_many(&job.w, &probes[0], n, distance, flips, &job.hits)
        self.done(rc, "search")
        return self.hits_with_keys(job, n)

    def band_search(self, const uint32_t[::1] bands):
        """For each query (SIGNATURE_BANDS band keys in ``bands``, query after
        query), [(key, fingerprint)] of every document whose fingerprint's top
        32 bits an entry of one of its band keys names: every text document
        that shares a band with it, and any other of those fingerprints."""
        cdef Job job = self.job()
        cdef Py_ssize_t n = bands.shape[0] // SIGNATURE_BANDS, i, b
        cdef list results = [[] for _ in range(n)]
        cdef uint64_t first
        cdef size_t h
        cdef int rc = 0
        if n == 0 or not self.env.has_bands:
            return results
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                rc = open_band_cursors(&job.w)
            i = 0
            while rc == 0 and i < n:
                for b in range(SIGNATURE_BANDS):
                    first = (<uint64_t>bands[i * SIGNATURE_BANDS + b]) << 32
                    rc = scan_range(job.w.band_cursors[b], first, first | 0xFFFFFFFFULL, 0, 64,
                                    IDENTITY_SPEC, 1, i, &job.hits)
                    if rc:
                        break
                i += 1
            if rc == 0:
                for h in range(job.hits.size):  # an entry's fingerprint prefix, once a query
                    job.hits.data[h].fp = (job.hits.data[h].fp & 0xFFFFFFFFULL) << 32
                rc = dedupe_hits(&job.hits)
        self.done(rc, "search")
        self.add_prefix_keys(job, results)
        return results

    cdef int add_prefix_keys(self, Job job, list results) except -1:
        """Append to ``results`` (a list per probe) the (key, fingerprint) of
        every document whose fingerprint starts with a hit's top 32 bits."""
        cdef size_t i
        cdef MDB_val k, v
        cdef uint8_t start[8]
        cdef uint64_t fp
        cdef int rc = 0
        for i in range(job.hits.size):
            found = results[job.hits.data[i].probe]
            write_be(start, job.hits.data[i].fp, 8)
            k.mv_size, k.mv_data = 8, start
            rc = index_get(&job.w, &k, &v, MDB_SET_RANGE)
            while rc == 0 and k.mv_size == 8:
                fp = read_be(<uint8_t*>k.mv_data, 8)
                if (fp >> 32) != (job.hits.data[i].fp >> 32):
                    break
                found.append((self._copy(&v), fp))
                rc = index_get(&job.w, &k, &v, MDB_NEXT)
            self.done(0 if rc == MDB_NOTFOUND else rc, "search")
        return 0

    cdef list hits_with_keys(self, Job job, Py_ssize_t n):
        cdef list results = [[] for _ in range(n)]
        self.add_keys(job, results)
        return results

    cdef int add_keys(self, Job job, list results) except -1:
        """Append to ``results`` (a list per probe) one (key, fingerprint,
        distance) for each document that has a hit's fingerprint now."""
        cdef size_t i
        cdef Hit* hit
        cdef Keyed* keyed
        cdef int rc
        with nogil:
            rc = read_keys(&job.w, &job.hits, &job.keyed)
        self.done(rc, "search")
        cdef int collecting = PyGC_Disable()  # lists of new tuples: nothing for it to collect
        try:
            for i in range(job.keyed.size):
                keyed = &job.keyed.data[i]
                hit = &job.hits.data[keyed.hit]
                found = (PyBytes_FromStringAndSize(<char*>job.keyed.bytes + keyed.at, keyed.size),
                         hit.fp, hit.distance)
                PyObject_GC_UnTrack(found)  # of bytes and ints: no cycle to collect
                results[hit.probe].append(found)
        finally:
            if collecting:
                PyGC_Enable()
        return 0

    def upsert(self, documents):
        """Store (key, fingerprint, value) documents (a list, or
        records.PackedDocuments), replacing existing keys."""
        cdef Job job = self.job(documents, True)
        cdef int rc
        job.w.index_committed = not self.changed
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                job.n = sort_unique(job.docs, job.n)
                rc = upsert(&job.w, job.docs, job.n, &job.touched)
            if rc == 0:
                rc = index_merges(&job.w, job.w.merge_limit, False)
        self.done(rc, "write to", job)

    def remove(self, list keys):
        """Remove the documents ``keys``; returns how many were stored."""
        cdef Job job = self.job(keys, False)
        cdef size_t count = 0
        cdef int rc
        cdef bint unchanged = not self.changed
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0:
                job.n = sort_unique(job.docs, job.n)
                rc = remove(&job.w, job.docs, job.n, &job.touched, &count, unchanged)
        self.done(rc, "write to", job)
        return count

    def insert_if_new(self, list documents, int distance, int flips):
        """For each (key, fingerprint, value) in order: the documents within
        ``distance`` (as search), storing it when there are none."""
        cdef Job job = self.job(documents, True)
        cdef list results = [[] for _ in range(job.n)]
        self.changed = True
        cdef size_t i, j = 0
        cdef int rc
        cdef bint replaced = False
        cdef uint64_t* fps = <uint64_t*>malloc((job.n + 1) * sizeof(uint64_t))
        cdef Hits stored
        stored.data, stored.size, stored.cap = NULL, 0, 0
        if fps == NULL:
            raise MemoryError()
        job.w.pending = &job.pending  # one run a table at the end, not one a stored document
        job.w.dirs = self.env.dirs
        with nogil:
            rc = open_cursors(&job.w)
            for i in range(job.n):
                fps[i] = job.docs[i].fp
            if rc == 0:  # the stored documents near each, for all at once (sweeps)
                rc = search_many(&job.w, fps, job.n, distance, flips, &stored)
            if rc == 0:
                rc = drop_stale(&job.w, &stored)
            i = 0
            while rc == 0 and i < job.n:
                job.hits.size = 0  # the stored ones still there, and the ones this call stored
                while rc == 0 and j < stored.size and stored.data[j].probe == i:
                    rc = hit_push(&job.hits, i, stored.data[j].fp, stored.data[j].distance)
                    j += 1
                if rc == 0:
                    rc = search_pending(&job.w, job.docs[i].fp, distance, i, replaced,
                                        &job.hits)
                if rc == 0 and job.hits.size == 0:
                    rc = upsert(&job.w, &job.docs[i], 1, &job.touched)
                    replaced = replaced or job.w.unlinked
                elif rc == 0:  # the keys as they are now: a later document may move one
                    with gil:
                        self.add_keys(job, results)
                i += 1
            if rc == 0:
                rc = flush_pending(&job.w)
            if rc == 0:
                rc = index_merges(&job.w, job.w.merge_limit, False)
        free(fps)
        free(stored.data)
        self.done(rc, "write to", job)
        return results

    def tidy(self):
        """One transaction's share of the work batches left (see tidy); returns
        whether there is more."""
        cdef Job job = self.job()
        cdef bint more = False, unchanged = not self.changed
        cdef int rc
        self.changed = True
        with nogil:
            rc = open_cursors(&job.w)
            if rc == 0 and unchanged:  # a rewrite of what removals left sparse, else
                rc = rewrite_sparse(&job.w, &more)  # the index's merges and the tables' share
            if rc == 0 and not more:
                rc = index_merges(&job.w, 0, unchanged)
            if rc == 0 and not more:
                rc = tidy(&job.w, &more)
        self.runs_written = self.runs_written or job.w.runs_written
        self.put_slot = job.w.put_slot
        self.done(rc, "write to")
        return more

    def convert_table(self, Py_ssize_t table):
        """Write table ``table``, kept in simhashdb 0.3's form (dupsort
        ``table:NNN``, already in order), as one run, then drop the old table;
        nothing where it is converted already."""
        self.check()
        name = old_table_name(table)
        cdef const char* old_name = name
        cdef const char* run_directory = RUN_DIRECTORY_NAME
        cdef MDB_dbi old, slot, run_dir
        cdef int rc = g_dbi_open(self.txn, old_name, MDB_DUPSORT | MDB_DUPFIXED, &old)
        for number in reversed(range(RUN_SLOTS)):  # every slot of the table, slot 0 last
            slot_name = run_slot_name(table, number)
            if rc == 0:
                rc = g_dbi_open(self.txn, slot_name, MDB_CREATE, &slot)
        cdef MDB_cursor* cursor = NULL
        cdef MDB_val k, v
        cdef U64s values
        values.data, values.size, values.cap = NULL, 0, 0
        cdef uint8_t record[RUN_RECORD_BYTES]
        cdef uint8_t key[TABLE_KEY_BYTES]
        cdef size_t blocks, entries = 0
        cdef Work w = self.work()
        with nogil:
            if rc == 0:
                rc = g_dbi_open(self.txn, run_directory, MDB_CREATE, &run_dir)
            if rc == 0:
                rc = g_drop(self.txn, slot, 0)
            if rc == 0:
                rc = g_cursor_open(self.txn, old, &cursor)
            if rc == 0:
                rc = g_cursor_get(cursor, &k, &v, MDB_FIRST)
            while rc == 0:
                if k.mv_size != 2 or v.mv_size != 6:
                    rc = CORRUPTED
                else:
                    rc = u64_push(&values, (read_be(<uint8_t*>k.mv_data, 2) << 48)
                                  | read_be(<uint8_t*>v.mv_data, 6))
                if rc == 0:
                    rc = g_cursor_get(cursor, &k, &v, MDB_NEXT)
            if cursor != NULL:
                mdb_cursor_close(cursor)
            rc = 0 if rc == MDB_NOTFOUND and cursor != NULL else rc
            if rc == 0 and values.size:
                rc = merge_runs(self.txn, NULL, NULL, 0, values.data, values.size, NULL, 0, slot,
                                1, &blocks, &entries)
            if rc == 0:
                write_be(record, 1, 4)
                record[4] = 0
                write_be(record + 5, entries, 8)
                write_be(key, table, TABLE_KEY_BYTES)
                k.mv_size, k.mv_data = TABLE_KEY_BYTES, key
                v.mv_size, v.mv_data = RUN_RECORD_BYTES if entries else 0, record
                rc = g_put(self.txn, run_dir, &k, &v, 0)
            if rc == 0 and table == 0:  # the counters tables kept as runs need
                rc = write_counter(&w, DISTINCT, entries)
                if rc == 0:
                    rc = write_counter(&w, STALE, 0)
            if rc == 0:
                rc = g_drop(self.txn, old, 1)
        free(values.data)
        self.runs_written = True
        if rc == MDB_NOTFOUND:
            return False
        if rc:
            raise self.env.fail(rc, "cannot convert the tables of %s" % self.env.path.decode())
        return True

    def copy_into(self, Txn target):
        """Write this snapshot's meta, documents and index into ``target``'s empty
        sub-databases in order (appending), and its tables as one run each."""
        self.check()
        target.check()
        target.changed = True
        cdef int rc = 0
        cdef MDB_dbi pairs[2][2]
        pairs[0][0], pairs[0][1] = self.env.meta, target.env.meta
        pairs[1][0], pairs[1][1] = self.env.docs, target.env.docs
        cdef int which
        cdef bint bands = self.env.has_bands and target.env.has_bands
        cdef Work source = self.work()
        with nogil:
            for which in range(2):
                if rc == 0:
                    rc = copy_dbi(self.txn, pairs[which][0], target.txn, pairs[which][1], False)
            if rc == 0:  # the index as one run, in its first slot
                rc = index_copy(&source, target.txn, target.env.index[0])
            index_close(&source)
            for which in range(SIGNATURE_BANDS if bands else 0):
                if rc == 0:
                    rc = copy_dbi(self.txn, self.env.bands[which], target.txn,
                                  target.env.bands[which], True)
        if rc:
            raise self.env.fail(rc, "cannot compact %s" % self.env.path.decode())
        cdef Work w = target.work()
        try:
            with nogil:
                rc = open_cursors(&w)
                if rc == 0:  # one run a table (meta brought the distinct count)
                    rc = rewrite_tables(&w, 0, w.layout.tables)
                if rc == 0:
                    rc = end_rewrite(&w, 0)
                if rc == 0:
                    rc = write_counter(&w, REMOVED, 0)
            target.runs_written = True
            if rc:
                raise target.env.fail(rc, "cannot write the compacted copy")
        finally:
            close_cursors(&w)


cdef int distinct_fingerprints(Work* w, U64s* out) noexcept nogil:
    cdef MDB_val k, v
    cdef int rc = index_get(w, &k, &v, MDB_FIRST)
    while rc == 0:
        if k.mv_size != 8:
            return -30796
        rc = u64_push(out, read_be(<uint8_t*>k.mv_data, 8))
        if rc == 0:
            rc = index_get(w, &k, &v, MDB_NEXT_NODUP)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int copy_dbi(MDB_txn* source, MDB_dbi from_dbi, MDB_txn* target, MDB_dbi to_dbi,
                  bint dupsort) noexcept nogil:
    """Append every entry of one sub-database to an empty one."""
    cdef MDB_cursor* reader
    cdef MDB_cursor* writer
    cdef MDB_val k, v
    cdef int rc = g_cursor_open(source, from_dbi, &reader)
    if rc:
        return rc
    rc = g_cursor_open(target, to_dbi, &writer)
    if rc:
        mdb_cursor_close(reader)
        return rc
    cdef int op_rc
    cdef size_t walked = 0
    rc = g_cursor_get(reader, &k, &v, MDB_FIRST)
    while rc == 0:
        op_rc = g_cursor_put(writer, &k, &v, MDB_APPEND)
        if op_rc == MDB_KEYEXIST and dupsort:
            op_rc = g_cursor_put(writer, &k, &v, MDB_APPENDDUP)
        if op_rc:
            rc = op_rc
            break
        walked += 1
        rc = g_cursor_get(reader, &k, &v, MDB_NEXT)
    mdb_cursor_close(reader)
    mdb_cursor_close(writer)
    return walked_whole(source, from_dbi, walked) if rc == MDB_NOTFOUND else rc
