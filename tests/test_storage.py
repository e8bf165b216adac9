"""The storage contract (simhashdb/storage/__init__.py), checked on every
registered backend through the interface alone: documents, the index and the
tables in step with an oracle, exact searches at and above the built
distance on adversarial fingerprints, whole transactions, insert-if-new,
iteration order, creation and closing. A new backend passes it with no
change here: conftest.py lists it in STORAGE_BACKENDS."""

import itertools
import random
from array import array

import pytest
from conftest import STORAGE_LAYOUT, key_order
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from simhashdb import DatabaseError, DatabaseNotFoundError, _ext, records
from simhashdb.storage import BANDS, MAX_KEY_BYTES, Storage, band_entries

LAYOUT = STORAGE_LAYOUT
MAX = 2**64 - 1


def documents(pairs, now=1000):
    """Encoded (key, fingerprint, value) documents of (key, fingerprint) pairs."""
    return records.encode_documents([(k, fp) for k, fp in pairs], MAX_KEY_BYTES, now)


def texts(pairs, now=1000):
    """Encoded text documents of (key, fingerprint, signature) triples."""
    return [(k, fp, records.with_signature(value, signature))
            for (k, fp, value), (_, _, signature) in zip(documents([p[:2] for p in pairs], now),
                                                          pairs)]


def signature_of(words):
    """A real signature of a text of ``words``."""
    return records.unpack(records.with_signature(b"\x93\x00\xc0\x00", __import__(
        "simhashdb").fingerprint_with_signature(" ".join(words))[1]))[3]


def put(storage, pairs):
    storage.write(lambda txn: txn.upsert(documents(pairs)))


def remove(storage, keys):
    return storage.write(lambda txn: txn.remove([records.encode_key(k) for k in keys]))


def by_key(items):
    return sorted(items, key=lambda item: key_order(item[0]))


def hits_by_key(hits):
    return by_key((records.unpack(key), fp, d) for key, fp, d in hits)


def oracle_hits(docs, probe, distance):
    return by_key((k, fp, (fp ^ probe).bit_count()) for k, fp in docs.items()
                  if (fp ^ probe).bit_count() <= distance)


def assert_agrees(storage, docs):
    """The storage holds exactly ``docs`` ({key: fingerprint}), index and tables
    too, and the band entries of its text documents."""
    with storage.read() as view:
        assert view.count() == len(docs)
        assert view.distinct() == len(set(docs.values()))
        values = {records.unpack(k): v for k, v in view.documents()}
        stored = {k: records.value_fingerprint(v) for k, v in values.items()}
        assert stored == docs
        entries = [band_entries(v, stored[k]) for k, v in values.items()]
        for band in range(BANDS):
            assert sorted(view.band_entries(band)) == sorted({e[band] for e in entries if e})
        groups = {fp: sorted((records.unpack(k) for k in keys), key=key_order)
                  for fp, keys in view.fingerprint_groups()}
        expected = {}
        for k, fp in docs.items():
            expected.setdefault(fp, []).append(k)
        assert groups == {fp: sorted(keys, key=key_order) for fp, keys in expected.items()}
        for table in range(LAYOUT.tables):
            assert sorted(view.table_fingerprints(table)) == sorted(expected)


def adversarial(rng, base):
    """Fingerprints that stress a layout: every flip in one block, exactly k and
    k + 1 bits away, duplicates, many under one prefix, 0 and 2**64 - 1."""
    fps = [0, MAX, base]
    for block in range(LAYOUT.blocks):
        mask = LAYOUT.block_masks[block]
        fps += [base ^ (mask & rng.getrandbits(64)) for _ in range(3)]
    for bits in (1, 2, 3, 4, 5):
        for _ in range(3):
            flipped = base
            for b in rng.sample(range(64), bits):
                flipped ^= 1 << b
            fps.append(flipped)
    top = base & ~((1 << 30) - 1)
    fps += [top | rng.getrandbits(30) for _ in range(200)]
    return fps + fps[:10]  # duplicates


