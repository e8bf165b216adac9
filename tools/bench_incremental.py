"""A monthly update on Spark: a new segment deduplicated against the corpus
kept so far (simhashdb.spark.dedupe(new, against=old)), side by side with
re-deduplicating old + new (simhashdb.spark.dedupe(old ∪ new)) in the same
session.

The corpus is bench_spark's planted one (a tenth of the fingerprints with 1
to 5 variants up to 3 bits away), OLD fingerprints; the new segment is NEW
more: half fresh, a fifth near copies (0 to 3 bits) of old ones, the rest
near copies within the segment. Both sides are written to Parquet first and
read by Spark, and each result is written to Parquet (the timings include
both). The incremental result is checked equal to the in-memory oracle
(simhashdb.find_all_indices over old + new: the new rows with no pair in
old, then one of each cluster among them) and to the database route (a
database holding old answering query_many for the new rows, then
find_all_indices over the survivors).

With --text, the text rule (signatures of synthetic texts, as bench_spark
--text makes them), checked against the database route only
(query_text_many is the oracle of the text rule).

Usage: python tools/bench_incremental.py [--old 1000000] [--new 100000] [--master local[2]]
       python tools/bench_incremental.py --text --old 100000 --new 10000
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simhashdb  # noqa: E402
from simhashdb import spark as sspark  # noqa: E402
from bench_spark import planted_corpus, start_session, text_corpus  # noqa: E402

DISTANCE = 3


def segment(old, n, seed=1):
    """n new fingerprints: half fresh, a fifth near copies of old ones, the
    rest near copies of fresh ones."""
    rng = np.random.default_rng(seed)
    fresh = rng.integers(0, 2**64, size=n // 2, dtype=np.uint64, endpoint=False)
    of_old = old[rng.choice(len(old), size=n // 5)]
    of_new = fresh[rng.choice(len(fresh), size=n - len(fresh) - len(of_old))]
    copies = np.concatenate([of_old, of_new])
    for _ in range(3):
        bit = np.uint64(1) << rng.integers(0, 64, size=len(copies)).astype(np.uint64)
        copies ^= np.where(rng.random(len(copies)) < 0.6, bit, np.uint64(0))
    return np.concatenate([fresh, copies])


def oracle(old, new):
    """The keys (positions in new) the incremental dedupe keeps, in memory."""
    both = np.concatenate([new, old])
    pairs = np.array(simhashdb.find_all_indices(both, DISTANCE + 2, DISTANCE), dtype=np.int64)
    pairs = pairs.reshape(-1, 2)
    across = pairs[(pairs[:, 0] < len(new)) & (pairs[:, 1] >= len(new))]
    seen = set(across[:, 0].tolist())
    return kept_of(new, [i for i in range(len(new)) if i not in seen])


def kept_of(fps, rows):
    """Of the rows (positions of fps), the smallest of each cluster among them."""
    parent = {r: r for r in rows}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, b in simhashdb.find_all_indices(fps[rows], DISTANCE + 2, DISTANCE):
        ra, rb = root(rows[a]), root(rows[b])
        parent[max(ra, rb)] = min(ra, rb)
    return sorted(r for r in rows if root(r) == r)


def database_route(old, new, where, texts=None):
    """The database's answer: new rows with no near-duplicate in a database
    of old (query_many, or query_text_many for texts), then one of each
    cluster of those (by find_all_indices, or a database's clusters)."""
    with simhashdb.DB(os.path.join(where, "old.db"), distance=DISTANCE,
                      recipe=simhashdb.RECIPE if texts else None) as db:
        if texts:
            db.insert_text_many(zip(range(len(old)), texts[0]), batch_size=50_000)
            found = db.query_text_many(texts[1])
        else:
            db.insert_many(zip(range(len(old)), old.tolist()), batch_size=100_000)
            found = db.query_many(new.tolist())
    fresh = [i for i, hits in enumerate(found) if not hits]
    if not texts:
        return kept_of(new, fresh)
    with simhashdb.DB(os.path.join(where, "fresh.db"), distance=DISTANCE,
                      recipe=simhashdb.RECIPE) as db:
        db.insert_text_many((i, texts[1][i]) for i in fresh)
        dropped = {k for c in db.clusters() for k in c if k != min(c)}
    return [i for i in fresh if i not in dropped]


def write(path, keys, fps, signatures=None):
    columns = {"key": pa.array(keys, pa.int64()), "fingerprint": pa.array(fps, pa.uint64())}
    if signatures is not None:
        columns["signature"] = pa.array(signatures, pa.binary())
    pq.write_table(pa.table(columns), path)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=int, default=1_000_000)
    parser.add_argument("--new", type=int, default=100_000)
    parser.add_argument("--text", action="store_true", help="texts by the text rule")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    where = tempfile.mkdtemp(prefix="bench-incremental-")
    try:
        texts = None
        if args.text:
            fps, signatures, words = text_corpus((args.old + args.new) * 10 // 11)
            fps, signatures, words = fps[:args.old + args.new], signatures[:args.old + args.new], \
                words[:args.old + args.new]   # the copies of old ones fall in new
            old, new = fps[:args.old], fps[args.old:]
            sig_old, sig_new = signatures[:args.old], signatures[args.old:]
            texts = (words[:args.old], words[args.old:])
        else:
            old = planted_corpus(args.old * 10 // 13)[:args.old]
            new = segment(old, args.new)
            sig_old = sig_new = None
        write(os.path.join(where, "old.parquet"), range(len(old)), old, sig_old)
        write(os.path.join(where, "new.parquet"), range(len(new)), new, sig_new)
        session = start_session(args, "bench-incremental")
        read = session.read.parquet
        options = {"signature": "signature"} if args.text else {}
        # old + new, keyed apart: new keys after old ones
        union = os.path.join(where, "union.parquet")
        write(union, list(range(len(new))) + list(range(len(new), len(new) + len(old))),
              np.concatenate([new, old]),
              None if not args.text else list(sig_new) + list(sig_old))
        timings = {}
        for run in range(2):   # alternating, the second run of each reported
            timings["incremental"], _ = timed(lambda: sspark.dedupe(
                read(os.path.join(where, "new.parquet")), DISTANCE,
                against=read(os.path.join(where, "old.parquet")), **options)
                .write.mode("overwrite").parquet(os.path.join(where, "inc.parquet")))
            timings["full"], _ = timed(lambda: sspark.dedupe(read(union), DISTANCE, **options)
                                       .write.mode("overwrite").parquet(
                                           os.path.join(where, "full.parquet")))
        kept = sorted(pq.read_table(os.path.join(where, "inc.parquet")).column("key")
                      .to_pylist())
        seconds, by_database = timed(lambda: database_route(old, new, where, texts))
        checks = {"equals the database route": kept == by_database}
        if not args.text:
            checks["equals the in-memory oracle"] = kept == oracle(old, new)
        figures = {"old": len(old), "new": len(new), "rule": "text" if args.text else "distance",
                   "master": args.master, "kept": len(kept),
                   "incremental s": round(timings["incremental"], 1),
                   "full s": round(timings["full"], 1),
                   "speedup": round(timings["full"] / timings["incremental"], 2),
                   "database route s": round(seconds, 1), **checks}
        print("| " + " | ".join(figures) + " |")
        print("|" + "---|" * len(figures))
        print("| " + " | ".join(str(v) for v in figures.values()) + " |")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(figures, out)
        session.stop()
        if not all(checks.values()):
            sys.exit("the incremental dedupe differs: %s" % checks)
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
