# The C declarations of the LMDB engine (and of the runs prototype in tools/):
# LMDB's API, its calls through the fault guard (guard.h), POSIX threads and
# the atomics a batch's threads share work by. Declarations only: a separate
# file from bits.pxd because Cython includes lmdb.h wherever this is cimported,
# and the other extensions build without LMDB.

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
        unsigned int ms_depth
        size_t ms_branch_pages
        size_t ms_leaf_pages
        size_t ms_overflow_pages
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
        MDB_MULTIPLE, MDB_NOSYNC,
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
    int mdb_env_set_userctx(MDB_env* env, void* ctx)
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
    ctypedef struct PageMap:
        size_t written  # the last write transaction a put, delete or drop succeeded in
    int g_page_map_find(MDB_env* e, PageMap* m)
    void page_map_free(PageMap* m)
    void guard_assert(MDB_env* env, const char* msg)
    int guard_install()
    int guard_last_signal()
    int g_get(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v)
    int g_put(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v, unsigned int f)
    int g_txn_written(MDB_txn* t)
    int g_del(MDB_txn* t, MDB_dbi d, MDB_val* k, MDB_val* v)
    int g_cursor_get(MDB_cursor* c, MDB_val* k, MDB_val* v, MDB_cursor_op op)
    int g_cursor_put(MDB_cursor* c, MDB_val* k, MDB_val* v, unsigned int f)
    int g_stat(MDB_txn* t, MDB_dbi d, MDB_stat* s)
    int g_drop(MDB_txn* t, MDB_dbi d, int delete)
    int g_txn_commit(MDB_txn* t)
    int g_dbi_open(MDB_txn* t, const char* name, unsigned int f, MDB_dbi* d)
    int g_cursor_open(MDB_txn* t, MDB_dbi d, MDB_cursor** c)
    int g_txn_begin(MDB_env* e, MDB_txn* parent, unsigned int f, MDB_txn** t)
    int g_copy(void* dst, const void* src, size_t n)

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
    """
    #define chunk_take(p, n) __atomic_fetch_add((p), (n), __ATOMIC_RELAXED)
    #define chunk_stop(p, n) __atomic_store_n((p), (n), __ATOMIC_RELAXED)
    """
    size_t chunk_take(size_t* p, size_t n) nogil
    void chunk_stop(size_t* p, size_t n) nogil
