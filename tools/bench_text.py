"""The text path of simhashdb.DB against its targets: a crawler's stream
through insert_text_if_new_many, the bytes a text document takes on LMDB,
and query_text_many at scale. The database's defaults throughout
(``DB(path, recipe=simhashdb.RECIPE)``: distance 3, 10 tables, 32 bands).

1. **Stream** (``--stream N``): the cached corpus (tools/corpus.py, the
   tuning and held-out kinds; HTML kinds as HTML, ``html=True``), then edited
   variants of it until N texts: in each later round every document comes
   once more, as a new page of its site (15% of its words replaced by words
   of other documents, what eval_quality calls foreign words: resemblance
   ~0.25 to the original, so it is stored) or, one time in five, as a
   near-duplicate (``eval_quality.edit_foreign_words`` at 1 to 5%: skipped).
   Into an empty database in batches of 1,000 and of 100 (each batch split
   into its HTML and its plain texts: two calls), documents/s over the
   stream and per stretch of it; then ``insert_text_if_new`` one text at a
   time (each its own durable commit) on the filled database. The time is
   broken down: HTML stripped, NFKC-normalised, then case folded, read into
   words, fingerprinted and signed in one native pass (the steps of
   ``fingerprint_with_signature``, timed one by one over the stream), and
   the database's own part (search, bands, confirmation, write, commit:
   the stream again into another database with every fingerprint and
   signature computed beforehand). Peers on a prefix of the stream:
   datasketch MinHashLSH (eval_dedupe.Datasketch: threshold 0.5, 128
   permutations, word 5-shingles, query then insert, in memory, no
   durability) and the py-lmdb backend.
2. **Bytes**: the data file per document, and each part's (documents,
   fingerprint index, permutation tables, band index) from LMDB's own
   statistics of every sub-database (read with py-lmdb after closing),
   live and compacted.
4. **Growth** (``--growth N``, with ``--only growth`` alone): the database's
   part as it fills, without the corpus's fingerprinting cost: N short
   synthetic texts (as in 3) through insert_text_if_new_many in batches of
   1,000; per stretch, documents/s and the bytes the process had written
   to the disk per document (``/proc/self/io``).
3. **Scale** (``--n N``, repeatable): one database filled by
   insert_text_many (``--chunk`` texts a transaction) with synthetic texts
   (80 to 200 words of a Zipf vocabulary of 200,000 words; 2% stored
   near-duplicates, 1 to 8% of their words replaced by new words; 1% a
   template of 300 words, one of 10, with 20 to 40 words of their own),
   measured on reaching each N (or where ``--fill-minutes`` stops it):
   query_text_many in calls of 100 texts of edited copies of stored
   documents (1, 2, 4, 8% new words; recall: the original among the
   matches), as many unrelated texts (any match is false), and 1% template
   texts (each matches every stored text of its template, N / 1,000);
   ms per text (a call's time / 100) at p50, p90, p99 over the calls, the
   same calls without their template texts, template texts alone, and
   query_text one text a call. The fill rate is measured and split (text
   generation, fingerprinting, the write).

Usage: python tools/bench_text.py [--stream 100000] [--single 3000]
       [--peers 10000] [--n 1000000 ...] [--chunk 1000000] [--queries 2000]
       [--fill-minutes 40] [--growth N] [--only stream|scale|growth] [--json FILE]
Needs: pip install datasketch numpy   (see tools/requirements.txt)
"""

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import tempfile
import time

import lmdb
import numpy as np

import corpus
import eval_dedupe
import eval_quality
from bench_db import table

import simhashdb
from simhashdb import _ext
from simhashdb.fingerprint import _method, _nfkc

BATCH = 1000
STRETCH = 20_000  # documents/s reported per stretch of the stream
NEW_PAGE, NEAR_DUPLICATE = 0.15, (0.01, 0.02, 0.05)


# 1. The stream

def documents(limit=None):
    """eval_quality.Documents of the cached corpus, tuning and held-out kinds."""
    raw = (corpus.debian_corpus() + corpus.held_out_corpus())[:limit]
    return [eval_quality.Document(d["text"], d["kind"], d["html"]) for d in raw]


