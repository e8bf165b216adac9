"""Merge policies of RUNS.md simulated: entries written per entry imported, per
table, and the most live runs (counted as a batch's run is added, before the
merges it starts), for an import of N entries in batches of B, into an
empty table or over a base run of --base entries (its writes not counted).

- ratio F: after each batch's run, merge the newest run into the one before
  while newest * F > previous (the policy in RUNS.md);
- tiers K: runs of one tier (size class) merged K at a time into one run of
  the next tier, so a tier holds at most K - 1 runs.

Usage: python tools/merge_policy.py [--n 10000000] [--batch 100000 1000000 1000] [--base 0]
"""

import argparse
import math


def by_ratio(n, batch, f, base):
    runs, written, most = [base] if base else [], 0, 0
    for start in range(0, n, batch):
        runs.append(min(batch, n - start))
        written += runs[-1]
        most = max(most, len(runs))
        while len(runs) > 1 and runs[-1] * f > runs[-2]:
            runs[-2:] = [runs[-2] + runs[-1]]
            written += runs[-1]
    return written / n, most


def by_tiers(n, batch, k, base):
    tiers, written, most = [[]], 0, 0
    if base:  # the base run in the tier of its size
        tiers = [[] for _ in range(int(math.log(base / batch, k)) + 1)]
        tiers[-1].append(base)
    for start in range(0, n, batch):
        tiers[0].append(min(batch, n - start))
        written += tiers[0][-1]
        most = max(most, sum(map(len, tiers)))
        for t in range(len(tiers)):
            if len(tiers[t]) < k:
                break
            merged = sum(tiers[t])
            tiers[t] = []
            if t + 1 == len(tiers):
                tiers.append([])
            tiers[t + 1].append(merged)
            written += merged
    return written / n, most


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[100_000, 1_000_000, 1_000])
    parser.add_argument("--base", type=int, default=0)
    args = parser.parse_args()
    print("| batch | policy | writes per entry | most runs |")
    print("|---|---|---|---|")
    for batch in args.batch:
        for name, policy, knob in [("ratio F = %d" % f, by_ratio, f) for f in (2, 4, 8)] + \
                [("tiers K = %d" % k, by_tiers, k) for k in (4, 8, 16)]:
            writes, most = policy(args.n, batch, knob, args.base)
            print("| {:,} | {} | {:.1f} | {} |".format(batch, name, writes, most))


if __name__ == "__main__":
    main()