def test_a_new_database_is_empty_and_keeps_its_parameters(opener):
    storage = opener()
    assert isinstance(storage, Storage) and storage.backend
    with storage.read() as view:
        assert (view.params(), view.count(), view.distinct()) == (None, 0, 0)
        assert list(view.documents()) == [] and list(view.fingerprint_groups()) == []
    storage.write(lambda txn: txn.set_params(b"\x81\xa1k\x01"))
    with storage.read() as view:
        assert view.params() == b"\x81\xa1k\x01"
    info = storage.info()
    sizes = [value for key, value in info.items() if key.endswith("_bytes")]
    assert info["backend"] == storage.backend and len(sizes) == 1 and sizes[0] >= 0


def test_upserts_and_removals_keep_documents_index_and_tables_in_step(opener):
    storage, rng = opener(), random.Random(1)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(300)}
    docs.update({"same%d" % i: 42 for i in range(5)})
    put(storage, docs.items())
    assert_agrees(storage, docs)
    moved = {k: rng.getrandbits(64) for k in list(docs)[:50]}  # a key upserted with a new fp
    put(storage, moved.items())
    docs.update(moved)
    assert_agrees(storage, docs)
    gone = list(docs)[40:120] + ["never-stored"]
    assert remove(storage, gone) == 80
    for k in gone:
        docs.pop(k, None)
    assert_agrees(storage, docs)
    with storage.read() as view:
        assert records.value_fingerprint(view.get(records.encode_key("k0"))) == docs["k0"]
        assert view.get(records.encode_key("k50")) is None
        asked = [records.encode_key(k) for k in ("k3", "k50", "k0", "k3")]
        assert view.get_many(asked) == [view.get(k) for k in asked] and view.get_many([]) == []
        assert view.get_many(asked)[1] is None and view.get_many(asked)[0] is not None
        keys = view.keys_of_many([42, docs["k0"], 7])
        assert [records.unpack(k) for k in keys[42]] == ["same%d" % i for i in range(5)]
        assert [records.unpack(k) for k in keys[docs["k0"]]] == ["k0"] and keys[7] == []


def test_a_key_repeated_in_a_batch_keeps_its_last_document(opener):
    storage = opener()
    put(storage, [("a", 1), ("b", 2), ("a", 3)])
    assert_agrees(storage, {"a": 3, "b": 2})


def test_searches_are_exact_at_and_above_the_built_distance(opener):
    storage, rng = opener(), random.Random(2)
    base = rng.getrandbits(64)
    fps = adversarial(rng, base)
    docs = {i: fp for i, fp in enumerate(fps)}
    put(storage, docs.items())
    probes = [base, 0, MAX, fps[5], base ^ 0b111, rng.getrandbits(64)]
    for distance in (0, 1, 3, 4, 5):
        found = storage.search(array("Q", probes), distance)
        with storage.read() as view:
            in_view = view.search(array("Q", probes), distance)
        for probe, hits, hits_in_view in zip(probes, found, in_view):
            assert hits_by_key(hits) == oracle_hits(docs, probe, distance)
            assert hits_by_key(hits_in_view) == hits_by_key(hits)


@pytest.mark.parametrize("in_recent", [True, False], ids=["recent", "runs"])
def test_probes_that_share_their_hits_each_find_every_document(opener, in_recent, request):
    """One batch of probes, most of them hitting the same stored fingerprints,
    each held by documents of several write batches (the index's entries
    spread over slots, the tables' in recent or in runs), some of them since
    removed: every probe finds each document within the distance, once."""
    if not in_recent:
        request.getfixturevalue("runs_only")
    storage, rng = opener(), random.Random(11)
    shared = [rng.getrandbits(64) for _ in range(12)]
    docs = {}
    for batch in range(5):
        pairs = {"b%d-%d" % (batch, i): shared[i % 12] ^ (1 << rng.randrange(64) if i % 3 else 0)
                 for i in range(36)}
        put(storage, pairs.items())
        docs.update(pairs)
    gone = rng.sample(sorted(docs), 30)
    remove(storage, gone)
    for key in gone:
        del docs[key]
    probes = shared * 4 + [fp ^ (1 << rng.randrange(64)) for fp in shared * 4]
    rng.shuffle(probes)
    for probe, hits in zip(probes, storage.search(array("Q", probes), 3)):
        assert hits_by_key(hits) == oracle_hits(docs, probe, 3)


