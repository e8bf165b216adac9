"""The import of a web archive side by side with the same pages read from
files, in one process: `simhashdb-cli import` of a WARC of N HTML pages
(gzip, as crawlers write it, and the same records uncompressed), and of a
directory of the same N pages as files with --html, each into a new
database, alternating, the best of --repeat runs each. The databases are
checked to hold the same fingerprints. Then the reading alone, the best
of 5 x --repeat runs each: simhashdb's reader (the pages' texts decoded,
not fingerprinted) beside warcio's ArchiveIterator (each record's content
read), which it builds on.

Pages are about 5 KB of HTML (300 words of prose in paragraphs, a head with
a title, a script and a style), a tenth of them near copies of others, a
third in windows-1252 with the charset in the HTTP header (UTF-8 files: the
same text).

Usage: python tools/bench_archives.py [--n 20000] [--repeat 3]
"""

import argparse
import contextlib
import gzip
import io
import os
import random
import shutil
import tempfile
import time
import timeit

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

import simhashdb
from simhashdb import cli, inputs

WORDS = ("river stone lantern harbor copper meadow signal orbit velvet quarry thistle beacon "
         "marble ember falcon glacier café naïve façade").split()


def pages(n, seed=0):
    """(url, html) of n pages, a tenth near copies of earlier ones."""
    rng = random.Random(seed)
    made = []
    for i in range(n):
        if made and rng.random() < 0.1:
            words = rng.choice(made)[2][:]
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        else:
            words = [rng.choice(WORDS) + str(rng.randrange(500)) for _ in range(300)]
        body = "".join("<p>%s</p>\n" % " ".join(words[j:j + 30]) for j in range(0, 300, 30))
        html = ("<html><head><title>page %d</title><style>p {margin: 0}</style>"
                "<script>var seen = %d;</script></head><body>%s</body></html>" % (i, i, body))
        made.append(("https://example.com/p/%d.html" % i, html, words))
    return [(url, html) for url, html, _ in made]


def write_inputs(where, docs):
    """A WARC of the pages (gzip, and plain) and a directory of them as files."""
    archive = os.path.join(where, "crawl.warc.gz")
    files = os.path.join(where, "files")
    os.mkdir(files)
    with open(archive, "wb") as out:
        writer = WARCWriter(out, gzip=True)
        for i, (url, html) in enumerate(docs):
            encoding = "cp1252" if i % 3 == 0 else "utf-8"
            headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=%s"
                                                   % encoding)], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(
                url, "response", payload=io.BytesIO(html.encode(encoding)), http_headers=headers))
            with open(os.path.join(files, "%d.html" % i), "w", encoding="utf-8") as page:
                page.write(html)
    plain = os.path.join(where, "crawl.warc")
    with gzip.open(archive) as members, open(plain, "wb") as out:
        shutil.copyfileobj(members, out)
    return archive, plain, files


def timed_import(where, name, argv):
    db = os.path.join(where, name + ".db")
    shutil.rmtree(db, ignore_errors=True)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):   # the import's summary
        assert cli.main(["import", db, "--quiet", *argv]) == 0
    return time.perf_counter() - start, db


def timed_reading(path, repeat):
    """The best of ``repeat`` readings of the archive ``path``, by
    simhashdb's reader and by warcio's ArchiveIterator alone."""
    reader = inputs.Reader(fingerprint=lambda text, html: 1)

    def by_reader():
        for _ in reader.records({path: "warc"}):
            pass

    def by_warcio():
        with open(path, "rb") as archive:
            for record in ArchiveIterator(archive, arc2warc=True):
                record.content_stream().read()
    return [min(timeit.repeat(read, number=1, repeat=repeat)) for read in (by_reader, by_warcio)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    where = tempfile.mkdtemp(prefix="bench-archives-")
    try:
        archive, plain, files = write_inputs(where, pages(args.n))
        runs = {"warc": [archive], "plain": [plain], "files": [files, "--html"]}
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.repeat):
            for name, argv in runs.items():
                seconds, db = timed_import(where, name, argv)
                best[name] = min(best[name], seconds)
        stored = []
        for name in runs:
            with simhashdb.DB(os.path.join(where, name + ".db")) as db:
                stored.append(sorted(r.fingerprint for r in db))
        print("| pages | WARC s | plain WARC s | files s | WARC / files | plain / files "
              "| pages/s (WARC) | same fingerprints |")
        print("|---|---|---|---|---|---|---|---|")
        print("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %s |" % (
            args.n, best["warc"], best["plain"], best["files"], best["warc"] / best["files"],
            best["plain"] / best["files"], args.n / best["warc"],
            stored[0] == stored[1] == stored[2]))
        print("\n| archive | reader s | warcio alone s | reader / warcio |")
        print("|---|---|---|---|")
        for name in ("warc", "plain"):
            ours, theirs = timed_reading(runs[name][0], 5 * args.repeat)   # (short: more runs)
            print("| %s | %.2f | %.2f | %.2f |" % (
                "gzip" if name == "warc" else "plain", ours, theirs, ours / theirs))
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
