"""The native kernels of the Redis backend against plain Python: the cluster
slot of a key, the MERGE records of a batch, the SCAN records of probes and
the hits decoded from SCAN replies (checked against brute force). No server
needed: the scripts' side is simulated here."""

import binascii
import random
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_multiprobe import adversarial_docs, probes_near

from simhashdb import _ext, _redis
from simhashdb.layout import Layout

MAX = (1 << 64) - 1


def slot_oracle(key):
    """The Redis Cluster spec: CRC-16/XMODEM of the hash tag (between the first
    { and the next }, if not empty) or of the key, mod 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return binascii.crc_hqx(key, 0) % 16384


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.sampled_from([b"", b"{", b"}", b"{}", b"{a}", b"}{", b"{x{y}"]),
       st.binary(max_size=8))
def test_native_slot_is_the_cluster_slot_hash_tags_included(head, tag, tail):
    key = head + tag + tail
    assert _redis.key_slot(key) == slot_oracle(key)


def test_native_slot_of_known_keys():
    # from the Redis Cluster specification: 12739 is the slot of "123456789"'s CRC
    assert _redis.key_slot(b"123456789") == 0x31C3 % 16384
    assert _redis.key_slot(b"{user1000}.following") == _redis.key_slot(b"user1000")
    assert _redis.key_slot(b"foo{}{bar}") == slot_oracle(b"foo{}{bar}")


def random_owners(rng, nodes):
    """A node for each slot, in runs as a cluster hands them out, shuffled."""
    cuts = sorted(rng.sample(range(1, 16384), nodes - 1)) if nodes > 1 else []
    order = list(range(nodes))
    rng.shuffle(order)
    owners = array("H")
    for node, (lo, hi) in zip(order, zip([0] + cuts, cuts + [16384])):
        owners += array("H", [node]) * (hi - lo)
    return owners


def bucket_key(table_key, value, bits):
    return table_key + (b"%0*x" % (bits // 4, value >> (64 - bits)) if bits else b"")


def tail(value, width):
    return (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([(5, 3, 8), (4, 2, 0), (6, 3, 16), (8, 3, 24)]),
       st.integers(1, 4), st.sampled_from([40, 300, 1 << 16]))
def test_native_merge_buckets_of_tables_are_the_python_ones(seed, shape, nodes, limit):
    blocks, distance, bits = shape
    rng = random.Random(seed)
    layout = Layout(blocks, distance)
    _, docs = adversarial_docs(layout, seed, crowd=rng.choice([0, 50]))
    fps = sorted(set(docs.values()))
    rng.shuffle(fps)
    cut = rng.randrange(len(fps) + 1)
    adds, deletes = fps[:cut], fps[cut:cut + rng.randrange(40)]
    table_keys = [b"db{x}:%03x" % t for t in range(layout.tables)]
    owners = random_owners(rng, nodes)
    width = 8 - bits // 8
    native = _redis.merge_buckets(
        [layout.table_values(array("Q", adds), t) for t in range(layout.tables)],
        [layout.table_values(array("Q", deletes), t) for t in range(layout.tables)],
        table_keys, bits, width, owners, nodes, limit)
    # the permuted values of each table from Layout.scan_bounds, not the native permutation
    added, deleted = ([sorted(layout.scan_bounds(fp)[0][t] for fp in fps) for t in
                       range(layout.tables)] for fps in (adds, deletes))
    assert native == merge_buckets_oracle(added, deleted, table_keys, bits, width, owners,
                                          limit)


def lua_scan(store, blob, key_length, width):
    """What the SCAN script answers for ``blob``: record number (from 1) and
    the bucket's entries in the record's range (all of a bucket of at most
    32), for each range with any."""
    size, out = key_length + 2 * width, []
    for r in range(len(blob) // size):
        record = blob[r * size:(r + 1) * size]
        key, first, last = record[:key_length], record[key_length:-width], record[-width:]
        bucket = store.get(key, [])
        entries = bucket if len(bucket) <= 32 else [e for e in bucket if first <= e <= last]
        if entries:
            out += [r + 1, b"".join(entries)]
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([(5, 3, 8), (4, 2, 0), (6, 3, 16), (7, 3, 24)]),
       st.integers(1, 4), st.integers(1, 7), st.booleans())
def test_native_scan_finds_what_brute_force_finds(seed, shape, nodes, per_blob, farther):
    """Ranges from probe_starts (or, past the layout's distance, the probe
    ranges), records per node, simulated SCAN replies, hits decoded: every
    fingerprint within the distance, none other."""
    blocks, distance, bits = shape
    rng = random.Random(seed)
    layout = Layout(blocks, distance)
    bases, docs = adversarial_docs(layout, seed, crowd=100)
    fps = sorted(set(docs.values()))
    probes = array("Q", probes_near(layout, bases, seed) + [0, MAX])
    width, table_keys = 8 - bits // 8, [b"db:%03x" % t for t in range(layout.tables)]
    key_length = len(table_keys[0]) + bits // 4
    store = {}
    for table, table_key in enumerate(table_keys):
        for perm in layout.table_values(array("Q", fps), table):
            store.setdefault(bucket_key(table_key, perm, bits), []).append(tail(perm, width))
    owners = random_owners(rng, nodes)
    radius = distance + 1 if farther else distance
    firsts, probe_of, table_of = layout.range_starts(probes, radius)
    if not farther:  # the native planning: one range a table
        assert list(zip(probe_of, table_of)) == [(i, t) for i in range(len(probes))
                                                 for t in range(layout.tables)]
        assert list(firsts) == [first for fp in probes
                                for first, _ in (r[0] for r in layout.probe_ranges(fp, radius)[1])]
    requests = _redis.scan_records(firsts, table_of, layout.prefixes, table_keys, bits, width,
                                 owners, nodes, per_blob)
    sent = sorted(r for _, ranges in requests for r in ranges)
    assert sent == list(range(len(firsts)))
    found = [{} for _ in probes]
    for node, (blobs, ranges) in enumerate(requests):
        assert all(len(b) <= per_blob * (key_length + 2 * width) for b in blobs)
        for blob, start in zip(blobs, range(0, len(ranges), per_blob)):
            for r, record in zip(ranges[start:start + per_blob],
                                 (blob[i:i + key_length + 2 * width]
                                  for i in range(0, len(blob), key_length + 2 * width))):
                last = firsts[r] | (~layout.prefixes[table_of[r]] & MAX)
                assert record == (bucket_key(table_keys[table_of[r]], firsts[r], bits)
                                  + tail(firsts[r], width) + tail(last, width))
                assert owners[slot_oracle(record[:key_length])] == node
        calls = [lua_scan(store, blob, key_length, width) for blob in blobs]
        _redis.scan_hits(calls, ranges, per_blob, firsts, probe_of, table_of, probes, layout.spec,
                       layout.tables, bits, width, radius, found)
    for probe, hits in zip(probes, found):
        assert hits == {fp: bin(fp ^ probe).count("1") for fp in fps
                        if bin(fp ^ probe).count("1") <= radius}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=30), st.one_of(st.none(), st.binary(max_size=9))),
                max_size=60),
       st.lists(st.tuples(st.sampled_from([0, 1, MAX, MAX - 1]) | st.integers(0, MAX),
                          st.one_of(st.none(), st.binary(max_size=9))), max_size=60),
       st.integers(0, 21))
def test_native_hash_writes_and_reads_group_fields_by_the_shards_of_the_backend(docs, fps, shard_bits):
    """Documents by the leading bits of the CRC-32 of their key, fingerprints
    by their own, each written as 8 bytes (the sharding of RedisStorage)."""
    for fields, by_fp in ((docs, False), (fps, True)):
        expected = {}
        for field, value in fields:
            shard = ((field >> (64 - shard_bits)) if by_fp else
                     (binascii.crc32(field) >> (32 - shard_bits)))
            sets, gone = expected.setdefault(shard, ([], []))
            field = field.to_bytes(8, "big") if by_fp else field
            if value is None:
                gone.append(field)
            else:
                sets += [field, value]
        assert _redis.hash_writes([list(f) for f in fields], shard_bits, by_fp) == expected
        names = [name for name, _ in fields]
        reads = {}
        for name in names:
            shard = ((name >> (64 - shard_bits)) if by_fp else
                     (binascii.crc32(name) >> (32 - shard_bits)))
            group = reads.setdefault(shard, ([], []))
            group[0].append(name)
            group[1].append(name.to_bytes(8, "big") if by_fp else name)
        assert _redis.hash_reads(names, shard_bits, by_fp) == reads
        assert _redis.unread(names + names[::-1], {names[0]: 1} if names else {}) == \
            [name for name in dict.fromkeys(names) if name != names[0]]


@given(st.dictionaries(st.integers(0, MAX), st.tuples(
    st.lists(st.binary(min_size=0, max_size=600), max_size=3, unique=True).map(sorted),
    st.lists(st.binary(max_size=5), max_size=3, unique=True).map(sorted))))
def test_native_planned_fingerprints_are_the_changed_ones_with_their_keys_joined(groups):
    fps = {fp: after for fp, (after, _) in groups.items()}
    committed = {fp: tuple(before) for fp, (_, before) in groups.items()}
    changed, added, removed, distinct = _redis.planned_fingerprints(fps, committed)
    assert changed == [(fp, b"".join(len(k).to_bytes(2, "big") + k for k in keys) or None)
                       for fp, keys in fps.items() if tuple(keys) != committed[fp]]
    assert list(added) == [fp for fp, keys in fps.items() if keys and not committed[fp]]
    assert list(removed) == [fp for fp, keys in fps.items() if not keys and committed[fp]]
    assert distinct == len(added) - len(removed)
    assert _redis.planned_documents({b"a": None, b"b": b"1", b"c": b"2", b"d": None},
                                  {b"a": b"0", b"b": None, b"c": b"2", b"d": None}) == \
        ([(b"a", None), (b"b", b"1")], 0)


@given(st.lists(st.lists(st.binary(max_size=300) | st.text(max_size=20)
                         | st.integers(-2**70, 2**70) | st.floats(allow_nan=False),
                         min_size=1, max_size=12), max_size=8))
def test_native_protocol_packing_is_the_redis_protocol(commands):
    def arg(a):
        if isinstance(a, bytes):
            return a
        return a.encode() if isinstance(a, str) else repr(a).encode()
    expected = b"".join(b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(arg(a)), arg(a))
                                                          for a in c) for c in commands)
    assert _redis.pack_commands(commands) == expected


def test_native_protocol_packing_refuses_what_is_no_argument():
    with pytest.raises(TypeError, match="got NoneType"):
        _redis.pack_commands([("SET", b"k", None)])


def test_native_add_absent_keeps_what_a_batch_has_read():
    fps, committed = {5: [b"a"]}, {5: (b"a",)}
    _redis.add_absent([5, 7, 7, 2**64 - 1], fps, committed)
    assert fps == {5: [b"a"], 7: [], 2**64 - 1: []}
    assert committed == {5: (b"a",), 7: (), 2**64 - 1: ()}
    fps[7].append(b"b")
    assert fps[2**64 - 1] == []


def merge_buckets_oracle(added, deleted, bucket_keys, bits, width, owners, limit):
    """The MERGE (blob, slots) pairs per node of sorted entries per table (or
    band), from plain Python: records by node, slot, table and bucket, cut
    after the one that reaches ``limit``."""
    records = []
    for table, table_key in enumerate(bucket_keys):
        buckets = {}
        for which, values in ((0, added[table]), (1, deleted[table])):
            for value in values:
                buckets.setdefault(bucket_key(table_key, value, bits), ([], []))[which].append(
                    value)
        for key, (adds, gone) in buckets.items():
            slot = slot_oracle(key)
            records.append((owners[slot], slot, table, key, key + struct.pack(
                ">II", len(adds), len(gone)) + b"".join(tail(v, width) for v in adds + gone)))
    records.sort()
    blobs = [[] for _ in range(max(owners) + 1)]
    for node in range(len(blobs)):
        blob, slots = b"", []
        for _, slot, _, _, record in (r for r in records if r[0] == node):
            blob += record
            slots += [slot] if slot not in slots else []
            if len(blob) >= limit:
                blobs[node].append((blob, slots))
                blob, slots = b"", []
        if blob:
            blobs[node].append((blob, slots))
    return blobs


def random_signature(rng, alphabet):
    """A signature of 128 bins drawn from ``alphabet`` (a small one makes texts share bands)."""
    return b"".join(rng.choice(alphabet).to_bytes(2, "big") for _ in range(128))


def band_entries_oracle(signatures, fps):
    entries = [set() for _ in range(32)]
    for signature, fp in zip(signatures, fps):
        if signature is None:
            continue
        for band, key in enumerate(_ext.bands(signature)):
            entries[band].add(key << 32 | fp >> 32)
    return [sorted(e) for e in entries]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0, 8, 16, 24]), st.integers(1, 4),
       st.sampled_from([40, 300, 1 << 16]))
def test_native_merge_buckets_of_tables_and_bands_are_the_python_ones(seed, bits, nodes, limit):
    """One MERGE plan for tables and bands (keys of one length): records of
    each key's sorted adds and deletes, per node and slot."""
    rng = random.Random(seed)
    width = 8 - bits // 8
    keys = [b"db:%03x" % t for t in range(3)] + [b"db:b%02x" % b for b in range(32)]
    base = rng.getrandbits(64)
    added, deleted = [], []
    for _ in keys:
        values = sorted({rng.choice([rng.getrandbits(64), base ^ rng.getrandbits(20), 0, MAX])
                         for _ in range(rng.randrange(12))})
        cut = rng.randrange(len(values) + 1)
        added.append(array("Q", values[:cut]))
        deleted.append(array("Q", values[cut:]))
    owners = random_owners(rng, nodes)
    assert _redis.merge_buckets(added, deleted, keys, bits, width, owners, nodes, limit) == \
        merge_buckets_oracle(added, deleted, keys, bits, width, owners, limit)
    with pytest.raises(ValueError, match="not sorted"):
        _redis.merge_buckets([array("Q", [2, 1])], [array("Q")], keys[:1], bits, width, owners,
                             nodes, limit)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 40), st.sampled_from([[0, 1, 2], list(range(1, 9)),
                                                                    list(range(65536))]))
