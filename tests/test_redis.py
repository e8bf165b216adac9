"""The Redis backend on local clusters: concurrent crawlers, killed writers,
a killed primary, a single server. (The storage tests of the other files
also run on Redis, through the ``backend`` fixture.)"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest

redis = pytest.importorskip("redis", reason="the redis extra is not installed: pip install '.[redis]'")
from conftest import REDIS, as_tuples, brute_force, flip, storage_of
from redis_cluster import LocalCluster, free_ports

from simhashdb import DB, DatabaseError, NodeTimeoutError, cli, records
from simhashdb.storage.redis import scripts

pytestmark = pytest.mark.skipif(not REDIS, reason="needs redis-server and the redis extra "
                                "(pip install '.[redis]'); CI has both")
TESTS = __file__.rsplit("/", 1)[0]


def spawn(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_local_cluster_serves_every_slot_with_a_replica(redis_cluster):
    nodes = redis.Redis.from_url(redis_cluster.url).execute_command("CLUSTER NODES").values()
    primaries = {n["node_id"]: n for n in nodes if "master" in n["flags"]}
    assert sum(int(end) - int(start) + 1 for n in primaries.values()
               for start, end in n["slots"]) == 16384
    replicas = [n["master_id"] for n in nodes if "slave" in n["flags"] and n["connected"]]
    assert len(primaries) == 3 and sorted(replicas) == sorted(primaries)


def test_a_url_opens_the_database_and_names_keep_databases_apart(redis_names):
    url = redis_names.url + "/crawl?replicas=1"
    with DB(url, distance=3, blocks=5) as a, DB(redis_names.url + "/other", distance=2) as b:
        assert a.backend == "redis" and a.path == redis_names.url + "/crawl"
        a.insert_many([("x", 1), ("y", 3)])
        b.insert("x", 1 << 60)
        assert as_tuples(a.query(1)) == [("x", 1, 0), ("y", 3, 1)]
        assert as_tuples(b.query(1 << 60)) == [("x", 1 << 60, 0)] and len(b) == 1
        assert a.stats()["replicas"] == 1 and a.stats()["primaries"] == 3
    with pytest.raises(simhashdb_errors().InvalidArgumentError, match="unknown option"):
        DB(redis_names.url + "/crawl?leese=3")
    with pytest.raises(simhashdb_errors().InvalidArgumentError, match="lmdb backend"):
        DB(redis_names.url + "/crawl", backend="lmdb")


def test_a_url_of_several_seeds_opens_at_the_first_that_answers(redis_names):
    dead = "127.0.0.1:%d" % free_ports(1)[0]  # nothing listens there
    live = redis_names.url[len("redis://"):]
    url = "redis://%s,%s,%s/seeded" % (dead, live, dead)
    with DB(url + "?retry=3", distance=3, blocks=5) as db:  # (a refused seed is no failover)
        assert db.path == "redis://%s,%s/seeded" % (dead, live)
        db.insert("a", 1)
    with DB("redis://[::1]:%d,%s/seeded" % (free_ports(1)[0], live)) as db:
        assert db.path.startswith("redis://[::1]:") and len(db) == 1
    other = dead.replace("127.0.0.1", "localhost")
    with pytest.raises(DatabaseError, match=r"no Redis server answers at %s \(.*\), %s \("
                       % (dead, other)):
        DB("redis://%s,%s/seeded" % (dead, other))
    for bad in ("%s,127.0.0.1:port" % live, "%s,:0" % live, "%s,[::1" % live, "%s," % live):
        with pytest.raises(simhashdb_errors().InvalidArgumentError, match="host:port"):
            DB("redis://%s/seeded" % bad)


def simhashdb_errors():
    import simhashdb.errors
    return simhashdb.errors


def test_check_finds_a_bucket_damaged_behind_its_back(redis_names):
    url = redis_names.url + "/damaged"
    with DB(url, distance=3, blocks=5) as db:
        db.insert_many([("a", 1), ("b", 2 << 60)])
        key = storage_of(db).keys.bucket(3, storage_of(db).layout.table_values([2 << 60], 3)[0])
        cluster = redis.RedisCluster.from_url(redis_names.url)
        assert len(cluster.get(key)) == 6  # one entry: 6 bytes
        cluster.delete(key)
        cluster.close()
        problems = db.check()
        assert len(problems) == 1 and "table 3" in problems[0] and "1 missing" in problems[0]


def test_a_texts_band_entries_are_in_the_keys_the_package_documents(redis_names):
    """Band b's entry k << 32 | fp >> 32 is the rest of its bytes in the string
    of N:b<b><first bits>, sorted; the tables' scan leaves band keys alone."""
    from simhashdb.storage import BANDS, band_entries

    with DB(redis_names.url + "/banded", distance=3, blocks=5) as db:
        db.insert_text_many([("a", _text(1)), ("b", _text(2))])
        keys, cluster = storage_of(db).keys, redis.RedisCluster.from_url(redis_names.url)
        with storage_of(db).read() as view:
            values = [(v, records.value_fingerprint(v)) for _, v in view.documents()]
            for band in range(BANDS):
                entries = sorted({band_entries(v, fp)[band] for v, fp in values})
                assert view.band_entries(band) == entries
                for entry in entries:
                    bucket = cluster.get(keys.band_bucket(band, entry))
                    assert bucket[:len(bucket) // keys.width * keys.width] == bucket
                    assert entry.to_bytes(8, "big")[8 - keys.width:] in [
                        bucket[i:i + keys.width] for i in range(0, len(bucket), keys.width)]
        assert keys.band_bucket(3, 0xABCDEF12 << 32) == b"banded:b03" + b"abcdef12"[:keys.bits // 4]
        cluster.close()
        assert db.check() == []


CRAWLER = """
import json, sys, simhashdb
db = simhashdb.DB(sys.argv[1])
records = json.loads(sys.stdin.readline())
print("ready", flush=True)
sys.stdin.readline()  # all start at once
stored = []
for start in range(0, len(records), 3):
    batch = [tuple(r) for r in records[start:start + 3]]
    for record, found in zip(batch, db.insert_if_new_many(batch)):
        if not found:
            stored.append(record[0])
print(json.dumps(stored), flush=True)
"""


def test_concurrent_crawlers_never_store_two_near_duplicates(redis_names):
    """Four processes insert_if_new members of the same planted groups of
    near-duplicates at the same moment: each group ends with exactly one
    member, the one its crawler was told it stored."""
    rng = random.Random(13)
    url = redis_names.url + "/crawlers"
    groups = 60
    bases = [rng.getrandbits(64) for _ in range(groups)]
    assert min(bin(a ^ b).count("1") for i, a in enumerate(bases) for b in bases[i + 1:]) > 6
    with DB(url, distance=3, blocks=5):
        pass
    crawlers, records = [], {}
    for c in range(4):
        mine = []
        for g, base in enumerate(bases):  # each member within 3 bits of every other
            fp = flip(base, rng.sample(range(64), 1)) if c else base
            mine += [("g%d-c%d-%d" % (g, c, i), flip(fp, [i]) if i else fp) for i in range(2)]
        rng.shuffle(mine)
        records.update((key, fp) for key, fp in mine)
        crawler = spawn(CRAWLER, url)
        crawler.stdin.write(json.dumps(mine) + "\n")
        crawler.stdin.flush()
        assert crawler.stdout.readline().strip() == "ready", crawler.stderr.read()
        crawlers.append(crawler)
    for crawler in crawlers:
        crawler.stdin.write("go\n")
        crawler.stdin.flush()
    told = []
    for crawler in crawlers:
        out, err = crawler.communicate(timeout=120)
        assert crawler.returncode == 0, err
        told += json.loads(out)
    with DB(url) as db:
        stored = {r.key: r.fingerprint for r in db}
        assert sorted(stored) == sorted(told)
        by_group = {}
        for key in stored:
            by_group.setdefault(key.split("-")[0], []).append(key)
        assert sorted(by_group) == sorted("g%d" % g for g in range(groups))
        assert all(len(keys) == 1 for keys in by_group.values()), by_group
        assert db.check() == []
    for key, fp in records.items():  # the groups were near-duplicates indeed
        g = key.split("-")[0]
        assert bin(fp ^ stored[by_group[g][0]]).count("1") <= 3


HALF_WRITER = """
import os, signal, sys, simhashdb
from simhashdb.storage.redis import cluster, protocol, scripts
protocol.ROUND_BYTES = 1 << 14  # many small rounds
rounds = []
apply_round = cluster.Nodes.round
def round_then_die(self, requests):
    replies = apply_round(self, requests)
    if any(c[0] == "EVAL" and c[1] == scripts.MERGE for cs in requests.values() for c in cs):
        rounds.append(1)
        if len(rounds) == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)  # mid-batch: some buckets merged, not all
    return replies
db = simhashdb.DB(sys.argv[1])
cluster.Nodes.round = round_then_die
db.insert_many([("new%d" % i, (i * 0x9E3779B97F4A7C15) % 2**64) for i in range(3000)])
"""


@pytest.mark.parametrize("rounds", [1, 4])
def test_a_writer_killed_mid_batch_leaves_a_batch_the_next_one_finishes(redis_names, rounds):
    url = redis_names.url + "/half?lease=1"
    with DB(url, distance=3, blocks=5) as db:
        db.insert_many([("old%d" % i, i << 20) for i in range(100)])
    child = spawn(HALF_WRITER, url, rounds)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    meta = redis.RedisCluster.from_url(redis_names.url)
    assert meta.get("{half}:pending") is not None
    assert int(meta.get("{half}:epoch")) % 2 == 1  # readers wait; the next lock holder finishes
    meta.close()
    docs = dict([("old%d" % i, i << 20) for i in range(100)]
                + [("new%d" % i, (i * 0x9E3779B97F4A7C15) % 2**64) for i in range(3000)])
    with DB(url) as db:  # its first read waits out the dead writer's lease, then finishes
        assert len(db) == 3100 and db.check() == []
        assert {r.key: r.fingerprint for r in db} == docs
        for probe in (docs["old7"] ^ 0b11, docs["new7"] ^ (1 << 63)):
            assert as_tuples(db.query(probe)) == brute_force(docs, probe, 3)


HALF_TEXT_WRITER = """
import os, random, signal, sys, simhashdb
from simhashdb.storage.redis import cluster, protocol, scripts
protocol.ROUND_BYTES = 1 << 14  # many small rounds
def text(seed):
    rng = random.Random(seed)
    return " ".join("w%d" % rng.randrange(3000) for _ in range(60))
sys.path.insert(0, sys.argv[3])
from conftest import storage_of
db = simhashdb.DB(sys.argv[1])
band_key = storage_of(db).keys.bands[0][:-2]  # N:b
rounds = []
apply_round = cluster.Nodes.round
def round_then_die(self, requests):
    replies = apply_round(self, requests)
    if any(c[0] == "EVAL" and c[1] == scripts.MERGE and band_key in c[5]
           for cs in requests.values() for c in cs):
        rounds.append(1)
        if len(rounds) == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)  # some bands' buckets merged, not all
    return replies
cluster.Nodes.round = round_then_die
db.insert_text_many([("old%d" % i, text(1000 + i)) for i in range(200)]
                    + [("new%d" % i, text(2000 + i)) for i in range(300)])
"""


def _text(seed):
    rng = random.Random(seed)
    return " ".join("w%d" % rng.randrange(3000) for _ in range(60))


@pytest.mark.parametrize("rounds", [1, 5])
def test_a_writer_killed_mid_batch_leaves_band_entries_the_next_one_finishes(redis_names,
                                                                             rounds):
    """A batch that replaces texts (their band entries go, but for those a
    twin still has) and stores new ones, killed when some of its bands'
    buckets had landed: the next writer lands the rest, so the band index
    holds exactly the entries of the stored texts."""
    from simhashdb.storage import BANDS, band_entries

    url = redis_names.url + "/halftext?lease=1"
    with DB(url, distance=3, blocks=5) as db:
        db.insert_text_many([("old%d" % i, _text(i)) for i in range(200)]
                            + [("twin%d" % i, _text(i)) for i in range(50)])
    child = spawn(HALF_TEXT_WRITER, url, rounds, os.path.dirname(__file__))
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    meta = redis.RedisCluster.from_url(redis_names.url)
    assert meta.get("{halftext}:pending") is not None

    def band_buckets():
        return len(list(meta.scan_iter(match="halftext:b*", count=1000)))
    half = band_buckets()
    with DB(url) as db:  # its first read waits out the dead writer's lease, then finishes
        assert len(db) == 550 and db.check() == []
        assert 0 < half < band_buckets()  # the bands were half written
        meta.close()
        with storage_of(db).read() as view:
            expected = [set() for _ in range(BANDS)]
            for key, value in view.documents():
                for band, entry in enumerate(band_entries(value, records.value_fingerprint(
                        value))):
                    expected[band].add(entry)
            assert all(sorted(view.band_entries(band)) == sorted(expected[band])
                       for band in range(BANDS))
        assert [m.key for m in db.query_text(_text(2007))] == ["new7"]
        assert [m.key for m in db.query_text(_text(1007))] == ["old7"]
        assert sorted(m.key for m in db.query_text(_text(7))) == ["twin7"]  # kept its entries
        assert db.query_text(_text(107)) == []  # replaced, its entries gone


def test_a_writer_stalled_past_its_lease_lands_nothing_over_a_later_batch(redis_names):
    """A writer that renewed its lock, then stalled (a pause, a slow network)
    past its lease before its round arrived: the next writer finished the
    stalled batch and wrote a later one; the round's fenced writes are refused,
    so the later batch stands, and the stalled writer's call still returns (its
    batch did land whole)."""
    url = redis_names.url + "/fenced?lease=0.5"
    with DB(url, distance=3, blocks=5) as stalled, DB(url) as other:
        stalled.insert("base", 7)
        nodes, stalling, resume = storage_of(stalled).nodes, threading.Event(), threading.Event()
        send = nodes.round

        def round_after_a_stall(requests):
            writes = [c for cs in requests.values() for c in cs
                      if c[0] == "EVAL" and c[1] in (scripts.MERGE, scripts.HWRITE)]
            if writes and not stalling.is_set():
                stalling.set()
                resume.wait(30)
            return send(requests)
        nodes.round = round_after_a_stall
        outcome = []
        writer = threading.Thread(target=lambda: outcome.append(
            stalled.insert_many([("gone", 1 << 40), ("moved", 5)])))
        writer.start()
        assert stalling.wait(10)
        time.sleep(1)  # the stalled writer's lease ends
        other.delete("gone")  # lands the stalled batch first, then this one
        other.insert("moved", 1 << 50)
        resume.set()
        writer.join(30)
        assert outcome == [2]
        docs = {"base": 7, "moved": 1 << 50}
        assert {r.key: r.fingerprint for r in other} == docs and len(other) == 2
        assert other.check() == []
        for probe in (1 << 40, 5, (1 << 50) ^ 3):
            assert as_tuples(other.query(probe)) == brute_force(docs, probe, 3)


def test_a_read_slower_than_the_writers_pace_still_finishes(redis_names):
    """A writer landing batch after batch would starve a reader that retries
    whenever a batch lands under it; after three tries the reader holds new
    batches back, reads, and lets them go."""
    url = redis_names.url + "/starved"
    with DB(url, distance=3, blocks=5) as reader, DB(url) as writer:
        seeds = {"seed%d" % i: (i * 0x9E3779B97F4A7C15) % 2**64 for i in range(50)}
        reader.insert_many(seeds.items())
        search = storage_of(reader).search_committed

        def slow_search(probes, distance):
            time.sleep(0.3)  # far longer than a batch
            return search(probes, distance)
        storage_of(reader).search_committed = slow_search
        stop, landed = threading.Event(), []

        def write():
            while not stop.is_set():
                writer.insert("w%d" % len(landed), random.getrandbits(64))
                landed.append(1)
        thread = threading.Thread(target=write)
        thread.start()
        try:
            while len(landed) < 3:
                time.sleep(0.01)
            probes, answers = list(seeds.values()), []
            query = threading.Thread(target=lambda: answers.extend(reader.query_many(probes)),
                                     daemon=True)
            query.start()
            query.join(30)
            assert answers, "the reader starved"
            everything = {r.key: r.fingerprint for r in writer}
            assert [sorted(m.key for m in ms) for ms in answers] == [
                sorted(k for k, _, _ in brute_force(everything, p, 3)) for p in probes]
            before = len(landed)
            time.sleep(0.5)
            assert len(landed) > before  # the writer was let go again
        finally:
            stop.set()
            thread.join(30)


def test_a_text_removed_while_a_query_reads_it_is_read_again_not_damage(redis_names):
    """A batch landing between a text query's search and its read of the
    hits' signatures makes the query read again (Redis keeps no snapshots),
    never report the missing document as damage."""
    url = redis_names.url + "/torn"
    text = "the crawler keeps every page it has seen " * 20
    with DB(url, distance=3, blocks=5) as reader, DB(url) as writer:
        reader.insert_text("page", text)
        hash_fields, removed = storage_of(reader).hash_fields, []

        def removing_first(kind, names, by_fingerprint):
            if kind == b"d" and not removed:  # the signatures' read: the page goes first
                writer.delete("page")
                removed.append(True)
            return hash_fields(kind, names, by_fingerprint)
        storage_of(reader).hash_fields = removing_first
        assert reader.query_text_many([text]) == [[]] and removed


BUSY_WRITER = """
import random, sys, simhashdb
db = simhashdb.DB(sys.argv[1])
print("open", flush=True)
i = 0
while True:
    db.insert("busy%d" % i, random.getrandbits(64))
    i += 1
"""


def test_a_writer_in_a_loop_cannot_keep_the_lock_from_another(redis_names):
    """A writer releasing the lock and asking again at once would win nearly
    every time against one polling for it (without the queue the busy writer
    got no turn at all while this one wrote 20 batches); a waiting writer
    queues for the next turn instead, so the two take turns."""
    url = redis_names.url + "/turns"
    with DB(url, distance=3, blocks=5) as db:
        busy = spawn(BUSY_WRITER, url)
        try:
            assert busy.stdout.readline().strip() == "open"
            while len(db) < 20:
                time.sleep(0.01)
            before = len(db)
            for i in range(20):
                db.insert("other%d" % i, random.getrandbits(64))
            busy_turns = len(db) - before - 20
        finally:
            busy.kill()
            busy.wait()
        assert busy_turns >= 5  # about one busy turn between two of ours (49-60 when loaded)
        assert sum(r.key.startswith("other") for r in db) == 20

FAILOVER_WRITER = """
import sys, simhashdb
db = simhashdb.DB(sys.argv[1])
print("open", flush=True)
i = 0
while True:
    db.insert_many([("w%d-%d" % (i, j), (i * 1000 + j) * 0x9E3779B97F4A7C15 % 2**64)
                    for j in range(100)])
    print(i, flush=True)
    i += 1
"""
FAILOVER_READER = """
import sys, time, simhashdb
db = simhashdb.DB(sys.argv[1], readonly=True)
probes = [int(p) for p in sys.argv[2:]]
print("open", flush=True)
while True:  # the monotonic clock is the machine's: the test compares it with its own
    begin = time.monotonic()
    hits = db.query_many(probes)
    assert [[m.key for m in ms] for ms in hits] == [["seed%d" % i] for i in range(len(probes))]
    print("%.3f %.3f" % (begin, time.monotonic()), flush=True)
"""


def through_a_fault(cluster, url, fault):
    """Store seeds at ``url``, start a writer and a reader on it, call
    ``fault(meta)`` with the port of the primary of the database's own slot
    (lock, pending batch, epoch) after 1.5 s and give them 1.5 s more; then
    check that every acknowledged batch is there and that queries were and
    are exact. Returns the longest a query waited counted from the moment
    ``fault`` was called."""
    rng = random.Random(3)
    seeds = {"seed%d" % i: rng.getrandbits(64) for i in range(150)}
    with DB(url, distance=3, blocks=5) as db:
        db.insert_many(seeds.items())
        meta = storage_of(db).nodes.owner(storage_of(db).keys.params)[1]
    writer = spawn(FAILOVER_WRITER, url)
    reader = spawn(FAILOVER_READER, url, *seeds.values())
    assert writer.stdout.readline().strip() == "open"
    assert reader.stdout.readline().strip() == "open"
    time.sleep(1.5)
    faulted_at = time.monotonic()
    fault(meta)
    time.sleep(1.5)
    killed_at = time.monotonic()
    for child in (writer, reader):
        child.send_signal(signal.SIGKILL)
    out, err = writer.communicate()
    acknowledged = [int(line) for line in out.split()[1:]]
    out, err = reader.communicate()
    assert reader.returncode == -signal.SIGKILL, err  # no query answered wrong
    times = [tuple(map(float, line.split())) for line in out.split("\n")[1:] if line]
    assert [i for i in acknowledged if i > 0], (out, err, times[:3], times[-3:], faulted_at)
    with DB(url) as db:
        docs = {r.key: r.fingerprint for r in db}
        for i in acknowledged:
            for j in range(0, 100, 3):
                assert docs["w%d-%d" % (i, j)] == (i * 1000 + j) * 0x9E3779B97F4A7C15 % 2**64
        assert len(docs) % 100 == 50 and db.check() == []  # whole batches
        probes = [fp ^ 0b1011 for fp in list(docs.values())[::50]]
        assert [as_tuples(m) for m in db.query_many(probes, 4)] == \
            [brute_force(docs, p, 4) for p in probes]
    assert any(begin > faulted_at for begin, _ in times)
    return max([end - max(begin, faulted_at) for begin, end in times if end > faulted_at]
               + [killed_at - times[-1][1]])  # the query it was running


def promoted(cluster, port):
    """Wait until a replica took over from the primary of ``port``."""
    began = time.monotonic()
    while port in cluster.primaries() or len(cluster.primaries()) < 3:
        assert time.monotonic() - began < 20, "no replica took over"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_primary_that_hangs_or_dies_is_failed_over_within_seconds_losing_nothing(tmp_path):
    """SIGSTOP, then SIGKILL, the primary of the database's own slot while a
    writer and a reader run: calls fail over as soon as its replica is
    promoted (~2.5 s with the cluster's 1 s node timeout; a hung primary
    stalled them for the 10 s socket timeout), none is lost or wrong; a
    handle opened just after the hang, whose connections to the hung
    primary are new, answers as soon (its handshake waited for the socket
    timeout). A URL of several seeds opens while its first seed hangs, and
    while it is dead."""
    cluster = LocalCluster(tmp_path).start()
    seeds = ",".join("127.0.0.1:%d" % port for port in cluster.ports)
    faulted, opened = [], []

    def fault(down, url=None):
        def down_until_replaced(meta):
            down(meta)
            faulted.append(meta)
            if url:
                began = time.monotonic()
                with DB(url) as db:
                    assert len(db) >= 150
                opened.append(time.monotonic() - began)
            promoted(cluster, meta)
        return down_until_replaced
    try:
        url = "redis://%s/hang?lease=2" % seeds
        assert through_a_fault(cluster, url, fault(cluster.pause, url)) < 5
        assert opened[0] < 5
        first = "127.0.0.1:%d" % faulted[0]
        others = seeds.replace(first, "").strip(",")
        for down in (cluster.pause, cluster.kill):  # hung (it still is), then dead
            down(faulted[0])
            with DB("redis://%s,%s/hang" % (first, others)) as db:
                assert db.path == "redis://%s,%s/hang" % (first, others)
                assert len(db) % 100 == 50
        with pytest.raises(DatabaseError, match="no Redis server answers at " + first):
            DB("redis://%s/hang" % first)
        cluster.start_node(faulted[0])  # back as the replica of its replica
        cluster.wait_healthy()
        assert through_a_fault(cluster, "redis://%s/killed?lease=2" % seeds,
                               fault(cluster.kill)) < 10
    finally:
        cluster.stop()


@pytest.fixture
def lone_server(tmp_path):
    """A single Redis server (not a cluster, no replicas): (port, process)."""
    port = free_ports(1)[0]
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis(port=port).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    yield port, process
    if process.poll() is None:
        process.terminate()
        process.wait()


def test_a_single_server_holds_a_database_and_a_dead_one_is_a_clear_error(lone_server):
    port, process = lone_server
    url = "redis://127.0.0.1:%d/lone?retry=1" % port
    rng = random.Random(8)
    docs = {i: rng.getrandbits(64) for i in range(2000)}
    with DB(url, distance=3, blocks=6) as db:
        assert db.stats()["replicas"] == 0 and db.stats()["primaries"] == 1
        db.insert_many(docs.items())
        probes = [fp ^ 0b111 for fp in list(docs.values())[:100]]
        assert [as_tuples(m) for m in db.query_many(probes)] == \
            [brute_force(docs, p, 3) for p in probes]
        process.kill()
        process.wait()
        start = time.monotonic()
        with pytest.raises(DatabaseError, match="within 1 s"):
            db.query(1)
        with pytest.raises(DatabaseError, match="within 1 s"):
            db.insert("late", 1)
        assert time.monotonic() - start < 15


def test_a_hung_server_is_an_error_naming_it_within_seconds(lone_server, capsys):
    """A server that accepts connections but never answers (SIGSTOP), with no
    replica to take over: a call, and an open (whose handshake redis-py
    waited for the whole socket timeout), give up after ?retry= with a
    NodeTimeoutError that names the node and what to do."""
    port, process = lone_server
    url = "redis://127.0.0.1:%d/hung?retry=0.5&timeout=1" % port
    node = "127.0.0.1:%d does not answer" % port
    with DB(url, distance=3, blocks=5) as db:
        db.insert("a", 1)
        process.send_signal(signal.SIGSTOP)
        try:
            for call in (lambda: db.query(1), lambda: DB(url)):
                start = time.monotonic()
                with pytest.raises(NodeTimeoutError, match=node + ".*resume or restart it"):
                    call()
                assert time.monotonic() - start < 4
            assert cli.main(["stats", url]) == 1
            err = capsys.readouterr().err
            assert node in err and len(err.strip().splitlines()) == 1
        finally:
            process.send_signal(signal.SIGCONT)
        assert len(db) == 1


def test_a_damaged_or_foreign_layout_record_is_a_clear_error(redis_names):
    meta = redis.RedisCluster.from_url(redis_names.url)
    for record in (b"\xc1", msgpack.packb({"bucket_bits": 100, "blocks": 5, "distance": 3}),
                   msgpack.packb({"bucket_bits": 16, "blocks": 6, "distance": 3})):
        meta.set("{laid}:layout", record)
        with pytest.raises(DatabaseError, match="damaged|created with blocks=6"):
            DB(redis_names.url + "/laid", distance=3, blocks=5)
    meta.close()


def test_a_damaged_pending_batch_is_a_clear_error(redis_names):
    url = redis_names.url + "/pend?lease=1"
    with DB(url, distance=3, blocks=5) as db:
        db.insert("a", 1)
        meta = redis.RedisCluster.from_url(redis_names.url)
        meta.set("{pend}:pending", b"\xc1")
        meta.close()
        with pytest.raises(DatabaseError, match="pending batch .* is damaged"):
            db.insert("b", 2)


def test_a_name_with_a_colon_is_refused_since_keys_are_name_colon(redis_names):
    with pytest.raises(simhashdb_errors().InvalidArgumentError, match="without"):
        DB(redis_names.url + "/crawl:d", distance=3)


def test_a_handle_whose_database_vanished_raises_instead_of_answering_or_writing(redis_names):
    """A server restarted without persistence, or a FLUSHALL: the handle must not
    answer "nothing stored" nor write into a database made anew with other settings."""
    url = redis_names.url + "/vanishing"
    with DB(url, distance=4, blocks=7) as db, DB(url) as reader:
        db.insert_many((i, i * 0x9E3779B97F4A7C15 % 2**64) for i in range(200))
        assert len(reader) == 200
        redis_names.flush()
        for handle in (db, reader):
            with pytest.raises(DatabaseError, match="gone or was created anew"):
                handle.query(5)
            with pytest.raises(DatabaseError, match="gone or was created anew"):
                len(handle)
        with pytest.raises(DatabaseError, match="gone or was created anew"):
            db.insert("late", 1)
        with DB(url, distance=3, blocks=5) as anew:  # another client starts afresh
            anew.insert("fresh", 2)
            with pytest.raises(DatabaseError, match="gone or was created anew"):
                reader.get("fresh")
            assert [r.key for r in anew] == ["fresh"]


def test_a_flushall_that_reached_some_nodes_is_a_database_error_not_a_value_error(redis_names):
    """FLUSHALL reaches a cluster's nodes one after another: a batch that reads
    a document but not its fingerprint index entry raises DatabaseError (it
    raised list.remove's ValueError), and so does a database whose
    parameters are gone (it was opened as a new one)."""
    url = redis_names.url + "/halfgone"
    rng = random.Random(11)
    docs = [("k%d" % i, rng.getrandbits(64)) for i in range(300)]
    with DB(url, distance=3, blocks=5) as db:
        db.insert_many(docs)
        meta = storage_of(db).nodes.owner(storage_of(db).keys.params)[1]
        for port in redis_names.primaries():  # all but the node of {halfgone}:...
            if port != meta:
                with redis_names.client(port) as client:
                    client.flushall()
        for write in (lambda: db.delete_many([key for key, _ in docs]),
                      lambda: db.insert_many((key, fp ^ 1) for key, fp in docs),
                      lambda: db.insert_if_new_many((key, fp ^ 1) for key, fp in docs)):
            with pytest.raises(DatabaseError, match="missing from the fingerprint index"):
                write()
        redis_names.client(meta).delete(b"{halfgone}:params")
        with pytest.raises(DatabaseError, match="parameters, {halfgone}:params, are missing"):
            DB(url)
        redis_names.flush()
        with pytest.raises(DatabaseError, match="gone or was created anew"):
            db.delete_many([key for key, _ in docs])


def test_a_hung_replica_holds_writes_up_only_until_the_cluster_flags_it(redis_names):
    """A SIGSTOPped replica stays listed by its primary (ROLE) for a minute,
    so writes waited for it and failed after ?retry=; once the cluster flags
    it as failing they go on without it, and wait for it again when it is back."""
    url = redis_names.url + "/replicahang"
    with DB(url, distance=3, blocks=5) as db:
        db.insert("a", 1)
        meta = storage_of(db).nodes.owner(storage_of(db).keys.params)
        replica = next(port for port in redis_names.ports if port != meta[1] and redis_names.client(
            port).info("replication").get("master_port") == meta[1])
        redis_names.pause(replica)
        try:
            began = time.monotonic()
            db.insert_many(("b%d" % i, i << 20) for i in range(100))
            assert time.monotonic() - began < 10  # the node timeout (1 s) and a WAIT
            assert len(db) == 101 and as_tuples(db.query(3 << 20, 0)) == [("b3", 3 << 20, 0)]
        finally:
            redis_names.resume(replica)
        redis_names.wait_healthy()
        time.sleep(1.1)
        db.insert("c", 2)
        assert storage_of(db).nodes.replicas_of[meta] == 1  # waited for again


def test_a_damaged_count_or_epoch_is_a_database_error(redis_names):
    url = redis_names.url + "/counted"
    with DB(url, distance=3, blocks=5) as db:
        db.insert("a", 1)
        meta = redis.RedisCluster.from_url(redis_names.url)
        for key in (b"{counted}:count", b"{counted}:distinct", b"{counted}:epoch"):
            kept = meta.get(key)
            for damage in (b"\xad2\xba", b"-4"):  # int() refused it; len() refused -4
                meta.set(key, damage)
                with pytest.raises(DatabaseError, match="holds .* not a count"):
                    db.insert("b", 2)
                if key != b"{counted}:distinct":  # what len() reads
                    with pytest.raises(DatabaseError, match="holds .* not a count"):
                        len(db)
            meta.set(key, kept)
        meta.close()
        assert len(db) == 1 and db.check() == []


def test_an_odd_epoch_without_a_pending_batch_is_an_error_not_an_endless_loop(redis_names):
    """Readers finished the pending batch of a dead writer until the epoch was
    even: with the pending batch gone (a deleted key) they looped for ever."""
    with DB(redis_names.url + "/odd", distance=3, blocks=5) as db:
        db.insert("a", 1)
        meta = redis.RedisCluster.from_url(redis_names.url)
        meta.incr(b"{odd}:epoch")
        meta.close()
        for call in (lambda: len(db), lambda: db.insert("b", 2)):
            assert "is odd with no batch pending" in error_within(10, call)


def test_fences_left_by_a_flushall_of_some_nodes_are_an_error_not_an_endless_loop(redis_names):
    """A FLUSHALL of the node of a database's own slot (its epoch) but not of
    the others (their fences): the database made anew there had each write
    refused by a fence above its epoch, and its writers, taking the refusal
    for another writer's takeover, tried again for ever."""
    url = redis_names.url + "/refenced"
    with DB(url, distance=3, blocks=5) as db:
        for i in range(5):
            db.insert_many(("k%d-%d" % (i, j), (i * 1000 + j) * 0x9E3779B97F4A7C15 % 2**64)
                           for j in range(100))
        meta = storage_of(db).nodes.owner(storage_of(db).keys.params)[1]
    with redis_names.client(meta) as client:
        client.flushall()
    with DB(url, distance=3, blocks=5) as anew:
        assert "fences are ahead of its epoch" in error_within(10, lambda: anew.insert_many(
            ("n%d" % j, j * 0x9E3779B97F4A7C15 % 2**64) for j in range(200)))


def error_within(seconds, call):
    """The message of the SimhashDBError that ``call()`` raises within ``seconds``."""
    outcome = []

    def run():
        with pytest.raises(simhashdb_errors().SimhashDBError) as raised:
            call()
        outcome.append(str(raised.value))
    thread = threading.Thread(target=run, daemon=True)  # left looping where it would
    thread.start()
    thread.join(seconds)
    assert outcome, "still running after %g s" % seconds
    return outcome[0]
