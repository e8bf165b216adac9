"""simhashdb.DB side by side with faiss IndexBinaryMultiHash and numpy brute force.

N random fingerprints, 10% of them planted near-duplicates (1 to 5 bits from
another), k = 3. Probes: half near a stored fingerprint (0 to 3 bits flipped),
half random. Recall of every method is checked against brute force.

Usage: python tools/bench_db.py [--n 1000000] [--big] [--queries 10000]
Needs: pip install numpy faiss-cpu   (see tools/requirements.txt)
"""

import argparse
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
    out = values.copy()
    for i, count in enumerate(counts):
        for bit in rng.choice(64, size=count, replace=False):
            out[i] ^= np.uint64(1) << np.uint64(bit)
    return out


def probes(fps, q, rng):
    near = flip_random_bits(fps[rng.integers(0, fps.size, size=q // 2)],
                            rng.integers(0, K + 1, size=q // 2), rng)
    far = rng.integers(0, 2**64, size=q - q // 2, dtype=np.uint64, endpoint=False)
    out = np.concatenate([near, far])
    rng.shuffle(out)
    return out


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


def bench_ours(fps, qs, truth, workdir):
    path = os.path.join(workdir, "bench.db")
    row = {"method": "simhashdb.DB"}
    db = simhashdb.DB(path, distance=K, expected_size=fps.size)
    start = time.perf_counter()
    db.insert_many(zip(range(fps.size), fps.tolist()))
    row["build_s"] = time.perf_counter() - start
    single = qs[:min(len(qs), 5000)].tolist()
    row["p50_us"], row["p99_us"], row["single_qps"] = latencies(db.query, single)
    start = time.perf_counter()
    results = db.query_many(qs)
    row["batch_qps"] = len(qs) / (time.perf_counter() - start)
    row["recall"] = recall([{m.key for m in r} for r in results], truth)
    new = np.arange(fps.size, fps.size + 20000)
    batch = [(int(k), int(fp)) for k, fp in zip(new, probes(fps, new.size, np.random.default_rng(1)))]
    start = time.perf_counter()
    for i in range(0, len(batch), 1000):
        db.insert_if_new_many(batch[i:i + 1000])
    row["if_new_per_s"] = len(batch) / (time.perf_counter() - start)
    stats = db.stats()
    row["bytes_per_fp_table"] = stats["disk_bytes"] / (len(db) * stats["tables"])
    db.compact()
    row["compacted_bytes_per_fp_table"] = db.stats()["disk_bytes"] / (len(db) * stats["tables"])
    row["note"] = "blocks=%d, %d tables" % (stats["blocks"], stats["tables"])
    db.close()
    return row


def bench_faiss(fps, qs, truth):
    import faiss
    faiss.omp_set_num_threads(1)
    row = {"method": "faiss IndexBinaryMultiHash(64, 4, 16)"}
    as_bytes = fps.view(np.uint8).reshape(-1, 8)
    q_bytes = qs.view(np.uint8).reshape(-1, 8)
    start = time.perf_counter()
    index = faiss.IndexBinaryMultiHash(64, 4, 16)
    index.add(as_bytes)
    row["build_s"] = time.perf_counter() - start
    single = q_bytes[:min(len(qs), 5000)]
    row["p50_us"], row["p99_us"], row["single_qps"] = latencies(
        lambda q: index.range_search(q.reshape(1, 8), K + 1), single)  # keeps distance < radius
    start = time.perf_counter()
    lims, _, ids = index.range_search(q_bytes, K + 1)
    row["batch_qps"] = len(qs) / (time.perf_counter() - start)
    row["recall"] = recall([set(ids[lims[i]:lims[i + 1]].tolist()) for i in range(len(qs))], truth)
    row["note"] = "in memory, one thread"
    return row


def bench_numpy(fps, qs, truth):
    row = {"method": "numpy brute force"}
    sample = qs[:len(truth)]
    start = time.perf_counter()
    found = [brute_force(fps, q) for q in sample]
    row["batch_qps"] = len(sample) / (time.perf_counter() - start)
    row["recall"] = recall(found, truth)
    row["note"] = "in memory"
    return row


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
    args = parser.parse_args()
    n = 10_000_000 if args.big else args.n
    rng = np.random.default_rng(0)
    fps = corpus(n, rng)
    qs = probes(fps, args.queries, rng)
    truth = {i: brute_force(fps, qs[i]) for i in range(min(args.oracle, len(qs)))}
    workdir = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    rows = []
    try:
        rows.append(bench_ours(fps, qs, truth, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        rows.append(bench_faiss(fps, qs, truth))
    except ImportError:
        print("faiss not installed: pip install faiss-cpu")
    rows.append(bench_numpy(fps, qs, truth))
    print("N = %d fingerprints (10%% planted near-duplicates), k = %d, %d probes"
          % (n, K, len(qs)))
    columns = ["method", "build_s", "p50_us", "p99_us", "single_qps", "batch_qps",
               "if_new_per_s", "bytes_per_fp_table", "compacted_bytes_per_fp_table",
               "recall", "note"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(_cell(row.get(c, "-")) for c in columns) + " |")


def _cell(value):
    return "%.1f" % value if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
