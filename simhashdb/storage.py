"""The storage interface: what :class:`simhashdb.DB` needs of a backend.

``DB`` speaks to storage in domain terms: documents (an encoded key and an
encoded value holding the fingerprint), the fingerprints' permutation tables,
and scans for batches of probes. Keys and values arrive encoded (bytes); the
backend never decodes a key or a value, except to read the fingerprint that
leads a document's value (see :func:`value_fingerprint`). Backends:

- ``"lmdb"``: the native LMDB backend (:mod:`simhashdb.lmdb_native`), the
  default where it was built;
- ``"py-lmdb"``: the portable py-lmdb backend (:mod:`simhashdb.lmdb_py`), the
  same files on disk;
- ``"redis"``: a database on a Redis Cluster or server (:mod:`simhashdb.redis_store`),
  for a ``redis://`` or ``rediss://`` URL.

A backend implements :class:`Storage`, whose transactions implement
:class:`View` (reads) and :class:`Txn` (reads and writes).
"""

import os
from array import array

from .errors import DatabaseError, InvalidArgumentError


class View:
    """Reads over one consistent snapshot (LMDB); a backend without snapshots
    (Redis) says what each read sees."""

    def params(self):
        """The stored parameters (bytes), or None for a new database."""
        raise NotImplementedError

    def count(self):
        """Number of documents."""
        raise NotImplementedError

    def distinct(self):
        """Number of distinct fingerprints."""
        raise NotImplementedError

    def get(self, key):
        """The encoded value of document ``key`` (bytes), or None."""
        raise NotImplementedError

    def documents(self, after=None):
        """Every (key, value), streamed in an order fixed by the backend (LMDB:
        key order; Redis: see :meth:`RedisView.documents`), from the first
        after key ``after`` in that order (from the first: None); ``after``
        need not be stored."""
        raise NotImplementedError

    def keys_of(self, fingerprint):
        """The keys of the documents whose fingerprint is ``fingerprint``, in order."""
        raise NotImplementedError

    def keys_of_many(self, fingerprints):
        """{fingerprint: :meth:`keys_of` it} of each of ``fingerprints``."""
        return {fp: self.keys_of(fp) for fp in fingerprints}

    def fingerprint_groups(self):
        """(fingerprint, [keys]) for each distinct fingerprint, in fingerprint order."""
        raise NotImplementedError

    def search(self, probes, distance):
        """For each fingerprint of ``probes`` (a uint64 buffer), every document
        within ``distance`` bits as (key, fingerprint, distance), in no order."""
        raise NotImplementedError

    def table_fingerprints(self, table):
        """The fingerprints stored in permutation table ``table``, in table order."""
        raise NotImplementedError


class Txn(View):
    """Reads and writes in one transaction: it lands whole or not at all."""

    def set_params(self, raw):
        """Store the parameters (bytes)."""
        raise NotImplementedError

    def upsert(self, documents):
        """Store (key, fingerprint, value) documents, replacing existing keys; a
        key repeated in ``documents`` keeps its last one. Each fingerprint is
        in the tables while a document has it."""
        raise NotImplementedError

    def remove(self, keys):
        """Remove the documents ``keys``; returns how many were there."""
        raise NotImplementedError

    def insert_if_new(self, documents, distance):
        """For each (key, fingerprint, value) in order: the documents within
        ``distance`` bits (as :meth:`search`), storing it when there are none."""
        found = []
        for document in documents:
            hits = self.search(_one(document[1]), distance)[0]
            if not hits:
                self.upsert([document])
            found.append(hits)
        return found


class Storage:
    """A store of documents and permutation tables. ``read()`` snapshots run
    side by side; ``write()`` transactions of one process take turns.

    Attributes: ``path`` (what it was opened with, for messages), ``readonly``,
    ``max_key_bytes`` (the largest encoded key).
    """

    max_key_bytes = None

    def open_tables(self, layout):
        """Use ``layout``'s permutation tables (creating them where writable)."""
        raise NotImplementedError

    def read(self):
        """A context manager giving a :class:`View` of one snapshot."""
        raise NotImplementedError

    def write(self, body):
        """Run ``body(txn)`` in one :class:`Txn`, commit, return its result."""
        raise NotImplementedError

    def search(self, probes, distance):
        """:meth:`View.search` over a snapshot of its own (backends may answer
        it faster than through :meth:`read`)."""
        with self.read() as view:
            return view.search(probes, distance)

    def compact(self):
        """Reclaim the space of deleted entries."""
        raise NotImplementedError

    def check(self):
        """Problems the backend sees in what it keeps (its files), as strings."""
        return []

    def info(self):
        """A dict of backend facts for :meth:`DB.stats`: ``backend``, the bytes
        the database takes where the backend keeps it (``disk_bytes``: its
        files, or ``memory_bytes``: its RAM on the servers), and more."""
        raise NotImplementedError

    def close(self):
        """Release the store; later calls raise DatabaseError."""
        raise NotImplementedError


BACKENDS = ("lmdb", "py-lmdb", "redis")


def open_storage(path, readonly=False, backend=None):
    """The backend for ``path``: a :class:`Storage` instance as it is, redis
    for a redis:// or rediss:// URL, else the named backend (default:
    ``$SIMHASHDB_BACKEND``, else native LMDB where it was built, else py-lmdb)."""
    if isinstance(backend, Storage):
        return backend
    url = is_url(path)
    if url and backend not in (None, "redis"):
        raise InvalidArgumentError("%s is a Redis URL, which the %s backend cannot open"
                                   % (path, backend))
    name = "redis" if url else backend or os.environ.get("SIMHASHDB_BACKEND") or default_backend()
    if name == "lmdb":
        from .lmdb_native import NativeStorage
        return NativeStorage(path, readonly=readonly)
    if name == "py-lmdb":
        from .lmdb_py import PyLmdbStorage
        return PyLmdbStorage(path, readonly=readonly)
    if name == "redis":
        from .redis_store import RedisStorage
        return RedisStorage(path, readonly=readonly)
    raise InvalidArgumentError("backend must be a Storage or one of %s, got %r"
                               % (", ".join(BACKENDS), name))


def is_url(path):
    """Whether ``path`` is a redis:// or rediss:// URL."""
    return str(path).startswith(("redis://", "rediss://"))


def database_exists(path, backend=None):
    """Whether a database is at ``path`` (with ``backend``, default
    ``$SIMHASHDB_BACKEND``): for messages that name what to do."""
    if is_url(path) or (backend or os.environ.get("SIMHASHDB_BACKEND")) == "redis":
        from .redis_store import RedisStorage
        storage = RedisStorage(path, readonly=True)
        try:
            with storage.read() as view:
                return view.params() is not None
        finally:
            storage.close()
    from .lmdb_files import DATA_FILE
    return os.path.exists(os.path.join(os.fspath(path), DATA_FILE))


def default_backend():
    """``"lmdb"`` where the native backend was built, else ``"py-lmdb"``."""
    try:
        from . import _lmdb  # noqa: F401
    except ImportError:
        return "py-lmdb"
    return "lmdb"


def value_fingerprint(value):
    """The fingerprint that leads an encoded document value: a msgpack array
    whose first item is an unsigned int."""
    if value[:1] in (b"\xdc", b"\xdd"):
        value = value[3:] if value[:1] == b"\xdc" else value[5:]
    else:
        value = value[1:]
    tag = value[0]
    if tag < 0x80:
        return tag
    width = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}.get(tag)
    if width is None:
        raise DatabaseError("a document record is damaged: its fingerprint is unreadable")
    return int.from_bytes(value[1:1 + width], "big")


def _one(fp):
    return array("Q", [fp])
