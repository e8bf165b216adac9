"""Bytes per document a band index would take in LMDB (issue 21: <= 300),
measured on files written by py-lmdb, for ``--bands`` bands a document:

- ``plain``: one sub-database, key = band number (1 byte) + 64-bit band
  hash, value = the document's 64-bit fingerprint (dupsort): what a first
  implementation would write;
- ``packed``: one dupsort/dupfixed sub-database per band, as the fingerprint
  tables: the LMDB key is the first 2 bytes of a 32-bit band hash, the fixed
  value the other 2 bytes and the first 6 bytes of the fingerprint (the
  document is found through the ``fingerprints`` index by that prefix;
  another document sharing 48 bits of fingerprint is one more candidate,
  which the confirmation turns away);
- ``packed6``: as ``packed`` with 4 bytes of fingerprint (6-byte values): at
  10M documents a 32-bit prefix is shared by another document 0.2% of the
  time, one more candidate to confirm;
- ``packed19``: one dupsort/dupfixed sub-database for all bands, the LMDB
  key 3 bytes (5 bits of band number, 19 bits of the band hash), the value
  the other 13 bits and 4 bytes of fingerprint: at 10M documents ~19 values
  a key, which LMDB keeps inline in the leaf (a key of 150 values, as 2-byte
  keys give at 10M, gets a sub-database page of its own); measured at 10M it
  packs tighter sorted (8.6 bytes an entry against 9.1) but not live (12.1 against 9.3).

Each is written twice: in random order (a live index, pages split as they
fill) and sorted with MDB_APPEND (a bulk load or a compacted file), and
measured as the pages of its B-trees (free pages left by the transactions
are not counted). Bands and fingerprints are random: band keys of real
documents are as good as random, but for the copies, which share some.
The tables are independent, so one band table of N documents costs what
each of the B tables of an index of N documents costs: ``--bands 1 --docs
N`` reaches large N, and a document costs B times a band entry.

Usage: python tools/band_bytes.py [--docs N] [--bands B]
"""

import argparse
import os
import random
import struct
import tempfile

import lmdb


def write(path, layout, docs, bands, ordered, seed=0):
    rng = random.Random(seed)
    names = [b"band%d" % j for j in range(bands)] if layout in ("packed", "packed6") \
        else [b"bands"]
    fp_bytes = 6 if layout == "packed" else 4
    env = lmdb.open(path, map_size=1 << 36, max_dbs=len(names) + 1, sync=False,
                    writemap=True)
    dbs = [env.open_db(n, dupsort=True, dupfixed=(layout != "plain")) for n in names]
    entries = []
    for _ in range(docs):
        fp = rng.getrandbits(64)
        for j in range(bands):
            h = rng.getrandbits(64)
            if layout == "plain":
                entries.append((0, struct.pack(">BQ", j, h), struct.pack(">Q", fp)))
            elif layout == "packed19":
                h32 = h >> 32
                entries.append((0, struct.pack(">I", j << 19 | h32 >> 13)[1:],
                                struct.pack(">H", h32 & 0x1FFF) + struct.pack(">Q", fp)[:4]))
            else:
                h32 = h >> 32
                entries.append((j, struct.pack(">H", h32 >> 16),
                                struct.pack(">H", h32 & 0xFFFF) + struct.pack(">Q", fp)[:fp_bytes]))
    if ordered:
        entries.sort()
    else:
        rng.shuffle(entries)
    step = 200_000
    for s in range(0, len(entries), step):
        with env.begin(write=True) as txn:
            cursors = [txn.cursor(db) for db in dbs]
            for d, k, v in entries[s:s + step]:
                cursors[d].put(k, v, dupdata=True, append=ordered)
    env.sync(True)
    with env.begin() as txn:
        pages = sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                    for st in [txn.stat(db) for db in dbs] + [env.stat()])
    used = pages * env.stat()["psize"]
    env.close()
    return used


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--bands", type=int, default=32)
    parser.add_argument("--layout", action="append", help="plain, packed, packed6, packed19 (default: all)")
    args = parser.parse_args()
    print("| layout (%d band tables, %d documents) | order | bytes a band entry | "
          "a document at 32 bands |" % (args.bands, args.docs))
    print("|---|---|---:|---:|")
    for layout in args.layout or ("plain", "packed", "packed6", "packed19"):
        for ordered in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                used = write(os.path.join(tmp, "db"), layout, args.docs, args.bands, ordered)
            entry = used / args.docs / args.bands
            print("| %s | %s | %.1f | %.0f |" % (layout, "sorted" if ordered else "random",
                                               entry, 32 * entry), flush=True)


if __name__ == "__main__":
    main()
