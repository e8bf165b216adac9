"""Issue 22: one table's worth of N random permuted fingerprints imported as
compressed runs (tools/runs_prototype) in batches of B, each batch a run, merged
by each policy of tools/merge_policy.py with the real merge (RUNS.md).

For each policy: the seconds of the import (batches sorted, written,
merged; durable unless --nosync), the entries written per entry, the most
live runs, the bytes per entry at the end, what a batch query then
costs (--queries sorted random ranges of the 10M layout, run_study.py's,
swept over every live run, in ns per range: best of 3, counts checked
against numpy), and the seconds of a compaction of the live runs into one. A database of T tables does
this T times over (RUNS.md's import target: 10M in 100k batches, 10 tables,
<= 15 s). With --tables T, T tables are imported at once, each in its own
environment and thread (merges release the GIL): the seconds are the
longest of the T imports, which ran together, the other columns the first
table's.

Usage: python tools/run_import.py [--n 10000000] [--batch 100000] [--queries 200000] [--nosync]
                                  [--tables 1] [--policy NAME ...]
Needs: numpy (in the test extras) and the prototype built: python tools/build_runs_prototype.py.
"""

import argparse
import os
import shutil
import tempfile
import threading
import time

import numpy as np
from merge_policy import POLICIES
from run_study import expected, ranges

from runs_prototype._runs import SLOT_COUNT, Study  # built by tools/build_runs_prototype.py


def sweep_all(env, runs, los, his):
    """Seconds to sweep the ranges over every run, and the counts."""
    start = time.perf_counter()
    counts = [np.frombuffer(env.sweep(run, los, his), np.uint64) for run in runs]
    return time.perf_counter() - start, sum(counts)


def run_import(values, batch, plan, path, sync, los, his):
    env = Study(path.encode(), 1 << 36, sync)
    live, last, written, most = [], 0, 0, 0  # live: (run id, entries), oldest first

    def new_run():  # an id whose slot no live run holds
        nonlocal last
        last += 1
        while last % SLOT_COUNT in {run % SLOT_COUNT for run, _ in live}:
            last += 1
        return last

    start = time.perf_counter()
    for i in range(0, values.size, batch):
        run = new_run()
        env.write_run(run, np.sort(values[i:i + batch]))
        live.append((run, min(batch, values.size - i)))
        written += live[-1][1]
        most = max(most, len(live))
        while (m := plan([size for _, size in live], batch)):
            run = new_run()
            env.merge([r for r, _ in live[-m:]], run)
            live[-m:] = [(run, sum(size for _, size in live[-m:]))]
            written += live[-1][1]
    seconds = time.perf_counter() - start
    runs = [run for run, _ in live]
    sweep_s, counts = min(sweep_all(env, runs, los, his) for _ in range(3))
    assert np.array_equal(counts, expected(np.sort(values), los, his))
    out = {"s": seconds, "writes": written / values.size, "most_runs": most, "runs": len(runs),
           "sweep_ns": sweep_s / los.size * 1e9,
           "bytes_per_entry": env.stat("runs")["bytes"] / values.size,
           "file_bytes_per_entry": os.path.getsize(os.path.join(path, "data.mdb")) / values.size}
    start = time.perf_counter()
    if len(runs) > 1:
        env.merge(runs, new_run())
    out["compact_s"] = time.perf_counter() - start
    return out


def import_tables(tables, batch, plan, sync, los, his):
    """Import each of ``tables`` at once, in its own thread: the longest
    import's seconds and the first table's figures."""
    results, workdirs = [None] * len(tables), [tempfile.mkdtemp(prefix="run_import_") for _ in tables]

    def one(t):
        results[t] = run_import(tables[t], batch, plan, workdirs[t], sync, los, his)

    threads = [threading.Thread(target=one, args=(t,)) for t in range(len(tables))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for workdir in workdirs:
            shutil.rmtree(workdir)
    if None in results:
        raise RuntimeError("an import failed")
    return max(r["s"] for r in results), results[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200_000)
    parser.add_argument("--nosync", action="store_true", help="commit without fsync")
    parser.add_argument("--tables", type=int, default=1, help="tables imported at once")
    parser.add_argument("--policy", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = parser.parse_args()
    rng = np.random.default_rng(22)
    tables = [rng.integers(0, 2**64, size=args.n, dtype=np.uint64) for _ in range(args.tables)]
    los, his = ranges(np.sort(rng.integers(0, 2**64, size=args.queries, dtype=np.uint64)))
    print("| N, batch | policy | s, %d table(s) (x 10 tables) | ns per entry written | writes per "
          "entry | most runs | bytes/entry (pages, file) | runs at the end: sweep ns per range "
          "| compaction s |" % args.tables)
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.policy:
        wall, r = import_tables(tables, args.batch, POLICIES[name], not args.nosync, los, his)
        print("| {:,}, {:,} | {} | {:.2f} ({:.1f}) | {:.1f} | {:.1f} | {} | {:.2f}, {:.2f} "
              "| {}: {:.0f} | {:.2f} |".format(
                  args.n, args.batch, name, wall, wall * 10 / args.tables,
                  wall / (args.tables * r["writes"] * args.n) * 1e9, r["writes"], r["most_runs"],
                  r["bytes_per_entry"], r["file_bytes_per_entry"], r["runs"], r["sweep_ns"],
                  r["compact_s"]))


if __name__ == "__main__":
    main()
