"""The storage interface: what :class:`simhashdb.DB` needs of a backend, and
the contract every backend keeps.

``DB`` speaks to storage in domain terms: documents, the fingerprint index,
the permutation tables of a :class:`simhashdb.layout.Layout`, and searches for
batches of probes. A backend is a :class:`Storage`; its snapshots are
:class:`View` objects and its transactions :class:`Txn` objects.
:mod:`simhashdb.storage.registry` opens one by name or URL. Backends:
``lmdb`` and ``py-lmdb`` (:mod:`simhashdb.storage.lmdb`, the same files),
``redis`` (:mod:`simhashdb.storage.redis`).

The contract:

- **Keys** are bytes (an encoded document key, :func:`simhashdb.records.encode_key`)
  of at most :attr:`Storage.max_key_bytes`; the backend compares them as bytes
  and never decodes them.
- **Values** are bytes; a backend never decodes one but for the fingerprint
  that leads it (:func:`simhashdb.records.value_fingerprint`), which it needs
  to update the index when a stored document is replaced or removed.
- **Parameters** (:meth:`View.params`) are bytes the backend stores as they are.
- **Fingerprints** are ints in [0, 2**64); batches of probes are uint64 buffers.
- **Every fingerprint a document has is in the index and in every table**
  while the document is stored; a table holds each distinct fingerprint once.
- **Bands**: a text document's value holds its resemblance signature
  (:func:`simhashdb.records.signature`); while it is stored, each of its
  :data:`BANDS` band keys (:func:`band_entries`) is in the band index, so
  that :meth:`View.band_search` finds every text document that shares a band
  with a query. A backend may keep them as it likes; the LMDB backends keep,
  per band, a sorted table of :func:`band_entries`.
- **Searches are exact**: every document within the distance asked, at any
  distance the layout answers (above its own distance, by probing every
  prefix within :meth:`Layout.prefix_flips` bits, see :meth:`Layout.probe_ranges`).
- **Snapshots**: a :meth:`Storage.read` view sees one consistent state for
  as long as it is open, where the backend keeps snapshots (LMDB); a backend
  that does not (Redis) says what each of its reads sees, and each read still
  sees whole transactions.
- **Transactions**: :meth:`Storage.write` runs ``body(txn)`` so that its
  changes land whole or not at all. The backend may run ``body`` more than
  once (LMDB after growing its map, Redis after losing its lock to a stalled
  writer's successor): ``body`` must only read and write through ``txn`` and
  return its result. An exception from ``body`` writes nothing and propagates.
  Writers of one process take turns; a backend says what it allows across
  processes.
- **Errors** a backend meets are :class:`simhashdb.DatabaseError` (or a
  subclass), never a foreign exception; no signal reaches the caller from
  damaged data.
- After :meth:`Storage.close`, every call raises DatabaseError.

A new backend is a :class:`Storage` subclass in a module of its own, one
:func:`simhashdb.storage.registry.register` call, and a green run of
``tests/test_storage.py`` (the contract suite) on it.
"""

import contextlib
import gc
import os
from abc import ABC, abstractmethod
from array import array

from .. import _ext
from .._ext import bands
from ..errors import DatabaseError
from ..records import signature

MAX_KEY_BYTES = 511  # the largest encoded key every backend takes (LMDB's limit)
BANDS = _ext.BANDS  # band keys of a text's signature


class View(ABC):
    """Reads over one snapshot (see the contract above for backends without snapshots)."""

    @abstractmethod
    def params(self):
        """The stored parameters (bytes), or None for a new database."""

    @abstractmethod
    def count(self):
        """Number of documents."""

    @abstractmethod
    def distinct(self):
        """Number of distinct fingerprints."""

    @abstractmethod
    def get(self, key):
        """The value of document ``key`` (bytes), or None."""

    def get_many(self, keys):
        """:meth:`get` of each of ``keys``, as a list."""
        return [self.get(key) for key in keys]

    @abstractmethod
    def documents(self, after=None):
        """Every (key, value), streamed in an order fixed by the backend
        (LMDB: by the key's hash, then the key), from the first after key
        ``after`` in that order (from the first: None); ``after`` need not be stored."""

    @abstractmethod
    def keys_of(self, fingerprint):
        """The keys of the documents whose fingerprint is ``fingerprint``, in order."""

    def keys_of_many(self, fingerprints):
        """{fingerprint: :meth:`keys_of` it} of each of ``fingerprints``."""
        return {fp: self.keys_of(fp) for fp in fingerprints}

    @abstractmethod
    def fingerprint_groups(self):
        """(fingerprint, [keys]) for each distinct fingerprint, in fingerprint order."""

    @abstractmethod
    def search(self, probes, distance):
        """For each fingerprint of ``probes`` (a uint64 buffer), every document
        within ``distance`` bits as (key, fingerprint, distance), in no order."""

    @abstractmethod
    def table_fingerprints(self, table):
        """The fingerprints stored in permutation table ``table``, in table order."""

    @abstractmethod
    def band_search(self, keys):
        """For each query (:data:`BANDS` band keys of ``keys``, a uint32
        buffer, query after query), the (key, fingerprint) of every stored text
        document that shares at least one band with it; others may come too
        (the caller checks), none of them twice."""

    @abstractmethod
    def band_entries(self, band):
        """What the band index holds for band ``band``, as :func:`band_entries`
        gives it: an iterable of ints, for :meth:`DB.check`."""


