# A part of _lmdb.pyx, which includes the parts in order; it builds on _signature.pxi,
# _buffers.pxi, _dirs.pxi, _work.pxi, _search.pxi, _txn.pxi.
#
# The environment: its sub-databases, snapshots and reader slots.

from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport strlen
from posix.types cimport pid_t
from posix.unistd cimport getpid
from clmdb cimport (
    g_dbi_open, g_get, g_page_map_find, g_stat, g_txn_begin, g_txn_commit, guard_assert,
    GUARD_FAULT, guard_install, guard_last_signal, MDB_CREATE, MDB_dbi, MDB_DUPSORT, MDB_env,
    mdb_env_close, mdb_env_create, mdb_env_info, mdb_env_open, mdb_env_set_assert,
    mdb_env_set_mapsize, mdb_env_set_maxdbs, mdb_env_set_maxreaders, mdb_env_set_userctx,
    mdb_env_stat, MDB_envinfo, MDB_NOLOCK, MDB_NORDAHEAD, MDB_NOSUBDIR, MDB_NOTFOUND, MDB_NOTLS,
    MDB_RDONLY, mdb_reader_check, mdb_reader_list, MDB_stat, MDB_txn, mdb_txn_abort, mdb_txn_id,
    mdb_txn_renew, MDB_val, page_map_free, PageMap, pthread_mutex_destroy, pthread_mutex_init,
)


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
    cdef Recent recent  # recent as the call reads it
    cdef Recent fresh   # the run entries the call adds

    def __dealloc__(self):
        close_cursors(&self.w)
        recent_free(&self.recent)
        recent_free(&self.fresh)
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
    cdef MDB_dbi meta, records
    cdef MDB_dbi docs                # the documents of format 6 and earlier (copy_into reads them)
    cdef readonly bint old_documents  # the file keeps its documents as format 6 or 7 did
    cdef readonly bint record_blocks  # its records are in blocks (else one an id: format 8 to 10)
    cdef bint keyed_by_key           # of format 7: records, and a key map by key (not read)
    cdef MDB_dbi index[INDEX_SLOTS]  # the fingerprint index's slots (_slotted.pxi)
    cdef readonly int index_slots    # how many the database has (1: made before they were)
    cdef MDB_dbi keys[KEY_SLOTS]     # the key map's slots
    cdef int key_slots               # how many are open (none in a file of format 6 or 7)
    cdef MDB_dbi run_dir
    cdef MDB_dbi recent              # recent (0: none, a file of format 8 opened read-only)
    cdef MDB_dbi run_slots[RUN_SETS * RUN_SLOTS]
    cdef readonly Py_ssize_t max_tables  # the most tables it has room to open (maxdbs)
    cdef public uint64_t batch_merge  # the most entries a batch's merges take (0: any); tidy the rest
    cdef public uint64_t recent_limit  # the most values recent holds (a test may set fewer)
    cdef public uint64_t directory_entries  # the largest run a search gives a block directory at once
    cdef public uint64_t directory_rent  # a larger run gets one after entries / this seeks without
    cdef public uint64_t filter_bits  # bits an entry of a directory's prefix filter (0: none; at most 64)
    cdef public size_t merge_threads     # the threads a large merge is cut among (1: none)
    cdef public uint64_t threaded_merge  # the least entries a merge takes to be cut so
    cdef readonly uint64_t threaded_merges  # merges cut so since it was opened
    cdef readonly uint64_t shared_lookups  # batches whose index lookups a thread shared
    cdef readonly uint64_t fed_merges  # index merges whose sources a thread read
    cdef Layout layout
    cdef DirCache* dirs  # the runs' block directories, for searches
    cdef SlotFilters slot_filters[2]  # the index's slots' filters, the key map's (_slotted.pxi)
    cdef uint64_t filters_txn  # the file's last transaction as this process's last write left it
    cdef uint64_t filters_owner  # the write transaction begun last (Txn.ticket)
    cdef bint filters_pending  # it has not ended (filters_end)
    cdef MDB_txn* spare[SPARE_READS]  # read transactions reset by Txn.abort, for begin to renew
    cdef int spares
    cdef pid_t pid       # the process that opened it (a fork child must not end its readers)
    cdef readonly bint broken
    cdef public str damage  # why the file was found damaged before it was mapped, or None
    cdef bytes path
    cdef PageMap pages  # where the map lies, for the checks of pages before writes (guard.h)

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
        mdb_env_set_userctx(self.env, &self.pages)
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
        self.recent_limit = RECENT_LIMIT
        self.pid = getpid()

    def __dealloc__(self):
        self.drop_spares()
        if self.env != NULL and not self.broken:
            mdb_env_close(self.env)
        page_map_free(&self.pages)
        self.drop_filters()
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

    cdef void drop_filters(self) noexcept:
        slot_filters_drop(&self.slot_filters[0], 0xFFFFFFFF)
        slot_filters_drop(&self.slot_filters[1], 0xFFFFFFFF)

    cdef void filters_end(self, uint64_t ticket, bint committed, uint64_t txnid) noexcept:
        """Write transaction ``ticket`` ended: committed, the file's last
        transaction now ``txnid`` (its own, or where it changed nothing the
        one before it), or not. (Where another has begun since, as a thread
        may once LMDB's lock is free, that one found the filters in doubt.)"""
        if ticket != self.filters_owner:
            return
        self.filters_pending = False
        slot_filters_end(&self.slot_filters[0], committed)
        slot_filters_end(&self.slot_filters[1], committed)
        if committed:
            self.filters_txn = txnid

    cdef int find_pages(self) noexcept:
        """Find where the map lies (again: a new map size may move it), for
        the checks of the pages a write changes (pages.h)."""
        return g_page_map_find(self.env, &self.pages)

    cdef object fail(self, int rc, str what):
        if rc == GUARD_FAULT:
            self.broken = True
            if self.damage:  # the fault's cause, known: what it says is the way out
                return DamagedError("%s: LMDB faulted (signal %d) reading the data file, which "
                                    "is damaged: %s; restore it from a backup"
                                    % (what, guard_last_signal(), self.damage))
        return lmdb_error(rc, what)

    def open_dbs(self, long[::1] spec, uint64_t[::1] prefixes, list prefix_bits, bint create):
        """Open the sub-databases of a layout's tables (and the fixed ones); of
        a file of format 6 and earlier, meta and its documents alone (all that
        copy_into reads of it), making nothing."""
        self.check()
        if self.dirs != NULL:
            dir_clear(self.dirs, False)  # a view holds the tables of the layout before
        self.drop_filters()
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
        # the documents: a file of format 6 keeps them in docs, one of format
        # 7 its key map by key; either gains nothing until it is copied (upgrade)
        self.keyed_by_key = rc == 0 and sub_database_exists(txn, OLD_KEYS_NAME)
        self.old_documents = self.keyed_by_key or (rc == 0 and sub_database_exists(txn, DOCS_NAME))
        cdef bint runs = not self.old_documents
        self.key_slots = 0
        if rc == 0 and self.old_documents and not self.keyed_by_key:
            rc = g_dbi_open(txn, DOCS_NAME, 0, &self.docs)
        elif rc == 0:
            self.record_blocks = not self.old_documents and not sub_database_exists(
                txn, RECORDS_NAME)
            rc = g_dbi_open(txn, BLOCKS_NAME if self.record_blocks else RECORDS_NAME,
                            create_flag if self.record_blocks else 0, &self.records)
        while rc == 0 and not self.old_documents and self.key_slots < KEY_SLOTS:
            rc = g_dbi_open(txn, key_name(self.key_slots), MDB_DUPSORT | create_flag,
                            &self.keys[self.key_slots])
            self.key_slots += rc == 0
        self.index_slots = 0
        for slot in range(INDEX_SLOTS if runs else 0):
            if rc == 0 and self.index_slots == slot:
                rc = g_dbi_open(txn, index_name(slot), MDB_DUPSORT | create_flag, &self.index[slot])
                if rc == MDB_NOTFOUND and slot:  # made before there were slots
                    rc = 0
                else:
                    self.index_slots += rc == 0
        if rc == 0 and tables > self.max_tables:
            mdb_txn_abort(txn)
            raise DatabaseError("this handle has room for %d tables, not %d"
                                % (self.max_tables, tables))
        if rc == 0 and runs:
            rc = g_dbi_open(txn, RUN_DIRECTORY_NAME, create_flag, &self.run_dir)
        cdef MDB_dbi recent = 0
        if rc == 0 and runs:
            rc = g_dbi_open(txn, RECENT_NAME, create_flag, &recent)
            if rc == MDB_NOTFOUND and not create:  # a file of format 8: an empty recent
                rc, recent = 0, 0
        for t in range(tables):
            if rc == 0 and runs:
                for slot in range(RUN_SLOTS):
                    if rc == 0:
                        rc = g_dbi_open(txn, run_slot_name(t, slot), create_flag,
                                        &self.run_slots[t * RUN_SLOTS + slot])
        for t in range(SIGNATURE_BANDS if runs else 0):
            for slot in range(RUN_SLOTS):
                if rc == 0:
                    rc = g_dbi_open(txn, band_run_name(t, slot), create_flag,
                                    &self.run_slots[(tables + t) * RUN_SLOTS + slot])
        if rc == 0:
            rc = g_txn_commit(txn)
        else:
            mdb_txn_abort(txn)
        if rc == MDB_NOTFOUND:
            raise DatabaseError("%s is not a simhashdb database (a sub-database is missing)"
                                % self.path.decode())
        if rc == 0:
            rc = self.find_pages()
        if rc:
            raise self.fail(rc, "cannot open the database at %s" % self.path.decode())
        self.recent = recent
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
        cdef MDB_txn* txn
        cdef int rc = mdb_env_set_mapsize(self.env, size)
        if rc == 0:
            rc = self.find_pages()
        if rc:
            dir_clear(self.dirs, False)
            raise self.fail(rc, "cannot grow the map of %s" % self.path.decode())
        if g_txn_begin(self.env, NULL, MDB_RDONLY, &txn):  # no snapshot to find them in
            dir_clear(self.dirs, False)
        else:  # the map may have moved: the directories point into it
            dir_rebase(self.dirs, txn, self.run_slots)
            mdb_txn_abort(txn)

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
        cdef bint others_wrote
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
        txn.index_put_slot = txn.key_put_slot = -1
        if write:  # after another writer's commit, the slots' filters may not hold
            self.pages.written = 0  # (an aborted transaction's id is given again)
            # (or where the one before has not ended: a thread's commit that
            # failed after LMDB let go of its lock)
            others_wrote = self.filters_pending or mdb_txn_id(txn.txn) != self.filters_txn + 1
            self.filters_owner += 1
            self.filters_pending = True
            txn.ticket = self.filters_owner
            slot_filters_begin(&self.slot_filters[0], others_wrote)
            slot_filters_begin(&self.slot_filters[1], others_wrote)
        if 0 < self.index_slots < INDEX_SLOTS and sub_database_exists(
                txn.txn, index_name(self.index_slots)):
            txn.abort()  # the slots another process added must be read too
            raise MapResizedError("the fingerprint index of %s gained slots: open them and "
                                  "begin again" % self.path.decode())
        if self.recent == 0 and self.key_slots and sub_database_exists(txn.txn, RECENT_NAME):
            txn.abort()  # the file took format 9 since it was opened read-only
            raise MapResizedError("%s gained recent: open it and begin again" % self.path.decode())
        return txn

    @property
    def has_recent(self):
        """Whether recent is open (a file of format 8 opened read-only has none)."""
        return self.recent != 0

    @property
    def directories_built(self):
        """The block directories searches have built since it was opened."""
        return self.dirs.built if self.dirs != NULL else 0

    @property
    def slot_filter_entries(self):
        """The entries of the index's and the key map's slots that write
        transactions read to build their filters."""
        return self.slot_filters[0].read + self.slot_filters[1].read

    @property
    def ranges_skipped(self):
        """The ranges searches have skipped, ruled out by a run's prefix filter."""
        return self.dirs.skipped if self.dirs != NULL else 0

    @property
    def filter_bytes(self):
        """The memory the prefix filters of the cached directories take."""
        cdef size_t at, words = 0
        cdef BlockDir* d
        if self.dirs == NULL:
            return 0
        pthread_mutex_lock(&self.dirs.lock)
        for at in range(RUN_SETS * RUN_SLOTS):
            d = self.dirs.dirs[at]
            if d != NULL and d.filter != NULL:
                words += d.filter_words
        pthread_mutex_unlock(&self.dirs.lock)
        return 8 * words

    def close(self):
        dir_clear(self.dirs, False)
        self.drop_filters()
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
