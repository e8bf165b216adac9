"""Iteration, check and expire on Redis stream the documents in rounds of a
bounded size (shard by shard), instead of reading the whole database."""

import collections
import random

import msgpack
import pytest
from conftest import REDIS, storage_of

from simhashdb import DB
from simhashdb import batches as db_clock
from simhashdb.storage.redis import storage as redis_storage

pytestmark = pytest.mark.skipif(not REDIS, reason="needs redis-server and the redis extra "
                                "(pip install '.[redis]'); CI has both")


class Rounds:
    """Counts what the rounds of a DB's storage read: hash fields per round."""

    def __init__(self, storage, monkeypatch):
        self.fields = []  # fields read by each round that read hashes
        send = storage.nodes.round

        def counted(requests):
            replies = send(requests)
            fields = sum(len(reply) // 2 for address, commands in requests.items()
                         for command, reply in zip(commands, replies[address])
                         if command[0] == "HGETALL")
            if fields or any(c[0] == "HGETALL" for cs in requests.values() for c in cs):
                self.fields.append(fields)
            return replies
        monkeypatch.setattr(storage.nodes, "round", counted)


def planted(n, seed):
    """{key: fingerprint}: ``n`` documents, some sharing a fingerprint."""
    rng = random.Random(seed)
    docs = {i: rng.getrandbits(64) for i in range(n)}
    for i in range(0, n, 7):
        docs["twin-%d" % i] = docs[i]
    docs["zero"], docs["ones"] = 0, (1 << 64) - 1
    return docs


def position(storage, key):
    return storage.keys.doc_shard(msgpack.packb(key)), msgpack.packb(key)


# 5 blocks: 8192 shards, walked one by one; 6 blocks: 2M shards, those in use found by SCAN
@pytest.mark.parametrize("blocks", [5, 6])
def test_expire_reads_each_document_a_bounded_number_of_times(redis_names, monkeypatch, blocks):
    clock = {"now": 1_000}
    monkeypatch.setattr(db_clock, "_now", lambda: clock["now"])
    docs = planted(3000, 1)
    with DB(redis_names.url + "/expiring", distance=3, blocks=blocks) as db:
        old = {k: fp for i, (k, fp) in enumerate(docs.items()) if i % 2}
        db.insert_many(old.items())
        clock["now"] = 2_000
        db.insert_many((k, fp) for k, fp in docs.items() if k not in old)
        rounds = Rounds(storage_of(db), monkeypatch)
        assert db.expire(1_500, batch_size=50) == len(old)
        # reading the whole database each batch (as before) is ~len(docs)**2 / 50 reads
        assert len(docs) <= sum(rounds.fields) <= 4 * len(docs)
        assert {r.key: r.fingerprint for r in db} == \
            {k: fp for k, fp in docs.items() if k not in old}
        assert db.check() == []


@pytest.mark.parametrize("blocks", [5, 6])
def test_iteration_bigger_than_a_round_equals_the_oracle(redis_names, monkeypatch, blocks):
    monkeypatch.setattr(redis_storage, "ROUND_FIELDS", 100)
    docs = planted(3000, 2)
    with DB(redis_names.url + "/big", distance=3, blocks=blocks) as db:
        db.insert_many(docs.items())
        rounds = Rounds(storage_of(db), monkeypatch)
        records = [(r.key, r.fingerprint) for r in db]
        assert dict(records) == docs and len(records) == len(docs)
        storage = storage_of(db)
        order = [position(storage, k) for k, _ in records]
        assert order == sorted(order)
        assert len(rounds.fields) > 10 and sum(rounds.fields) == len(docs)
        assert max(rounds.fields) <= 3 * 100  # bounded memory: about ROUND_FIELDS a round
        groups = collections.defaultdict(list)
        for key, fp in docs.items():
            groups[fp].append(msgpack.packb(key))
        with storage.read() as view:
            assert [(fp, sorted(keys)) for fp, keys in view.fingerprint_groups()] == \
                sorted((fp, sorted(keys)) for fp, keys in groups.items())
        assert db.check() == []