def stream(docs, n, seed=0):
    """(key, text, html) of n texts: the corpus, then rounds of variants."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    pool = np.array([d.units[i] for d in docs for i in d.editable[::50]], dtype=object)
    parts = []  # per document: its words and separators interleaved, an object array
    for d in docs:
        p = np.empty(2 * len(d.units) - 1, dtype=object)
        p[0::2], p[1::2] = d.units, d.seps  # a Document has one separator fewer
        parts.append(p)
    items, round_ = [], 0
    while len(items) < n:
        order = list(range(len(docs)))
        rng.shuffle(order)
        for i in order[:n - len(items)]:
            d = docs[i]
            if round_ == 0 or not d.editable:
                text = d.text
            elif rng.random() < 0.2:  # a near-duplicate: skipped by the rule
                text = eval_quality.edit_foreign_words(docs, i, rng.choice(NEAR_DUPLICATE), rng)
            else:  # a new page of the site: 15% of its words replaced by other documents'
                p = parts[i].copy()
                where = 2 * nrng.choice(d.editable, size=max(1, int(NEW_PAGE * len(d.editable))))
                p[where] = pool[nrng.integers(0, len(pool), size=len(where))]
                text = "".join(p.tolist())
            items.append(("r%d/%d" % (round_, i), text, d.html))
        round_ += 1
    return items


class Precomputed(simhashdb.DB):
    """The database with each text's fingerprint and signature given
    beforehand (by id of the text): what is left is the database's part."""

    def __init__(self, path, prints, **options):
        super().__init__(path, **options)
        self.prints = prints

    def _text_fingerprint(self, text, html):
        return self.prints[id(text)]


def run_stream(db, items, batch):
    """items through insert_text_if_new_many in batches; (seconds per batch, stored)."""
    seconds, stored = [], 0
    for b in range(0, len(items), batch):
        chunk = items[b:b + batch]
        start = time.perf_counter()
        found = eval_dedupe._by_html(chunk, lambda group, html: db.insert_text_if_new_many(
            group, html=html))
        seconds.append(time.perf_counter() - start)
        stored += sum(not f for f in found)
    return np.array(seconds), stored


def stages(items):
    """Each step of fingerprint_with_signature timed over items: (seconds by
    step, {id(text): (fingerprint, signature)})."""
    fingerprint_and_signature = _method(**simhashdb.RECIPES[simhashdb.RECIPE])[1]
    took, prints = collections.Counter(), {}
    for _, text, html in items:
        t0 = time.perf_counter()
        plain = simhashdb.strip_html(text) if html else text
        t1 = time.perf_counter()
        nfkc = _nfkc(plain)
        t2 = time.perf_counter()
        fp, signature = fingerprint_and_signature(nfkc, True)
        prints[id(text)] = fp, _ext.narrow(signature)  # a new database's 8-bit bins
        t3 = time.perf_counter()
        took["strip HTML"] += t1 - t0
        took["normalise (NFKC)"] += t2 - t1
        took["case fold, words, fingerprint (idf), signature (word 5-shingle MinHash)"] += \
            t3 - t2
    for _, text, html in items[:200]:  # the steps are the function
        assert prints[id(text)] == simhashdb.fingerprint_with_signature(
            text, html=html, **simhashdb.RECIPES[simhashdb.RECIPE])
    return took, prints