def test_searches_stay_exact_over_batches_of_removals_and_returns(opener):
    """Fingerprints added over many batches, removed, moved, and back again
    (the same fingerprint under the same or another key), each state searched
    against the brute-force oracle."""
    storage, rng = opener(), random.Random(5)
    base = rng.getrandbits(64)
    top = base & ~((1 << 24) - 1)  # thousands under one 40-bit prefix
    pool = adversarial(rng, base) + [top | rng.getrandbits(24) for _ in range(2000)]
    docs = {}
    for round_ in range(6):
        batch = {"k%d" % rng.randrange(len(pool)): rng.choice(pool) for _ in range(400)}
        put(storage, batch.items())
        docs.update(batch)
        gone = rng.sample(sorted(docs), len(docs) // 5)
        assert remove(storage, gone) == len(gone)
        for k in gone:
            del docs[k]
        back = {k: docs[rng.choice(sorted(docs))] if i % 2 else rng.choice(pool)
                for i, k in enumerate(gone[:40])}  # returns: under a new key or the old one
        put(storage, back.items())
        docs.update(back)
        assert_agrees(storage, docs)
        probes = [base, 0, MAX, top, rng.choice(pool), rng.choice(pool) ^ 0b1011, rng.getrandbits(64)]
        for distance in (3, 4):
            for probe, hits in zip(probes, storage.search(array("Q", probes), distance)):
                assert hits_by_key(hits) == oracle_hits(docs, probe, distance), (round_, probe)


def test_large_batches_that_bring_back_indexed_fingerprints_keep_everything_in_step(opener):
    """Batches of thousands of new keys, some under fingerprints the index
    holds in earlier batches' slots (some twice in one batch, some whose old
    keys were removed): each is noted once, as it was or was not stored."""
    storage, rng = opener(), random.Random(8)
    storage.format_stored()  # what a backend adds at this version's format (as DB has it)
    first = [rng.getrandbits(64) for _ in range(5000)]
    docs = dict(enumerate(first))
    put(storage, docs.items())
    second = {5000 + i: rng.getrandbits(64) for i in range(5000)}
    put(storage, second.items())
    docs.update(second)
    again = first[:2500] + first[:200] + [rng.getrandbits(64) for _ in range(2500)]
    batch = {10_000 + i: fp for i, fp in enumerate(again)}
    put(storage, batch.items())
    docs.update(batch)
    assert_agrees(storage, docs)
    gone = list(range(1000))  # their fingerprints live on under 10_000 and up
    assert remove(storage, gone) == len(gone)
    for k in gone:
        del docs[k]
    batch = {"s%d" % i: fp for i, fp in enumerate(first[:1500] + [fp + 1 for fp in first[:3000]])}
    put(storage, batch.items())
    docs.update(batch)
    assert_agrees(storage, docs)


def test_insert_if_new_sees_what_the_batch_stored_before(opener):
    storage = opener()
    put(storage, [("old", 0b1111 << 40)])
    batch = documents([("near-old", 0b1110 << 40), ("first", 1 << 20), ("near-first", 3 << 20),
                       ("far", MAX)])
    found = storage.write(lambda txn: txn.insert_if_new(batch, 3))
    assert [[records.unpack(k) for k, _, _ in hits] for hits in found] == \
        [["old"], [], ["first"], []]
    assert_agrees(storage, {"old": 0b1111 << 40, "first": 1 << 20, "far": MAX})


def test_a_write_searches_what_it_stored_and_the_next_snapshots_agree(opener):
    """Searches inside the transaction that stored new runs see them, and
    searches after its commit, in new snapshots, find what it committed (a
    search reads no block directory of a run not yet committed)."""
    storage, rng = opener(), random.Random(12)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(2000)}
    pairs = list(docs.items())
    put(storage, pairs[:1000])
    probes = array("Q", [fp ^ (1 << rng.randrange(64)) for fp in list(docs.values())[::40]])

    def body(txn):
        before = txn.search(probes, 3)
        txn.upsert(documents(pairs[1000:]))
        return before, txn.search(probes, 3)

    before, inside = storage.write(body)
    docs.update(more := {"m%d" % i: rng.getrandbits(64) for i in range(10)})
    put(storage, more.items())  # a write that may reuse the first one's page buffers
    for probe, old, new, after in zip(probes, before, inside, storage.search(probes, 3)):
        assert hits_by_key(old) == oracle_hits(dict(pairs[:1000]), probe, 3)
        assert hits_by_key(new) == oracle_hits(dict(pairs), probe, 3)
        assert hits_by_key(after) == oracle_hits(docs, probe, 3)


