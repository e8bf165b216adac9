"""The band index of the storage contract under random batches of text
documents, on every registered backend: documents that share fingerprint
prefixes, band keys, both or neither; replaced signatures; documents without
one; and the reads of a transaction (its own band search and band entries)
before it lands. The oracle is a dict of the documents."""

import itertools
import random
from array import array

import pytest
from conftest import STORAGE_LAYOUT
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import simhashdb
from simhashdb import _ext, records
from simhashdb.storage import BANDS, MAX_KEY_BYTES, band_entries

LAYOUT = STORAGE_LAYOUT

_rng = random.Random(7)
_VOCABULARY = ["w%d" % i for i in range(200)]
_BASE = [_rng.choice(_VOCABULARY) for _ in range(50)]


def _variant(replaced):
    words = list(_BASE)
    for j in _rng.sample(range(len(words)), replaced):
        words[j] = _rng.choice(_VOCABULARY)
    return simhashdb.fingerprint_with_signature(" ".join(words))[1]


# signatures that share many, few or no bands with each other, and None (a
# document stored without one)
SIGNATURES = [_variant(r) for r in (0, 2, 5, 12, 25, 50)] + [None]
# fingerprints in few top-32-bit prefixes, so that documents share them
PREFIXES = [_rng.getrandbits(32) for _ in range(3)]
FINGERPRINTS = [p << 32 | low for p in PREFIXES for low in (0, 1, _rng.getrandbits(32))]
KEYS = ["k%d" % i for i in range(8)]


def encoded(docs):
    """Encoded (key, fingerprint, value) of (key, fingerprint, signature index) triples."""
    plain = records.encode_documents([(k, fp) for k, fp, _ in docs], MAX_KEY_BYTES, 1000)
    out = []
    for (key, fp, value), (_, _, s) in zip(plain, docs):
        theirs = SIGNATURES[s]
        out.append((key, fp, value if theirs is None else records.with_signature(value, theirs)))
    return out


def expected_entries(docs):
    """Per band, the entries the band index must hold for ``docs`` ({key:
    (fingerprint, signature index)})."""
    entries = [set() for _ in range(BANDS)]
    for key, (fp, s) in docs.items():
        value = encoded([(key, fp, s)])[0][2]
        for band, entry in enumerate(band_entries(value, fp)):
            entries[band].add(entry)
    return [sorted(e) for e in entries]


def check_band_search(view, docs):
    """Every query (one per signature) finds each document that shares a
    band with it, each once, and only stored documents with their fingerprints."""
    queries = [s for s in SIGNATURES if s is not None]
    keys = array("I", itertools.chain.from_iterable(_ext.bands(s) for s in queries))
    found = view.band_search(keys)
    assert len(found) == len(queries)
    for query, hits in zip(queries, found):
        got = [records.unpack(key) for key, _ in hits]
        assert len(got) == len(set(got))
        for key, fp in hits:
            assert docs[records.unpack(key)][0] == fp
        ours = _ext.bands(query)
        sharing = {k for k, (_, s) in docs.items() if SIGNATURES[s] is not None
                   and any(a == b for a, b in zip(ours, _ext.bands(SIGNATURES[s])))}
        assert sharing <= set(got)


def check_agrees(view, docs):
    expected = expected_entries(docs)
    for band in range(BANDS):
        assert sorted(view.band_entries(band)) == expected[band]
    check_band_search(view, docs)


class BandMachine(RuleBasedStateMachine):
    opener = None
    databases = itertools.count()

    def __init__(self):
        super().__init__()
        self.where = "bands%d" % next(self.databases)
        self.storage = self.opener(where=self.where)
        self.docs = {}  # key -> (fingerprint, signature index)

    documents = st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(FINGERPRINTS),
                                   st.integers(0, len(SIGNATURES) - 1)), max_size=5)

    @rule(batch=documents)
    def upsert(self, batch):
        self.storage.write(lambda txn: txn.upsert(encoded(batch)))
        self.docs.update((k, (fp, s)) for k, fp, s in batch)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def remove(self, keys):
        self.storage.write(lambda txn: txn.remove([records.encode_key(k) for k in keys]))
        for k in keys:
            self.docs.pop(k, None)

    @rule(batch=documents, keys=st.lists(st.sampled_from(KEYS), max_size=3), land=st.booleans())
    def mixed(self, batch, keys, land):
        """Upserts then removals in one transaction that reads its own bands
        before it lands (or fails)."""
        after = dict(self.docs)
        after.update((k, (fp, s)) for k, fp, s in batch)
        for k in keys:
            after.pop(k, None)

        def body(txn):
            txn.upsert(encoded(batch))
            check_band_search(txn, dict(self.docs, **{k: (fp, s) for k, fp, s in batch}))
            txn.remove([records.encode_key(k) for k in keys])
            check_agrees(txn, after)
            if not land:
                raise KeyError("failed")

        if land:
            self.storage.write(body)
            self.docs = after
        else:
            with pytest.raises(KeyError):
                self.storage.write(body)

    @invariant()
    def agrees(self):
        with self.storage.read() as view:
            check_agrees(view, self.docs)


def test_the_band_machine(opener):
    BandMachine.opener = staticmethod(opener)
    machine = BandMachine.TestCase
    machine.settings = settings(max_examples=settings().max_examples // 3 or 1,
                                stateful_step_count=12, deadline=None)
    machine().runTest()
