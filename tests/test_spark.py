"""simhashdb.spark on a local[2] session, against brute force, the in-memory
functions and the database; with signatures, the text rule against the
pair-at-a-time oracle of tests/test_text_rule.py, matching.text_pairs and the
database of texts. Data is kept small (tens of thousands of fingerprints, a
few hundred texts): tools/bench_spark.py compares at 1M and more."""

import io
import json
import random
import sys
from decimal import Decimal

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install '.[spark]'")
import pyarrow as pa  # noqa: E402  (the spark extra brings it)
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

import simhashdb
from simhashdb import _ext, cli, matching
from simhashdb import spark as sspark
from simhashdb.spark import incremental as spark_incremental, scan as spark_scan, text as spark_text
from simhashdb.layout import Layout
from test_signature_width import as_made_before_format_10
from test_text_rule import THRESHOLD, components, corpus as text_corpus, oracle
from warcio.warcwriter import WARCWriter  # noqa: E402  (the test extra brings it)

pytestmark = pytest.mark.slow  # a Spark session starts in ~20 s
DISTANCE, BLOCKS = 3, 5
MAX = 2**64 - 1


@pytest.fixture(scope="module")
def spark():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)  # the workers run this Python
        session = (SparkSession.builder.master("local[2]").appName("simhashdb-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   # the JIT's first tier only: these jobs are short, so the driver's
                   # optimizing compiler never paid back the core it took (the JVM
                   # used half the CPU time, 35 s against 66 s, for 5 of the tests);
                   # that tier alone gets a code cache of 48 MB, which the module's
                   # jobs once filled ("CodeCache is full"), and the JVM then died
                   .config("spark.driver.extraJavaOptions",
                           "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m")
                   .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()


def flip(fp, bits):
    for b in bits:
        fp ^= 1 << b
    return fp


def corpus(n, seed):
    """Random fingerprints and near copies of a tenth of them: 0 to k+1 bits
    flipped anywhere or packed into one block; 0, 2**64-1 and 2**63 with
    neighbours; exact copies (under other keys)."""
    rng = random.Random(seed)
    layout = Layout(BLOCKS, DISTANCE)
    fps = [rng.getrandbits(64) for _ in range(n)] + [0, MAX, 1 << 63, (1 << 63) - 1, 7, MAX ^ 7]
    for _ in range(n // 10):
        base = rng.choice(fps)
        for _ in range(rng.randint(1, 3)):
            count = rng.randint(0, DISTANCE + 1)
            if rng.random() < 0.5:
                block = rng.randrange(BLOCKS)
                low = 64 - sum(layout.widths[:block + 1])
                bits = rng.sample(range(low, low + layout.widths[block]), count)
            else:
                bits = rng.sample(range(64), count)
            fps.append(flip(base, bits))
    rng.shuffle(fps)
    return fps


def brute_force(fps, distance=DISTANCE):
    """Every (i, j, distance), i < j, of positions within ``distance``."""
    values = np.array(fps, dtype=np.uint64)
    pairs = set()
    for i in range(len(values) - 1):
        between = np.bitwise_count(values[i] ^ values[i + 1:])
        for j in np.flatnonzero(between <= distance):
            pairs.add((i, i + 1 + int(j), int(between[j])))
    return pairs


def frame(spark, keys, fps, kind="long"):
    """A DataFrame of (key, fingerprint), the fingerprint as ``kind``."""
    column = pa.array(fps, pa.uint64())
    if kind == "long":
        column = column.cast(pa.int64(), safe=False)
    elif kind == "decimal":
        column = column.cast(pa.decimal128(20, 0))
    else:
        column = pa.array([fp.to_bytes(8, "big") for fp in fps], pa.binary())
    return spark.createDataFrame(pa.table({"key": keys, "fingerprint": column}))


def signed(fp):
    """A fingerprint as Spark's LongType holds it."""
    return fp - (1 << 64) if fp >> 63 else fp


def rows(df):
    return [tuple(r) for r in df.collect()]


def expected_pairs(keys, fps):
    return {(min(keys[i], keys[j]), max(keys[i], keys[j]), d) for i, j, d in brute_force(fps)}


def expected_clusters(keys, fps):
    """key -> smallest key of its component, by union-find over brute force."""
    parent = list(range(len(fps)))

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for i, j, _ in brute_force(fps):
        parent[max(root(i), root(j))] = min(root(i), root(j))
    smallest = {}
    for i, k in enumerate(keys):
        r = root(i)
        smallest[r] = min(smallest.get(r, k), k)
    return {k: smallest[root(i)] for i, k in enumerate(keys)}


def test_find_all_equals_brute_force_the_database_and_in_memory(spark, tmp_path):
    fps = corpus(20_000, seed=1)
    keys = list(range(len(fps)))
    got = rows(sspark.find_all(frame(spark, keys, fps), DISTANCE, BLOCKS))
    assert len(got) == len(set(got)), "a pair was reported twice"
    expected = expected_pairs(keys, fps)
    assert any(d == 0 for _, _, d in expected) and any(d == DISTANCE for _, _, d in expected)
    assert set(got) == expected
    values = {(min(fps[a], fps[b]), max(fps[a], fps[b])) for a, b, _ in got}
    assert values == set(simhashdb.find_all(fps, BLOCKS, DISTANCE))
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, blocks=BLOCKS) as db:
        db.insert_many(zip(keys, fps))
        assert set(db.find_all()) == expected


def test_clusters_and_dedupe_equal_the_database_whatever_the_partitioning(spark, tmp_path):
    fps = corpus(20_000, seed=2)
    keys = ["doc%06d" % i for i in range(len(fps))]
    df = frame(spark, keys, fps)
    expected = expected_clusters(keys, fps)
    got = dict(rows(sspark.clusters(df, DISTANCE, BLOCKS)))
    assert got == expected
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, blocks=BLOCKS) as db:
        db.insert_many(zip(keys, fps))
        for cluster in db.clusters():
            assert {got[k] for k in cluster} == {cluster[0]}
    fp_of = dict(zip(keys, fps))
    in_memory = {tuple(sorted({fp_of[k] for k in members})) for members in _groups(got).values()}
    assert {c for c in in_memory if len(c) > 1} == \
        {tuple(c) for c in simhashdb.find_clusters(fps, BLOCKS, DISTANCE)}
    kept = sorted((k, signed(fp)) for k, fp in zip(keys, fps) if expected[k] == k)
    assert len(kept) < len(keys)
    for parts in (1, 7):
        shuffled = df.repartition(parts).orderBy("fingerprint")
        deduped = sspark.dedupe(shuffled, DISTANCE, BLOCKS)
        assert deduped.columns == df.columns
        assert sorted(rows(deduped)) == kept


def _groups(clusters):
    groups = {}
    for key, cluster in clusters.items():
        groups.setdefault(cluster, []).append(key)
    return groups


def test_a_hot_prefix_is_split_and_no_pair_across_parts_is_lost(spark, monkeypatch):
    """10,000 fingerprints under one prefix of table 0, a dense template
    cluster of 742 among them, and near copies across the group; 3,000 under
    another prefix (split in fewer parts)."""
    rng = random.Random(3)
    fps = []
    for size in (10_000, 3_000):
        prefix = rng.getrandbits(26) << 38   # table 0 leads with blocks 0 and 1: 26 bits
        hot = [prefix | rng.getrandbits(38) for _ in range(size)]
        template = prefix | rng.getrandbits(38)
        hot += [template] + [flip(template, [a]) for a in range(38)] + \
            [flip(template, [a, b]) for a in range(38) for b in range(a)]
        hot += [flip(rng.choice(hot), rng.sample(range(38), rng.randint(1, 4)))
                for _ in range(size // 5)]
        fps += hot
    fps += [rng.getrandbits(64) for _ in range(2000)]
    keys = list(range(len(fps)))
    df = frame(spark, keys, fps)
    found = []

    def recording(*args):
        groups = real(*args)
        found.extend(groups)
        return groups
    real = spark_scan._hot_groups
    monkeypatch.setattr(spark_scan, "_hot_groups", recording)
    got = rows(sspark.find_all(df, DISTANCE, BLOCKS, split=500))
    parts = sorted(parts for t, _, parts, _ in found if t == 0)
    assert len(parts) == 2 and 5 <= parts[0] < parts[1], found
    assert len(got) == len(set(got))
    expected = expected_pairs(keys, fps)
    assert len(expected) > 40_000
    assert set(got) == expected
    assert dict(rows(sspark.clusters(df, DISTANCE, BLOCKS, split=500))) == \
        expected_clusters(keys, fps)


@pytest.mark.parametrize("kind,make_key", [
    ("long", lambda i: i),
    ("decimal", lambda i: "k%d" % (i * 7919 % 10007)),
    ("binary", lambda i: (i * 7919 % 10007).to_bytes(2, "big") + b"\xff"),
])
def test_fingerprint_column_types(spark, kind, make_key):
    fps = corpus(2_000, seed=4) + [0, MAX, 1 << 63, MAX ^ 1]
    keys = [make_key(i) for i in range(len(fps))]
    df = frame(spark, keys, fps, kind).withColumnsRenamed({"key": "url", "fingerprint": "hash"})
    options = {"key": "url", "fingerprint": "hash"}
    assert set(rows(sspark.find_all(df, DISTANCE, BLOCKS, **options))) == \
        expected_pairs(keys, fps)
    deduped = sspark.dedupe(df, DISTANCE, BLOCKS, **options)
    assert deduped.schema == df.schema
    clusters = expected_clusters(keys, fps)
    assert sorted(rows(deduped)) == sorted(r for r in rows(df) if clusters[r[0]] == r[0])


def test_long_chains_and_no_pairs(spark):
    """Two paths of 300 fingerprints, each 2 bits from the next, keys in no
    order along them: one cluster each, named by its smallest key."""
    rng = random.Random(5)
    fps = []
    for _ in range(2):
        fp = rng.getrandbits(64)
        for _ in range(300):
            fp = flip(fp, rng.sample(range(64), 2))
            fps.append(fp)
    keys = rng.sample(range(10**6), len(fps))
    got = dict(rows(sspark.clusters(frame(spark, keys, fps), DISTANCE, BLOCKS)))
    assert got == expected_clusters(keys, fps)
    assert len(set(got.values())) == 2
    lonely = [0xFF << i for i in range(0, 64, 8)]   # 16 bits apart from each other
    keys = list(range(len(lonely)))
    assert dict(rows(sspark.clusters(frame(spark, keys, lonely), DISTANCE))) == \
        {k: k for k in keys}


def test_bad_input_raises_simhashdb_errors_at_the_call(spark):
    schema = "key string, fingerprint long"
    good = spark.createDataFrame([("a", 1), ("b", 3)], schema)
    cases = [
        (spark.createDataFrame([("a", 1), ("b", None)], schema), {},
         simhashdb.InvalidFingerprintError),
        (spark.createDataFrame([(None, 1)], schema), {}, simhashdb.InvalidKeyError),
        (spark.createDataFrame([("a", Decimal(2**64))], "key string, fingerprint decimal(20,0)"),
         {}, simhashdb.InvalidFingerprintError),
        (spark.createDataFrame([("a", Decimal(-1))], "key string, fingerprint decimal(20,0)"),
         {}, simhashdb.InvalidFingerprintError),
        (spark.createDataFrame([("a", b"1234567")], "key string, fingerprint binary"), {},
         simhashdb.InvalidFingerprintError),
        (spark.createDataFrame([("a", 1.0)], "key string, fingerprint double"), {},
         simhashdb.InvalidArgumentError),
        (spark.createDataFrame([([1], 1)], "key array<int>, fingerprint long"), {},
         simhashdb.InvalidArgumentError),
        (good, {"fingerprint": "fp"}, simhashdb.InvalidArgumentError),
        (good, {"distance": 64}, simhashdb.InvalidArgumentError),
        (good, {"distance": 3, "blocks": 3}, simhashdb.InvalidArgumentError),
        (good, {"split": 1}, simhashdb.InvalidArgumentError),
        ([("a", 1)], {}, simhashdb.InvalidArgumentError),
    ]
    for df, options, error in cases:
        with pytest.raises(error) as caught:
            sspark.find_all(df, **options)
        assert isinstance(caught.value, simhashdb.SimhashDBError)
    for function in (sspark.clusters, sspark.dedupe):
        with pytest.raises(simhashdb.InvalidFingerprintError):
            function(cases[0][0])
        with pytest.raises(simhashdb.InvalidArgumentError):
            function(good, split=1)
    assert rows(sspark.find_all(good, distance=1)) == [("a", "b", 1)]


def test_parquet_between_a_database_and_spark(spark, tmp_path):
    fps = corpus(2_000, seed=6)
    keys = ["url/%d" % i for i in range(len(fps))]
    with simhashdb.DB(str(tmp_path / "crawl.db"), distance=DISTANCE, blocks=BLOCKS) as db:
        db.insert_many((k, fp, {"n": i} if i % 3 else None, 1_700_000_000 + i)
                       for i, (k, fp) in enumerate(zip(keys, fps)))
        assert db.export_parquet(str(tmp_path / "crawl.parquet")) == len(fps)
    df = spark.read.parquet(str(tmp_path / "crawl.parquet"))
    assert df.schema["fingerprint"].dataType == T.DecimalType(20, 0)
    sspark.dedupe(df, DISTANCE, BLOCKS).write.parquet(str(tmp_path / "kept.parquet"))
    clusters = expected_clusters(keys, fps)
    with simhashdb.DB(str(tmp_path / "kept.db")) as kept:
        assert kept.import_parquet(str(tmp_path / "kept.parquet")) == \
            sum(k == c for k, c in clusters.items())
        position = {k: i for i, k in enumerate(keys)}
        for record in kept:
            i = position[record.key]
            assert clusters[record.key] == record.key and record.fingerprint == fps[i]
            assert record.meta == ({"n": i} if i % 3 else None)
            assert record.stored_at == 1_700_000_000 + i
    signed = pa.table({"key": [1, 2, 3], "fingerprint": pa.array([-1, 0, 5], pa.int64()),
                       "fp8": [MAX.to_bytes(8, "big"), bytes(8), (5).to_bytes(8, "big")]})
    pq.write_table(signed, str(tmp_path / "signed.parquet"))
    for column in ("fingerprint", "fp8"):
        with simhashdb.DB(str(tmp_path / column)) as db:
            db.import_parquet(str(tmp_path / "signed.parquet"), fingerprint=column)
            assert sorted((r.key, r.fingerprint) for r in db) == [(1, MAX), (2, 0), (3, 5)]
    with simhashdb.DB(str(tmp_path / "mixed.db")) as db:
        db.insert_many([(1, 5), ("one", 6)])
        with pytest.raises(simhashdb.InvalidKeyError):
            db.export_parquet(str(tmp_path / "mixed.parquet"))
    assert not (tmp_path / "mixed.parquet").exists()


def test_cli_spark_commands(spark, tmp_path, capsys):
    fps = corpus(1_000, seed=7)
    (tmp_path / "in.dec").write_text("".join("%d\n" % fp for fp in fps))
    # the file and line number, as `import` keys the lines of a file
    keys = ["%s:%d" % (tmp_path / "in.dec", line) for line in range(1, len(fps) + 1)]
    assert cli.main(["--quiet", "spark", "find-all", str(tmp_path / "in.dec"), "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {tuple(json.loads(line)) for line in lines} == expected_pairs(keys, fps)

    out = str(tmp_path / "kept.parquet")
    assert cli.main(["--quiet", "spark", "dedupe", str(tmp_path / "in.dec"), out]) == 0
    kept = sum(k == c for k, c in expected_clusters(keys, fps).items())
    assert '"rows": %d' % kept in capsys.readouterr().out
    db = str(tmp_path / "kept.db")
    assert cli.main(["import-parquet", db, out]) == 0
    assert cli.main(["export-parquet", db, str(tmp_path / "again.parquet")]) == 0
    assert capsys.readouterr().out.splitlines() == ['{"imported": %d}' % kept,
                                                    '{"exported": %d}' % kept]
    assert pq.read_table(str(tmp_path / "again.parquet")).num_rows == kept

    assert cli.main(["--quiet", "spark", "clusters", out, "-"]) == 0
    clustered = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(clustered) == kept and all(k == c for k, c in clustered)
    assert cli.main(["--quiet", "spark", "dedupe", out, "-", "--distance", "0"]) == 0
    written = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    fp_of = dict(zip(keys, fps))
    clusters = expected_clusters(keys, fps)
    assert sorted(written, key=lambda r: r["key"]) == [
        {"key": k, "fingerprint": fp_of[k]} for k, c in sorted(clusters.items()) if k == c]
    assert any(r["fingerprint"] >= 1 << 63 for r in written)
    assert cli.main(["--quiet", "spark", "dedupe", str(tmp_path / "in.dec"), out]) == 1
    error = capsys.readouterr().err
    assert error.startswith("simhashdb-cli: error: spark:") and error.count("\n") == 1


# The text rule


def text_frame(spark, keys, fps, signatures):
    """A DataFrame of (key, fingerprint, signature), the fingerprint a long."""
    return spark.createDataFrame(pa.table({
        "key": keys, "fingerprint": pa.array(fps, pa.uint64()).cast(pa.int64(), safe=False),
        "signature": pa.array(signatures, pa.binary())}))


def in_memory(keys, fps, signatures, layout=Layout(BLOCKS, DISTANCE)):
    """{(key_a, key_b): (distance, resemblance or None)} by matching.text_pairs."""
    found = {}
    for i, j, score in matching.text_pairs(fps, signatures, layout, THRESHOLD):
        a, b = sorted((keys[i], keys[j]))
        assert (a, b) not in found
        found[a, b] = ((fps[i] ^ fps[j]).bit_count(), score)
    return found


def scored(df):
    """find_all's rows as {(key_a, key_b): (distance, resemblance)}, none twice."""
    got = rows(df)
    assert len(got) == len({(a, b) for a, b, _, _ in got}), "a pair was reported twice"
    return {(a, b): (d, r) for a, b, d, r in got}


def cluster_sets(clusters):
    """(key, cluster) rows as the set of clusters of two keys or more."""
    return {frozenset(keys) for keys in _groups(dict(clusters)).values() if len(keys) > 1}


@pytest.fixture(scope="module")
def text_docs():
    """The edited stdlib texts of tests/test_text_rule.py, exact copies of two
    of them under other keys; fingerprints without text near and far from
    one; a document whose signature is all zero (no text) near another."""
    docs = text_corpus()
    docs += [("t0-copy", docs[0][1]), ("t3-copy", docs[3][1]), ("t3-copy2", docs[3][1])]
    prints = [simhashdb.fingerprint_with_signature(text) for _, text in docs]
    keys = [k for k, _ in docs] + ["raw-near", "raw-far", "raw-zero"]
    fps = [fp for fp, _ in prints] + [prints[0][0] ^ 0b101, prints[0][0] ^ (2**40 - 1),
                                      prints[1][0] ^ 0b11]
    signatures = [s for _, s in prints] + [None, None, bytes(256)]
    return docs, keys, fps, signatures


def test_text_rule_equals_the_oracle_the_database_and_in_memory(spark, tmp_path, text_docs):
    docs, keys, fps, signatures = text_docs
    df = text_frame(spark, keys, fps, signatures)
    signed_by = {k: s if s and any(s) else None for k, s in zip(keys, signatures)}
    near = oracle(signed_by, dict(zip(keys, fps)))
    expected = in_memory(keys, fps, signatures)
    assert set(expected) == near and ("raw-zero", "t1") in near
    assert {("t0", "t0-copy"), ("t3-copy", "t3-copy2"), ("raw-near", "t0-copy")} <= near
    pairs = sspark.find_all(df, DISTANCE, BLOCKS, signature="signature")
    assert pairs.columns == ["key_a", "key_b", "distance", "resemblance"]
    got = scored(pairs)
    assert got == expected   # the pairs, their distance and resemblance, to the bit
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(docs)
        db.insert_many((k, fp) for k, fp in zip(keys[len(docs):], fps[len(docs):]))
        assert {(p.key_a, p.key_b): (p.distance, p.resemblance) for p in db.find_all()} == got
        database = {frozenset(c) for c in db.clusters()}
    assert database == {c for c in components(near) if len(c) > 1}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spark_text, "SMALL_GROUP", 1)   # the groups of copies scanned natively
        clusters = rows(sspark.clusters(df, DISTANCE, BLOCKS, signature="signature", split=20))
    assert len(clusters) == len(keys) and cluster_sets(clusters) == database
    cluster_of = dict(clusters)
    assert all(cluster_of[k] == min(c) for c in database for k in c)
    shuffled = df.repartition(7).orderBy("fingerprint")
    deduped = sspark.dedupe(shuffled, DISTANCE, BLOCKS, signature="signature")
    assert deduped.columns == df.columns
    assert sorted(r[0] for r in rows(deduped)) == sorted(k for k in keys if cluster_of[k] == k)
    stricter = scored(sspark.find_all(df, DISTANCE, signature="signature", threshold=0.8))
    assert stricter == {p: v for p, v in expected.items() if v[1] is None or v[1] >= 0.8}
    assert stricter != expected


def test_a_database_of_texts_goes_to_parquet_and_back_with_its_signatures(spark, tmp_path,
                                                                           text_docs):
    docs, keys, fps, signatures = text_docs
    path = str(tmp_path / "texts.parquet")
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(docs)
        db.insert_many((k, fp) for k, fp in zip(keys[len(docs):], fps[len(docs):]))
        pairs = {(p.key_a, p.key_b): (p.distance, p.resemblance) for p in db.find_all()}
        assert db.export_parquet(path) == len(keys)
    assert any(v is None for _, v in pairs.values()) and any(v for _, v in pairs.values())
    assert pq.read_schema(path).metadata[b"simhashdb.recipe"] == simhashdb.RECIPE.encode()
    exported = spark.read.parquet(path)   # Spark decides the export as the database did
    assert scored(sspark.find_all(exported, DISTANCE, BLOCKS, signature="signature")) == pairs
    with simhashdb.DB(str(tmp_path / "again"), distance=DISTANCE) as again:  # unnamed, empty
        assert again.import_parquet(path) == len(keys)
        assert again.recipe == simhashdb.RECIPE and again.check() == []
        assert {(p.key_a, p.key_b): (p.distance, p.resemblance)
                for p in again.find_all()} == pairs
        assert "t0-copy" in [m.key for m in again.query_text(docs[0][1])]
    with simhashdb.DB(str(tmp_path / "other"), recipe="other/1") as other:
        with pytest.raises(simhashdb.ParameterMismatchError, match="recipe"):
            other.import_parquet(path)
        assert len(other) == 0
    pq.write_table(pa.table({"key": ["a"], "fingerprint": pa.array([1], pa.uint64()),
                             "signature": [b"x" * 64]}), str(tmp_path / "crypto.parquet"))
    with simhashdb.DB(str(tmp_path / "crypto")) as crypto:
        with pytest.raises(simhashdb.InvalidArgumentError, match="rename that column"):
            crypto.import_parquet(str(tmp_path / "crypto.parquet"))
        assert len(crypto) == 0 and crypto.recipe is None


def test_hot_band_groups_and_prefixes_of_texts_are_split_and_no_pair_is_lost(spark, monkeypatch):
    """240 copies of one text with 1% to 15% of their words replaced (a site
    template: dozens of them share each band of the original), their
    fingerprints (set here) under one prefix of table 0 with near ones among
    them; 40 other texts and 30 fingerprints without text, many near them."""
    rng = random.Random(11)
    texts = [t for k, t in text_corpus(seed=3) if "-" not in k]
    words = texts[0].split()
    others = [w for t in texts[1:] for w in t.split()]
    docs = []
    for i in range(240):
        edited = list(words)
        for j in rng.sample(range(len(words)), max(1, int(rng.uniform(0.01, 0.15) * len(words)))):
            edited[j] = rng.choice(others)
        docs.append(" ".join(edited))
    docs += [" ".join(rng.sample(others, 300)) for _ in range(40)]
    signatures = [simhashdb.fingerprint_with_signature(t)[1] for t in docs] + [None] * 30
    prefix = rng.getrandbits(26) << 38   # table 0 leads with blocks 0 and 1: 26 bits
    fps = []
    for i in range(len(signatures)):
        if i < 240 or i >= 280:
            base = rng.choice(fps) if fps and rng.random() < 0.6 else \
                prefix | rng.getrandbits(38)
            fps.append(flip(base, rng.sample(range(38), rng.randint(0, 3))))
        else:
            fps.append(rng.getrandbits(64))
    keys = ["doc%03d" % i for i in rng.sample(range(1000), len(fps))]
    df = text_frame(spark, keys, fps, signatures)
    bands, prefixes = [], []

    def recording(found, real, hot=lambda result: result):
        def record(*args):
            result = real(*args)
            found.extend(hot(result))
            return result
        return record
    monkeypatch.setattr(spark_text, "_hot_bands",
                        recording(bands, spark_text._hot_bands, lambda result: result[1]))
    monkeypatch.setattr(spark_scan, "_hot_groups", recording(prefixes, spark_scan._hot_groups))
    expected = in_memory(keys, fps, signatures)
    assert len(expected) > 3_000
    assert any(r is None for _, r in expected.values())
    signature_of = dict(zip(keys, signatures))
    assert sum(r is not None and not _ext.shares_a_band(signature_of[a], signature_of[b])
               for (a, b), (_, r) in expected.items()) >= 5   # the distance stage's
    assert scored(sspark.find_all(df, DISTANCE, BLOCKS, signature="signature",
                                  split=100)) == expected
    assert len(bands) >= 16 and min(parts for _, parts, _ in bands) >= 2 and \
        max(parts for _, parts, _ in bands) >= 5, bands
    assert any(t == 0 and parts >= 2 for t, _, parts, _ in prefixes), prefixes
    monkeypatch.setattr(spark_text, "SMALL_GROUP", 1)   # every band group scanned natively
    assert scored(sspark.find_all(df, DISTANCE, BLOCKS, signature="signature",
                                  split=100)) == expected
    clusters = rows(sspark.clusters(df, DISTANCE, BLOCKS, signature="signature", split=100))
    near = {frozenset(c) for c in components(expected) if len(c) > 1}
    assert cluster_sets(clusters) == near


def test_cli_spark_over_texts_decides_as_the_database(spark, tmp_path, capsys, text_docs):
    docs = text_docs[0][:40] + text_docs[0][-3:]
    folder = tmp_path / "texts"
    folder.mkdir()
    for key, text in docs:
        (folder / ("%s.txt" % key)).write_text(text)
    db = str(tmp_path / "texts.db")
    assert cli.main(["--quiet", "import", db, str(folder)]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == len(docs)
    assert cli.main(["--quiet", "clusters", db]) == 0
    database = {frozenset(json.loads(line)) for line in capsys.readouterr().out.splitlines()}
    assert cli.main(["--quiet", "find-all", db]) == 0
    pairs = {tuple(json.loads(line)) for line in capsys.readouterr().out.splitlines()}
    assert len(database) >= 5 and pairs

    assert cli.main(["spark", "clusters", str(folder), "-"]) == 0
    captured = capsys.readouterr()
    assert "by the text rule" in captured.err and "at least %g" % THRESHOLD in captured.err
    clustered = [json.loads(line) for line in captured.out.splitlines()]
    assert len(clustered) == len(docs) and cluster_sets(clustered) == database
    assert cli.main(["--quiet", "spark", "find-all", str(folder), "-"]) == 0
    assert {tuple(json.loads(line)) for line in capsys.readouterr().out.splitlines()} == pairs
    kept = str(tmp_path / "kept.parquet")
    assert cli.main(["--quiet", "spark", "dedupe", str(folder), kept]) == 0
    cluster_of = dict(clustered)
    firsts = sorted(k for k, c in cluster_of.items() if k == c)
    assert json.loads(capsys.readouterr().out)["rows"] == len(firsts)
    table = pq.read_table(kept)
    assert sorted(table.column("key").to_pylist()) == firsts
    assert {len(s) for s in table.column("signature").to_pylist()} == {128}
    assert cli.main(["spark", "clusters", kept, "-", "--threshold", "0.3"]) == 0
    captured = capsys.readouterr()   # the signatures went along: the text rule again
    assert "by the text rule" in captured.err and "at least 0.3" in captured.err
    assert "column 'signature'" in captured.err
    assert all(k == c for k, c in (json.loads(line) for line in captured.out.splitlines()))
    assert cli.main(["spark", "clusters", kept, "-", "--signature", ""]) == 0
    captured = capsys.readouterr()   # a column named signature, not taken: the distance
    assert "by the distance of their fingerprints" in captured.err


def test_bad_signatures_and_thresholds_raise_at_the_call(spark):
    schema = "key string, fingerprint long, signature binary"
    good = spark.createDataFrame([("a", 1, bytes([1]) * 256), ("b", 3, None)], schema)
    cases = [
        (spark.createDataFrame([("a", 1, b"short")], schema), {},
         simhashdb.InvalidArgumentError, "neither 128 nor 256 bytes"),
        (good.withColumn("signature", good.fingerprint), {}, simhashdb.InvalidArgumentError,
         "expected binary"),
        (good, {"signature": "sig"}, simhashdb.InvalidArgumentError, "no signature column"),
        (good, {"threshold": 1.5}, simhashdb.InvalidArgumentError, "threshold"),
        (good, {"signature": None, "threshold": 0.5}, simhashdb.InvalidArgumentError,
         "signature column too"),
    ]
    for df, options, error, words in cases:
        for function in (sspark.find_all, sspark.clusters):
            with pytest.raises(error, match=words):
                function(df, **dict({"signature": "signature"}, **options))
    assert rows(sspark.find_all(good, signature="signature")) == [("a", "b", 1, None)]


# A new segment against an old corpus


def survivors_deduped(new_keys, near, across):
    """The keys an incremental dedupe keeps: the new keys in no pair ``across``
    (new key, old key), then of each component of ``near`` (pairs of new
    keys) among them, the smallest."""
    left = sorted(set(new_keys) - {a for a, _ in across})
    within = {(a, b) for a, b in near if a in left and b in left}
    dropped = {k for c in components(within) for k in c if k != min(c)}
    return [k for k in left if k not in dropped]


def test_incremental_dedupe_of_fingerprints_equals_brute_force_and_the_database(spark,
                                                                               tmp_path):
    fps = corpus(1500, seed=7)
    rng = random.Random(8)
    old_fps = fps[:1200]
    new_fps = fps[1200:] + [flip(rng.choice(old_fps), rng.sample(range(64), rng.randint(0, 4)))
                            for _ in range(150)]
    new_fps += [flip(new_fps[i], [i % 64]) for i in range(40)]   # near copies within new
    old_keys = ["o%05d" % i for i in range(len(old_fps))]
    new_keys = ["n%05d" % i for i in range(len(new_fps))]
    both = brute_force(new_fps + old_fps)
    keys = new_keys + old_keys
    across = {(keys[i], keys[j], d) for i, j, d in both if i < len(new_keys) <= j}
    near = {(keys[i], keys[j]) for i, j, _ in both if j < len(new_keys)}
    assert len(across) > 100 and len(near) > 40
    new, old = frame(spark, new_keys, new_fps), frame(spark, old_keys, old_fps, "decimal")
    kept = sorted(r[0] for r in rows(sspark.dedupe(new, DISTANCE, against=old)))
    assert kept == survivors_deduped(new_keys, near, {(a, b) for a, b, _ in across})
    with pytest.MonkeyPatch.context() as patch:   # a segment too large to ship to every task,
        patch.setattr(spark_incremental, "SHIPPED_ROWS", 0)  # its survivors too many for the driver
        patch.setattr(sspark, "_dropped_in_memory", lambda *args: None)
        assert sorted(r[0] for r in rows(sspark.dedupe(new, DISTANCE, against=old))) == kept
    copies = frame(spark, ["c%d" % i for i in range(9)], old_fps[:9])   # nothing survives
    assert rows(sspark.dedupe(copies, DISTANCE, against=old)) == []
    pairs = rows(sspark.find_all(new, DISTANCE, against=old))
    assert {(a, b, d) for a, b, d, crossing in pairs if crossing} == across
    assert {(a, b) for a, b, d, crossing in pairs if not crossing} == near
    with simhashdb.DB(str(tmp_path / "old"), distance=DISTANCE) as db:   # the database route
        db.insert_many(zip(old_keys, old_fps))
        fresh = [(k, fp) for k, fp, found in zip(new_keys, new_fps, db.query_many(new_fps))
                 if not found]
    pairs = matching.find_all_indices([fp for _, fp in fresh], BLOCKS, DISTANCE)
    clusters = components({(fresh[i][0], fresh[j][0]) for i, j in pairs})
    assert kept == sorted(k for k, _ in fresh if all(k == min(c) for c in clusters if k in c))


def test_incremental_dedupe_of_texts_equals_the_oracle_and_the_database(spark, tmp_path,
                                                                        text_docs):
    docs, keys, fps, signatures = text_docs
    texts = dict(docs)
    everything = list(zip(keys, fps, signatures))
    old, new = everything[0::2], everything[1::2] + [everything[0]]  # t0 crawled again
    side = {"old": old, "new": new}
    signed = {"%s:%s" % (s, k): sig if sig and any(sig) else None
              for s in side for k, _, sig in side[s]}
    near = oracle(signed, {"%s:%s" % (s, k): fp for s in side for k, fp, _ in side[s]})
    named = [sorted((a, b), reverse=True) for a, b in near]   # ("old:..", "new:..")
    across = {(a[4:], b[4:]) for b, a in named if a.startswith("new:") and b.startswith("old:")}
    within = {tuple(sorted((a[4:], b[4:]))) for a, b in named
              if a.startswith("new:") and b.startswith("new:")}
    assert ("t0", "t0") in across and within
    frames = [text_frame(spark, *map(list, zip(*rows_))) for rows_ in (new, old)]
    kept = sorted(r[0] for r in rows(sspark.dedupe(frames[0], DISTANCE, BLOCKS,
                                                   signature="signature", against=frames[1])))
    new_keys = [k for k, _, _ in new]
    assert kept == survivors_deduped(new_keys, within, across)
    pairs = rows(sspark.find_all(frames[0], DISTANCE, signature="signature", against=frames[1]))
    assert {(a, b) for a, b, _, _, crossing in pairs if crossing} == across
    assert {(a, b) for a, b, _, _, crossing in pairs if not crossing} == within
    with simhashdb.DB(str(tmp_path / "old"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many((k, texts[k]) for k, _, _ in old if k in texts)
        db.insert_many((k, fp) for k, fp, _ in old if k not in texts)
        found = dict(zip([k for k, _, _ in new if k in texts],
                         db.query_text_many([texts[k] for k, _, _ in new if k in texts])))
        found.update(zip([k for k, _, _ in new if k not in texts],
                         db.query_many([fp for k, fp, _ in new if k not in texts])))
    fresh = [(k, fp) for k, fp, _ in new if not found[k]]
    with simhashdb.DB(str(tmp_path / "fresh"), distance=DISTANCE,
                      recipe=simhashdb.RECIPE) as db:
        db.insert_text_many((k, texts[k]) for k, _ in fresh if k in texts)
        db.insert_many((k, fp) for k, fp in fresh if k not in texts)
        dropped = {k for c in db.clusters() for k in c if k != min(c)}
    assert kept == sorted(k for k, _ in fresh if k not in dropped)


def test_signatures_of_16_bit_bins_meet_8_bit_ones_narrowed(spark, text_docs):
    """Signatures of 16-bit bins (simhashdb before 0.15) beside 8-bit ones, in
    one frame or as an old corpus: the pairs of all of them narrowed."""
    docs, keys, fps, signatures = text_docs
    texts = dict(docs)
    wide = [simhashdb.fingerprint_with_signature(texts[k], signature_bits=16)[1]
            if k in texts else s for k, s in zip(keys, signatures)]
    assert all(_ext.narrow(w) == s for k, w, s in zip(keys, wide, signatures) if k in texts)
    mixed = [w if i % 2 and w else s for i, (w, s) in enumerate(zip(wide, signatures))]
    assert {len(s) for s in mixed if s} == {128, 256}
    pairs = sspark.find_all(text_frame(spark, keys, fps, mixed), DISTANCE, BLOCKS,
                            signature="signature")
    assert scored(pairs) == in_memory(keys, fps, signatures)
    everything = list(zip(keys, fps, signatures, wide))
    old, new = everything[0::2], everything[1::2] + [everything[0]]
    frames = {form: [text_frame(spark, [r[0] for r in side], [r[1] for r in side],
                                [r[column] for r in side]) for side in (new, old)]
              for form, column in (("narrow", 2), ("wide", 3))}
    expected = sorted(rows(sspark.find_all(frames["narrow"][0], DISTANCE, signature="signature",
                                           against=frames["narrow"][1])))
    assert any(crossing for *_, crossing in expected)
    for new_frame, old_frame in ((frames["narrow"][0], frames["wide"][1]),
                                 (frames["wide"][0], frames["narrow"][1])):
        assert sorted(rows(sspark.find_all(new_frame, DISTANCE, signature="signature",
                                           against=old_frame))) == expected


@pytest.mark.parametrize("bits", [8, 16])
def test_cli_spark_dedupe_against_a_database_or_its_parquet(spark, tmp_path, capsys, text_docs,
                                                            bits):
    """The monthly update, against a database of either signature width (16:
    one made before format 10): the new texts are signed as its are."""
    docs = text_docs[0]
    old, new = docs[0::2], docs[1::2] + [docs[0]]
    with simhashdb.DB(str(tmp_path / "old.db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        if bits == 16:
            as_made_before_format_10(db)
    with simhashdb.DB(str(tmp_path / "old.db")) as db:
        db.insert_text_many(old)
        db.export_parquet(str(tmp_path / "old.parquet"))
    segment = str(tmp_path / "new.warc.gz")   # the new pages as a crawl archive
    with open(segment, "wb") as out:
        writer = WARCWriter(out, gzip=True)
        for k, t in new:
            writer.write_record(writer.create_warc_record(
                k, "resource", payload=io.BytesIO(t.encode()), warc_content_type="text/plain",
                warc_headers_dict={"WARC-Date": "2026-12-01T00:00:00Z"}))
    outputs = []
    for against in ("old.db", "old.parquet"):
        assert cli.main(["spark", "dedupe", segment, "-", "--quiet",
                         "--against", str(tmp_path / against)]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert all(line["meta"] == {"date": "2026-12-01T00:00:00Z"} for line in lines)
        outputs.append(sorted(line["key"] for line in lines))
    new_frame, old_frame = (text_frame(spark, [k for k, _ in part], *map(list, zip(*(
        simhashdb.fingerprint_with_signature(t, signature_bits=bits) for _, t in part))))
        for part in (new, old))
    expected = [r[0] for r in rows(sspark.dedupe(new_frame, DISTANCE, signature="signature",
                                                 against=old_frame))]
    assert outputs == [sorted(expected)] * 2 and "t0" not in expected
    kept = str(tmp_path / "kept.parquet")   # the monthly update: the survivors join the database
    assert cli.main(["spark", "dedupe", segment, kept, "--quiet",
                     "--against", str(tmp_path / "old.db")]) == 0
    assert {len(s) for s in pq.read_table(kept).column("signature").to_pylist()} == {bits * 16}
    assert cli.main(["import-parquet", str(tmp_path / "old.db"), kept, "--quiet"]) == 0
    capsys.readouterr()
    with simhashdb.DB(str(tmp_path / "old.db")) as db:
        assert len(db) == len(old) + len(expected)
        assert db.get(expected[0]).meta == {"date": "2026-12-01T00:00:00Z"}
        assert expected[0] in {m.key for m in db.query_text(dict(new)[expected[0]])}
    assert cli.main(["spark", "clusters", str(tmp_path / "new.jsonl"), "-",
                     "--against", str(tmp_path / "old.db")]) == 2


def test_against_columns_named_apart_or_refused_in_one_line(spark, tmp_path, capsys, text_docs):
    docs = text_docs[0]
    old, new = docs[0::2], docs[1::2] + [docs[0]]
    with simhashdb.DB(str(tmp_path / "old.db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(old)
        db.export_parquet(str(tmp_path / "old.parquet"))   # key, fingerprint, signature
    fps, signatures = zip(*(simhashdb.fingerprint_with_signature(t) for _, t in new))
    pq.write_table(pa.table({"url": [k for k, _ in new], "fp": pa.array(fps, pa.uint64()),
                             "sig": pa.array(signatures, pa.binary())}),
                   str(tmp_path / "new.parquet"))
    new_frame = spark.read.parquet(str(tmp_path / "new.parquet"))
    old_frame = spark.read.parquet(str(tmp_path / "old.parquet"))
    options = dict(key="url", fingerprint="fp", signature="sig")
    with pytest.raises(simhashdb.InvalidArgumentError, match="old corpus.*no key column 'url'"):
        sspark.dedupe(new_frame, DISTANCE, against=old_frame, **options)
    expected = sorted(r[0] for r in rows(sspark.dedupe(
        new_frame, DISTANCE, against=old_frame, **options,
        against_columns={"key": "key", "fingerprint": "fingerprint", "signature": "signature"})))
    assert "t0" not in expected and 0 < len(expected) < len(new)
    spark_args = ["spark", "dedupe", str(tmp_path / "new.parquet"), "-", "--quiet",
                  "--key", "url", "--fingerprint", "fp", "--signature", "sig", "--against"]
    code = cli.main(spark_args + [str(tmp_path / "old.parquet")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "has no key column 'url'" in err and "--against-key" in err
    for against in (["old.db"], ["old.parquet", "--against-key", "key", "--against-fingerprint",
                                 "fingerprint", "--against-signature", "signature"]):
        assert cli.main(spark_args + [str(tmp_path / against[0])] + against[1:]) == 0
        out = capsys.readouterr().out.splitlines()
        assert sorted(json.loads(line)["url"] for line in out) == expected


def test_short_words_decide_spark_pairs_as_the_database_does(spark, tmp_path):
    """Short pages alike only through their template pair without
    short_words and not with it, in the band groups (numpy and native), the
    distance scan and the probe of an old corpus, as find_all on a database
    pairs them."""
    from test_short_pages import SHORT, check_pairs, pages
    records = pages()
    keys = [k for k, _ in records]
    prints = [simhashdb.fingerprint_with_signature(page, html=True) for _, page in records]
    df = text_frame(spark, keys, [fp for fp, _ in prints], [s for _, s in prints])
    with simhashdb.DB(str(tmp_path / "db"), distance=DISTANCE, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(records, html=True)
        database = {short: {(p.key_a, p.key_b) for p in db.find_all(short_words=short)}
                    for short in (None, SHORT)}
    olds = ("s0", "s2", "f0")
    old, new = df.where("key in %s" % (olds,)), df.where("key not in %s" % (olds,))
    acrosses = []
    for short in (None, SHORT):
        check_pairs(database[short], short)
        with pytest.MonkeyPatch.context() as patch:
            for small_group in (spark_text.SMALL_GROUP, 1):
                patch.setattr(spark_text, "SMALL_GROUP", small_group)
                got = {(a, b) for a, b, _, _ in rows(sspark.find_all(
                    df, DISTANCE, BLOCKS, signature="signature", short_words=short))}
                assert got == database[short]
        across = {(a, b) for a, b, _, _, is_across in rows(sspark.find_all(
            new, DISTANCE, BLOCKS, signature="signature", against=old, short_words=short))
            if is_across}
        assert across == {(ours, theirs) for pair in database[short]
                          for ours, theirs in (pair, pair[::-1])
                          if ours not in olds and theirs in olds}
        acrosses.append(across)
    assert acrosses[0] > acrosses[1]
