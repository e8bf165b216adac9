"""Can a text's stored signature be 128 bytes? b-bit MinHash bins against
today's 16-bit ones, measured (issue 43, item 2), in memory, the package
unchanged.

Today a text stores 128 MinHash bins of 16 bits (1 to 65535, 0: an empty
bin). The ``b``-bit form stores each filled bin as ``1 + (v - 1) mod
(2^b - 1)`` of its 16-bit value ``v`` (the low bits of the bin's rest, as
bandsim.py reduces a bin to a width: 0 stays free to mark an empty bin,
which the bands' densification and the short-text rule read); its 32 band
keys are computed from those b-bit bins by the package's own band code
(``_ext.bands`` on the codes laid out as today's 256 bytes), and its
resemblance is corrected for unrelated bins equal by chance, ``c = 1 /
(2^b - 1)``: ``J = max(0, (f - c) / (1 - c))``, ``f`` the equal bins over the
bins not empty in both (the native estimate). Everything else is the
package's: recipe 3 fingerprints, distance 3, the threshold (0.45), the
candidates (a shared band or a fingerprint within 3 bits) and the rule that
confirms them (``simhashdb.rule``: ``resemblances``, ``passing``,
``kept_pairs``). 16 bits is the form of databases made before format 10,
uncorrected; a new database keeps the 8-bit form (since simhashdb 0.15).

1. The quality harness's corpora (tools/eval_quality.py's Debian corpus with
   its held-out kinds; ``--quick``: the Python corpus):
   - all pairs: the pairs each form accepts among the corpus's documents,
     the unrelated ones (exact word 5-shingle Jaccard < 0.3) per document,
     the pairs decided otherwise than at 16 bits, with their 16-bit
     estimate's side of the threshold, and the band candidates a document
     meets that the rule does not confirm (the cost in reads);
   - the edited copies of every edit model and rate against their original:
     found or not, per form, tuning and held-out kinds apart;
   - tools/eval_dedupe.py's stream (every document and the planted copies,
     insert-if-new, in order), decided by each form: its tables, and the
     texts decided otherwise than at 16 bits (its docs/s are those of this
     study's Python, not of a database);
   - tools/eval_templates.py's pages (Python's HTML manual and short pages
     under a site's template, ``html=True``, with and without
     ``short_words``).
2. tools/bench_crawl.py's stream of pages to ``--pages``, decided by each
   form in memory: the pages flagged, those decided otherwise.
3. The band index: the S-curve of each form (the chance that a pair of
   resemblance J shares a band, 32-bit band keys), and the band candidates
   a query meets unconfirmed in the crawl's stream, per stored page, taken
   to 1M and 10M stored pages.

Usage: python tools/bbit_study.py [--quick] [--seed N] [--recall N] [--bits 16 12 8 4]
       [--pages 300000] [--only corpus|templates|crawl|curve ...] [--check-db]
(``--check-db``: the 8-bit form's stream against DB.insert_text_if_new_many
itself, texts decided otherwise counted: 0 unless this study's rule drifted
from the package's.)
"""

import argparse
import collections
import functools
import random

import numpy as np

import corpus
import eval_dedupe
import eval_quality
import eval_templates
from bench_crawl import Crawl

import simhashdb
from simhashdb import _ext, rule

DISTANCE = 3
BAND_NUMBER = np.arange(_ext.BANDS, dtype=np.uint64) << np.uint64(32)
KEY_CHANCE = 2.0 ** -32  # two different bands under one 32-bit key


def sign(text, html=False):
    """(fingerprint, 256-byte signature of 16-bit bins) of a text, as a database
    made before format 10 makes them (a new one keeps their 8-bit form)."""
    return simhashdb.fingerprint_with_signature(text, html=html, signature_bits=16,
                                                **simhashdb.RECIPES[simhashdb.RECIPE])


def as_rows(signatures):
    return np.frombuffer(b"".join(signatures), np.uint8).reshape(-1, _ext.WIDE_SIGNATURE_BYTES)