def test_native_band_entries_are_those_of_each_signature_sorted_once(seed, n, alphabet):
    """Entries of the bands of random signatures (None: none; all bins empty:
    none), with prefixes shared, less random subsets of them."""
    rng = random.Random(seed)
    signatures = [None if rng.random() < 0.15 else bytes(256) if rng.random() < 0.1
                  else random_signature(rng, alphabet) for _ in range(n)]
    prefixes = [rng.getrandbits(32) for _ in range(3)]
    fps = array("Q", [rng.choice(prefixes) << 32 | rng.getrandbits(32) for _ in range(n)])
    expected = band_entries_oracle([s if s and any(s) else None for s in signatures], fps)
    assert [list(e) for e in _redis.sorted_band_entries(signatures, fps)] == expected
    without = [array("Q", sorted(rng.sample(e, rng.randrange(len(e) + 1)) + [rng.getrandbits(64)]))
               for e in expected]
    assert [list(e) for e in _redis.sorted_band_entries(signatures, fps, without)] == \
        [[x for x in e if x not in set(w)] for e, w in zip(expected, without)]
    with pytest.raises(ValueError, match="256"):
        _redis.sorted_band_entries([b"\x01" * 255], array("Q", [1]))
    with pytest.raises(ValueError):
        _redis.sorted_band_entries([None, None], array("Q", [1]))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0, 8, 16, 24]), st.integers(1, 4),
       st.integers(1, 70))
