# A part of _lmdb.pyx, which includes the parts in order; it builds on _signature.pxi, _runs.pxi,
# _buffers.pxi, _dirs.pxi, _slotted.pxi, _merges.pxi, _recent.pxi.

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from clmdb cimport MDB_cursor, mdb_cursor_close, MDB_dbi, MDB_txn, mdb_txn_id


# The layout of the tables, and what one transaction works with

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
    size_t at                  # the cache's place of slot 0 (run set * RUN_SLOTS)
    uint64_t sought[RUN_SLOTS]  # seeks this search made in each run without a directory
    uint32_t written_from      # the first run id this call wrote into the table (0: none)


cdef enum:  # a Recent's groups: each band's (under its number), then the tables' fingerprints
    FINGERPRINTS = SIGNATURE_BANDS
    RECENT_GROUPS = SIGNATURE_BANDS + 1


cdef struct Recent:         # recent's values (_recent.pxi), or the new ones of a call
    U64s groups[RECENT_GROUPS]  # each band's entries, then the tables' fingerprints (FINGERPRINTS)
    uint64_t values         # the values its records hold (a value may be in two records)
    bint loaded


cdef struct RunsView:
    size_t txnid            # the committed transaction whose runs these are
    size_t refs             # its holders: the cache and the searches using it
    Py_ssize_t tables       # the run sets (run_sets): the tables, then the bands
    TableRuns* runs         # per run set; every run with its directory, no cursors
    Recent* recent          # recent as read in that transaction, or NULL


cdef struct SlotCursors:
    bint opened
    int n                            # sub-cursors open: on each slot in use, and the transaction's own
    int slot[INDEX_SLOTS]
    MDB_cursor* cursor[INDEX_SLOTS]
    bint on[INDEX_SLOTS]             # positioned on an entry (merged reads)
    uint64_t entries[INDEX_SLOTS]    # each one's slot's entries
    int at                           # the sub-cursor of the merged position (-1: none)
    MDB_cursor* put                  # on the transaction's own slot (upsert's puts)


cdef struct SlotFilter:     # a Bloom filter of a slot's keys (_slotted.pxi), or none (words NULL)
    uint64_t* words
    uint64_t count          # its words
    uint64_t entries        # the slot's entries when it was built
    uint64_t sought         # lookups made in the slot without one (since it last changed)


cdef struct SlotFilters:    # an Env's filters of a slotted structure's slots, for write transactions
    SlotFilter slot[INDEX_SLOTS]
    uint32_t unsure         # slots the write transaction may have added to: no filter used or built
    uint32_t fresh          # slots whose filter it built (from what it left: dropped if it aborts)
    uint64_t read           # the entries read for them since the Env was opened


cdef struct Slotted:        # sorted duplicates kept in slots (_slotted.pxi): the index, the key map
    MDB_dbi* dbis           # its slots (KEY_SLOTS == INDEX_SLOTS at most)
    int slots               # how many the database has (the index: 1 where an older one is read)
    int put_slot            # the slot the transaction puts new entries into (-1: none yet)
    SlotCursors ix          # its cursors in this call
    SlotFilters* filters    # its slots' filters (NULL: none, a read transaction)


cdef struct RecordBlock:          # a block of records, decoded (_documents.pxi), or being made
    U64s ids                # its records' ids, ascending
    U64s ends               # where each record ends in body (the first begins at 0)
    uint8_t* body
    size_t size, room       # body bytes used, allocated
    uint64_t key            # its key
    bint held               # it is the stored block under key, as stored
    size_t stored           # the bytes it is stored in (once held)


cdef struct Records:        # the documents as one call reads and writes them (_documents.pxi)
    MDB_cursor* cursor
    MDB_dbi dbi
    bint blocks             # in blocks (else a record an id: a file of format 8 to 10)
    RecordBlock read              # the block last read
    RecordBlock tail              # records appended, to store (tail_store)
    bint tail_replaces      # tail.key is a stored block's, whose records the tail took in
    RecordBlock edit              # a block being written again (block_rewrite)
    U64s gone               # ids removed, to take out of their blocks (remove_gone)
    uint8_t* packed         # a block's stored bytes, read or made
    size_t packed_room
    uint8_t* scratch        # a block's body, or a record, being made
    size_t scratch_room
    double ratio            # body bytes a stored byte, of the last block stored
    size_t walk             # the next record of read a walk gives (record_next)
    size_t walked           # the items a walk read
    uint64_t walk_last      # the id a walk gave last (once walked)


