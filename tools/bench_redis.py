"""simhashdb.DB on a Redis Cluster: RAM per table entry, bulk inserts and
query_many from 1, 2 and 4 client processes, and what 1B fingerprints need.

N random fingerprints (10% planted near-duplicates, 1 to 5 bits from
another), k = 3, blocks chosen for N. Queries: half near a stored
fingerprint (0 to 3 bits flipped), half random; their answers are checked
against numpy brute force. RAM is the growth of the primaries' used_memory
(INFO memory), per table entry (N x tables), and the MEMORY USAGE of the
database's keys by kind, from which the 1B projection is made.

Usage: python tools/bench_redis.py [--n 1000000] [--queries 20000] [--url redis://host:port]
(without --url it starts a 3-primary, 3-replica cluster on loopback, as the tests do;
needs numpy and redis-server)
"""

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np
import redis

import simhashdb
from simhashdb.layout import Layout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from redis_cluster import LocalCluster  # noqa: E402

from bench_db import K, corpus, probes  # the same corpus, probes and k as bench_db

BATCH = 1_000_000  # a bulk load is fastest in large batches


def used_memory(url):
    """used_memory summed over the primaries."""
    nodes = redis.Redis.from_url(url).execute_command("CLUSTER NODES")
    total = 0
    for address, node in nodes.items():
        if "master" in node["flags"] and node["slots"]:
            host, port = address.split("@")[0].rsplit(":", 1)
            total += redis.Redis(host=host, port=int(port)).info("memory")["used_memory"]
    return total


def load(url, fps, start, stop):
    """Insert fps[start:stop] as (index, fp) in batches; seconds taken."""
    with simhashdb.DB(url) as db:
        began = time.perf_counter()
        for lo in range(start, stop, BATCH):
            hi = min(lo + BATCH, stop)
            db.insert_many(zip(range(lo, hi), fps[lo:hi].tolist()), batch_size=BATCH)
        return time.perf_counter() - began


def query(url, qs):
    """query_many of ``qs`` in batches of 1000; (seconds, answers as key lists)."""
    with simhashdb.DB(url, readonly=True) as db:
        began = time.perf_counter()
        answers = []
        for lo in range(0, qs.size, 1000):
            answers += [[m.key for m in ms] for ms in db.query_many(qs[lo:lo + 1000])]
        return time.perf_counter() - began, answers


def in_processes(function, argument_lists):
    """Run ``function`` once per argument list, each in a process of its own,
    all at once; their results and the wall time."""
    with multiprocessing.get_context("spawn").Pool(len(argument_lists)) as pool:
        began = time.perf_counter()
        results = pool.starmap(function, argument_lists)
        return results, time.perf_counter() - began


