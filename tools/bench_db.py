"""simhashdb.DB (native and py-lmdb backends) side by side with faiss
IndexBinaryMultiHash and numpy brute force.

N random fingerprints, 10% of them planted near-duplicates (1 to 5 bits from
another), k = 3. Probes: half near a stored fingerprint (0 to 3 bits flipped),
half random. The rate of a batch query (query_many, faiss's range_search) is
the median of five calls after a first one. Recall of every method is checked
against brute force. A second table: query_many above the built distance (k2 =
3..6 on the k = 3 database).

Usage: python tools/bench_db.py [--n 1000000] [--big] [--queries 10000] [--json FILE]
       [--import both|one|batches|arrays] [--batch-size B] [--churn ROUNDS] [--no-faiss] [--no-compact] [--above 2000]
Needs: pip install numpy faiss-cpu   (see tools/requirements.txt)
"""

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

import simhashdb

K = 3


def corpus(n, rng):
    fps = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    planted = rng.choice(n, size=n // 10, replace=False)
    sources = rng.integers(0, n, size=planted.size)
    fps[planted] = flip_random_bits(fps[sources], rng.integers(1, 6, size=planted.size), rng)
    return fps


def flip_random_bits(values, counts, rng):
    """values with counts[i] distinct random bits of values[i] flipped: random
    bits are set in a mask until it has as many as asked (a uniform choice)."""
    mask = np.zeros(values.size, dtype=np.uint64)
    todo = np.nonzero(np.asarray(counts) > 0)[0]
    while todo.size:
        mask[todo] |= np.uint64(1) << rng.integers(0, 64, size=todo.size, dtype=np.uint64)
        todo = todo[np.bitwise_count(mask[todo]) < counts[todo]]
    return values ^ mask


def probes(fps, q, rng):
    return split_probes(fps, q, rng)[0]


def split_probes(fps, q, rng):
    """``q`` probes, half near a stored fingerprint (0 to K bits flipped), half
    random, shuffled; and the near ones and the random ones apart."""
    near = flip_random_bits(fps[rng.integers(0, fps.size, size=q // 2)],
                            rng.integers(0, K + 1, size=q // 2), rng)
    far = rng.integers(0, 2**64, size=q - q // 2, dtype=np.uint64, endpoint=False)
    out = np.concatenate([near, far])
    rng.shuffle(out)
    return out, near, far


def brute_force(fps, probe):
    return set(np.nonzero(np.bitwise_count(fps ^ probe) <= K)[0].tolist())


def latencies(fn, items):
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    times = np.array(times) * 1e6
    return np.percentile(times, 50), np.percentile(times, 99), len(items) / (times.sum() / 1e6)


LAYOUT = {}  # blocks and table_distance, where given: the database chooses them otherwise
BATCH_CALLS = 5  # timed calls of a batch query, after one that warms: their median counts


def batch_rate(search, qs):
    """Queries a second of ``search(qs)``: the median of BATCH_CALLS calls after
    a first one (the same rule for ours and faiss's); and the first call's answer."""
    answer = search(qs)
    times = []
    for _ in range(BATCH_CALLS):
        start = time.perf_counter()
        search(qs)
        times.append(time.perf_counter() - start)
    return len(qs) / float(np.median(times)), answer


def bench_ours(fps, qs, parts, truth, workdir, backend, k2_rows=None, imports="both",
               above=2000, compact=True, batch_size=None, writes=True):
    """Import into an empty database in one transaction (and, timed alone,
    from arrays into another) and in batches
    (``batch_size``, default insert_many's) into another (``imports``: both,
    one or batches), then query, insert-if-new and compact the first one built
    (with ``writes``); ``parts``: the near probes and the random ones, each
    queried alone too. Returns the figures and the last database built, open,
    unchanged since its import but for the queries."""
    path = os.path.join(workdir, backend + ".db")
    row = {"method": "simhashdb.DB, backend %r" % backend}
    db = None
    if imports in ("both", "one"):
        db = simhashdb.DB(path, distance=K, expected_size=fps.size, backend=backend, **LAYOUT)
        records = list(zip(range(fps.size), fps.tolist()))
        start = time.perf_counter()
        db.insert_many(records, batch_size=len(records))
        row["import_one_txn_s"] = time.perf_counter() - start
        stats = db.stats()
        row["bytes_per_fp_table"] = stats["disk_bytes"] / (fps.size * stats["tables"])
        del records
        with simhashdb.DB(path + ".arrays", distance=K, expected_size=fps.size,
                          backend=backend, **LAYOUT) as from_arrays:
            start = time.perf_counter()
            from_arrays.insert_many(keys=np.arange(fps.size, dtype=np.uint64),
                                    fingerprints=fps, batch_size=fps.size)
            row["import_arrays_s"] = time.perf_counter() - start
        shutil.rmtree(path + ".arrays")
    if imports == "arrays":
        db = simhashdb.DB(path, distance=K, expected_size=fps.size, backend=backend, **LAYOUT)
        start = time.perf_counter()
        db.insert_many(keys=np.arange(fps.size, dtype=np.uint64), fingerprints=fps,
                       **({"batch_size": batch_size} if batch_size else {}))
        row["import_arrays_s"] = time.perf_counter() - start
        stats = db.stats()
        row["bytes_per_fp_table"] = stats["disk_bytes"] / (fps.size * stats["tables"])
    batched = None
    if imports in ("both", "batches"):
        batched = simhashdb.DB(path + ".batched", distance=K, expected_size=fps.size,
                               backend=backend, **LAYOUT)
        start = time.perf_counter()
        batched.insert_many(streamed(fps), **({"batch_size": batch_size} if batch_size else {}))
        row["import_batches_s"] = time.perf_counter() - start
        stats = batched.stats()
        row["batched_bytes_per_fp_table"] = stats["disk_bytes"] / (fps.size * stats["tables"])
    last = batched or db
    db = db or batched
    single = qs[:min(len(qs), 5000)].tolist()
    db.query_many(qs)  # the same pages for every method: warm
    row["p50_us"], row["p99_us"], row["single_qps"] = latencies(db.query, single)
    row["batch_qps"], results = batch_rate(db.query_many, qs)
    row["recall"] = recall([{m.key for m in r} for r in results], truth)
    for name, part in zip(("near_qps", "random_qps"), parts):
        row[name] = batch_rate(db.query_many, part)[0]
    if k2_rows is not None and above:
        k2_rows += bench_above(db, fps, qs[:above], backend)
    if not writes:
        row["note"] = "blocks=%d, %d tables" % (db.blocks, db.tables)
        if last is not db:
            db.close()
        return row, last
    new = np.arange(fps.size, fps.size + 20000)
    batch = [(int(k), int(fp)) for k, fp in zip(new, probes(fps, new.size, np.random.default_rng(1)))]
    start = time.perf_counter()
    for i in range(0, len(batch), 1000):
        db.insert_if_new_many(batch[i:i + 1000])
    row["if_new_per_s"] = len(batch) / (time.perf_counter() - start)
    stats = db.stats()
    if compact:
        db.compact()
        stats = db.stats()
        row["compacted_bytes_per_fp_table"] = stats["disk_bytes"] / (len(db) * stats["tables"])
    row["bytes_per_fp"] = stats["disk_bytes"] / len(db)
    row["note"] = "blocks=%d, %d tables, data file %.2f GB%s" % (
        stats["blocks"], stats["tables"], stats["disk_bytes"] / 1e9,
        "" if imports != "batches" else "; built and queried in batches of %d"
        % (batch_size or simhashdb.db.DEFAULT_BATCH_SIZE))
    if last is not db:
        db.close()
    return row, last if last is not db else None


def streamed(fps, chunk=1_000_000):
    """(key, fingerprint) records of fps, made a chunk at a time."""
    for start in range(0, fps.size, chunk):
        yield from zip(range(start, start + chunk), fps[start:start + chunk].tolist())


def churn(db, fps, rounds, fraction, rng, oracle):
    """Rounds of deleting ``fraction`` of the documents and inserting as many
    new ones (delete_many, insert_many, default batches): the time and the
    database's size after each; then recall against brute force over what is
    left."""
    keys = np.arange(fps.size)
    live = fps.copy()
    next_key = fps.size
    tables = db.tables
    stats = db.stats()
    rows = [{"round": 0, "disk_MB": stats["disk_bytes"] / 1e6,
             "bytes_per_fp_table": stats["disk_bytes"] / (live.size * tables),
             "distinct": stats["distinct_fingerprints"], "stale": meta_counter(db, b"stale")}]
    for r in range(1, rounds + 1):
        m = int(live.size * fraction)
        gone = rng.choice(live.size, size=m, replace=False)
        start = time.perf_counter()
        db.delete_many(keys[gone].tolist())
        delete_s = time.perf_counter() - start
        keep = np.ones(live.size, dtype=bool)
        keep[gone] = False
        keys, live = keys[keep], live[keep]
        new_fps = corpus(m, rng)
        new_keys = np.arange(next_key, next_key + m)
        next_key += m
        start = time.perf_counter()
        db.insert_many(zip(new_keys.tolist(), new_fps.tolist()))
        insert_s = time.perf_counter() - start
        keys, live = np.concatenate([keys, new_keys]), np.concatenate([live, new_fps])
        stats = db.stats()
        rows.append({"round": r, "delete_s": delete_s, "insert_s": insert_s,
                     "round_s": delete_s + insert_s, "disk_MB": stats["disk_bytes"] / 1e6,
                     "bytes_per_fp_table": stats["disk_bytes"] / (live.size * tables),
                     "distinct": stats["distinct_fingerprints"],
                     "stale": meta_counter(db, b"stale")})
    qs = probes(live, oracle, rng)
    truth = {i: set(keys[list(brute_force(live, q))].tolist()) for i, q in enumerate(qs)}
    results = db.query_many(qs)
    rows[-1]["recall"] = recall([{m.key for m in r} for r in results], truth)
    return rows


def meta_counter(db, name):
    """A counter of the native backend's meta (``stale``), None elsewhere."""
    try:
        with db._storage.read() as view:
            raw = view._txn.get(name, True)
    except AttributeError:
        return None
    return int.from_bytes(raw, "big") if raw else 0


def bench_above(db, fps, qs, backend):
    """query_many at distances above the built one, recall against brute force."""
    rows = []
    for k2 in range(K, 2 * K + 1):
        start = time.perf_counter()
        results = db.query_many(qs, distance=k2)
        elapsed = time.perf_counter() - start
        checked = range(min(50, len(qs)))
        truth = {i: set(np.nonzero(np.bitwise_count(fps ^ qs[i]) <= k2)[0].tolist())
                 for i in checked}
        rows.append({"backend": backend, "k2": k2, "qps": len(qs) / elapsed,
                     "recall": recall([{m.key for m in r} for r in results], truth)})
    return rows


def bench_faiss(fps, qs, parts, truth, nhash, b, nflip):
    import faiss
    row = {"method": "faiss IndexBinaryMultiHash(64, %d, %d), nflip %d" % (nhash, b, nflip)}
    as_bytes = fps.view(np.uint8).reshape(-1, 8)
    q_bytes = qs.view(np.uint8).reshape(-1, 8)
    start = time.perf_counter()
    index = faiss.IndexBinaryMultiHash(64, nhash, b)
    index.nflip = nflip
    index.add(as_bytes)
    row["import_one_txn_s"] = time.perf_counter() - start
    single = q_bytes[:min(len(qs), 5000)]
    row["p50_us"], row["p99_us"], row["single_qps"] = latencies(
        lambda q: index.range_search(q.reshape(1, 8), K + 1), single)  # keeps distance < radius
    row["batch_qps"], (lims, _, ids) = batch_rate(lambda q: index.range_search(q, K + 1), q_bytes)
    row["recall"] = recall([set(ids[lims[i]:lims[i + 1]].tolist()) for i in range(len(qs))], truth)
    for name, part in zip(("near_qps", "random_qps"), parts):
        row[name] = batch_rate(lambda q: index.range_search(q, K + 1),
                               part.view(np.uint8).reshape(-1, 8))[0]
    row["note"] = "in memory, %d threads" % faiss.omp_get_max_threads()
    return row


def bench_numpy(truth, seconds):
    """The brute force that gave ``truth``, timed."""
    return {"method": "numpy brute force", "batch_qps": len(truth) / seconds,
            "recall": "1.0000", "note": "in memory; gives the truth"}


def recall(found, truth):
    hits = sum(len(found[i] & t) for i, t in truth.items())
    wanted = sum(len(t) for t in truth.values())
    extra = sum(len(found[i] - t) for i, t in truth.items())
    return "%.4f%s" % (hits / wanted if wanted else 1.0, " (+%d wrong)" % extra if extra else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--big", action="store_true", help="N = 10,000,000")
    parser.add_argument("--queries", type=int, default=10000)
    parser.add_argument("--oracle", type=int, default=200, help="probes checked by brute force")
    parser.add_argument("--fallback-n", type=int, default=1_000_000,
                        help="fingerprints for the py-lmdb backend (0: skip it)")
    parser.add_argument("--import", dest="imports", choices=("both", "one", "batches", "arrays"),
                        default="both", help="how the native database is built (both: "
                        "one transaction, queried, and default batches into another; "
                        "arrays: one insert_many of numpy arrays, queried)")
    parser.add_argument("--batch-size", type=int,
                        help="of the import in batches (default: insert_many's)")
    parser.add_argument("--above", type=int, default=2000,
                        help="probes for query_many above the built distance (0: skip)")
    parser.add_argument("--no-compact", action="store_true")
    parser.add_argument("--no-faiss", action="store_true")
    parser.add_argument("--churn", type=int, default=0, metavar="ROUNDS",
                        help="then delete --churn-fraction of the last database built and "
                             "insert as many new, ROUNDS times (no insert-if-new or compaction "
                             "before)")
    parser.add_argument("--churn-fraction", type=float, default=0.1)
    parser.add_argument("--blocks", type=int, help="the databases' blocks (default: chosen)")
    parser.add_argument("--table-distance", type=int,
                        help="the distance their tables are built for (default: chosen)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    LAYOUT.update({name: value for name, value in (("blocks", args.blocks),
                   ("table_distance", args.table_distance)) if value is not None})
    n = 10_000_000 if args.big else args.n
    rng = np.random.default_rng(0)
    fps = corpus(n, rng)
    qs, *parts = split_probes(fps, args.queries, rng)
    start = time.perf_counter()
    truth = {i: brute_force(fps, qs[i]) for i in range(min(args.oracle, len(qs)))}
    oracle_s = time.perf_counter() - start
    workdir = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    rows, k2_rows, churn_rows = [], [], []
    try:
        row, batched = bench_ours(fps, qs, parts, truth, workdir, "lmdb", k2_rows, args.imports,
                                  args.above, not args.no_compact, args.batch_size,
                                  not args.churn)
        rows.append(row)
        if batched is not None:
            if args.churn:
                churn_rows = churn(batched, fps, args.churn, args.churn_fraction,
                                   np.random.default_rng(2), args.oracle)
            batched.close()
        if args.fallback_n:
            small = fps[:min(n, args.fallback_n)]
            small_truth = {i: brute_force(small, qs[i]) for i in truth}
            row, batched = bench_ours(small, qs, parts, small_truth, workdir, "py-lmdb", k2_rows,
                                      args.imports, args.above, not args.no_compact,
                                      args.batch_size)
            if batched is not None:
                batched.close()
            row["note"] += "; N = %d" % small.size
            rows.append(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        if not args.no_faiss:
            rows.append(bench_faiss(fps, qs, parts, truth, 2, 32, 1))
            rows.append(bench_faiss(fps, qs, parts, truth, 4, 16, 0))
    except ImportError:
        print("faiss not installed: pip install faiss-cpu")
    rows.append(bench_numpy(truth, oracle_s))
    faiss = next((r for r in rows if "(64, 2, 32)" in r["method"]), None)
    for row in rows:
        for rate, ratio in (("batch_qps", "batch_vs_faiss_2x32"), ("near_qps", "near_vs_faiss"),
                            ("random_qps", "random_vs_faiss")):
            if faiss and rate in row:
                row[ratio] = "%.2fx" % (row[rate] / faiss[rate])
    print("N = %d fingerprints (10%% planted near-duplicates), k = %d, %d probes, %d cores"
          % (n, K, len(qs), os.cpu_count()))
    table(rows, ["method", "import_one_txn_s", "import_arrays_s", "import_batches_s", "p50_us",
                 "p99_us", "single_qps", "batch_qps", "batch_vs_faiss_2x32", "near_qps",
                 "near_vs_faiss", "random_qps", "random_vs_faiss", "if_new_per_s",
                 "bytes_per_fp", "bytes_per_fp_table", "batched_bytes_per_fp_table",
                 "compacted_bytes_per_fp_table", "recall", "note"])
    if k2_rows:
        print("\nquery_many above the built distance (k = %d database, %d probes)"
              % (K, args.above))
        table(k2_rows, ["backend", "k2", "qps", "recall"])
    if churn_rows:
        print("\nchurn of the database built %s: each round deletes %d%% and inserts as many "
              "new (default batches); recall after the last round, %d probes"
              % ("in one transaction" if args.imports == "one" else "in batches",
                 round(args.churn_fraction * 100), args.oracle))
        table(churn_rows, ["round", "delete_s", "insert_s", "round_s", "disk_MB",
                           "bytes_per_fp_table", "distinct", "stale", "recall"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "rows": rows, "above": k2_rows, "churn": churn_rows}, f,
                      indent=1)


def table(rows, columns):
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(_cell(row.get(c, "-")) for c in columns) + " |")


def _cell(value):
    return "%.1f" % value if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
