"""A crawler's stream through simhashdb.DB, as crawlers send it: pages with
URL keys and metadata, decided by insert_text_if_new_many in batches (each
its own durable commit) or one page a call, while the database grows.

The stream: pages of 120 to 600 words of a Zipf vocabulary of 200,000 words
(tools/bench_text.py's Synthetic), 3% near-duplicates of a stored page with
1 to 4% of its words replaced by new words, 2% pages of one of 50 site
templates (300 words of the template and 20 to 40 of their own); URL keys
of 60 to 110 bytes; metadata ``{"fetched": ..., "status": 200}``.

Reported per stretch of the stream (``--stretch`` pages): pages/s of the
call alone (fingerprinting included, generating the pages not), the bytes
the process wrote per page (``/proc/self/io``: its write calls' bytes, and
beside them what the kernel accounts, which on Linux 6 counts a large folio
for each 4 KB page written: see bench_text.written_bytes) and the data
file's bytes per page stored. Then: pages one a call on the filled
database; query_text_many in calls of 100 texts (edited copies of stored
pages with 1, 2 and 4% new words, unrelated pages, 1% template pages):
ms per text at p50 and p99, recall of the copies; the bytes of each part
of the file, live and after compact(); and the decisions: how many planted
near-duplicates were flagged, how many other pages, and a digest of the
flagged pages' positions, which is equal for two builds that decide alike.

Usage: python tools/bench_crawl.py [--pages 1000000] [--batch 1000]
       [--stretch 100000] [--single 2000] [--queries 2000]
       [--backend lmdb|py-lmdb] [--json FILE]
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

import simhashdb
from bench_db import table
from bench_text import Synthetic, lmdb_bytes, written_bytes, bytes_table

COPY_RATES = (0.01, 0.02, 0.03, 0.04)
QUERY_RATES = (0.01, 0.02, 0.04)


class Crawl(Synthetic):
    """Pages of the stream, in order; page i's key and text are fixed by the seed."""

    def __init__(self, seed=0):
        super().__init__(seed=seed, templates=50)
        self.recent = []  # (key, text) of pages a copy may be made of

    def url(self, i):
        site = int(self.rng.integers(20_000))
        path = "-".join(self.words(int(self.rng.integers(3, 9))).tolist())
        url = "https://www.site%05d.example.com/articles/%s/%d.html" % (site, path, i)
        return url[:110] if len(url) > 60 else url + "?ref=" + "x" * (60 - len(url) - 5)

    def pages(self, start, count):
        """(key, text, meta, planted) of pages start..start+count."""
        draw = self.rng.random(count)
        lengths = self.rng.integers(120, 601, count)
        out = []
        for i, (r, n) in enumerate(zip(draw.tolist(), lengths.tolist()), start):
            planted = False
            if r < 0.02:
                text = self.texts(1, template=True)[0]
            elif r < 0.05 and self.recent:
                source = self.recent[int(self.rng.integers(len(self.recent)))]
                text = self.edited(source, COPY_RATES[int(self.rng.integers(len(COPY_RATES)))])
                planted = True
            else:
                text = " ".join(self.words(n).tolist())
            if len(self.recent) < 5000:
                self.recent.append(text)
            elif self.rng.random() < 0.05:
                self.recent[int(self.rng.integers(5000))] = text
            out.append((self.url(i), text, {"fetched": 1_780_000_000 + i, "status": 200},
                        planted))
        return out


def data_file(db):
    return db.stats()["disk_bytes"]


def stream(db, crawl, pages, batch, stretch):
    """The stream into ``db``: per stretch, pages/s and bytes written; the
    decisions' counts and digest."""
    rows, flagged, digest, done = [], {"planted": 0, "other": 0, "planted_total": 0}, \
        hashlib.sha256(), 0
    kept = []  # (key, text) of every 20th page stored, for queries
    while done < pages:
        n = min(stretch, pages - done)
        items = crawl.pages(done, n)
        before, seconds = io_bytes(), 0.0
        for b in range(0, n, batch):
            chunk = items[b:b + batch]
            began = time.perf_counter()
            found = db.insert_text_if_new_many([(k, t, m) for k, t, m, _ in chunk])
            seconds += time.perf_counter() - began
            for j, ((_, _, _, planted), matches) in enumerate(zip(chunk, found)):
                flagged["planted_total"] += planted
                if matches:
                    flagged["planted" if planted else "other"] += 1
                    digest.update(b"%d," % (done + b + j))
                elif (done + b + j) % 20 == 0 and len(kept) < 20_000:
                    kept.append(chunk[j][:2])
        done += n
        rows.append({"pages": done, "pages_per_s": n / seconds,
                     **per_page(before, io_bytes(), n),
                     "file_bytes_per_page": data_file(db) / len(db),
                     "load": "%.2f" % os.getloadavg()[0]})
        print("  %d pages: %.0f pages/s, %s KB written a page (%s accounted), %.0f bytes a page "
              "in the file" % (done, rows[-1]["pages_per_s"], rows[-1]["kb_written_per_page"],
                               rows[-1]["kb_accounted_per_page"],
                               rows[-1]["file_bytes_per_page"]), flush=True)
    flagged["digest"] = digest.hexdigest()[:16]
    return rows, flagged, kept


