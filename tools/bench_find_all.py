"""find_all side by side with simhash-pybind (simhash-py's C++ core).

Cases: random fingerprints at 1M (blocks 5, distance 3) and 10M (blocks 6,
distance 3, with --big), and a corpus where 10% of fingerprints have 1 to 5
planted variants 1 to 3 bits away, where the output is large. Peak memory of
ours is measured in a child process (ru_maxrss).

Usage: python tools/bench_find_all.py [--big]
"""

import argparse
import subprocess
import sys
import time

import numpy as np
import peers

import simhashdb


def random_corpus(n, seed=0):
    return np.random.default_rng(seed).integers(0, 2**64, size=n, dtype=np.uint64,
                                                endpoint=False)


def planted_corpus(n, seed=0):
    rng = np.random.default_rng(seed)
    bases = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    sources = rng.choice(n, size=n // 10, replace=False)
    variants = []
    for source in sources:
        for _ in range(rng.integers(1, 6)):
            value = int(bases[source])
            for bit in rng.choice(64, size=rng.integers(1, 4), replace=False):
                value ^= 1 << int(bit)
            variants.append(value)
    return np.concatenate([bases, np.array(variants, dtype=np.uint64)])


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def peak_memory_mb(n, blocks, distance):
    code = ("import resource, sys; sys.path.insert(0, %r); import bench_find_all as b, simhashdb;"
            "h = b.random_corpus(%d); simhashdb.find_all(h, %d, %d);"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
            % (sys.path[0], n, blocks, distance))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also 10M with blocks 6")
    args = parser.parse_args()
    pybind = peers.load("simhash_pybind")
    cases = [("1M random", random_corpus(1_000_000), 5, 3),
             ("1M + planted variants", planted_corpus(1_000_000), 5, 3)]
    if args.big:
        cases.append(("10M random", random_corpus(10_000_000), 6, 3))
    print("| case | blocks, k | pairs | simhashdb s | simhash-pybind s | speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for name, hashes, blocks, distance in cases:
        ours_s, ours = timed(simhashdb.find_all, hashes, blocks, distance)
        ref_s, ref = timed(pybind.find_all, hashes.tolist(), blocks, distance) if pybind \
            else (float("nan"), None)
        if ref is not None:
            expected = sorted((min(a, b), max(a, b)) for a, b in ref)
            assert [p for p in ours if p[0] != p[1]] == expected, "results differ"
        print("| %s | %d, %d | %d | %.2f | %.2f | %.1fx |"
              % (name, blocks, distance, len(ours), ours_s, ref_s, ref_s / ours_s))
    if args.big:
        print("peak memory of find_all at 10M (blocks 6, k 3): %.0f MB"
              % peak_memory_mb(10_000_000, 6, 3))


if __name__ == "__main__":
    main()