def test_native_band_search_finds_the_prefixes_of_every_shared_band(seed, bits, nodes, per_blob):
    """Band queries as ranges, their SCAN records per node, simulated SCAN
    replies (whole small buckets included), prefixes decoded: for each query,
    the prefix of every entry with one of its band keys, none other."""
    rng = random.Random(seed)
    alphabet = rng.choice([[1, 2], [1, 2, 3], list(range(1, 200))])
    signatures = [random_signature(rng, alphabet) for _ in range(rng.randrange(1, 60))]
    prefixes = [rng.getrandbits(32) for _ in range(20)]
    fps = array("Q", [rng.choice(prefixes) << 32 | rng.getrandbits(32) for _ in signatures])
    entries = band_entries_oracle(signatures, fps)
    width, band_keys = 8 - bits // 8, [b"db:b%02x" % b for b in range(32)]
    key_length = len(band_keys[0]) + bits // 4
    store = {}
    for band, values in enumerate(entries):
        for value in values:
            store.setdefault(bucket_key(band_keys[band], value, bits), []).append(
                tail(value, width))
    queries = [rng.choice(signatures) for _ in range(3)] + [random_signature(rng, alphabet)]
    keys = array("I", [k for q in queries for k in _ext.bands(q)])
    firsts, bands = _redis.band_ranges(keys)
    owners = random_owners(rng, nodes)
    requests = _redis.scan_records(firsts, bands, _redis.BAND_PREFIXES, band_keys, bits, width,
                                   owners, nodes, per_blob)
    assert sorted(r for _, ranges in requests for r in ranges) == list(range(len(keys)))
    found = [set() for _ in queries]
    for blobs, ranges in requests:
        calls = [lua_scan(store, blob, key_length, width) for blob in blobs]
        _redis.band_hits(calls, ranges, per_blob, firsts, bits, width, found)
    for q, query in enumerate(queries):
        ours = _ext.bands(query)
        assert found[q] == {e & 0xFFFFFFFF for band, key in enumerate(ours)
                            for e in entries[band] if e >> 32 == key}
    with pytest.raises(ValueError, match="32 keys"):
        _redis.band_ranges(array("I", [1, 2]))