cdef struct Work:
    MDB_txn* txn
    MDB_dbi meta
    Records rec             # the documents
    Slotted index           # fingerprint -> document id
    Slotted keys            # the key's hash -> document id
    MDB_dbi run_dir         # every run set's directory of runs (directory_number, u16 BE)
    MDB_dbi* run_slots      # per run set: RUN_SLOTS slot sub-databases
    TableRuns* table_runs   # per run set (run_sets): its live runs, loaded by open_cursors
    U64s* pending           # insert_if_new on runs: fingerprints added, not yet in a run
    MDB_dbi recent_dbi      # recent (0: the file has none, one of format 8 read as it is)
    Recent* recent          # recent as this transaction reads it (load_recent), or NULL
    Recent* fresh           # the run entries this call adds, for recent or runs (store_fresh)
    uint64_t recent_limit   # the most values recent may hold
    Layout* layout
    U64s* band_changes      # per band: (entry, 1 if added else 0) of the batch's text documents
    bint index_was_empty    # the fingerprint index was empty when the batch began
    bint unlinked           # the batch took documents out of the index
    uint64_t merge_limit    # the most entries a merge may take (0: any; a batch: Env.batch_merge)
    uint64_t merged         # the entries this transaction's merges have taken
    uint64_t settle         # settling: merge the newest runs (smallest slots) within this many entries
    bint untidy             # the batch left merges or a rewrite of the tables for tidy
    DirCache* dirs          # where a search finds and leaves block directories (NULL: none)
    bint snapshot           # a read transaction: its runs may be cached as a view
    RunsView* view          # the cached view table_runs points into, or NULL (table_runs is its own)
    uint64_t directory_entries  # the largest run a search gives a directory at once
    uint64_t directory_rent  # a larger run gets one after entries / this seeks without (0: never)
    uint64_t filter_bits     # bits an entry of a directory's prefix filter (0: none)
    bint runs_written       # the transaction wrote runs (only committed runs get directories)
    bint index_committed    # no earlier call of the transaction changed the index
    size_t merge_threads    # the threads a large merge of committed runs is cut among
    uint64_t threaded_merge  # the least entries a merge takes to be cut so
    uint64_t* threaded_merges  # the Env's count of merges cut so
    uint64_t* shared_lookups  # the Env's count of batches whose lookups a thread shared
    uint64_t* fed_merges    # the Env's count of index merges whose sources a thread read


cdef inline Py_ssize_t run_sets(const Work* w) noexcept nogil:
    """What keeps runs: the tables, then the bands."""
    return w.layout.tables + SIGNATURE_BANDS


cdef inline int prefix_shift(const Work* w, Py_ssize_t t) noexcept nogil:
    """The shift that leaves of an entry of run set ``t`` the prefix its
    searches' ranges span: a table's leading blocks, a band's key."""
    return 64 - (w.layout.prefix_bits[t] if t < w.layout.tables else 32)


cdef inline uint64_t directory_number(const Work* w, Py_ssize_t t) noexcept nogil:
    """The key of run set ``t``'s directory: a table's number, BAND_DIRECTORY + a band's."""
    return <uint64_t>t if t < w.layout.tables else BAND_DIRECTORY + <uint64_t>(t - w.layout.tables)


cdef int open_cursors(Work* w) noexcept nogil:
    cdef Py_ssize_t t
    cdef int rc = open_records(w)
    if rc:
        return rc
    cdef bint viewed = w.snapshot and w.dirs != NULL
    if viewed:
        w.view = view_acquire(w.dirs, mdb_txn_id(w.txn))
        if w.view != NULL:
            w.table_runs = w.view.runs
            if w.view.recent != NULL:
                w.recent = w.view.recent
            return 0
    w.table_runs = <TableRuns*>calloc(run_sets(w) + 1, sizeof(TableRuns))
    if w.table_runs == NULL:
        return NO_MEMORY
    for t in range(run_sets(w)):
        if rc == 0:
            rc = load_runs(w, t)
    if rc == 0 and viewed and w.recent != NULL:  # a view holds recent read
        rc = load_recent(w, w.recent)
    if rc == 0 and viewed:
        view_offer(w.dirs, mdb_txn_id(w.txn), w.table_runs, run_sets(w), w.recent)
    return rc


cdef void close_two(MDB_cursor* a, MDB_cursor* b) noexcept nogil:
    """Close the cursors a copy reads from and writes to, where they were opened."""
    if a != NULL:
        mdb_cursor_close(a)
    if b != NULL:
        mdb_cursor_close(b)


cdef void close_cursors(Work* w) noexcept nogil:
    cdef Py_ssize_t t
    records_close(&w.rec)
    slotted_close(&w.index)
    slotted_close(&w.keys)
    if w.view != NULL:
        view_release(w.dirs, w.view)
    elif w.table_runs != NULL:
        for t in range(run_sets(w)):
            close_runs(&w.table_runs[t])
        free(w.table_runs)