def test_snapshots_of_different_commits_searched_in_turn_each_find_their_own(opener):
    """An old snapshot and new ones, searched in turn, many times: each finds
    what its commit held (a backend may keep the runs of the last snapshot
    searched for the next snapshot of the same commit, never another's)."""
    storage, rng = opener(), random.Random(13)
    if not storage.snapshots:
        pytest.skip("%s keeps no snapshots" % storage.backend)
    docs = {"k%d" % i: rng.getrandbits(64) for i in range(3000)}
    pairs = list(docs.items())
    put(storage, pairs[:1000])
    probes = array("Q", [fp ^ (1 << rng.randrange(64)) for fp in list(docs.values())[::30]])
    held = {}
    with storage.read() as old:
        for end in (2000, 3000):
            put(storage, pairs[end - 1000:end])
            held[end] = dict(pairs[:end])
            for _ in range(2):  # each twice in a row: the second may reuse the first's runs
                searches = [old.search(probes, 3), old.search(probes, 3),
                            storage.search(probes, 3), storage.search(probes, 3)]
                for probe, *hits in zip(probes, *searches):
                    assert [hits_by_key(h) for h in hits] == \
                        [oracle_hits(dict(pairs[:1000]), probe, 3)] * 2 + \
                        [oracle_hits(held[end], probe, 3)] * 2


def test_insert_if_new_sees_what_the_batch_replaced(opener):
    """A document stored early in the batch replaces a key whose fingerprint a
    later one is near: the later one no longer finds it, and is stored."""
    storage = opener()
    put(storage, [("a", 0b1111 << 40), ("b", 7)])
    batch = documents([("a", MAX), ("c", 0xF0F0 << 20), ("near-a", 0b1110 << 40), ("near-b", 6)])
    found = storage.write(lambda txn: txn.insert_if_new(batch, 3))
    assert [[records.unpack(k) for k, _, _ in hits] for hits in found] == [[], [], [], ["b"]]
    assert_agrees(storage, {"a": MAX, "c": 0xF0F0 << 20, "near-a": 0b1110 << 40, "b": 7})
    batch = documents([("k", 0), ("k", 1), ("j", 2), ("i", 0)])  # the same within the batch
    found = storage.write(lambda txn: txn.insert_if_new(batch, 0))
    assert [[records.unpack(k) for k, _, _ in hits] for hits in found] == [[], [], [], []]


