"""A toy backend: databases in this process's memory, named by their path.

It is the smallest :class:`simhashdb.storage.Storage` that keeps the contract
(snapshots, whole transactions, exact searches at any distance), and it
exists to show what adding a backend takes: this module, one
``registry.register("memory", MemoryStorage)`` (conftest.py does it), and a
green ``tests/test_storage.py``.
"""

import contextlib
import copy
import threading

from simhashdb.errors import DatabaseError, DatabaseNotFoundError
from simhashdb.records import value_fingerprint
from simhashdb.storage import BANDS, Storage, Txn, View, band_entries

_databases = {}  # path -> _State: what "persists" while the process lives


class _State:
    def __init__(self):
        self.params = None
        self.docs = {}  # key -> value
        self.index = {}  # fingerprint -> set of keys


class MemoryView(View):
    def __init__(self, state, layout):
        self._state, self._layout = state, layout

    def params(self):
        return self._state.params

    def count(self):
        return len(self._state.docs)

    def distinct(self):
        return len(self._state.index)

    def get(self, key):
        return self._state.docs.get(key)

    def documents(self, after=None):
        return iter([(k, v) for k, v in sorted(self._state.docs.items())
                     if after is None or k > after])

    def keys_of(self, fingerprint):
        return sorted(self._state.index.get(fingerprint, ()))

    def fingerprint_groups(self):
        return iter([(fp, sorted(keys)) for fp, keys in sorted(self._state.index.items())])

    def search(self, probes, distance):
        """Through the layout's tables, as the contract asks: a range scan of
        each probe range over the table's sorted permuted fingerprints."""
        layout = self._layout
        tables = [layout.table_values(list(self._state.index), t) for t in range(layout.tables)]

        def scan(table, first, last, perm):
            return [(entry, (entry ^ perm).bit_count()) for entry in tables[table]
                    if first <= entry <= last and (entry ^ perm).bit_count() <= distance]

        return [[(key, fp, bits) for fp, bits in layout.near(probe, distance, scan).items()
                 for key in self.keys_of(fp)] for probe in probes]

    def table_fingerprints(self, table):
        return [self._layout.unpermute(p, table)
                for p in self._layout.table_values(list(self._state.index), table)]

    def band_search(self, keys):
        """Every text document's band entries, looked through."""
        results = []
        for query in range(len(keys) // BANDS):
            wanted = keys[query * BANDS:(query + 1) * BANDS]
            results.append([(key, value_fingerprint(value))
                            for key, value in sorted(self._state.docs.items())
                            if any(entry >> 32 == k for entry, k in zip(
                                band_entries(value, value_fingerprint(value)), wanted))])
        return results

    def band_entries(self, band):
        return sorted({entries[band] for entries in (band_entries(v, value_fingerprint(v))
                                                     for v in self._state.docs.values())
                       if entries})


class MemoryTxn(MemoryView, Txn):
    def set_params(self, raw):
        self._state.params = raw

    def upsert(self, documents):
        for key, fp, value in documents:
            self._unlink(key)
            self._state.docs[key] = value
            self._state.index.setdefault(fp, set()).add(key)

    def remove(self, keys):
        removed = 0
        for key in set(keys):
            if self._unlink(key):
                del self._state.docs[key]
                removed += 1
        return removed

    def _unlink(self, key):
        old = self._state.docs.get(key)
        if old is None:
            return False
        keys = self._state.index[value_fingerprint(old)]
        keys.discard(key)
        if not keys:
            del self._state.index[value_fingerprint(old)]
        return True


class MemoryStorage(Storage):
    """Database ``path`` in this process's memory."""

    backend = "memory"

    def __init__(self, path, readonly=False, create=True):
        self.path, self.readonly = str(path), readonly
        if self.path not in _databases:
            if readonly or not create:
                raise DatabaseNotFoundError("no database at %s" % self.path)
            _databases[self.path] = _State()
        self._layout = None
        self._lock = threading.Lock()
        self._open = True

    def _state(self):
        if not self._open:
            raise DatabaseError("the database at %s is closed" % self.path)
        return _databases[self.path]

    def open_tables(self, layout):
        self._layout = layout

    @contextlib.contextmanager
    def read(self):
        with self._lock:
            snapshot = copy.deepcopy(self._state())
        yield MemoryView(snapshot, self._layout)

    def write(self, body, documents=0):
        if self.readonly:
            raise DatabaseError("the database at %s is open read-only" % self.path)
        with self._lock:
            changed = copy.deepcopy(self._state())
            result = body(MemoryTxn(changed, self._layout))
            _databases[self.path] = changed  # whole, or not at all
            return result

    def compact(self):
        self._state()

    def info(self):
        state = self._state()
        size = sum(len(k) + len(v) for k, v in state.docs.items())
        return {"backend": self.backend, "memory_bytes": size}

    def close(self):
        self._open = False
