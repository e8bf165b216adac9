"""The LMDB backends: ``lmdb`` (:mod:`.native`, Cython on the LMDB C API, the
default) and ``py-lmdb`` (:mod:`.pylmdb`, the portable fallback), over the
same files; :mod:`.files` holds what they share.

A database is a directory holding one LMDB environment (``data.mdb``,
LMDB's ``lock.mdb``) and simhashdb's lock files. Its sub-databases:

- ``meta``: ``b"params"`` -> the parameters (bytes the DB stores);
- ``docs``: encoded key -> document value (:mod:`simhashdb.records`);
- ``fingerprints`` (sorted duplicates): 8-byte big-endian fingerprint -> key,
  one entry per document;
- ``band:NN`` (sorted, fixed-size duplicates): the band index of text documents;
- ``runs``: each permutation table's directory of live runs, keyed by the
  table (2 bytes big-endian): (run id, slot, entries) a run, oldest first;
- ``runs:NNN:SS``: slot SS of table NNN, holding at most one run: the table's
  permuted fingerprints in order, in blocks of up to 996 bytes coded by their
  differences (Elias-Fano), each keyed by the run id and its first value.
  A batch appends a run; runs are merged as they grow, and once the entries
  that removals left behind could reach a quarter of the table, every table
  is written again from the index (:data:`.files.RUN_RATIO`);
- ``meta`` also holds ``b"distinct"`` (the distinct fingerprints),
  ``b"stale"`` (fingerprints removed since the tables were last written whole),
  ``b"removed"`` (documents removed since the documents and the index were
  last written whole: past a quarter of the documents, they are written
  again, in order, without the space removals left) and, while
  the tables are being written again, ``b"rewrite"`` (the next table, and the
  stale count the rewrite began with; 8 bytes big-endian each).

Databases of simhashdb 0.3 and earlier keep each table as ``table:NNN``
(sorted, fixed-size duplicates: the permuted fingerprint's top 2 bytes as key,
the other 6 as value). They are read as they are; to write to one, convert
it first (:meth:`.files.LmdbStorage.convert_tables`).
"""
