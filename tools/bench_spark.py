"""simhashdb.spark side by side with the in-memory simhashdb.find_all and
find_clusters on the same machine.

N fingerprints (10% of them with 1 to 5 variants 1 to 3 bits away, as in
bench_find_all's planted case) are written to Parquet (key and fingerprint
int64); Spark reads them, finds every pair, then the clusters, and writes
each result to Parquet. Both results are checked equal to the in-memory
functions'. Spark's own metrics (its UI's REST API, on the loopback
interface) give the bytes shuffled and the peak memory of the JVM and of the
Python workers (process-tree metrics, sampled every 200 ms).

With --text N, the text rule instead: N synthetic texts (300 words each
from a vocabulary of 20,000 with Zipf-like frequencies; a tenth of them with
1 to 3 copies, 1% to 8% of their words replaced by others) are
fingerprinted with their signatures and written to Parquet (key,
fingerprint, signature); Spark runs find_all and clusters on them by the
fingerprint rule and by the text rule (signature=), and the text rule's
pairs are checked equal to simhashdb.matching.text_pairs' in memory.

Usage: python tools/bench_spark.py [--n 10000000] [--master local[2]] [--blocks M]
       python tools/bench_spark.py --text 100000
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import simhashdb
from simhashdb import matching
from simhashdb import spark as sspark
from simhashdb.layout import Layout


def planted_corpus(n, seed=0):
    """n random fingerprints and, for a tenth of them, 1 to 5 variants with up
    to 3 bits flipped."""
    rng = np.random.default_rng(seed)
    bases = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    sources = np.repeat(rng.choice(n, size=n // 10, replace=False),
                        rng.integers(1, 6, size=n // 10))
    flips = rng.integers(1, 4, size=len(sources))
    mask = np.zeros(len(sources), dtype=np.uint64)
    for f in range(3):
        bit = np.uint64(1) << rng.integers(0, 64, size=len(sources)).astype(np.uint64)
        mask ^= np.where(flips > f, bit, np.uint64(0))
    return np.concatenate([bases, bases[sources] ^ mask])


def text_corpus(n, seed=0, words=300, vocabulary=20_000):
    """n texts of random words and copies of a tenth of them (1 to 3 each)
    with 1% to 8% of their words replaced; their fingerprints, signatures
    and the texts."""
    rng = np.random.default_rng(seed)
    names = np.array(["w%d" % i for i in range(vocabulary)], dtype=object)
    weights = 1.0 / np.arange(1, vocabulary + 1) ** 0.8
    weights /= weights.sum()
    bases = rng.choice(vocabulary, size=(n, words), p=weights)
    sources = np.repeat(rng.choice(n, size=n // 10, replace=False),
                        rng.integers(1, 4, size=n // 10))
    copies = bases[sources].copy()
    for row, rate in zip(copies, rng.uniform(0.01, 0.08, size=len(sources))):
        at = rng.choice(words, size=max(1, int(rate * words)), replace=False)
        row[at] = rng.choice(vocabulary, size=len(at), p=weights)
    options = simhashdb.RECIPES[simhashdb.RECIPE]
    texts = [" ".join(names[row]) for row in np.concatenate([bases, copies])]
    prints = [simhashdb.fingerprint_with_signature(text, **options) for text in texts]
    return (np.array([fp for fp, _ in prints], dtype=np.uint64),
            [signature for _, signature in prints], texts)


class SparkMetrics:
    """Stage and executor metrics from the session's UI (REST API)."""

    def __init__(self, session):
        context = session.sparkContext
        self.base = "%s/api/v1/applications/%s" % (context.uiWebUrl, context.applicationId)

    def _get(self, what):
        with urllib.request.urlopen("%s/%s" % (self.base, what)) as response:
            return json.load(response)

    def last_stage(self):
        return max((s["stageId"] for s in self._get("stages")), default=-1)

    def shuffle_bytes_since(self, stage):
        return sum(s["shuffleWriteBytes"] for s in self._get("stages") if s["stageId"] > stage)

    def peak_memory(self):
        time.sleep(1)  # one more poll of the process tree
        peaks = [e.get("peakMemoryMetrics") or {} for e in self._get("executors")]
        return {name: max(p.get(name, 0) for p in peaks) for name in
                ("JVMHeapMemory", "ProcessTreeJVMRSSMemory", "ProcessTreePythonRSSMemory")}


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def value_pairs(keyed, fps):
    """Key pairs as sorted distinct (fingerprint, fingerprint) rows, smaller first."""
    a = fps[keyed.column("key_a").to_numpy()]
    b = fps[keyed.column("key_b").to_numpy()]
    pairs = np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
    return np.unique(pairs, axis=0) if len(pairs) else pairs.reshape(0, 2)