def bench_stream(items, single, args, workdir):
    rows, breakdown, extra = [], [], {}
    mb = sum(len(t.encode()) for _, t, _ in items) / 1e6
    took, prints = stages(items)
    extra["stream"] = {"texts": len(items), "mb": mb,
                       "html_share": sum(h for _, _, h in items) / len(items)}

    def row(name, seconds, texts, stored, note=""):
        return {"method": name, "texts": len(texts), "docs_per_s": len(texts) / seconds.sum(),
                "mb_per_s": sum(len(t.encode()) for _, t, _ in texts) / 1e6 / seconds.sum(),
                "stored": "%.1f%%" % (100 * stored / len(texts)), "note": note}

    path = os.path.join(workdir, "db")
    db = Precomputed(path + ".pre", prints, recipe=simhashdb.RECIPE)
    pre, _ = run_stream(db, items, BATCH)
    db.close()
    shutil.rmtree(path + ".pre")
    db = simhashdb.DB(path, recipe=simhashdb.RECIPE)
    backend = db.stats()["backend"]
    full, stored = run_stream(db, items, BATCH)
    rows.append(row("insert_text_if_new_many, batches of 1,000 (%s)" % backend, full,
                    items, stored))
    per_stretch = STRETCH // BATCH
    extra["stretches"] = [{"texts": "%d-%d" % (s * STRETCH, min(len(items), (s + 1) * STRETCH)),
                           "docs_per_s": len(full[s * per_stretch:(s + 1) * per_stretch]) * BATCH
                           / full[s * per_stretch:(s + 1) * per_stretch].sum(),
                           "db_part_docs_per_s": len(pre[s * per_stretch:(s + 1) * per_stretch])
                           * BATCH / pre[s * per_stretch:(s + 1) * per_stretch].sum()}
                          for s in range(-(-len(full) // per_stretch))]
    total = full.sum()
    for step, seconds in took.items():
        breakdown.append({"step": step, "us_per_doc": 1e6 * seconds / len(items),
                          "share": "%.0f%%" % (100 * seconds / total)})
    breakdown.append({"step": "database: encode, search, bands, confirm, write, commit "
                              "(measured apart)", "us_per_doc": 1e6 * pre.sum() / len(items),
                      "share": "%.0f%%" % (100 * pre.sum() / total)})
    breakdown.append({"step": "the whole call (insert_text_if_new_many)",
                      "us_per_doc": 1e6 * total / len(items), "share": "100%"})
    breakdown.append({"step": "sum of the parts", "us_per_doc": 1e6 * (
        sum(took.values()) + pre.sum()) / len(items),
        "share": "%.0f%%" % (100 * (sum(took.values()) + pre.sum()) / total)})
    start, stored = time.perf_counter(), 0
    for key, text, html in single:
        stored += not db.insert_text_if_new(key, text, html=html)
    seconds = np.array([time.perf_counter() - start])
    rows.append(row("insert_text_if_new, one at a time (%s), on the database above" % backend,
                    seconds, single, stored, "the %d texts after the stream" % len(single)))
    extra["count"] = len(db)
    db.close()
    extra["bytes"] = lmdb_bytes(path, extra["count"])
    db = simhashdb.DB(path, recipe=simhashdb.RECIPE)
    db.compact()
    db.close()
    extra["bytes_compacted"] = lmdb_bytes(path, extra["count"])
    shutil.rmtree(path)
    db = simhashdb.DB(path + ".100", recipe=simhashdb.RECIPE)
    small, stored = run_stream(db, items, 100)
    db.close()
    shutil.rmtree(path + ".100")
    rows.append(row("insert_text_if_new_many, batches of 100 (%s)" % backend, small,
                    items, stored))
    prefix = items[:args.peers]
    ours = full[:len(prefix) // BATCH]
    db = simhashdb.DB(path + ".py", recipe=simhashdb.RECIPE, backend="py-lmdb")
    fallback, stored = run_stream(db, prefix, BATCH)
    db.close()
    shutil.rmtree(path + ".py")
    rows.append(row("insert_text_if_new_many, batches of 1,000 (py-lmdb)", fallback,
                    prefix, stored, "first %d texts: %.2fx the native rate there" % (
                        len(prefix), ours.sum() / fallback.sum())))
    try:
        peer, seconds, stored = eval_dedupe.Datasketch(), [], 0
        for b in range(0, len(prefix), BATCH):
            start = time.perf_counter()
            stored += sum(not f for f in peer.decide(prefix[b:b + BATCH]))
            seconds.append(time.perf_counter() - start)
        seconds = np.array(seconds)
        rows.append(row("datasketch MinHashLSH (0.5, 128 perm), query + insert, in memory",
                        seconds, prefix, stored,
                        "first %d texts: simhashdb %.2fx its rate there" % (
                            len(prefix), seconds.sum() / ours.sum())))
    except ImportError:
        print("datasketch not installed: pip install datasketch")
    return rows, breakdown, extra


# 2. Bytes

def lmdb_bytes(path, docs):
    """Bytes per document of the data file and of each group of sub-databases
    (their B-tree pages, from LMDB's statistics)."""
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=512, subdir=True)
    with env.begin() as txn:
        names = [key for key, _ in txn.cursor()]
    groups = collections.Counter()
    for name in names:
        kind = name.decode().split(":")[0]
        fixed = kind == "table" or kind == "band" and name.count(b":") == 1  # (0.5's bands)
        db = env.open_db(name, create=False, dupsort=fixed or kind in ("fingerprints", "index"),
                         dupfixed=fixed)
        with env.begin() as txn:
            st = txn.stat(db)
        groups[kind] += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) \
            * st["psize"]
    st = env.stat()
    groups["main (names)"] += (st["branch_pages"] + st["leaf_pages"]) * st["psize"]
    file_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
    env.close()
    out = {k: v / docs for k, v in sorted(groups.items())}
    out["free and unused pages"] = (file_bytes - sum(groups.values())) / docs
    out["data file"] = file_bytes / docs
    return out


def bytes_table(label_bytes):
    parts = [k for k in next(iter(label_bytes.values()))]
    rows = [{"part": k, **{label: figures[k] for label, figures in label_bytes.items()}}
            for k in parts]
    table(rows, ["part"] + list(label_bytes))


# 3. Scale

class Synthetic:
    """Short texts of a Zipf vocabulary, with planted near-duplicates and
    template documents (see the module docstring)."""

    def __init__(self, seed=0, vocabulary=200_000, templates=10):
        self.rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        words = set()
        while len(words) < vocabulary:
            for n in self.rng.integers(3, 10, size=vocabulary):
                words.add("".join(self.rng.choice(letters, size=n)))
        self.vocab = np.array(sorted(words)[:vocabulary], dtype=object)
        self.rng.shuffle(self.vocab)
        weights = 1 / (np.arange(vocabulary) + 2.7)  # Zipf-Mandelbrot, as eval_quality's
        self.cumulative = np.cumsum(weights) / weights.sum()
        self.templates = [" ".join(self.words(300).tolist()) + " " for _ in range(templates)]
        self.fresh = 0

    def words(self, n):
        return self.vocab[np.searchsorted(self.cumulative, self.rng.random(n))]

    def texts(self, count, template=None):
        """``count`` texts: 80 to 200 words, or with ``template`` (True: any,
        or its number) a template and 20 to 40 words."""
        lengths = self.rng.integers(20, 41, count) if template is not None \
            else self.rng.integers(80, 201, count)
        words, ends = self.words(int(lengths.sum())).tolist(), np.cumsum(lengths).tolist()
        texts = [" ".join(words[e - n:e]) for e, n in zip(ends, lengths.tolist())]
        if template is not None:
            which = self.rng.integers(len(self.templates), size=count) if template is True \
                else [template] * count
            texts = [self.templates[t] + text for t, text in zip(which, texts)]
        return texts

    def edited(self, text, rate):
        """``text`` with ``rate`` of its words replaced by new words."""
        words = text.split(" ")
        for p in self.rng.choice(len(words), size=max(1, round(rate * len(words))),
                                 replace=False):
            self.fresh += 1
            words[p] = "new%dword" % self.fresh
        return " ".join(words)

    def chunk(self, start, count):
        """(key, text) of documents start..start+count: 1% template texts
        (``t``), 2% near-duplicates of an earlier text of the chunk (``c``),
        the rest new texts (``d``)."""
        draw = self.rng.random(count)
        plain = iter(self.texts(int((draw >= 0.01).sum())))
        templated = iter(self.texts(int((draw < 0.01).sum()), template=True))
        records = []
        for i, r in enumerate(draw.tolist(), start):
            if r < 0.01:
                records.append(("t%d" % i, next(templated)))
            elif r < 0.03 and records:
                source = records[int(self.rng.integers(len(records)))][1]
                records.append(("c%d" % i, self.edited(source, RATES[int(self.rng.integers(4))])))
                next(plain)
            else:
                records.append(("d%d" % i, next(plain)))
        return records


RATES = (0.01, 0.02, 0.04, 0.08)


def bench_scale(sizes, args, workdir):
    """One database filled by insert_text_many, ``args.chunk`` texts a
    transaction, measured on reaching each of ``sizes`` (or where the fill
    stops, at ``args.fill_minutes``)."""
    gen = Synthetic()
    path = os.path.join(workdir, "scale")
    db = simhashdb.DB(path, recipe=simhashdb.RECIPE)
    keep = max(1, min(sizes) // (4 * args.queries))  # a sample of originals, for queries
    took, kept, done, rows, chunks, filling = collections.Counter(), {}, 0, [], [], 0.0
    for n in sorted(sizes):
        while done < n and filling < 60 * args.fill_minutes:
            start = time.perf_counter()
            records = gen.chunk(done, min(args.chunk, n - done))
            generated = time.perf_counter()
            db.insert_text_many(records, batch_size=len(records))
            wrote = time.perf_counter()
            took["generate texts"] += generated - start
            took["insert_text_many"] += wrote - generated
            filling += wrote - start
            kept.update((k, t) for k, t in records if k[0] == "d" and int(k[1:]) % keep == 0)
            done += len(records)
            chunks.append({"documents": done,
                           "insert_docs_per_s": len(records) / (wrote - generated),
                           "load": "%.2f" % os.getloadavg()[0]})
            print("  filled %d: insert_text_many %.0f docs/s this chunk, %.0f s so far, load %s"
                  % (done, chunks[-1]["insert_docs_per_s"], filling, chunks[-1]["load"]),
                  flush=True)
        sample = [t for _, t in records[:5000]]
        start = time.perf_counter()
        for text in sample:
            simhashdb.fingerprint_with_signature(text)
        split = dict(took, **{"of which fingerprint+signature (sampled)": (
            time.perf_counter() - start) / len(sample) * done})
        wait_for_quiet(args.wait_minutes)
        row = measure(db, gen, kept, done, args)
        row["distinct_fingerprints"] = db.stats()["distinct_fingerprints"]
        row.update(fill_s=filling, fill_docs_per_s=done / filling,
                   fill_split={k: "%.0f s" % v for k, v in split.items()})
        db.close()
        row["bytes"] = lmdb_bytes(path, done)
        rows.append(row)
        if done < n:
            print("  the fill stopped at %d documents after %.0f s (--fill-minutes %g)"
                  % (done, filling, args.fill_minutes))
            break
        db = simhashdb.DB(path, recipe=simhashdb.RECIPE)
    else:
        db.close()
    shutil.rmtree(path)
    return rows, chunks


def written_bytes(field="wchar"):
    """Bytes this process has written (Linux, /proc/self/io), or None:
    ``wchar``, what its write calls handed the kernel (LMDB writes its pages
    with pwrite), or ``write_bytes``, what the kernel accounts it for sending
    to storage. On Linux 6 the latter counts the whole large folio (16-64 KB)
    that a 4 KB write into the page cache dirties: for LMDB's scattered pages
    it came out 10-13 times wchar, while the disk's own counters
    (/sys/block/*/stat) wrote about wchar."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except OSError:
        return None


def growth(n, workdir):
    """The database's part as it grows: n short synthetic texts (cheap to
    fingerprint) through insert_text_if_new_many in batches of 1,000; per
    stretch, documents/s and the bytes written to the disk per document."""
    gen, rows = Synthetic(seed=1), []
    db = simhashdb.DB(os.path.join(workdir, "growth"), recipe=simhashdb.RECIPE)
    for start in range(0, n, STRETCH):
        records = gen.chunk(start, min(STRETCH, n - start))
        before, began = written_bytes(), time.perf_counter()
        for b in range(0, len(records), BATCH):
            db.insert_text_if_new_many(records[b:b + BATCH])
        seconds, after = time.perf_counter() - began, written_bytes()
        rows.append({"stored_before": start, "docs_per_s": len(records) / seconds,
                     "kb_written_per_doc": (after - before) / len(records) / 1e3
                     if before is not None else "-"})
    stats = db.stats()
    db.close()
    shutil.rmtree(os.path.join(workdir, "growth"))
    return rows, stats


def wait_for_quiet(minutes):
    """Wait (up to ``minutes``) while a test suite runs on this shared machine."""
    deadline = time.monotonic() + 60 * minutes
    while subprocess.run(["pgrep", "-f", "pytest"], capture_output=True).stdout and \
            time.monotonic() < deadline:
        time.sleep(30)
    print("  measuring at load %.2f%s" % (os.getloadavg()[0], "" if time.monotonic() < deadline
                                            else " (a test suite still runs)"), flush=True)


def measure(db, gen, kept, n, args):
    """query_text_many over edited copies of stored texts, unrelated texts
    and 1% template texts, in calls of 100; query_text alone."""
    stats = db.stats()
    originals = sorted(kept.items())
    random.Random(n).shuffle(originals)
    queries = []  # (text, the key expected among the matches or None, group)
    for j, (key, text) in enumerate(originals[:args.queries]):
        rate = RATES[j % len(RATES)]
        queries.append((gen.edited(text, rate), key, "copy %g%%" % (100 * rate)))
    queries += [(t, None, "unrelated") for t in gen.texts(args.queries)]
    template = [(t, None, "template") for t in gen.texts(max(100, len(queries) // 100),
                                                         template=True)]
    queries += template[:len(queries) // 100]
    random.Random(1).shuffle(queries)
    db.query_text_many([t for t, _, _ in queries[:500]])  # warm the path, not the data
    per_text, found = [], []
    for b in range(0, len(queries), 100):
        chunk = queries[b:b + 100]
        start = time.perf_counter()
        found += db.query_text_many([t for t, _, _ in chunk])
        per_text.append((time.perf_counter() - start) / len(chunk) * 1e3)
    plain, plain_ms = [q for q in queries if q[2] != "template"], []
    for b in range(0, len(plain), 100):  # the same calls without their template texts
        chunk = plain[b:b + 100]
        start = time.perf_counter()
        db.query_text_many([t for t, _, _ in chunk])
        plain_ms.append((time.perf_counter() - start) / len(chunk) * 1e3)
    template_ms, template_found = [], []
    for b in range(0, len(template), 100):
        chunk = template[b:b + 100]
        start = time.perf_counter()
        template_found += db.query_text_many([t for t, _, _ in chunk])
        template_ms.append((time.perf_counter() - start) / len(chunk) * 1e3)
    singles = []
    for text, _, _ in queries[:1000]:
        start = time.perf_counter()
        db.query_text(text)
        singles.append((time.perf_counter() - start) * 1e3)
    hits = collections.defaultdict(list)
    for (text, key, group), matches in zip(queries, found):
        keys = {m.key for m in matches}
        hits[group].append(key in keys if key else len(keys))

    def ms(values, p):
        return "%.2f" % np.percentile(values, p)

    return {"N": n, "p50_ms": ms(per_text, 50), "p90_ms": ms(per_text, 90),
            "p99_ms": ms(per_text, 99), "calls": len(per_text),
            "no_template_p50_ms": ms(plain_ms, 50), "no_template_p99_ms": ms(plain_ms, 99),
            "single_p50_ms": ms(singles, 50), "single_p99_ms": ms(singles, 99),
            "template_ms_per_text": "%.2f" % np.mean(template_ms),
            "template_matches": np.mean([len(f) for f in template_found]),
            "unrelated_with_a_match": "%.4f" % np.mean([h > 0 for h in hits["unrelated"]]),
            **{"recall %s" % g: "%.3f (%d)" % (np.mean(hits[g]), len(hits[g]))
               for g in sorted(hits) if g.startswith("copy")},
            "data_file_gb": "%.2f" % (stats["disk_bytes"] / 1e9),
            "load": "%.2f" % os.getloadavg()[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", type=int, default=100_000, help="texts in the stream")
    parser.add_argument("--single", type=int, default=3000,
                        help="texts inserted one at a time after the stream")
    parser.add_argument("--peers", type=int, default=10_000,
                        help="texts of the stream's prefix for datasketch and py-lmdb")
    parser.add_argument("--n", type=int, action="append",
                        help="stored synthetic texts for query_text_many (repeatable; "
                             "default 1,000,000)")
    parser.add_argument("--chunk", type=int, default=1_000_000, help="texts a fill transaction")
    parser.add_argument("--fill-minutes", type=float, default=40,
                        help="stop filling after this long and measure there")
    parser.add_argument("--queries", type=int, default=2000,
                        help="edited copies, and as many unrelated texts, per N")
    parser.add_argument("--wait-minutes", type=float, default=10,
                        help="before measuring queries, wait up to this long while pytest runs")
    parser.add_argument("--growth", type=int, default=0,
                        help="also: N short synthetic texts through insert_text_if_new_many, "
                             "the database's part as it grows and the bytes it writes")
    parser.add_argument("--only", choices=("stream", "scale", "growth"))
    parser.add_argument("--corpus-docs", type=int, help="only the first N documents (a trial)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    out = {"load": os.getloadavg()}
    print("load average at start: %.2f %.2f %.2f, %d cores\n" % (*out["load"], os.cpu_count()))
    try:
        if args.only not in ("scale", "growth"):
            items = stream(documents(args.corpus_docs), args.stream + args.single)
            rows, breakdown, extra = bench_stream(items[:args.stream], [
                ("one/" + key, text, html) for key, text, html in items[args.stream:]], args,
                workdir)
            s = extra["stream"]
            print("## Stream: %d texts, %.0f MB (%.1f KB a text), %.0f%% HTML\n" % (
                s["texts"], s["mb"], s["mb"] * 1e3 / s["texts"], 100 * s["html_share"]))
            table(rows, ["method", "texts", "docs_per_s", "mb_per_s", "stored", "note"])
            print("\nBy stretch of the stream (batches of 1,000; the database's part alone "
                  "beside)\n")
            table(extra["stretches"], ["texts", "docs_per_s", "db_part_docs_per_s"])
            print("\nWhere the time of insert_text_if_new_many (batches of 1,000) goes\n")
            table(breakdown, ["step", "us_per_doc", "share"])
            print("\n## Bytes per document on LMDB (native), %d documents stored of %d texts\n"
                  % (extra["count"], s["texts"]))
            bytes_table({"live": extra["bytes"], "compacted": extra["bytes_compacted"]})
            out.update(rows=rows, breakdown=breakdown, **extra)
            print("\nload average after the stream: %.2f %.2f %.2f\n" % os.getloadavg())
        if args.growth:
            rows, stats = growth(args.growth, workdir)
            print("## The database's part as it grows: short synthetic texts through "
                  "insert_text_if_new_many, batches of 1,000 (%s)\n" % stats["backend"])
            table(rows, ["stored_before", "docs_per_s", "kb_written_per_doc"])
            out["growth"] = rows
        if args.only not in ("stream", "growth"):
            scale, chunks = bench_scale(args.n or [1_000_000], args, workdir)
            print("\n## query_text_many at scale (calls of 100 texts; ms per text)\n")
            table(scale, ["N", "distinct_fingerprints", "fill_s", "fill_docs_per_s", "data_file_gb",
                          "p50_ms", "p90_ms",
                          "p99_ms", "calls", "no_template_p50_ms", "no_template_p99_ms",
                          "single_p50_ms", "single_p99_ms",
                          "template_ms_per_text", "template_matches",
                          "unrelated_with_a_match", "load"])
            print()
            table(scale, ["N"] + [k for k in scale[0] if k.startswith("recall")])
            print("\nFill time split\n")
            table([{"N": r["N"], **r["fill_split"]} for r in scale],
                  ["N"] + list(scale[0]["fill_split"]))
            print("\nBytes per document\n")
            bytes_table({"N = %d" % r["N"]: r["bytes"] for r in scale})
            print("\nThe fill, chunk by chunk\n")
            table(chunks, ["documents", "insert_docs_per_s", "load"])
            out.update(scale=scale, chunks=chunks)
            print("\nload average at the end: %.2f %.2f %.2f" % os.getloadavg())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