def single(db, crawl, start, n):
    """n pages, one a call (each its own durable commit): pages/s and KB written a page."""
    items = crawl.pages(start, n)
    before, began = io_bytes(), time.perf_counter()
    for key, text, meta, _ in items:
        db.insert_text_if_new(key, text, meta)
    seconds = time.perf_counter() - began
    return {"pages": n, "pages_per_s": n / seconds, **per_page(before, io_bytes(), n)}


def io_bytes():
    """(bytes the process's write calls handed the kernel, bytes the kernel
    accounts it for writing): see bench_text.written_bytes."""
    return written_bytes("wchar"), written_bytes("write_bytes")


def per_page(before, after, n):
    """KB written a page, and KB accounted a page, between two io_bytes."""
    return {name: "%.1f" % ((b - a) / n / 1e3) if a is not None else "-"
            for name, a, b in zip(("kb_written_per_page", "kb_accounted_per_page"), before, after)}


def queries(db, crawl, stored, n):
    """query_text_many in calls of 100: ms per text at p50/p99, and the copies' recall."""
    rng = np.random.default_rng(7)
    picks = rng.choice(len(stored), size=min(n, len(stored)), replace=False)
    asked = [(crawl.edited(stored[p][1], QUERY_RATES[j % 3]), stored[p][0], QUERY_RATES[j % 3])
             for j, p in enumerate(picks.tolist())]
    asked += [(t, None, None) for t in crawl.texts(n)]
    asked += [(t, None, "template") for t in crawl.texts(max(1, len(asked) // 100), template=True)]
    order = rng.permutation(len(asked))
    asked = [asked[i] for i in order.tolist()]
    db.query_text_many([t for t, _, _ in asked[:200]])
    ms, found = [], []
    for b in range(0, len(asked), 100):
        chunk = asked[b:b + 100]
        began = time.perf_counter()
        found += db.query_text_many([t for t, _, _ in chunk])
        ms.append((time.perf_counter() - began) / len(chunk) * 1e3)
    row = {"p50_ms": "%.3f" % np.percentile(ms, 50), "p99_ms": "%.3f" % np.percentile(ms, 99)}
    for rate in QUERY_RATES:
        hits = [key in {m.key for m in f} for (_, key, r), f in zip(asked, found) if r == rate]
        row["recall %d%%" % round(100 * rate)] = "%.4f" % np.mean(hits)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="pages a call (a durable commit)")
    parser.add_argument("--stretch", type=int, default=100_000, help="pages a reported stretch")
    parser.add_argument("--single", type=int, default=2000, help="pages one a call at the end")
    parser.add_argument("--queries", type=int, default=2000, help="edited copies, as many "
                        "unrelated pages")
    parser.add_argument("--backend", default="lmdb")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    path = os.path.join(workdir, "crawl.db")
    print("load average at start: %.2f %.2f %.2f, %d cores, backend %s\n"
          % (*os.getloadavg(), os.cpu_count(), args.backend), flush=True)
    try:
        crawl = Crawl()
        db = simhashdb.DB(path, recipe=simhashdb.RECIPE, backend=args.backend)
        rows, flagged, stored = stream(db, crawl, args.pages, args.batch, args.stretch)
        one = single(db, crawl, args.pages, args.single) if args.single else None
        asked = queries(db, crawl, stored, args.queries)
        count = len(db)
        db.close()
        live = lmdb_bytes(path, count)
        with simhashdb.DB(path, backend=args.backend) as db:
            db.compact()
        compacted = lmdb_bytes(path, count)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n## insert_text_if_new_many, batches of %d (%s)\n" % (args.batch, args.backend))
    table(rows, ["pages", "pages_per_s", "kb_written_per_page", "kb_accounted_per_page",
                 "file_bytes_per_page", "load"])
    print("\nlast stretch / second stretch: %.2f" % (rows[-1]["pages_per_s"]
                                                      / rows[min(1, len(rows) - 1)]["pages_per_s"]))
    if one:
        print("\n## One page a call on the filled database\n")
        table([one], ["pages", "pages_per_s", "kb_written_per_page", "kb_accounted_per_page"])
    print("\n## query_text_many, calls of 100 texts\n")
    table([asked], list(asked))
    print("\n## Decisions\n")
    table([flagged], ["planted_total", "planted", "other", "digest"])
    print("\n## Bytes a page (%d pages stored)\n" % count)
    bytes_table({"live": live, "compacted": compacted})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "stream": rows, "single": one, "queries": asked,
                       "decisions": flagged, "live": live, "compacted": compacted}, f, indent=1)


if __name__ == "__main__":
    main()