def test_iteration_during_writes_yields_each_key_once(redis_names, monkeypatch):
    monkeypatch.setattr(redis_storage, "ROUND_FIELDS", 50)
    stable = planted(1000, 3)
    rng = random.Random(4)
    with DB(redis_names.url + "/moving", distance=3, blocks=5) as db:
        db.insert_many(stable.items())
        db.insert_many(("moving-%d" % i, rng.getrandbits(64)) for i in range(300))
        seen, added = [], 0
        for n, record in enumerate(db):
            seen.append(record.key)
            if n % 100 == 0:  # batches land between the rounds of the iteration
                db.insert_many(("new-%d" % (added + i), rng.getrandbits(64)) for i in range(40))
                added += 40
                db.delete_many("moving-%d" % rng.randrange(300) for _ in range(20))
                db.insert_many(("moving-%d" % rng.randrange(300), rng.getrandbits(64))
                               for _ in range(20))
        assert added >= 400
        assert len(seen) == len(set(seen))  # no key twice, changed or not
        assert set(stable) <= set(seen)  # every key unchanged meanwhile
        assert set(seen) <= set(stable) | {r.key for r in db} | \
            {"moving-%d" % i for i in range(300)}


def test_a_batch_iterates_its_own_changes_in_the_backends_order(redis_names):
    with DB(redis_names.url + "/own", distance=3, blocks=5) as db:
        db.insert_many((i, i * 7919) for i in range(200))
        storage = storage_of(db)
        encode = msgpack.packb

        def body(txn):
            txn.upsert([(encode("new-%d" % i), 5 + i, encode([5 + i, 0])) for i in range(30)])
            txn.upsert([(encode(7), 1 << 40, encode([1 << 40, 0]))])
            txn.remove([encode(i) for i in range(100, 150)])
            middle = sorted(storage.keys.doc_shard(encode(k)) for k in range(200))[100]
            after = b"\x00" if middle == 0 else next(
                encode(k) for k in range(200) if storage.keys.doc_shard(encode(k)) == middle)
            assert txn.keys_of_many([1 << 40, 7 * 7919, 8 * 7919]) == \
                {1 << 40: [encode(7)], 7 * 7919: [], 8 * 7919: [encode(8)]}
            return (list(txn.documents()), list(txn.documents(after)),
                    list(txn.fingerprint_groups()), after)
        docs, tail, groups, after = storage.write(body)
        expected = {encode(k): k * 7919 for k in range(200) if not 100 <= k < 150}
        expected.update({encode("new-%d" % i): 5 + i for i in range(30)})
        expected[encode(7)] = 1 << 40
        assert {k: msgpack.unpackb(v)[0] for k, v in docs} == expected
        keys = [k for k, _ in docs]
        order = [(storage.keys.doc_shard(k), k) for k in keys]
        assert order == sorted(order) and len(keys) == len(expected)
        start = (storage.keys.doc_shard(after), after)
        assert tail == [d for d, o in zip(docs, order) if o > start] and 0 < len(tail) < len(docs)
        assert [(fp, len(ks)) for fp, ks in groups] == sorted(
            collections.Counter(expected.values()).items())


def test_check_reads_the_index_a_chunk_of_documents_at_a_time(redis_names, monkeypatch):
    docs = planted(3000, 5)
    with DB(redis_names.url + "/checked", distance=3, blocks=5) as db:
        db.insert_many(docs.items())
        rounds = []
        send = storage_of(db).nodes.round
        monkeypatch.setattr(storage_of(db).nodes, "round",
                            lambda requests: rounds.append(requests) or send(requests))
        assert db.check() == []
        assert len(rounds) < len(docs) / 2  # not a round (or three) per document
        encoded = msgpack.packb(17)
        shard = storage_of(db).keys.hash(b"f", docs[17] >> (64 - storage_of(db).keys.shard_bits))
        storage_of(db).run([(shard, ("HDEL", shard, docs[17].to_bytes(8, "big")))])
        problems = db.check()
        assert any("document 17 " in p and "missing from the fingerprint index" in p
                   for p in problems), problems
        with storage_of(db).read() as view:
            assert encoded not in view.keys_of_many([docs[17]])[docs[17]]
