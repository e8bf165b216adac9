"""Merge policies of RUNS.md simulated: entries written per entry imported, per
table, the most live runs (counted as a batch's run is added, before the
merges it starts) and the live runs after a batch's merges, on average, for
an import of N entries in batches of B, into an empty table or over a base
run of --base entries (its writes not counted).

A policy looks at the live runs' sizes, oldest first, after each batch and
each merge, and names how many of the newest to merge next (0: none):

- ratio F: the newest into the one before while newest * F > previous (the
  policy in RUNS.md);
- tiers K: the K newest once they are of one size class, floor(log_K(size /
  B)), so a class holds at most K - 1 runs;
- lazy C: none until there are more than C runs, then the newest j that
  free j - 1 runs at the least entries written a run freed;
- bands F: the bands' rule (since 0.14.0): none until 6 runs are live
  (counted with the batch's: one short of the slots running short), then the
  newest j (two at least) while together they are over 1/F of the run
  before them (since 0.15.0 band b takes F = 3 + b / 31).

tools/run_import.py runs the same policies with the real merge.

Usage: python tools/merge_policy.py [--n 10000000] [--batch 100000 1000000 1000] [--base 0]
"""

import argparse


def ratio(f):
    return lambda sizes, batch: 2 if len(sizes) > 1 and sizes[-1] * f > sizes[-2] else 0


def size_class(size, batch, k):
    c = 0
    while size >= batch * k ** (c + 1):
        c += 1
    return c


def tiers(k):
    return lambda sizes, batch: k if len(sizes) >= k and len(
        {size_class(s, batch, k) for s in sizes[-k:]}) == 1 else 0


def lazy(cap):
    return lambda sizes, batch: 0 if len(sizes) <= cap else min(
        range(2, len(sizes) + 1), key=lambda j: sum(sizes[-j:]) / (j - 1))


def bands(f, short=6):
    def plan(sizes, batch):
        if len(sizes) < short:
            return 0
        j, merged = 2, sizes[-1] + sizes[-2]
        while j < len(sizes) and merged * f > sizes[-1 - j]:
            merged += sizes[-1 - j]
            j += 1
        return j
    return plan


POLICIES = {"ratio F = %d" % f: ratio(f) for f in (2, 4, 8)}
POLICIES.update({"tiers K = %d" % k: tiers(k) for k in (4, 8, 16)})
POLICIES.update({"lazy C = %d" % c: lazy(c) for c in (4, 6)})
POLICIES.update({"bands F = %d" % f: bands(f) for f in (3, 4, 5)})


def simulate(n, batch, plan, base=0):
    """(entries written per entry imported, most live runs, mean live runs
    after a batch's merges)."""
    sizes, written, most, live, batches = [base] if base else [], 0, 0, 0, 0
    for start in range(0, n, batch):
        sizes.append(min(batch, n - start))
        written += sizes[-1]
        most = max(most, len(sizes))
        while (m := plan(sizes, batch)):
            sizes[-m:] = [sum(sizes[-m:])]
            written += sizes[-1]
        live, batches = live + len(sizes), batches + 1
    return written / n, most, live / batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[100_000, 1_000_000, 1_000])
    parser.add_argument("--base", type=int, default=0)
    args = parser.parse_args()
    print("| batch | policy | writes per entry | most runs | runs after a batch |")
    print("|---|---|---|---|---|")
    for batch in args.batch:
        for name, plan in POLICIES.items():
            writes, most, live = simulate(args.n, batch, plan, args.base)
            print("| {:,} | {} | {:.1f} | {} | {:.1f} |".format(batch, name, writes, most, live))


if __name__ == "__main__":
    main()
