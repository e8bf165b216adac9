# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""The native LMDB backend's kernels, on the LMDB C API.

One environment: ``meta``, ``blocks`` (the documents' records, key and
value under an id, in compressed blocks of consecutive ids:
``_documents.pxi``), the key map (the key's 64-bit hash -> id) and the
fingerprint index (fingerprint -> id), each sorted duplicates of 8-byte
big-endian integers kept in slots
(``_slotted.pxi``), and each permutation table kept as compressed sorted runs
(issue 22, RUNS.md, ``_runs.pxi``): a run a batch, merged by size, scanned
run by run, hits checked against the index; the run entries of small
writes wait together in ``recent`` (``_recent.pxi``) until they are many,
read by every search beside the runs. A search permutes, seeks, scans
and verifies every table for a batch of probes in one call without the GIL;
upserts and removals keep the index and the tables in step. Every LMDB call
goes through a guard (guard.h) that turns a fault on a damaged file into an
error; the environment is then marked broken.

A file of format 6 or earlier keeps its documents in ``docs``, one of format
7 its key map by key (``keys``): either is an Env's ``old_documents``. Only
the compaction's copy reads such a file, its meta and documents alone
(copy_into, for upgrade), whatever form its tables and bands are in.

This file holds the module's errors and names; the engine is in its parts,
included below in order, each a concern that cimports the C declarations it
uses (clmdb.pxd: LMDB, the guard, threads; bits.pxd: bit builtins and
big-endian integers) and names the parts it builds on.
"""

from clmdb cimport (
    GUARD_FAULT, MDB_MAP_FULL, MDB_MAP_RESIZED, MDB_READERS_FULL, MDB_TXN_FULL, guard_install,
    guard_last_signal, mdb_strerror, mdb_version,
)

from simhashdb.errors import DamagedError, DatabaseError, MapFullError, MapResizedError
from simhashdb.storage.lmdb import format as lmdb_format

include "_format.pxi"  # the file format's constants (simhashdb/storage/lmdb/format.py)

cdef bytes META_NAME = lmdb_format.META.name(), RECORDS_NAME = lmdb_format.RECORDS.name()
cdef bytes BLOCKS_NAME = lmdb_format.RECORD_BLOCKS.name()
cdef bytes DOCS_NAME = lmdb_format.OLD_DOCS.name(), OLD_KEYS_NAME = lmdb_format.OLD_KEYS.name()
cdef bytes RUN_DIRECTORY_NAME = lmdb_format.RUN_DIRECTORY.name()
cdef bytes RECENT_NAME = lmdb_format.RECENT_WRITES.name()
cdef bytes INDEX_NAME = lmdb_format.INDEX.name(0)  # (the index's first slot)
index_name, key_name = lmdb_format.INDEX.name, lmdb_format.KEYS.name
band_run_name = lmdb_format.BAND_RUNS.name
run_slot_name = lmdb_format.TABLE_RUNS.name

cdef enum:
    MAIN_DBI = 1        # LMDB's main database: the sub-databases' names and records
    MAX_TABLES = 1024
    SPARE_READS = 8     # ended read transactions an Env keeps to renew (Env.begin)
cdef int NO_MEMORY = -29999
cdef int RUN_DAMAGED = -29998  # a run holds other entries than its directory says, or lost its sums


cdef object lmdb_error(int rc, str what):
    if rc == GUARD_FAULT:
        return DamagedError("%s: LMDB faulted (signal %d) reading the data file, which is "
                            "damaged; restore it from a backup, or open it read-only and "
                            "`export` what is readable" % (what, guard_last_signal()))
    if rc == NO_MEMORY:
        return MemoryError("%s: out of memory" % what)
    if rc == RUN_DAMAGED:
        return DamagedError("%s: a run of the tables or bands is damaged (its blocks hold other than the "
                            "entries it was written with, or its id lost the flag of their "
                            "checksums); db.check() lists the damage, and compact() writes the "
                            "tables again from the fingerprint index" % what)
    if rc == RECENT_DAMAGED:
        return DamagedError("%s: recent (the run entries of the latest small writes) is damaged "
                            "(a record that is not one, or a count that disagrees); compact() "
                            "writes the tables again from the fingerprint index and the bands "
                            "from the documents" % what)
    if rc == BLOCK_DAMAGED:
        return DamagedError("%s: a block of the tables or bands is damaged (its bytes disagree "
                            "with its checksum); db.check() lists the damage, and compact() "
                            "writes the tables again from the fingerprint index and the bands "
                            "from the documents" % what)
    if rc == CORRUPTED:
        return DamagedError("%s: the data file is damaged (%s); restore it from a backup, or "
                            "open it read-only and `export` what is readable"
                            % (what, mdb_strerror(rc).decode(errors="replace")))
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


# Shared with the other extensions: the document value's bytes, the tables'
# permutations, the text signature's bands, and runs (the block codec in LMDB)
include "_values.pxi"
include "_tables.pxi"
include "_signature.pxi"
include "_runs.pxi"

# The engine, by concern
include "_buffers.pxi"
include "_dirs.pxi"
include "_work.pxi"
include "_search.pxi"
include "_slotted.pxi"
include "_documents.pxi"
include "_merges.pxi"
include "_bands.pxi"
include "_writes.pxi"
include "_tidy.pxi"
include "_recent.pxi"
include "_upsert.pxi"
include "_env.pxi"
include "_txn.pxi"
