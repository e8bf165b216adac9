"""insert_many from arrays (keys=, fingerprints=) beside insert_many of
(key, fingerprint) tuples, into a new database (10 tables, k = 3), and
query_many(arrays=True) beside query_many's lists of Matches.

N random fingerprints, keys 0..N-1 in a numpy int64 array. "tuples" starts
from the same numpy arrays (the tuples are built from them, as a caller
holding arrays would); "tuples, built" times insert_many alone. Each load is
timed whole, and split into encoding (the documents the storage takes) and
the storage's write (backend, commit). One transaction, then batches of the
default 100,000 (--batch: 0 is one transaction). Each row is the best of
--repeat runs.

Usage: python tools/bench_arrays.py [--n 1000000 ...] [--batch 0 100000] [--queries 100000]
                                    [--repeat 1] [--backend lmdb]
Needs: numpy
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import simhashdb
from simhashdb import records


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def load(workdir, name, backend, insert):
    """Seconds to run ``insert(db)`` on a new database, its storage write alone."""
    path = os.path.join(workdir, name)
    db = simhashdb.DB(path, backend=backend)
    assert db.tables == 10 and db.distance == 3
    write, writing = db._storage.write, []

    def timed_write(body, documents=0):
        seconds, result = timed(lambda: write(body, documents))
        writing.append(seconds)
        return result

    db._storage.write = timed_write
    seconds, _ = timed(lambda: insert(db))
    db._storage.write = write
    db.close()
    shutil.rmtree(path, ignore_errors=True)
    return seconds, sum(writing)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--batch", type=int, nargs="+", default=[0, 100_000])
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--backend", default="lmdb")
    args = parser.parse_args()
    rng = np.random.default_rng(22)
    print("| N | load | batch | seconds | fps/s | encode s | storage s | vs tuples |")
    print("|---|---|---|---|---|---|---|---|")
    query_rows = []
    for n in args.n:
        keys = np.arange(n, dtype=np.int64)
        fps = rng.integers(0, 2**64, n, dtype=np.uint64)
        for batch in (size or n for size in args.batch):
            workdir = tempfile.mkdtemp(prefix="bench_arrays")
            try:
                built = list(zip(keys.tolist(), fps.tolist()))
                rows = {
                    "tuples": lambda db: db.insert_many(
                        list(zip(keys.tolist(), fps.tolist())), batch_size=batch),
                    "tuples, built": lambda db: db.insert_many(built, batch_size=batch),
                    "arrays": lambda db: db.insert_many(keys=keys, fingerprints=fps,
                                                        batch_size=batch),
                }
                encode = {"tuples": lambda: records.encode_documents(
                              list(zip(keys.tolist(), fps.tolist())), 511, 0),
                          "tuples, built": lambda: records.encode_documents(built, 511, 0),
                          "arrays": lambda: records.int_arrays(keys, fps)[1](0, n, 0)}
                base = None
                for name, insert in rows.items():
                    seconds, storage = min(load(workdir, name, args.backend, insert)
                                           for _ in range(args.repeat))
                    base = base or seconds
                    print("| %s | %s | %s | %.2f | %s | %.2f | %.2f | %.2fx |" % (
                        f"{n:,}", name, f"{batch:,}", seconds, f"{n / seconds:,.0f}",
                        min(timed(encode[name])[0] for _ in range(args.repeat)), storage,
                        base / seconds), flush=True)
                built = None  # the tuples freed before the next size
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        workdir = tempfile.mkdtemp(prefix="bench_arrays")
        try:
            with simhashdb.DB(os.path.join(workdir, "q"), backend=args.backend) as db:
                db.insert_many(keys=keys, fingerprints=fps, batch_size=n)
                near = fps[rng.integers(0, n, args.queries)] ^ (
                    np.uint64(1) << rng.integers(0, 64, args.queries).astype(np.uint64))
                db.query_many(near)  # warm
                lists = min(timed(lambda: db.query_many(near))[0] for _ in range(args.repeat))
                flat = min(timed(lambda: db.query_many(near, arrays=True))[0]
                           for _ in range(args.repeat))
                query_rows.append((n, lists, flat))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n| N | probes | lists of Matches s | arrays s | ratio |")
    print("|---|---|---|---|---|")
    for n, lists, flat in query_rows:
        print("| %s | %s | %.3f | %.3f | %.2fx |" % (f"{n:,}", f"{args.queries:,}", lists, flat,
                                                 lists / flat))


if __name__ == "__main__":
    main()