def value_clusters(table, fps):
    """(key, cluster) rows as the in-memory function's clusters: the distinct
    fingerprints of each cluster, those of two or more, sorted."""
    values = fps[table.column("key").to_numpy()]
    cluster = table.column("cluster").to_numpy()
    order = np.lexsort((values, cluster))
    cluster, values = cluster[order], values[order]
    first = np.ones(len(values), dtype=bool)   # first row of each (cluster, value)
    first[1:] = (cluster[1:] != cluster[:-1]) | (values[1:] != values[:-1])
    cluster, values = cluster[first], values[first]
    groups = np.split(values, np.flatnonzero(np.diff(cluster)) + 1)
    return sorted(g.tolist() for g in groups if len(g) > 1)


def start_session(args, name):
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master(args.master).appName(name)
               .config("spark.driver.memory", args.driver_memory)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.executor.processTreeMetrics.enabled", "true")
               .config("spark.executor.metrics.pollingInterval", "200ms")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def text_main(args):
    """The text rule against the fingerprint rule, on the same texts."""
    started = time.perf_counter()
    fps, signatures, _ = text_corpus(args.text)
    made_s = time.perf_counter() - started
    n = len(fps)
    threshold = simhashdb.rule.THRESHOLD
    spark_blocks = args.blocks or sspark.choose_blocks(args.distance, n)
    layout = Layout(Layout.choose_blocks(args.distance, n), args.distance)
    memory_s, expected = timed(lambda: {(i, j) for i, j, _ in matching.text_pairs(
        fps, signatures, layout, threshold)})
    work = tempfile.mkdtemp(prefix="bench_spark_")
    try:
        pq.write_table(pa.table({"key": np.arange(n, dtype=np.int64),
                                 "fingerprint": fps.view(np.int64),
                                 "signature": pa.array(signatures, pa.binary())}),
                       os.path.join(work, "in.parquet"))
        session = start_session(args, "bench_spark_text")
        metrics = SparkMetrics(session)
        df = session.read.parquet(os.path.join(work, "in.parquet"))
        sspark.find_all(df.limit(1000), args.distance, signature="signature").count()  # warm up
        rows = [("in-memory matching.text_pairs", "text", memory_s, len(expected), "-")]

        def run(name, function, out, **options):
            before = metrics.last_stage()
            path = os.path.join(work, out)
            seconds, _ = timed(lambda: function(df, args.distance, spark_blocks, **options)
                               .write.parquet(path))
            return seconds, metrics.shuffle_bytes_since(before), pq.read_table(path)

        for rule, options in (("fingerprint", {}), ("text", {"signature": "signature"})):
            seconds, shuffled, pairs = run(rule, sspark.find_all, rule + "-pairs.parquet",
                                           **options)
            if rule == "text":
                got = set(zip(pairs.column("key_a").to_pylist(),
                              pairs.column("key_b").to_pylist()))
                assert got == expected, "text pairs differ from matching.text_pairs'"
            rows.append(("simhashdb.spark.find_all", rule, seconds, pairs.num_rows,
                         "%.0f" % (shuffled / 2**20)))
        if not args.no_clusters:
            for rule, options in (("fingerprint", {}), ("text", {"signature": "signature"})):
                seconds, shuffled, table = run(rule, sspark.clusters,
                                               rule + "-clusters.parquet", **options)
                cluster = table.column("cluster").to_numpy(zero_copy_only=False)
                named = len(np.unique(cluster[cluster != table.column("key").to_numpy()]))
                rows.append(("simhashdb.spark.clusters", rule, seconds, named,
                             "%.0f" % (shuffled / 2**20)))
        peak = metrics.peak_memory()
        session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("N = %d texts (%d base + edited copies), k = %d, threshold %g, blocks %d, %s; "
          "texts made in %.0f s; text pairs equal to the in-memory function's"
          % (n, args.text, args.distance, threshold, spark_blocks, args.master, made_s))
    print()
    print("| method | rule | s | pairs / clusters | shuffle MB |")
    print("|---|---|---:|---:|---:|")
    for name, rule, seconds, count, shuffle in rows:
        print("| %s | %s | %.1f | %d | %s |" % (name, rule, seconds, count, shuffle))
    print()
    print("text / fingerprint rule on Spark: find_all %.1fx%s" % (
        rows[2][2] / rows[1][2], "" if args.no_clusters else
        ", clusters %.1fx" % (rows[4][2] / rows[3][2])))
    print("peak memory: JVM heap %.0f MB, JVM RSS %.0f MB, Python workers RSS %.0f MB (all "
          "workers together)" % tuple(peak[k] / 2**20 for k in (
              "JVMHeapMemory", "ProcessTreeJVMRSSMemory", "ProcessTreePythonRSSMemory")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="base fingerprints (1M)")
    parser.add_argument("--distance", type=int, default=3)
    parser.add_argument("--blocks", type=int, help="Spark's blocks (default: its own choice)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--no-clusters", action="store_true", help="pairs only")
    parser.add_argument("--text", type=int, metavar="N",
                        help="the text rule on N base texts instead (e.g. 100000)")
    args = parser.parse_args()
    if args.text:
        return text_main(args)

    fps = planted_corpus(args.n)
    n = len(fps)
    memory_blocks = Layout.choose_blocks(args.distance, n)
    spark_blocks = args.blocks or sspark.choose_blocks(args.distance, n)
    work = tempfile.mkdtemp(prefix="bench_spark_")
    try:
        pq.write_table(pa.table({"key": np.arange(n, dtype=np.int64),
                                 "fingerprint": fps.view(np.int64)}),
                       os.path.join(work, "in.parquet"))
        pairs_s, expected = timed(simhashdb.find_all, fps, memory_blocks, args.distance)
        expected = np.array(expected, dtype=np.uint64).reshape(-1, 2)
        if not args.no_clusters:
            clusters_s, expected_clusters = timed(simhashdb.find_clusters, fps, memory_blocks,
                                                  args.distance)

        session = start_session(args, "bench_spark")
        metrics = SparkMetrics(session)
        df = session.read.parquet(os.path.join(work, "in.parquet"))
        rows = [("in-memory find_all", memory_blocks, pairs_s, len(expected), "-")]

        def run(name, function, out):
            before = metrics.last_stage()
            path = os.path.join(work, out)
            seconds, _ = timed(lambda: function(df, args.distance, spark_blocks)
                               .write.parquet(path))
            shuffled = metrics.shuffle_bytes_since(before)
            return seconds, shuffled, pq.read_table(path)

        seconds, shuffled, pairs = run("find_all", sspark.find_all, "pairs.parquet")
        assert np.array_equal(value_pairs(pairs, fps), expected), "pairs differ"
        rows.append(("simhashdb.spark.find_all", spark_blocks, seconds, pairs.num_rows,
                     "%.0f" % (shuffled / 2**20)))
        if not args.no_clusters:
            rows.append(("in-memory find_clusters", memory_blocks, clusters_s,
                         len(expected_clusters), "-"))
            seconds, shuffled, table = run("clusters", sspark.clusters, "clusters.parquet")
            assert value_clusters(table, fps) == expected_clusters, "clusters differ"
            rows.append(("simhashdb.spark.clusters", spark_blocks, seconds,
                         len(value_clusters(table, fps)), "%.0f" % (shuffled / 2**20)))
        peak = metrics.peak_memory()
        session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("N = %d fingerprints (%d base + planted variants), k = %d, %s; results equal"
          % (n, args.n, args.distance, args.master))
    print()
    print("| method | blocks | s | pairs / clusters | shuffle MB |")
    print("|---|---:|---:|---:|---:|")
    for name, blocks, seconds, count, shuffle in rows:
        print("| %s | %d | %.1f | %d | %s |" % (name, blocks, seconds, count, shuffle))
    print()
    print("spark / in-memory: find_all %.1fx%s" % (rows[1][2] / rows[0][2], "" if args.no_clusters
          else ", clusters %.1fx" % (rows[3][2] / rows[2][2])))
    print("peak memory: JVM heap %.0f MB, JVM RSS %.0f MB, Python workers RSS %.0f MB (all "
          "workers together)" % tuple(peak[k] / 2**20 for k in (
              "JVMHeapMemory", "ProcessTreeJVMRSSMemory", "ProcessTreePythonRSSMemory")))


if __name__ == "__main__":
    main()
