"""The LMDB backends: ``lmdb`` (:mod:`.native`, Cython on the LMDB C API, the
default) and ``py-lmdb`` (:mod:`.pylmdb`, the portable fallback), over the
same files; :mod:`.files` holds what they share.

A database is a directory holding one LMDB environment (``data.mdb``,
LMDB's ``lock.mdb``) and simhashdb's lock files; :mod:`.format` declares its
sub-databases, their keys and values, and meta's counters. A database of
simhashdb 0.8 and earlier (format 7 and before) keeps its documents in
another form, which only the copy of :meth:`.files.LmdbStorage.relayout`
reads (:func:`simhashdb.upgrade`).
"""