class Form:
    """A signature stored as 128 bins of ``bits`` bits (16: today's)."""

    def __init__(self, bits):
        self.bits = bits
        self.collision = 1 / ((1 << bits) - 1)  # two unrelated filled bins equal
        self.chance = 0.0 if bits == 16 else self.collision  # today's estimate: uncorrected
        self.name = "%d-bit bins (%d bytes)" % (bits, rule.BINS * bits // 8)

    def stored(self, rows):
        """(n, 256) uint8 rows of 16-bit signatures in this form, in the same layout."""
        if self.bits == 16:
            return rows
        v = rows.view(">u2").astype(np.int64)
        codes = np.where(v == 0, 0, (v - 1) % ((1 << self.bits) - 1) + 1)
        return np.ascontiguousarray(codes.astype(">u2")).view(np.uint8)

    @staticmethod
    def bands(stored):
        """(n, 32) uint64: each row's band keys, the band's number above; 0: no text."""
        out = np.zeros((len(stored), _ext.BANDS), np.uint64)
        for i, row in enumerate(stored):
            keys = _ext.bands(row)
            if keys:
                out[i] = np.frombuffer(keys, np.uint32).astype(np.uint64) | BAND_NUMBER
        return out

    def accepted(self, stored, a, b, texts, banded, near, threshold):
        """The rule on the pairs of rows (a, b): which it keeps, and the resemblances."""
        scores = rule.resemblances(stored, a, b)
        scores = np.clip((scores - self.chance) / (1 - self.chance), 0, None)
        passed = rule.passing(stored, a, b, scores, threshold)
        return rule.kept_pairs(texts, banded, near, passed), scores


def popcount(x):
    return np.bitwise_count(np.asarray(x, np.uint64))


class Postings:
    """Ids by 64-bit key: a sorted base, and a dict of the entries added since."""

    def __init__(self, flush=1 << 19):
        self.keys, self.ids = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self.recent, self.pending, self.flush = collections.defaultdict(list), 0, flush

    def add(self, keys, i):
        for key in keys:
            self.recent[key].append(i)
        self.pending += len(keys)
        if self.pending >= self.flush:
            keys = np.fromiter((k for k, ids in self.recent.items() for _ in ids), np.uint64)
            ids = np.fromiter((i for ids in self.recent.values() for i in ids), np.int64)
            keys, ids = np.concatenate([self.keys, keys]), np.concatenate([self.ids, ids])
            order = np.argsort(keys, kind="stable")
            self.keys, self.ids = keys[order], ids[order]
            self.recent, self.pending = collections.defaultdict(list), 0

    def find(self, keys):
        """The ids under any of ``keys`` (a list of ints), with repeats."""
        lo = np.searchsorted(self.keys, np.array(keys, np.uint64), "left")
        hi = np.searchsorted(self.keys, np.array(keys, np.uint64), "right")
        found = [self.ids[x:y] for x, y in zip(lo.tolist(), hi.tolist()) if y > x]
        found += [np.array(self.recent[k]) for k in keys if k in self.recent]
        return np.concatenate(found) if found else np.zeros(0, np.int64)


class Memory:
    """Insert-if-new under one form, in memory, one text after another (as
    DB.insert_text_if_new_many decides a batch): the candidates share a band
    or a 16-bit block of the fingerprint (four blocks: within 3 bits, two
    fingerprints agree on one), and the rule confirms them. A text stored
    under a key already stored replaces the document there."""

    def __init__(self, form, threshold, capacity):
        self.form, self.threshold = form, threshold
        self.sigs = np.zeros((capacity + 1, _ext.WIDE_SIGNATURE_BYTES), np.uint8)
        self.fps, self.texts = np.zeros(capacity, np.uint64), np.zeros(capacity, bool)
        self.by_band, self.by_block, self.keys = Postings(), Postings(), []
        self.ids, self.replaced = {}, np.zeros(capacity, bool)
        self.band_candidates = self.unconfirmed = self.queries = self.exposure = 0

    def decide(self, key, fp, signature):
        """The keys of the stored texts ``key`` matches; stored when none."""
        n = len(self.keys)
        self.sigs[n] = self.form.stored(np.frombuffer(signature, np.uint8)[None])[0]
        bands = self.form.bands(self.sigs[n:n + 1])[0]
        bands = bands.tolist() if bands.any() else []
        blocks = [(p << 16) | (fp >> 16 * p) & 0xFFFF for p in range(4)]
        by_band = np.unique(self.by_band.find(bands))
        candidates = np.union1d(by_band, self.by_block.find(blocks)).astype(np.int64)
        candidates = candidates[~self.replaced[candidates]]
        hits = []
        if len(candidates):
            banded = np.isin(candidates, by_band)
            near = popcount(self.fps[candidates] ^ np.uint64(fp)) <= DISTANCE
            kept, _ = self.form.accepted(self.sigs, np.full(len(candidates), n), candidates,
                                         self.texts[candidates] & bool(bands), banded, near,
                                         self.threshold)
            hits = candidates[kept].tolist()
            self.band_candidates += int(banded.sum())
            self.unconfirmed += int((banded & ~kept).sum())
        self.queries += 1
        self.exposure += n  # the stored texts this query met: unrelated candidates scale with it
        if not hits:
            self.fps[n], self.texts[n] = fp, bool(bands)
            self.keys.append(key)
            if key in self.ids:
                self.replaced[self.ids[key]] = True
            self.ids[key] = n
            self.by_band.add(bands, n)
            self.by_block.add(blocks, n)
        return [self.keys[j] for j in hits]


class Decider:
    """A Memory as eval_dedupe's deciders are: decide(batch) -> matched keys,
    a batch's plain texts decided before its HTML ones, as the database's are."""

    def __init__(self, memory, signed):
        self.memory, self.signed = memory, signed

    def decide(self, batch):
        return eval_dedupe._by_html(batch, lambda group, html: [
            self.memory.decide(key, *self.signed[key]) for key, _ in group])

    def close(self):
        pass


# 1. The quality harness's corpora

def band_pairs(keys, texts):
    """The pairs (i < j, as i * n + j) of rows that share a band key."""
    n = len(keys)
    rows = np.flatnonzero(texts)
    flat, owner = keys[rows].ravel(), np.repeat(rows, keys.shape[1])
    order = np.argsort(flat, kind="stable")
    flat, owner = flat[order], owner[order]
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
    ends = np.r_[starts[1:], len(flat)]
    codes = [np.zeros(0, np.int64)]
    for s, e in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist()):
        group = owner[s:e]
        i, j = np.triu_indices(len(group), 1)
        codes.append(np.minimum(group[i], group[j]) * n + np.maximum(group[i], group[j]))
    return np.unique(np.concatenate(codes))


