"""Fingerprint the Python standard library's own .py files and print the
groups of near-identical files (within 3 bits)."""

import pathlib
import sysconfig
from array import array

import simhashdb

DISTANCE = 3


def main():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    fps = array("Q", (simhashdb.fingerprint(p.read_bytes()) for p in paths))
    print("fingerprinted %d files under %s" % (len(paths), root))
    group_of = list(range(len(paths)))
    for i in range(len(paths)):
        for j, d in enumerate(simhashdb.num_differing_bits_many(fps, fps[i])):
            if j > i and d <= DISTANCE and fps[i]:
                group_of[j] = group_of[i]
    groups = {}
    for i, g in enumerate(group_of):
        groups.setdefault(g, []).append(i)
    for members in (m for m in groups.values() if len(m) > 1):
        print("near-identical:")
        for i in members:
            print("  %s (%016x)" % (paths[i].relative_to(root), fps[i]))


if __name__ == "__main__":
    main()