def test_band_search_finds_every_text_that_shares_a_band(opener):
    storage, rng = opener(), random.Random(4)
    vocabulary = ["w%d" % i for i in range(300)]
    base = [rng.choice(vocabulary) for _ in range(60)]
    variants = {"base": base}
    for i in range(12):  # ever more words replaced: fewer and fewer bands shared
        words = list(base)
        for j in rng.sample(range(len(words)), 3 * i):
            words[j] = rng.choice(vocabulary)
        variants["v%d" % i] = words
    variants.update({"u%d" % i: [rng.choice(vocabulary) for _ in range(40)] for i in range(8)})
    variants["short"] = ["one", "two"]
    signatures = {k: signature_of(words) for k, words in variants.items()}
    fps = {k: rng.getrandbits(64) for k in variants}
    fps["twin"], signatures["twin"] = fps["v3"], signatures["v3"]  # entries shared
    fps["prefix"], signatures["prefix"] = fps["v5"] ^ 1, signatures["u0"]  # a prefix shared
    storage.write(lambda txn: txn.upsert(texts([(k, fps[k], signatures[k]) for k in fps])))
    put(storage, [("raw", fps["base"] ^ 7)])  # no signature: never in the band index
    assert_agrees(storage, dict(fps, raw=fps["base"] ^ 7))

    def shared(a, b):
        return any(x == y for x, y in zip(_ext.bands(a), _ext.bands(b)))

    for probe, signature in [("base", signatures["base"]), ("v9", signatures["v9"]),
                             ("short", signatures["short"])]:
        with storage.read() as view:
            found = view.band_search(array("I", _ext.bands(signature)))[0]
        keys = [records.unpack(k) for k, _ in found]
        assert len(keys) == len(set(keys))
        expected = {k for k in fps if shared(signature, signatures[k])}
        assert expected <= set(keys)
        assert {fp >> 32 for _, fp in found} == {fps[e] >> 32 for e in expected}
    storage.write(lambda txn: txn.remove([records.encode_key("v3")]))
    fps_left = {k: fp for k, fp in fps.items() if k != "v3"}
    assert_agrees(storage, dict(fps_left, raw=fps["base"] ^ 7))  # the twin keeps the entries
    storage.write(lambda txn: txn.upsert(texts([("twin", fps["twin"], signatures["u1"])])))
    assert_agrees(storage, dict(fps_left, raw=fps["base"] ^ 7))  # now they are gone


def test_a_failed_transaction_writes_nothing(opener):
    storage = opener()
    put(storage, [("kept", 5)])

    def body(txn):
        txn.upsert(documents([("lost", 6), ("kept", 7)]))
        txn.remove([records.encode_key("kept")])
        raise ValueError("the caller's own error")

    with pytest.raises(ValueError, match="own error"):
        storage.write(body)
    assert_agrees(storage, {"kept": 5})
    assert storage.write(lambda txn: "its result") == "its result"


def test_a_transaction_reads_its_own_writes(opener):
    storage = opener()

    def body(txn):
        txn.upsert(documents([("a", 10), ("b", 10)]))
        seen = (txn.count(), txn.distinct(), [records.unpack(k) for k in txn.keys_of(10)])
        txn.remove([records.encode_key("a")])
        values = txn.get_many([records.encode_key(k) for k in ("a", "b", "c")])
        return seen + (txn.get(records.encode_key("a")), txn.count(),
                       values[0], records.value_fingerprint(values[1]), values[2])

    assert storage.write(body) == (2, 1, ["a", "b"], None, 1, None, 10, None)


def test_documents_stream_in_one_order_from_any_key(opener):
    storage, rng = opener(), random.Random(3)
    put(storage, [("d%03d" % i, rng.getrandbits(64)) for i in range(200)] + [(7, 1), (b"x", 2)])
    with storage.read() as view:
        order = [k for k, _ in view.documents()]
        assert len(order) == len(set(order)) == 202
        for at in (0, 1, 57, 201):
            assert [k for k, _ in view.documents(order[at])] == order[at + 1:]


