"""Fingerprints per second on real text (the standard library's .py files),
ours side by side with PyPI ``simhash`` (1e0ng), simhash-pybind and samecode.

Usage: python tools/bench_fingerprint.py [--files N] [--repeat R]
"""

import argparse
import pathlib
import random
import sysconfig
import time

import peers

import simhashdb
from simhashdb.halohash import BitAverageHaloHash


def corpus(limit):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    texts = [p.read_text("utf-8", "replace") for p in paths[:limit]]
    return [t for t in texts if len(t) >= 500]


def best_of(repeat, fn, items):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    texts = corpus(args.files)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    rng = random.Random(0)
    hash_lists = [[rng.getrandbits(64) for _ in range(1000)] for _ in range(200)]
    words = [t.encode().split() for t in texts]

    recipe_1, recipe_2 = (simhashdb.RECIPES[name] for name in sorted(simhashdb.RECIPES)[:2])
    rows = [("simhashdb.fingerprint (text, recipe 3)", simhashdb.fingerprint, texts, megabytes),
            ("simhashdb.fingerprint_with_signature (text, recipe 3)",
             simhashdb.fingerprint_with_signature, texts, megabytes),
            ("simhashdb.fingerprint (text, recipe 2)",
             lambda t: simhashdb.fingerprint(t, **recipe_2), texts, megabytes),
            ("simhashdb.fingerprint (text, recipe 1)",
             lambda t: simhashdb.fingerprint(t, **recipe_1), texts, megabytes),
            ("simhashdb.compute (1000 hashes)", simhashdb.compute, hash_lists, None),
            ("simhashdb BitAverageHaloHash 64 (words)",
             lambda w: BitAverageHaloHash(w, size_in_bits=64).digest(), words, megabytes)]
    e0ng = peers.load("simhash_1e0ng")
    if e0ng:
        rows.append(("PyPI simhash Simhash(text)", e0ng.Simhash, texts, megabytes))
    pybind = peers.load("simhash_pybind")
    if pybind:
        def seed_recipe(text):
            return pybind.compute([pybind.unsigned_hash(" ".join(s).encode())
                                   for s in pybind.shingle(text.split(), 4)])
        rows.append(("simhash-pybind seed-000 recipe (text)", seed_recipe, texts, megabytes))
        rows.append(("simhash-pybind compute (1000 hashes)", pybind.compute, hash_lists, None))
    try:
        from samecode.halohash import BitAverageHaloHash as SamecodeHalo
        rows.append(("samecode BitAverageHaloHash 64 (words)",
                     lambda w: SamecodeHalo(w, size_in_bits=64).digest(), words, megabytes))
    except ImportError:
        print("samecode not installed: pip install samecode")

    print("%d documents, %.1f MB of text" % (len(texts), megabytes))
    print("| method | items/s | MB/s |")
    print("|---|---:|---:|")
    for name, fn, items, mb in rows:
        seconds = best_of(args.repeat, fn, items)
        print("| %s | %.0f | %s |" % (name, len(items) / seconds,
                                      "%.1f" % (mb / seconds) if mb else "-"))


if __name__ == "__main__":
    main()
