"""Issue 22's compressed run (tools/runs_prototype, RUNS.md) against today's table.

One permutation table's worth of N random permuted fingerprints (what a
table of random fingerprints holds), written three ways into LMDB:

- a compressed run: Elias-Fano blocks of <= 996 bytes, keyed by run id and
  first value, appended (MDB_APPEND) in one transaction;
- today's table (dupsort, 2-byte key + 6-byte values) appended in one
  transaction, as a bulk load into an empty database writes it;
- today's table written in batches of --batch random values, a transaction
  each, as insert_many's batches write it.

For each: bytes per entry (the sub-database's pages / N) and the write rate.
Then the scan cost of a probe range of the 10M layout (k = 3, 5 blocks: a
26-bit leading prefix, ranges of 2**38 values) over the run and the one-txn
table, in ns per range, warm: random probes (mostly empty ranges) and probes
at a stored value (its range holds it), in random order (single queries) and
sorted (a batch), and sorted ranges swept over the run (one block decoded
whole and kept while the ranges start in it); the best of 3 (the machine may
be shared), every count checked against numpy. Last, the
merges of the write path: a batch of N/100 into the N run (a base merge),
split into merging (decode, merge, encode, put), dropping the source's slot
and committing; and a batch of 1,000 into a 4,096-entry run (a small
merge). Each write is one transaction, durable unless --nosync (which
leaves out the fsync, to separate the CPU from the disk).

Usage: python tools/run_study.py [--n 1000000 10000000] [--batch 100000] [--queries 200000] [--nosync]
Needs: numpy (in the test extras) and the prototype built: python tools/build_runs_prototype.py.
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from runs_prototype._runs import Study  # built by tools/build_runs_prototype.py

PREFIX_BITS = 26


def distinct(rng, n):
    return np.unique(rng.integers(0, 2**64, size=n, dtype=np.uint64))


def directory(workdir, name):
    path = os.path.join(workdir, name)
    os.mkdir(path)
    return path.encode()


def sizes(env, which, workdir, n):
    """Bytes per entry of the sub-database's pages and of the whole file."""
    stat = env.stat(which)
    path = os.path.join(workdir, "runs" if which == "runs" else "table", "data.mdb")
    if workdir.endswith("/batched"):
        path = os.path.join(workdir, "data.mdb")
    return {"bytes_per_entry": stat["bytes"] / n, "file_bytes_per_entry": os.path.getsize(path) / n,
            "depth": stat["depth"]}


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def ranges(starts):
    low = np.uint64((1 << (64 - PREFIX_BITS)) - 1)
    los = np.ascontiguousarray(starts & ~low)
    return los, np.ascontiguousarray(los | low)


def expected(values, los, his):
    return np.searchsorted(values, his, side="right") - np.searchsorted(values, los)


def study(n, batch, queries, workdir, rng, sync):
    values = distinct(rng, n)
    n = values.size
    row = {"n": n}
    runs = Study(directory(workdir, "runs"), 1 << 34, sync)
    table = Study(directory(workdir, "table"), 1 << 34, sync)
    seconds, blocks = timed(runs.write_run, 1, values)
    row["run"] = dict(sizes(runs, "runs", workdir, n), entries_per_block=n / blocks,
                      M_per_s=n / seconds / 1e6)
    seconds, _ = timed(table.write_table, values, True)
    row["table_one_txn"] = dict(sizes(table, "table", workdir, n), M_per_s=n / seconds / 1e6)
    batched = Study(directory(workdir, "batched"), 1 << 34, sync)
    shuffled = rng.permutation(values)
    start = time.perf_counter()
    for i in range(0, n, batch):
        batched.write_table(np.sort(shuffled[i:i + batch]), False)
    row["table_batches"] = dict(sizes(batched, "table", workdir + "/batched", n),
                                M_per_s=n / (time.perf_counter() - start) / 1e6)
    del batched

    scans = {}
    for kind, starts in (("random", rng.integers(0, 2**64, size=queries, dtype=np.uint64)),
                         ("at_value", values[rng.integers(0, n, size=queries)])):
        for order in ("shuffled", "sorted"):
            los, his = ranges(np.sort(starts) if order == "sorted" else starts)
            want = expected(values, los, his)
            scanners = [("run", runs.scan, 1), ("table", table.scan, 0)]
            if order == "sorted":
                scanners.append(("run sweep", runs.sweep, 1))
            for name, scan, run in scanners:
                scan(run, los, his)  # warm
                seconds, got = min(timed(scan, run, los, his) for _ in range(3))
                assert np.array_equal(np.frombuffer(got, np.uint64), want), (name, kind, order)
                scans["%s %s %s" % (name, kind, order)] = seconds / queries * 1e9
            scans["entries per range %s" % kind] = want.mean()
    row["scan_ns"] = scans

    fresh = np.setdiff1d(distinct(rng, max(n // 100, 1)), values)
    seconds, parts = timed(runs.merge, [1], 2, fresh)
    row["base_merge"] = {"entries": n + fresh.size, "s": seconds,
                         "ns_per_entry": {part[:-2]: parts[part] / (n + fresh.size) * 1e9
                                          for part in ("merge_s", "drop_s", "commit_s")}}
    row["run_after_merges"] = sizes(runs, "runs", workdir, n + fresh.size)
    times, smalls = [], Study(directory(workdir, "small"), 1 << 30, sync)
    for r in range(1, 41, 2):
        small = distinct(rng, 4096)
        smalls.write_run(r, small)
        seconds, _ = timed(smalls.merge, [r], r + 1, np.setdiff1d(distinct(rng, 1000), small))
        times.append(seconds)
    row["small_merge_ms"] = float(np.median(times) * 1e3)
    assert np.array_equal(np.frombuffer(runs.values(2), np.uint64), np.union1d(values, fresh))
    return row


def markdown(rows):
    print("| N | kind | bytes/entry (pages) | bytes/entry (file) | M entries/s written | depth |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        for kind in ("run", "table_one_txn", "table_batches", "run_after_merges"):
            r = row[kind]
            print("| %s | %s | %.2f | %.2f | %s | %d |" % (
                "{:,}".format(row["n"]), kind, r["bytes_per_entry"], r["file_bytes_per_entry"],
                "%.2f" % r["M_per_s"] if "M_per_s" in r else "", r["depth"]))
    print()
    print("| N | scan (ns per range) | value |")
    print("|---|---|---|")
    for row in rows:
        for name, value in row["scan_ns"].items():
            print("| %s | %s | %.3g |" % ("{:,}".format(row["n"]), name, value))
        merge = row["base_merge"]
        print("| %s | base merge: %s entries, s (ns/entry: merge + drop + commit) "
              "| %.2f (%s) |" % ("{:,}".format(row["n"]), "{:,}".format(merge["entries"]), merge["s"],
                                 " + ".join("%.1f" % v for v in merge["ns_per_entry"].values())))
        print("| %s | small merge 4,096 + 1,000, ms | %.2f |" % (
            "{:,}".format(row["n"]), row["small_merge_ms"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200_000)
    parser.add_argument("--nosync", action="store_true", help="commit without fsync")
    args = parser.parse_args()
    rng = np.random.default_rng(22)
    rows = []
    for n in args.n:
        workdir = tempfile.mkdtemp(prefix="run_study_")
        try:
            rows.append(study(n, args.batch, args.queries, workdir, rng, not args.nosync))
        finally:
            shutil.rmtree(workdir)
    markdown(rows)


if __name__ == "__main__":
    main()