def kind_groups(kinds):
    """{group: kinds}: all, tuning and held-out kinds."""
    return {"all": set(kinds), "tuned": {k for k in kinds if k not in corpus.HELD_OUT},
            "held out": {k for k in kinds if k in corpus.HELD_OUT}}


def all_pairs(c, forms, fps, rows, threshold):
    """Every pair of the corpus's documents under each form (see module docstring)."""
    n, kinds = len(c.docs), np.array([d.kind for d in c.docs])
    texts = (rows != 0).any(axis=1)
    near = np.array([a * n + b for a, b in simhashdb.find_all_indices(
        [int(f) for f in fps], DISTANCE + 2, DISTANCE)] or [], np.int64)
    stored = {f: f.stored(rows) for f in forms}
    banded = {f: band_pairs(f.bands(stored[f]), texts) for f in forms}
    union = functools.reduce(np.union1d, banded.values(), near)
    a, b = union // n, union % n
    kept, scores = {}, {}
    for f in forms:
        kept[f], scores[f] = f.accepted(stored[f], a, b, texts[a] & texts[b],
                                        np.isin(union, banded[f]), np.isin(union, near),
                                        threshold)
    anyone = np.flatnonzero(functools.reduce(np.logical_or, kept.values()))
    unrelated = np.zeros(len(union), bool)
    unrelated[anyone] = [c.unrelated(int(x), int(y)) for x, y in zip(a[anyone], b[anyone])]
    size = collections.Counter(kinds.tolist())
    groups = kind_groups(size)
    base = forms[0]
    print("\n## All pairs of the corpus (%d documents, %d pairs): threshold %g\n"
          % (n, n * (n - 1) // 2, threshold.least))
    print("| form | pairs accepted | false matches / doc: all | tuned | held out | "
          "unconfirmed band candidates / doc | the same per 1M stored | accepted here only "
          "(unrelated) | accepted at 16 bits only (unrelated) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in forms:
        false = collections.Counter()
        for x, y in zip(a[kept[f] & unrelated].tolist(), b[kept[f] & unrelated].tolist()):
            false[kinds[x]] += 1
            false[kinds[y]] += 1
        shares = ["%.5f" % (sum(false[k] for k in g) / sum(size[k] for k in g)) if g else "-"
                  for g in groups.values()]
        waste = 2 * int((np.isin(union, banded[f]) & ~kept[f]).sum()) / n
        only, lost = kept[f] & ~kept[base], kept[base] & ~kept[f]
        print("| %s | %d | %s | %.3f | %.1f | %d (%d) | %d (%d) |" % (
            f.name, kept[f].sum(), " | ".join(shares), waste, waste / (n - 1) * 1e6,
            only.sum(), (only & unrelated).sum(), lost.sum(), (lost & unrelated).sum()))
    print("\n| pairs decided otherwise than at 16 bits | pairs | unrelated | kinds | "
          "16-bit estimate min / median / max | within 0.01 of %g at 16 bits | the form's "
          "estimate min / max | exact Jaccard min / median / max |" % threshold.least)
    print("|---|---:|---:|---|---|---:|---|---|")
    for f in forms[1:]:
        for label, pick in (("accepted here only", kept[f] & ~kept[base]),
                            ("accepted at 16 bits only", kept[base] & ~kept[f])):
            at = np.flatnonzero(pick)
            if not len(at):
                continue
            exact = [eval_quality.jaccard(c.sets[x], c.sets[y]) for x, y in zip(a[at], b[at])]
            ours = scores[base][at]
            print("| %s, %s | %d | %d | %s | %.3f / %.3f / %.3f | %d | %.3f / %.3f | "
                  "%.3f / %.3f / %.3f |" % (
                      f.name, label, len(at), unrelated[at].sum(), ", ".join(
                          "%s %d" % kv for kv in collections.Counter(
                              kinds[a[at]].tolist()).most_common(3)),
                      ours.min(), np.median(ours), ours.max(),
                      (abs(ours - threshold.least) <= 0.01).sum(), scores[f][at].min(),
                      scores[f][at].max(), min(exact), np.median(exact), max(exact)))


def copies(c, forms, fps, rows, threshold):
    """Each edited copy against its original, per form: found or not."""
    sample = np.array(c.sample)
    kinds = np.array([c.docs[i].kind for i in c.sample])
    groups = kind_groups(set(kinds.tolist()))
    cells, found = [], {f: [] for f in forms}
    for model, rates in c.edits.items():
        for rate, variants in rates.items():
            signed = [sign(t, c.docs[i].html) for i, t in zip(c.sample, variants)]
            vfps = np.array([fp for fp, _ in signed], np.uint64)
            both = np.concatenate([rows[sample], as_rows([s for _, s in signed])])
            m = len(sample)
            a, b = np.arange(m), m + np.arange(m)
            texts = (both != 0).any(axis=1)
            near = popcount(fps[sample] ^ vfps) <= DISTANCE
            cells.append((model, rate))
            for f in forms:
                stored = f.stored(both)
                keys = f.bands(stored)
                banded = (keys[a] == keys[b]).any(axis=1) & texts[a] & texts[b]
                found[f].append(f.accepted(stored, a, b, texts[a] & texts[b], banded, near,
                                           threshold)[0])
    print("\n## Edited copies against their original (%d originals a cell)\n" % len(sample))
    for group, members in groups.items():
        if not members:
            continue
        mask = np.isin(kinds, list(members))
        print("| form (%s kinds) | %s |" % (group, " | ".join(
            "%s %g%%" % (m, 100 * r) for m, r in cells)))
        print("|---|" + "---:|" * len(cells))
        for f in forms:
            print("| %s | %s |" % (f.name, " | ".join(
                "%.3f" % hit[mask].mean() for hit in found[f])))
        print()
    for f in forms[1:]:
        for group, members in groups.items():
            if not members:
                continue
            mask = np.isin(kinds, list(members))
            moved = [(m, r, int((h & ~g & mask).sum()), int((g & ~h & mask).sum()))
                     for (m, r), h, g in zip(cells, found[f], found[forms[0]])]
            print("- %s, %s kinds (%d copies): found here only %d, at 16 bits only %d%s" % (
                f.name, group, mask.sum() * len(cells), sum(x[2] for x in moved),
                sum(x[3] for x in moved), "".join("; %s %g%% +%d -%d" % (m, 100 * r, up, down)
                                                  for m, r, up, down in moved if up or down)))


def dedupe_stream(c, forms, seed, threshold, check_db):
    """eval_dedupe's stream, decided by each form; its tables and the differences."""
    items = list(eval_dedupe.stream(c, seed))
    signed = {key: sign(text, html) for key, text, html, _ in items}
    rows = [eval_dedupe.run_decider(f.name, c, seed, Decider(
        Memory(f, threshold, len(items)), signed), items) for f in forms]
    if check_db:
        rows.append(eval_dedupe.run_db(c, seed, None, items))
        eight = [row for f, row in zip(forms, rows) if f.bits == 8]
        if eight:
            stored, _ = eval_dedupe.differences(eight[0], rows[-1])
            print("\n- the database against the 8-bit form: %d texts stored by one and "
                  "skipped by the other" % len(stored))
    print("\n## tools/eval_dedupe.py's stream (%d texts), decided by each form\n" % len(items))
    print(eval_dedupe.table(rows, "tuned") + "\n")
    if any(k in corpus.HELD_OUT for k in c.kinds):
        print(eval_dedupe.table(rows, "held out") + "\n")
    print(eval_dedupe.kind_table(rows, c.kinds) + "\n")
    for row in rows[1:]:
        stored, other = eval_dedupe.differences(rows[0], row)
        held = [k for k in stored if c.docs[eval_dedupe._index(k)].kind in corpus.HELD_OUT]
        print("- %s against 16 bits: %d texts stored by one and skipped by the other (%d "
              "of held-out kinds), %d of them flagged here only (%d originals, the rest "
              "copies); %d skipped by both with other matches" % (
                  row["method"], len(stored), len(held),
                  sum(bool(row["_matches"][k]) for k in stored),
                  sum(bool(row["_matches"][k]) for k in stored if k.startswith("doc")),
                  len(other)))


# The templates' pages

def templates(forms, seed, short_words=(0, 132)):
    """eval_templates' pages decided by each form: false drops, copies found."""
    rng = random.Random(seed)
    pages = eval_templates.corpus(rng)
    content = {key: shingles for key, _, _, shingles in pages}
    order = eval_templates.stream(pages, rng)
    signed = [sign(markup, True) for _, markup, _, _, _ in order]  # a key may come twice
    print("\n## tools/eval_templates.py's pages (html=True), decided by each form\n")
    print("| form | short_words | full: false drops | copies found | short: false drops | "
          "copies found |")
    print("|---|---:|---:|---:|---:|---:|")
    for words in short_words:
        for f in forms:
            memory = Memory(f, rule.text_rule(None, words), len(order))
            decided = {item[0]: memory.decide(item[0], *signature)
                       for item, signature in zip(order, signed)}
            row = collections.Counter()
            for key, _, group, original, _ in order:
                found = decided[key]
                if original is None:
                    row[group, "pages"] += 1
                    row[group, "false"] += bool(found) and all(eval_templates.jaccard(
                        content[key], content[m.split("#")[0]]) < 0.3 for m in found)
                elif not decided[original]:
                    row[group, "planted"] += 1
                    row[group, "found"] += any(m.split("#")[0] == original for m in found)
            print("| %s | %d | %s |" % (f.name, words, " | ".join(
                "%d of %d | %d of %d" % (row[g, "false"], row[g, "pages"], row[g, "found"],
                                         row[g, "planted"]) for g in ("full", "short"))))


# 2 and 3. The crawl's stream and the band index

def crawl(forms, pages, stretch, seed):
    """bench_crawl's stream to ``pages`` decided by each form; the candidates."""
    threshold = rule.text_rule()
    stream = Crawl(seed)
    memories = {f: Memory(f, threshold, pages) for f in forms}
    flagged = {f: np.zeros(pages, bool) for f in forms}
    planted = np.zeros(pages, bool)
    costs = {f: [] for f in forms}  # per stretch: (unconfirmed a query, mean stored)
    for start in range(0, pages, stretch):
        before = {f: (m.unconfirmed, m.queries, len(m.keys)) for f, m in memories.items()}
        for i, (key, text, _, copy) in enumerate(stream.pages(start, min(stretch, pages - start)),
                                                 start):
            planted[i] = copy
            fp, signature = sign(text)
            for f, m in memories.items():
                flagged[f][i] = bool(m.decide(key, fp, signature))
        for f, m in memories.items():
            unconfirmed, queries, stored = before[f]
            costs[f].append(((m.unconfirmed - unconfirmed) / (m.queries - queries),
                             (stored + len(m.keys)) / 2))
        print("  %d pages decided" % min(start + stretch, pages), flush=True)
    base = forms[0]
    print("\n## tools/bench_crawl.py's stream, %d pages (%d planted copies), decided by each "
          "form\n" % (pages, planted.sum()))
    print("| form | planted flagged | others flagged | decided otherwise than 16 bits: "
          "flagged here only (planted) | flagged at 16 bits only (planted) | band candidates "
          "a query | unconfirmed band candidates | unconfirmed a query at 1M stored | at 10M |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f, m in memories.items():
        only, lost = flagged[f] & ~flagged[base], flagged[base] & ~flagged[f]
        per_stored = m.unconfirmed / m.exposure
        print("| %s | %d | %d | %d (%d) | %d (%d) | %.3f | %d | %.3g | %.3g |" % (
            f.name, (flagged[f] & planted).sum(), (flagged[f] & ~planted).sum(), only.sum(),
            (only & planted).sum(), lost.sum(), (lost & planted).sum(),
            m.band_candidates / m.queries, m.unconfirmed, per_stored * 1e6, per_stored * 1e7))
    print("\nUnconfirmed band candidates a query, by stretch (mean stored in the stretch):\n")
    for f in forms:
        print("- %s: %s" % (f.name, ", ".join("%.3f (%.0fk)" % (u, s / 1e3)
                                              for u, s in costs[f])))


def s_curve(forms, grid=(0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8)):
    """The chance a pair of resemblance J shares a band: a bin agrees with
    chance J + (1 - J) c, a band's 4 bins all, or its 32-bit key by chance."""
    print("\n## The S-curve: P(a pair of resemblance J shares one of 32 bands of 4 bins)\n")
    print("| form | " + " | ".join("J = %g" % j for j in grid) + " | unrelated candidates "
          "a query (J = 0): at 1M | at 10M |")
    print("|---|" + "---:|" * (len(grid) + 2))
    for f in forms:
        def share(j):
            agree = j + (1 - j) * f.collision
            band = agree ** 4 + (1 - agree ** 4) * KEY_CHANCE
            return 1 - (1 - band) ** _ext.BANDS
        print("| %s | %s | %.3f | %.2f |" % (f.name, " | ".join(
            "%.3g" % share(j) for j in grid), share(0) * 1e6, share(0) * 1e7))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small Python corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recall", type=int, help="documents of each kind edited "
                        "(default: 150, --quick 40)")
    parser.add_argument("--bits", type=int, nargs="+", default=[16, 12, 8, 4],
                        help="bin widths (16, today's, is always first)")
    parser.add_argument("--pages", type=int, default=300_000, help="the crawl's pages")
    parser.add_argument("--stretch", type=int, default=50_000)
    parser.add_argument("--only", nargs="+", choices=("corpus", "templates", "crawl", "curve"),
                        default=("corpus", "templates", "crawl", "curve"))
    parser.add_argument("--check-db", action="store_true",
                        help="also decide eval_dedupe's stream by the database (8 bits)")
    args = parser.parse_args()
    forms = [Form(b) for b in [16] + [b for b in args.bits if b != 16]]
    threshold = rule.text_rule()
    if "curve" in args.only:
        s_curve(forms)
    if "corpus" in args.only:
        raw = eval_quality.load_corpus(args.quick, args.seed)
        c = eval_quality.Corpus(raw, args.seed,
                                recall_per_kind=args.recall or (40 if args.quick else 150))
        signed = [sign(d.text, d.html) for d in c.docs]
        fps = np.array([fp for fp, _ in signed], np.uint64)
        rows = as_rows([s for _, s in signed])
        print("\n%d documents: %s" % (len(c.docs), ", ".join(
            "%s %d%s" % (k, n, " (held out)" if k in corpus.HELD_OUT else "") for k, n in
            sorted(collections.Counter(d.kind for d in c.docs).items()))))
        all_pairs(c, forms, fps, rows, threshold)
        copies(c, forms, fps, rows, threshold)
        dedupe_stream(c, forms, args.seed, threshold, args.check_db)
    if "templates" in args.only:
        templates(forms, args.seed)
    if "crawl" in args.only:
        crawl(forms, args.pages, args.stretch, args.seed)


if __name__ == "__main__":
    main()
