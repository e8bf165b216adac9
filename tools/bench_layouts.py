"""The layouts of a database of N fingerprints side by side, k = 3: the one
simhashdb chooses for N and this machine's memory, a table per choice of 3
blocks (Manku's, m = 5 or 6), and fewer tables built for a smaller distance
and probed wider (multi-index hashing: m = 2 tables of 32 bits built for 1,
m = 4 built for 2).

The corpus is tools/bench_db.py's (random fingerprints, 10% planted 1 to 5
bits from another), loaded from arrays in batches, int keys. For each layout:
the build's seconds, the file's bytes a fingerprint, query_many's rate over
probes near stored fingerprints and over random ones (the best of three
calls), single query p50 / p99, insert_if_new_many in durable batches of
1,000, and the answers of 300 probes at distances 3 and 4 against brute force.

Usage: python tools/bench_layouts.py [--n 10000000] [--queries 20000]
       [--layouts chosen,manku,2x1,4x2] [--batch 1000000] [--json FILE]
"""

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

import simhashdb
from bench_db import corpus, flip_random_bits, latencies, table
from simhashdb.layout import Layout

K = 3


def layouts(n, names):
    chosen = Layout.choose(K, n)
    every = {"chosen": (chosen.blocks, chosen.distance),
             "manku": (Layout.choose_blocks(K, n), K), "2x1": (2, 1), "4x2": (4, 2)}
    chosen_too = [name for name in names if name != "chosen" and every[name] == every["chosen"]]
    return [(name + "".join(" = " + same for same in chosen_too) * (name == "chosen"), every[name])
            for name in names if name not in chosen_too]


def measure(path, fps, blocks, table_distance, near, far, batch, rng):
    row = {"blocks": blocks, "table distance": table_distance}
    start = time.perf_counter()
    with simhashdb.DB(path, distance=K, blocks=blocks, table_distance=table_distance,
                      expected_size=fps.size) as db:
        for i in range(0, fps.size, batch):
            db.insert_many(keys=np.arange(i, min(fps.size, i + batch), dtype=np.uint64),
                           fingerprints=fps[i:i + batch])
        row["tables"], row["build s"] = db.tables, time.perf_counter() - start
        row["bytes a fp"] = db.stats()["disk_bytes"] / fps.size
        for name, probes in (("near", near), ("random", far)):
            db.query_many(probes[:1000])
            times = []
            for _ in range(3):
                start = time.perf_counter()
                db.query_many(probes)
                times.append(time.perf_counter() - start)
            row["query_many %s q/s" % name] = probes.size / min(times)
        singles = [int(p) for p in near[:2000]]
        row["query p50 us"], row["query p99 us"], _ = latencies(db.query, singles)
        new = flip_random_bits(fps[rng.integers(0, fps.size, 20_000)],
                               rng.integers(0, 2 * K, 20_000), rng)
        start = time.perf_counter()
        decisions = db.insert_if_new_many(zip(range(fps.size, fps.size + new.size),
                                              new.tolist()), batch_size=1000)
        row["insert_if_new docs/s"] = new.size / (time.perf_counter() - start)
        wrong = 0
        stored = np.nonzero([not d for d in decisions])[0]  # none was near: stored
        keys = np.concatenate([np.arange(fps.size), fps.size + stored])
        oracle = np.concatenate([fps, new[stored]])
        for distance in (K, K + 1):
            for probe in near[:150].tolist() + far[:150].tolist():
                want = set(keys[np.bitwise_count(oracle ^ np.uint64(probe)) <= distance].tolist())
                wrong += {m.key for m in db.query(probe, distance)} != want
        row["wrong of 600"] = wrong
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--layouts", default="chosen,manku,2x1,4x2")
    parser.add_argument("--batch", type=int, default=1_000_000, help="fingerprints a load")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    fps = corpus(args.n, rng)
    near = flip_random_bits(fps[rng.integers(0, fps.size, args.queries)],
                            rng.integers(0, K + 1, args.queries), rng)
    far = rng.integers(0, 2**64, args.queries, dtype=np.uint64, endpoint=False)
    print("N = %d, k = %d, %.0f GiB of memory, load average %s, backend %s" % (
        args.n, K, simhashdb.layout.physical_memory() / 2**30,
        " ".join("%.2f" % x for x in os.getloadavg()), os.environ.get("SIMHASHDB_BACKEND",
                                                                     "lmdb")))
    rows = []
    for name, (blocks, table_distance) in layouts(args.n, args.layouts.split(",")):
        root = tempfile.mkdtemp(prefix="bench-layouts-")
        try:
            row = measure(os.path.join(root, "db"), fps, blocks, table_distance, near, far,
                          args.batch, np.random.default_rng(1))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append(dict(row, layout=name))
        print(name, row, flush=True)
    base = rows[0]
    for row in rows:
        for column in ("query_many near q/s", "query_many random q/s", "insert_if_new docs/s"):
            row[column + " ratio"] = row[column] / base[column]
    table(rows, ["layout", "blocks", "table distance", "tables", "build s", "bytes a fp",
                 "query_many near q/s", "query_many random q/s", "query p50 us", "query p99 us",
                 "insert_if_new docs/s", "query_many near q/s ratio",
                 "query_many random q/s ratio", "wrong of 600"])
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
