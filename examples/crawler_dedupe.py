"""A crawl loop that keeps only new content: fetched pages are fingerprinted
and stored with insert_if_new_many, and near-duplicates are reported as they
come. Pages go in small batches: each batch is one durable (fsynced)
transaction, and a page is checked against the pages before it in the batch.

The "web" here is local: the Python standard library's files and, where the
machine has it, /usr/share/doc.

Usage: python examples/crawler_dedupe.py [--db crawl.db] [--limit N] [--distance K]
"""

import argparse
import itertools
import pathlib
import sysconfig
import tempfile
import time

import simhashdb


def pages():
    """Yield (url, body) for every readable text file of the local corpus."""
    roots = [pathlib.Path(sysconfig.get_paths()["stdlib"]), pathlib.Path("/usr/share/doc")]
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if "site-packages" not in path.parts and path.suffix in (".py", ".txt", ".md", ".rst", ".html") and path.is_file():
                try:
                    body = path.read_bytes()
                except OSError:
                    continue
                if len(body) >= 200:
                    yield "file://%s" % path, body


def crawl(db, limit, distance, batch=100):
    seen = kept = 0
    start = time.perf_counter()
    fetched = itertools.islice(pages(), limit)
    while records := [(url, simhashdb.fingerprint(body), {"bytes": len(body)})
                      for url, body in itertools.islice(fetched, batch)]:
        for (url, _, _), found in zip(records, db.insert_if_new_many(records, distance)):
            seen += 1
            if found:
                print("duplicate  %s\n       of  %s (%d bits)"
                      % (url, found[0].key, found[0].distance))
            else:
                kept += 1
    elapsed = time.perf_counter() - start
    print("crawled %d pages in %.1f s (%.0f pages/s): %d kept, %d near-duplicates skipped"
          % (seen, elapsed, seen / elapsed if elapsed else 0, kept, seen - kept))
    return seen, kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database directory (default: a new temporary one)")
    parser.add_argument("--limit", type=int, default=None, help="stop after N pages")
    parser.add_argument("--distance", type=int, default=3)
    args = parser.parse_args()
    path = args.db or tempfile.mkdtemp(prefix="crawl-") + "/crawl.db"
    with simhashdb.DB(path, distance=args.distance, recipe=simhashdb.RECIPE) as db:
        crawl(db, args.limit, args.distance)
        print("%s holds %d documents" % (path, len(db)))


if __name__ == "__main__":
    main()