def test_keys_up_to_the_limit_are_stored(opener):
    storage = opener()
    key = "k" * (storage.max_key_bytes - 3)  # msgpack's str header takes 3 bytes
    put(storage, [(key, 9)])
    assert_agrees(storage, {key: 9})


def test_a_missing_database_is_not_made_unless_asked(opener):
    with pytest.raises(DatabaseNotFoundError):
        opener(create=False)
    with pytest.raises(DatabaseNotFoundError):
        opener(readonly=True)
    storage = opener()
    storage.write(lambda txn: txn.set_params(b"\x80"))
    storage.close()
    assert opener(create=False) is not None


def test_a_closed_storage_refuses_every_call(opener):
    storage = opener()
    storage.close()
    for call in (lambda: storage.read().__enter__(), lambda: storage.write(lambda txn: None),
                 lambda: storage.search(array("Q", [1]), 3), storage.info):
        with pytest.raises(DatabaseError):
            call()


def test_a_snapshot_does_not_see_later_writes(opener):
    storage = opener()
    if not storage.snapshots:
        pytest.skip("%s keeps no snapshots: each read sees whole batches only"
                    % storage.backend)
    put(storage, [("a", 1)])
    with storage.read() as view:
        put(storage, [("b", 2)])
        assert view.count() == 1 and view.get(records.encode_key("b")) is None
    with storage.read() as view:
        assert view.count() == 2


class StorageMachine(RuleBasedStateMachine):
    """Random batches of upserts, removals, insert-if-new and failed
    transactions, with reopening; the oracle is a dict and brute force."""

    opener = None
    databases = itertools.count()

    def __init__(self):
        super().__init__()
        self.where = "machine%d" % next(self.databases)
        self.storage = self.opener(where=self.where)
        self.docs = {}

    keys = st.sampled_from(["k%d" % i for i in range(12)] + [0, 1, b"b"])
    fingerprints = st.one_of(st.integers(0, MAX), st.sampled_from([0, MAX, 1, 3, 7, MAX - 1]))

    @rule(batch=st.lists(st.tuples(keys, fingerprints), max_size=6))
    def upsert(self, batch):
        put(self.storage, batch)
        self.docs.update(batch)

    @rule(keys=st.lists(keys, max_size=4))
    def remove(self, keys):
        assert remove(self.storage, keys) == len(set(keys) & set(self.docs))
        for k in keys:
            self.docs.pop(k, None)

    @rule(batch=st.lists(st.tuples(keys, fingerprints), max_size=4), distance=st.integers(0, 4))
    def insert_if_new(self, batch, distance):
        found = self.storage.write(lambda txn: txn.insert_if_new(documents(batch), distance))
        for (k, fp), hits in zip(batch, found):
            assert hits_by_key(hits) == oracle_hits(self.docs, fp, distance)
            if not hits:
                self.docs[k] = fp

    @rule(batch=st.lists(st.tuples(keys, fingerprints), min_size=1, max_size=3))
    def fail(self, batch):
        def body(txn):
            txn.upsert(documents(batch))
            raise KeyError("failed")
        with pytest.raises(KeyError):
            self.storage.write(body)

    @rule(probe=fingerprints, distance=st.integers(0, 5))
    def search(self, probe, distance):
        hits = self.storage.search(array("Q", [probe]), distance)[0]
        assert hits_by_key(hits) == oracle_hits(self.docs, probe, distance)

    @rule()
    def reopen(self):
        self.storage.close()
        self.storage = self.opener(where=self.where)

    @invariant()
    def agrees(self):
        assert_agrees(self.storage, self.docs)


def test_the_storage_machine(opener):
    StorageMachine.opener = staticmethod(opener)
    machine = StorageMachine.TestCase
    machine.settings = settings(max_examples=settings().max_examples // 3 or 1,
                                stateful_step_count=12, deadline=None)
    machine().runTest()
