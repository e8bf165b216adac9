"""A crawl loop that keeps only new content, as a crawler would write it:
each fetched page goes, as HTML, through insert_text_if_new_many, which reads
its text (markup, scripts and styles dropped), fingerprints it by the
database's recipe and keeps it unless a stored page is a near-duplicate by
the text rule (a shared band of their word-shingle signatures, or
fingerprints within the distance, and a resemblance of at least the
threshold). Pages go in small batches: each batch is one durable (fsynced)
transaction, and a page is checked against the pages before it in the batch;
each page's Decision says what became of it (a page without text is
"invalid", and the rest of its batch is stored).
Near-duplicates found are refreshed, so that expire() forgets only what the
crawl no longer sees.

The "web" here is local: the Python standard library's HTML documentation
where the machine has it (/usr/share/doc), and its source files, each served
as a page of one site template.

Usage: python examples/crawler_dedupe.py [--db crawl.db] [--limit N]
"""

import argparse
import collections
import contextlib
import html
import itertools
import pathlib
import sysconfig
import tempfile
import time
from typing import Iterator, Optional, Union

import simhashdb

TEMPLATE = ("<!DOCTYPE html><html><head><title>%s</title><style>body{margin:0}</style>"
            "<script>track('%s')</script></head><body><nav><a href='/'>Home</a> | "
            "<a href='/index'>Index</a></nav><main><pre>%s</pre></main>"
            "<footer>Served by the example crawler</footer></body></html>")


def pages() -> Iterator[tuple[str, Union[str, bytes]]]:
    """Yield (url, html) for every page of the local web."""
    docs = pathlib.Path("/usr/share/doc")
    for path in sorted(docs.rglob("*.html")) if docs.is_dir() else ():
        try:
            yield "file://%s" % path, path.read_bytes()
        except OSError:
            continue
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            source = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        name = path.relative_to(stdlib).as_posix()  # one URL a file: many share a basename
        yield "https://example.org/%s" % name, TEMPLATE % (name, name, html.escape(source))


def crawl(db: simhashdb.DB, limit: Optional[int], batch: int = 100) -> collections.Counter[str]:
    statuses: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    fetched = itertools.islice(pages(), limit)
    while records := [(url, body, {"bytes": len(body)})
                      for url, body in itertools.islice(fetched, batch)]:
        for (url, _, _), found in zip(records, db.insert_text_if_new_many(
                records, html=True, refresh=True)):
            statuses[found.status] += 1  # stored, unchanged, duplicate or invalid
            if found.status == "duplicate":
                print("duplicate  %s\n       of  %s (resemblance %.2f)"
                      % (url, found[0].key, found[0].resemblance or 1.0))
    elapsed = time.perf_counter() - start
    seen = sum(statuses.values())
    print("crawled %d pages in %.1f s (%.0f pages/s): %d stored, %d unchanged, %d "
          "near-duplicates skipped, %d without text" % (
              seen, elapsed, seen / elapsed if elapsed else 0, statuses["stored"],
              statuses["unchanged"], statuses["duplicate"], statuses["invalid"]))
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", help="database directory (default: a new temporary one)")
    parser.add_argument("--limit", type=int, default=None, help="stop after N pages")
    args = parser.parse_args()
    with contextlib.nullcontext(args.db) if args.db else tempfile.TemporaryDirectory(
            prefix="crawl-") as where:
        path = args.db or where + "/crawl.db"
        with simhashdb.DB(path, recipe=simhashdb.RECIPE) as db:
            crawl(db, args.limit)
            gone = db.expire(time.time() - 30 * 86400)  # pages not seen in 30 days
            print("%s holds %d documents (%d expired)" % (path, len(db), gone))


if __name__ == "__main__":
    main()