def memory_by_kind(url, name):
    """{kind: (keys, bytes of MEMORY USAGE, bytes of values)} of database ``name``."""
    client = redis.RedisCluster.from_url(url)
    keys = list(client.scan_iter(match=name + ":*", count=10000, target_nodes=client.PRIMARIES))
    out = {}
    for lo in range(0, len(keys), 20000):
        chunk = keys[lo:lo + 20000]
        pipe = client.pipeline()
        for key in chunk:
            pipe.memory_usage(key, samples=0)
            pipe.strlen(key) if key.split(b":")[1] not in (b"d", b"f") else pipe.exists(key)
        replies = pipe.execute()
        for key, usage, size in zip(chunk, replies[::2], replies[1::2]):
            kind = {b"d": "documents", b"f": "fingerprint index"}.get(
                key[len(name) + 1:].split(b":")[0], "tables")
            count, total, values = out.get(kind, (0, 0, 0))
            out[kind] = (count + 1, total + usage, values + (size if kind == "tables" else 0))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--url", help="a cluster to use (default: start one here)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    fps = corpus(args.n, rng)
    qs = probes(fps, args.queries, rng)
    cluster = None
    if args.url is None:
        cluster = LocalCluster(tempfile.mkdtemp(prefix="bench-redis-")).start()
        args.url = cluster.url
    figures = {"n": args.n, "queries": args.queries}
    try:
        rows = []
        for clients in (1, 2, 4):
            name = "bench%d" % clients
            url = "%s/%s" % (args.url, name)
            with simhashdb.DB(url, distance=K, expected_size=args.n) as db:
                layout = Layout(db.blocks, db.distance)
                bits = db.stats()["bucket_bits"]
            before = used_memory(args.url)
            parts = [(url, fps, args.n * c // clients, args.n * (c + 1) // clients)
                     for c in range(clients)]
            _, load_seconds = in_processes(load, parts)
            grown = used_memory(args.url) - before
            chunks = np.array_split(qs, clients)
            results, query_seconds = in_processes(query, [(url, chunk) for chunk in chunks])
            answers = [a for _, part in results for a in part]
            wrong = check_answers(fps, qs, answers, rng)
            rows.append((clients, args.n / load_seconds, args.queries / query_seconds, wrong))
            if clients == 1:
                entries = args.n * layout.tables
                kinds = memory_by_kind(args.url, name)
                figures.update(blocks=layout.blocks, tables=layout.tables, bucket_bits=bits,
                               ram_bytes=grown, ram_per_table_entry=grown / entries,
                               by_kind={k: list(v) for k, v in kinds.items()})
                print("## RAM (N = %d, %d tables, buckets of %d bits)\n" % (
                    args.n, layout.tables, bits))
                print("| kind | keys | MEMORY USAGE bytes | per fingerprint |")
                print("|---|---:|---:|---:|")
                for kind, (keys, total, _) in sorted(kinds.items()):
                    print("| %s | %d | %d | %.1f |" % (kind, keys, total, total / args.n))
                print("| used_memory growth of the primaries | | %d | %.1f |"
                      % (grown, grown / args.n))
                print("\nper table entry: %.1f bytes (used_memory growth / (N x tables)); "
                      "tables alone: %.1f bytes\n" % (
                          grown / entries, kinds["tables"][1] / entries))
            # leave the cluster empty for the next row
            redis.RedisCluster.from_url(args.url).flushall(target_nodes="primaries")
        print("## Throughput (loopback cluster of 3 primaries + 3 replicas, 2 cores)\n")
        print("| clients | bulk insert fps/s | query_many queries/s | wrong answers |")
        print("|---:|---:|---:|---:|")
        for clients, inserts, queries, wrong in rows:
            print("| %d | %.0f | %.0f | %d |" % (clients, inserts, queries, wrong))
        figures["throughput"] = [dict(zip(("clients", "inserts_per_s", "queries_per_s",
                                           "wrong"), row)) for row in rows]
        projection(figures)
    finally:
        if cluster is not None:
            cluster.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


def check_answers(fps, qs, answers, rng, sample=500):
    """How many of a sample of answers differ from brute force."""
    wrong = 0
    for i in rng.choice(qs.size, size=min(sample, qs.size), replace=False):
        distances = np.bitwise_count(fps ^ qs[i])
        expected = sorted(np.nonzero(distances <= K)[0].tolist())
        wrong += sorted(answers[i]) != expected
    return wrong


def projection(figures):
    """RAM for 1B fingerprints, from the measured bytes per key and per entry."""
    n = 10**9
    blocks = Layout.choose_blocks(K, n)
    layout = Layout(blocks, K)
    bits = min(24, 8 * max(0, (min(layout.prefix_bits) - 6) // 8))
    width = 8 - bits // 8
    keys, total, values = figures["by_kind"]["tables"]
    per_key = (total - values) / keys  # a bucket's RAM beyond its entries
    tables = layout.tables * (n * width + per_key * min(2**bits, n))
    docs = sum(figures["by_kind"][k][1] for k in ("documents", "fingerprint index")
               if k in figures["by_kind"]) / figures["n"] * n
    total = tables + docs
    node = 64 * 2**30 * 0.75  # a 64 GiB primary, filled to 75%
    figures["projection_1b"] = {"blocks": blocks, "tables": layout.tables, "bucket_bits": bits,
                                "table_bytes": tables, "document_bytes": docs,
                                "primaries_of_64gib": math.ceil(total / node)}
    print("\n## 1B fingerprints (projected)\n")
    print("k = %d, %d blocks, %d tables, buckets of %d bits (%d-byte entries, %.0f per bucket); "
          "%.0f bytes of bucket overhead a key, documents and index as measured here "
          "(int keys).\n" % (K, blocks, layout.tables, bits, width, n / 2**bits, per_key))
    print("| | GiB |\n|---|---:|")
    print("| tables | %.0f |\n| documents and index | %.0f |\n| total (primaries) | %.0f |"
          % (tables / 2**30, docs / 2**30, total / 2**30))
    print("\n%d primaries of 64 GiB filled to 75%% (and as many replicas)"
          % figures["projection_1b"]["primaries_of_64gib"])


if __name__ == "__main__":
    main()
