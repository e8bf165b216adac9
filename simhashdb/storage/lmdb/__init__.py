"""The LMDB backends: ``lmdb`` (:mod:`.native`, Cython on the LMDB C API, the
default) and ``py-lmdb`` (:mod:`.pylmdb`, the portable fallback), over the
same files; :mod:`.files` holds what they share.

A database is a directory holding one LMDB environment (``data.mdb``,
LMDB's ``lock.mdb``) and simhashdb's lock files. Its sub-databases:

- ``meta``: ``b"params"`` -> the parameters (bytes the DB stores);
- ``docs``: encoded key -> document value (:mod:`simhashdb.records`);
- ``fingerprints`` (sorted duplicates): 8-byte big-endian fingerprint -> key,
  one entry per document;
- ``table:NNN`` (sorted, fixed-size duplicates): the 8-byte big-endian
  permuted fingerprint split into a 2-byte key and a 6-byte value, one entry
  per *distinct* fingerprint. Key-then-value order is the order of the
  permuted fingerprint, so a range scan works as on 8-byte keys, while LMDB
  packs the 6-byte values of one key side by side.

Behind a switch (``SIMHASHDB_RUNS=1``, native backend only; RUNS.md), a new
database keeps each table as compressed sorted runs instead: ``runs`` (each
table's directory of live runs, keyed by the table) and per table the slots
``runs:NNN:SS``, one run each,
with the count of distinct fingerprints in ``meta`` (``b"distinct"``).
"""