class Txn(View):
    """Reads and writes in one transaction: it lands whole or not at all, and
    its reads see its own writes."""

    @abstractmethod
    def set_params(self, raw):
        """Store the parameters (bytes)."""

    @abstractmethod
    def upsert(self, documents):
        """Store (key, fingerprint, value) documents, replacing existing keys; a
        key repeated in ``documents`` keeps its last one."""

    @abstractmethod
    def remove(self, keys):
        """Remove the documents ``keys``; returns how many were there."""

    def insert_if_new(self, documents, distance):
        """For each (key, fingerprint, value) in order: the documents within
        ``distance`` bits (as :meth:`search`, seeing the ones stored before it
        in the batch), storing it when there are none."""
        found = []
        for document in documents:
            hits = self.search(array("Q", [document[1]]), distance)[0]
            if not hits:
                self.upsert([document])
            found.append(hits)
        return found


@contextlib.contextmanager
def no_cyclic_gc():
    """Pause Python's cyclic garbage collector for a write: a batch allocates
    many small objects, none in cycles, and the collections they would set
    off walk them again and again. The young generations, whose collection
    the pause put off (the process's other threads' objects too), are
    collected after it as the collector would have."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            counts, thresholds = gc.get_count(), gc.get_threshold()
            if counts[1] > thresholds[1]:
                gc.collect(1)
            elif counts[0] > thresholds[0]:
                gc.collect(0)


class Storage(ABC):
    """A store of documents, their fingerprint index and permutation tables.

    Attributes: ``backend`` (its registered name), ``path`` (what it was
    opened with, for messages), ``readonly``, ``max_key_bytes`` (the largest
    encoded key), ``snapshots`` (whether a :meth:`read` view keeps seeing one
    state while others write).

    A backend's constructor takes ``(path, readonly=False, create=True)``:
    with ``create`` False (or ``readonly``), a missing database is a
    :class:`simhashdb.DatabaseNotFoundError`, and nothing is made.
    """

    backend = None
    max_key_bytes = MAX_KEY_BYTES
    snapshots = True

    @classmethod
    def open(cls, path, readonly=False, create=True):
        """The storage a ``DB`` opens at ``path`` (:func:`registry.open_storage`):
        a new instance, unless the backend shares one among the handles of a
        process."""
        return cls(path, readonly=readonly, create=create)

    @abstractmethod
    def open_tables(self, layout):
        """Use ``layout``'s permutation tables (creating them where writable)."""

    old_documents = False
    """Whether the backend keeps the documents in the form of an earlier
    format, which only :meth:`relayout`'s copy reads (:func:`simhashdb.upgrade`)."""

    record_blocks = False
    """Whether the backend keeps the documents in blocks of records (LMDB's,
    since format 11)."""

    old_records = False
    """Whether the backend keeps the documents a record an id, as LMDB files of
    format 8 to 10 did: read and written as they are, put in blocks by
    :meth:`relayout`'s copy (:func:`simhashdb.upgrade`)."""

    def format_stored(self):
        """Called on a writable storage once its parameters give this version's
        format, which earlier versions refuse to open: a backend may now add
        what they could not read (none by default)."""

    @abstractmethod
    def read(self):
        """A context manager giving a :class:`View` of one snapshot."""

    def read_whole(self, read):
        """``read(view)`` over one state of the database: a backend without
        snapshots runs it again while a batch lands under it."""
        with self.read() as view:
            return read(view)

    @abstractmethod
    def write(self, body, documents=0):
        """Run ``body(txn)`` in one :class:`Txn` and land it; returns its
        result. ``body`` may run more than once (see the contract).
        ``documents``: about how many documents it writes or removes, so
        that a backend can make room for them first."""

    def settle(self, documents):
        """After a call that wrote ``documents`` in many batches: leave what
        it wrote as few runs as a bulk load of them would (backends without
        runs keep what they wrote as it is)."""

    def search(self, probes, distance):
        """:meth:`View.search` over a snapshot of its own (backends may answer
        it faster than through :meth:`read`)."""
        with self.read() as view:
            return view.search(probes, distance)

    @abstractmethod
    def compact(self):
        """Reclaim the space of deleted entries."""

    def relayout(self, layout, params):
        """Build the tables again in ``layout``, with ``params`` (the stored
        parameters that give it), as one change: a crash leaves the old
        tables or the new; refused while other handles have it open."""
        raise DatabaseError("the %s backend cannot build a database's tables again in another "
                            "layout; export the database and import it into a new one"
                            % self.backend)

    def check(self):
        """Problems the backend sees in what it keeps (its files), as strings."""
        return []

    @abstractmethod
    def info(self):
        """A dict of backend facts for :meth:`DB.stats`: ``backend``, one
        ``<where>_bytes`` item, what the database takes where the backend keeps
        it (``disk_bytes``: its files; ``memory_bytes``: RAM on servers), and
        whatever else the backend reports."""

    def statistics(self):
        """Counts of how the backend's engine did its work since this process
        opened the database, for tuning and tests (not part of
        :meth:`DB.stats`): a dict of names to counts, empty where the backend
        keeps none."""
        return {}

    @abstractmethod
    def close(self):
        """Release the store; later calls raise DatabaseError."""


def band_entries(value, fingerprint):
    """The band entries of a document value: for each of its :data:`BANDS`
    band keys, ``key << 32 | the fingerprint's top 32 bits`` (a fingerprint
    found by its prefix leads to the document); [] for a document with no
    signature (stored without text, or of a text with no word)."""
    theirs = signature(value)
    return [(key << 32) | (fingerprint >> 32) for key in bands(theirs)] if theirs else []


_this_process = os.getpid()  # read on every query: os.getpid() is a system call


def _forked():
    global _this_process
    _this_process = os.getpid()


os.register_at_fork(after_in_child=_forked)


def check_process(opened_in):
    """Raise DatabaseError in a process other than ``opened_in`` (a fork child
    of the process that opened a store: it must open its own)."""
    if _this_process != opened_in:
        raise DatabaseError("this DB was opened in process %d before a fork; open a new "
                            "DB in the child process" % opened_in)
