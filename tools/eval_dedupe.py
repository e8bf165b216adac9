"""A crawler's dedupe over a whole corpus, measured: every document of the
corpus (tools/eval_quality.py, with the held-out kinds) goes through an
insert-if-new step in a shuffled order, with edited copies of a sample
planted at random places after their originals, by every edit model of
eval_quality (foreign words 1, 2, 5, 10%; a foreign block of 3, 5, 10%;
same-document words 1, 2, 5, 10%), reported apart.

Per method: the share of the corpus flagged as a duplicate of unrelated
documents only (word 5-shingle Jaccard < 0.3 with every match), the planted
copies found (a match related to the copy's original), per edit model and
rate, for the tuning kinds and the held-out kinds apart and per kind, the
same among the copies whose original was stored, and documents per second
through the whole loop (fingerprinting or signing, the check and the write,
batches of 1,000). Methods:

- ``simhashdb``: the database itself, ``DB.insert_text_if_new_many``. Its
  text rule: the candidates are the stored documents that share one of the
  32 bands (4 bins each, densified) of the text's 128 x 8-bit MinHash
  signature, or whose fingerprint is within the database's distance (3); a
  candidate is confirmed when the estimated resemblance is at least
  ``simhashdb.rule.THRESHOLD`` (0.45; ``--threshold`` runs it at others too);
- the fingerprint alone: recipe 3 fingerprints through
  ``DB.insert_if_new_many`` at k = 3 (the index-only rule), and PyPI
  ``simhash``'s the same way (left out by ``--ours``);
- datasketch ``MinHashLSH`` (threshold 0.5, 128 permutations, word
  5-shingles of simhashdb's words): query, insert when nothing is found; it
  never verifies a candidate.

``--html-main`` runs the database's text rule again with the HTML documents
read as ``html="main"`` (their main content, without nav, header, footer and
aside elements).

Study options, for designs the database does not have (in memory, numpy;
their documents/s say nothing of a native implementation):

- ``--reference``: the database's text rule done again in memory over the
  native signatures and band keys (``fingerprint_with_signature``,
  ``_ext.bands``, ``resemblance``): it decides every text as the database
  does, so the run also counts the texts where the two differ (0 unless
  the database or the reference is wrong);
- ``--band SPEC``: a band rule simulated by bandsim.py with signatures of any
  size (``BINSxWIDTH,BANDS,ROWS,EMPTY,THRESHOLD``; the database's design is
  ``128x8,32,4,densify,0.45``; bandsim's word hashes are not the native
  ones, so it agrees with the database in distribution, not text by text);
- ``--brute T``: every stored document a candidate, confirmed at T: the
  bound of the confirmation rule whatever the index;
- ``--alias SPEC``: a simulated band rule that also keeps the signature and
  bands of every skipped text as an alias of the document it matched, so
  that a later copy of a skipped text can match it (``--alias-floor``: only
  when the document the alias leads to resembles the text at 0.3 or more
  too, so that near-duplicates do not chain into unrelated documents).

Usage: python tools/eval_dedupe.py [--quick] [--ours] [--seed N] [--recall N]
       [--no-held-out] [--threshold T] [--html-main] [--no-datasketch] [--reference]
       [--band BINSxWIDTH,BANDS,ROWS,EMPTY,THRESHOLD] [--study-only]
       [--brute THRESHOLD] [--alias SPEC] [--alias-floor SPEC] [--json out.json]
"""

import argparse
import collections
import json
import random
import tempfile
import time

import numpy as np

import bandsim
import corpus
import eval_quality

import simhashdb
from simhashdb import _ext
from simhashdb.rule import NARROW_CODES, THRESHOLD

BATCH = 1000
MODEL_CODE = {eval_quality.FOREIGN_WORDS: "fw", eval_quality.FOREIGN_BLOCK: "fb",
              eval_quality.SAME_DOCUMENT: "sd"}
CODE_MODEL = {v: k for k, v in MODEL_CODE.items()}
DB_DESIGN = "128x8,32,4,densify,%g" % THRESHOLD  # the database's, as a --band SPEC


def stream(c, seed):
    """(key, text, html, (original, model, rate) or None) in insertion order:
    the corpus shuffled, each copy somewhere after its original."""
    rng = random.Random(seed)
    order = list(range(len(c.docs)))
    rng.shuffle(order)
    position = {i: p for p, i in enumerate(order)}
    planted = [[] for _ in order]
    models = [eval_quality.SAME_DOCUMENT] + [m for m in c.edits if m != eval_quality.SAME_DOCUMENT]
    for model in models:  # same-document first: its copies land where they did before
        for rate, texts in c.edits[model].items():
            for i, text in zip(c.sample, texts):
                planted[rng.randrange(position[i], len(order))].append((i, model, rate, text))
    for p, i in enumerate(order):
        doc = c.docs[i]
        yield "doc%d" % i, doc.text, doc.html, None
        for original, model, rate, text in planted[p]:
            yield "copy%d@%s@%g" % (original, MODEL_CODE[model], rate), text, \
                c.docs[original].html, (original, model, rate)


# Deciders: decide(batch of (key, text, html)) -> [[matched keys], ...]

def db_name(threshold=None):
    """The row name of the database's text rule at ``threshold`` (default: its own)."""
    return "simhashdb: insert_text_if_new_many (bands or fingerprint within 3, " \
        "resemblance >= %g)" % (THRESHOLD if threshold is None else threshold)


class TextDB:
    """The database's text rule: DB.insert_text_if_new_many (at ``threshold``,
    or the database's own), HTML read whole or (``main``) its main content."""

    def __init__(self, path, threshold=None, main=False):
        self.db = simhashdb.DB(path, recipe=simhashdb.RECIPE)
        self.threshold, self.main = threshold, main

    def decide(self, batch):
        return _by_html(batch, lambda group, html: [
            [m.key for m in found] for found in self.db.insert_text_if_new_many(
                group, html="main" if html and self.main else html, threshold=self.threshold)])

    def close(self):
        self.db.close()


class FingerprintDB:
    """64-bit fingerprints through DB.insert_if_new_many at k = 3."""

    def __init__(self, path, method):
        self.db, self.method = simhashdb.DB(path), method

    def decide(self, batch):
        return _by_html(batch, lambda group, html: [[m.key for m in found] for found in
                                                    self.db.insert_if_new_many(
                                                        [(k, self.method(t, html))
                                                         for k, t in group])])

    def close(self):
        self.db.close()


def _by_html(batch, fn):
    """fn(group of (key, text), html) for the plain and the HTML items of a
    batch, the results back in the batch's order."""
    results = {}
    for is_html in (False, True):
        group = [(key, text) for key, text, html in batch if html == is_html]
        if group:
            results.update(zip((key for key, _ in group), fn(group, is_html)))
    return [results[key] for key, _, _ in batch]


class Datasketch:
    """datasketch MinHashLSH (threshold 0.5, 128 permutations) over word
    5-shingles: query, insert when nothing is found."""

    def __init__(self, threshold=0.5, num_perm=128):
        from datasketch import MinHash, MinHashLSH
        self.MinHash, self.num_perm = MinHash, num_perm
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)

    def decide(self, batch):
        out = []
        for key, text, html in batch:
            words = bandsim.words_of(text, html)
            n = bandsim.SHINGLE_WORDS
            shingles = [" ".join(words[i:i + n]).encode()
                        for i in range(max(1, len(words) - n + 1))]
            m = self.MinHash(num_perm=self.num_perm)
            m.update_batch(shingles)
            found = self.lsh.query(m)
            if not found:
                self.lsh.insert(key, m)
            out.append(found)
        return out

    def close(self):
        pass


class BandRule:
    """The band rule of bandsim, in memory: candidates share a band or are
    within k bits; confirmed by estimated resemblance >= the threshold. With
    ``native``, the signatures, band keys and fingerprints are the native
    ones (``cfg`` must then be the database's design): the database's text
    rule done again."""

    def __init__(self, cfg, capacity, brute=False, alias=False, floor=None, native=False):
        self.cfg, self.brute, self.alias, self.floor = cfg, brute, alias, floor
        self.native = native
        if native:
            assert (cfg.bins, cfg.bands, cfg.rows, cfg.empty) == (128, 32, 4, "densify")
        self.home = []  # per entry: the entry of the stored document (itself, or an alias's)
        self.index = collections.defaultdict(list)
        self.fps = np.zeros(capacity, dtype=np.uint64)
        self.sigs = np.zeros((capacity, cfg.bins), dtype=np.uint64)
        self.keys, self.candidates, self.queries = [], 0, 0

    def decide(self, batch):
        cfg, out = self.cfg, []
        for key, text, html in batch:
            if self.native:
                fp, raw = simhashdb.fingerprint_with_signature(
                    text, html=html, **simhashdb.RECIPES[simhashdb.RECIPE])
                fp = np.uint64(fp)
                sig = np.frombuffer(raw, dtype=np.uint8 if len(raw) == 128 else ">u2"
                                    ).astype(np.uint64)
                band_keys = list(_ext.bands(raw))
            else:
                least = bandsim.one_permutation(bandsim.shingle_hashes(text, html), cfg.bins)
                sig, bands, valid = cfg.signatures(least[None, :])
                sig, bands, valid = sig[0], bands[0], valid[0]
                fp = np.uint64(simhashdb.fingerprint(text, html=html))
                band_keys = [int(k) for k, v in zip(bands, valid) if v]
            n = len(self.keys)
            if self.brute:  # every stored document is a candidate: the bound of any index
                found = range(n)
            else:
                found = set(np.flatnonzero(bandsim.popcount(self.fps[:n] ^ fp) <= cfg.k).tolist())
                for k in band_keys:
                    found.update(self.index.get(k, ()))
            self.candidates += len(found)
            self.queries += 1
            found = sorted(found)
            confirmed = []
            if found:
                est = bandsim.estimate(self.sigs[found], sig[None, :])
                if self.native and cfg.width == 8:  # as the database corrects 8-bit bins
                    est = np.maximum(0.0, (est * NARROW_CODES - 1) / (NARROW_CODES - 1))
                hits = [j for j, e in zip(found, est) if e >= cfg.threshold]
                if self.floor is not None:  # an alias counts when its document is near too
                    hits = [j for j in hits if self.home[j] == j or bandsim.estimate(
                        self.sigs[self.home[j]], sig) >= self.floor]
                confirmed = [self.keys[j] for j in hits]
            if not confirmed or self.alias:
                # stored; or, with alias, a skipped text's signature and bands kept
                # too, leading to the document it matched (not stored as a document)
                self.fps[n], self.sigs[n] = fp, sig
                self.keys.append(confirmed[0] if confirmed else key)
                self.home.append(self.home[hits[0]] if confirmed else n)
                for k in band_keys:
                    self.index[k].append(n)
            out.append(sorted(set(confirmed)))
        return out

    def close(self):
        pass


def parse_band(spec):
    size, bands, rows, empty, threshold = spec.split(",")
    bins, width = size.split("x")
    return bandsim.Config(int(bins), int(width), int(bands), int(rows), empty, float(threshold))


def run_decider(name, c, seed, decider, items=None):
    """Every item of the stream through ``decider``; the row of figures."""
    items = items or list(stream(c, seed))
    copies = {}
    start = time.perf_counter()
    for b in range(0, len(items), BATCH):
        batch = items[b:b + BATCH]
        matches = decider.decide([(key, text, html) for key, text, html, _ in batch])
        for (key, _, _, copy), found in zip(batch, matches):
            copies[key] = (copy, found)
    seconds = time.perf_counter() - start
    decider.close()
    kinds = [d.kind for d in c.docs]
    flagged = collections.Counter()
    found = collections.defaultdict(collections.Counter)    # (model, rate) -> kind -> found
    planted = collections.defaultdict(collections.Counter)
    # copies whose original was stored (not itself taken for a near-duplicate
    # of an earlier document): (model, rate) -> [planted, found]
    kept = collections.defaultdict(lambda: [0, 0])
    for key, (copy, matches) in copies.items():
        if copy is None:
            i = int(key[3:])
            if matches and all(c.unrelated(i, _index(m)) for m in matches):
                flagged[kinds[i]] += 1
            continue
        original, model, rate = copy
        planted[model, rate][kinds[original]] += 1
        hit = any(_index(m) == original or not c.unrelated(original, _index(m)) for m in matches)
        if hit:
            found[model, rate][kinds[original]] += 1
        if not copies["doc%d" % original][1]:
            kept[model, rate][0] += 1
            kept[model, rate][1] += hit
    size = collections.Counter(kinds)
    held = [k for k in size if k in corpus.HELD_OUT]
    tuned = [k for k in size if k not in corpus.HELD_OUT]

    def share(counter, total, group):
        n = sum(total[k] for k in group)
        return sum(counter[k] for k in group) / n if n else None

    row = {"method": name, "docs_per_s": len(items) / seconds, "seconds": seconds,
           "flagged": sum(flagged.values()) / len(c.docs),
           "flagged_tuned": share(flagged, size, tuned),
           "flagged_held_out": share(flagged, size, held),
           "flagged_by_kind": dict(flagged), "found_by_model": {}}
    for (model, rate), counts in planted.items():
        row["found_by_model"].setdefault(model, {})[rate] = {
            "all": share(found[model, rate], counts, list(counts)),
            "tuned": share(found[model, rate], counts, [k for k in counts if k in tuned]),
            "held out": share(found[model, rate], counts, [k for k in counts if k in held]),
            **{k: found[model, rate][k] / counts[k] for k in counts}}
    row["found_original_stored"] = {
        model: {rate: kept[model, rate][1] / max(1, kept[model, rate][0])
                for (m, rate) in kept if m == model} for model in {m for m, _ in kept}}
    row["original_stored"] = {
        model: {rate: kept[model, rate][0] / sum(planted[model, rate].values())
                for (m, rate) in kept if m == model} for model in {m for m, _ in kept}}
    if isinstance(decider, BandRule):
        row["candidates_per_query"] = decider.candidates / max(1, decider.queries)
    # each text's matches, to compare two methods text by text (not in --json)
    row["_matches"] = {key: frozenset(found) for key, (_, found) in copies.items()}
    return row


def run_db(c, seed=0, threshold=None, items=None, main=False):
    """The row of the database's text rule (at ``threshold``, or its own; with
    ``main``, HTML read as html="main")."""
    with tempfile.TemporaryDirectory() as tmp:
        return run_decider(db_name(threshold) + (", html=\"main\"" if main else ""), c, seed,
                           TextDB(tmp + "/db", threshold, main), items)


def differences(a, b):
    """The texts that rows ``a`` and ``b`` decided differently: (stored by one
    and skipped by the other, skipped by both with other matches), keys sorted."""
    keys = sorted(a["_matches"])
    stored = [k for k in keys if bool(a["_matches"][k]) != bool(b["_matches"][k])]
    other = [k for k in keys if a["_matches"][k] and b["_matches"][k]
             and a["_matches"][k] != b["_matches"][k]]
    return stored, other


def _index(key):
    """The corpus index of a stored key: a document's, or a copy's original's
    (a copy is taken as related to what its original is related to)."""
    return int(key[3:] if key.startswith("doc") else key[4:].split("@")[0])


def table(rows, group):
    cells = [(m, r) for m, rates in eval_quality.EDIT_MODELS.items() for r in rates]
    lines = ["| method (%s kinds) | unrelated flagged | %s | docs/s |" % (group, " | ".join(
        "%s %g%%" % (m, 100 * r) for m, r in cells)), "|---|---:|" + "---:|" * (len(cells) + 1)]
    flag = "flagged_tuned" if group == "tuned" else "flagged_held_out"
    for row in rows:
        lines.append("| %s | %.3f%% | %s | %.0f |" % (
            row["method"], 100 * (row[flag] or 0), " | ".join(
                "%.3f" % row["found_by_model"][m][r][group] for m, r in cells),
            row["docs_per_s"]))
    return "\n".join(lines)


def stored_table(rows):
    """Copies found among those whose original was stored (all kinds): what
    is left when the original itself was not taken for a copy of an earlier
    document (then only that document, less like the copy, can be found)."""
    cells = [(m, r) for m, rates in eval_quality.EDIT_MODELS.items() for r in rates]
    lines = ["| method (copies of stored originals, all kinds) | originals stored | %s |" % (
        " | ".join("%s %g%%" % (m, 100 * r) for m, r in cells)),
        "|---|---:|" + "---:|" * len(cells)]
    for row in rows:
        stored = row["original_stored"][eval_quality.SAME_DOCUMENT][0.01]
        lines.append("| %s | %.3f | %s |" % (row["method"], stored, " | ".join(
            "%.3f" % row["found_original_stored"][m][r] for m, r in cells)))
    return "\n".join(lines)


def kind_table(rows, kinds):
    models = [(eval_quality.FOREIGN_WORDS, 0.01), (eval_quality.FOREIGN_WORDS, 0.05),
              (eval_quality.FOREIGN_WORDS, 0.10), (eval_quality.FOREIGN_BLOCK, 0.05),
              (eval_quality.FOREIGN_BLOCK, 0.10), (eval_quality.SAME_DOCUMENT, 0.05)]
    lines = ["| method | figure | %s |" % " | ".join(
        k + (" (held out)" if k in corpus.HELD_OUT else "") for k in kinds),
        "|---|---|" + "---:|" * len(kinds)]
    for row in rows:
        lines.append("| %s | unrelated flagged (docs) | %s |" % (row["method"], " | ".join(
            str(row["flagged_by_kind"].get(k, 0)) for k in kinds)))
        for m, r in models:
            lines.append("| %s | %s %g%% | %s |" % (row["method"], m, 100 * r, " | ".join(
                "%.3f" % row["found_by_model"][m][r].get(k, float("nan")) for k in kinds)))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small Python corpus")
    parser.add_argument("--ours", action="store_true", help="leave PyPI simhash out")
    parser.add_argument("--no-datasketch", action="store_true")
    parser.add_argument("--threshold", action="append", type=float,
                        help="also run the database's text rule at this threshold "
                             "(repeatable; its own, %g, always runs)" % THRESHOLD)
    parser.add_argument("--html-main", action="store_true",
                        help='also run the database\'s text rule with HTML read as html="main" '
                             "(its main content: no nav, header, footer, aside)")
    parser.add_argument("--reference", action="store_true",
                        help="the database's text rule done again in memory over the native "
                             "signatures; count the texts it decides otherwise")
    parser.add_argument("--study-only", action="store_true",
                        help="only the study options (--reference, --band, --alias, --brute)")
    parser.add_argument("--band", action="append", metavar="SPEC",
                        help="a band rule simulated by bandsim.py, BINSxWIDTH,BANDS,ROWS,EMPTY,"
                             "THRESHOLD (repeatable; the database's design is %s)" % DB_DESIGN)
    parser.add_argument("--alias", action="append", metavar="SPEC",
                        help="a band rule design that also keeps the signature and bands of "
                             "each skipped text, as an alias of the document it matched")
    parser.add_argument("--alias-floor", action="append", metavar="SPEC",
                        help="as --alias, an alias confirmed only when the document it leads "
                             "to resembles the text at 0.3 or more too")
    parser.add_argument("--brute", action="append", metavar="THRESHOLD", type=float,
                        help="also confirm against EVERY stored document at this threshold "
                             "(128x8 signatures): what no candidate index can beat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recall", type=int,
                        help="documents of each kind edited (default: 150, --quick 40)")
    parser.add_argument("--no-held-out", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    raw = eval_quality.load_corpus(args.quick, args.seed, not args.no_held_out)
    c = eval_quality.Corpus(raw, args.seed,
                            recall_per_kind=args.recall or (40 if args.quick else 150))
    items = list(stream(c, args.seed))
    rows = []
    if not args.study_only:
        rows.append(run_db(c, args.seed, None, items))
        for threshold in args.threshold or ():
            rows.append(run_db(c, args.seed, threshold, items))
        if args.html_main:
            rows.append(run_db(c, args.seed, None, items, main=True))
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run_decider("recipe 3 fingerprint alone, insert_if_new k = 3", c,
                                    args.seed, FingerprintDB(tmp + "/fp", eval_quality.ours()),
                                    items))
            if not args.ours:
                import peers
                e0ng = peers.load("simhash_1e0ng")
                if e0ng:
                    rows.append(run_decider(
                        "PyPI simhash (1e0ng), insert_if_new k = 3", c, args.seed,
                        FingerprintDB(tmp + "/e0ng", eval_quality.peer(
                            lambda t: e0ng.Simhash(t).value)), items))
        if not args.no_datasketch:
            rows.append(run_decider("datasketch MinHashLSH (0.5, 128 perm)", c, args.seed,
                                    Datasketch(), items))
    if args.reference:
        rows.append(run_decider("the database's text rule again, in memory (reference)", c,
                                args.seed, BandRule(parse_band(DB_DESIGN), len(items),
                                                    native=True), items))
    for spec in args.band or ():
        cfg = parse_band(spec)
        rows.append(run_decider("band rule %s (simulated)" % cfg.name, c, args.seed,
                                BandRule(cfg, len(items)), items))
    for spec in args.alias or ():
        cfg = parse_band(spec)
        rows.append(run_decider("band rule %s, skipped texts kept as aliases (simulated)"
                                % cfg.name, c, args.seed, BandRule(cfg, len(items), alias=True),
                                items))
    for spec in args.alias_floor or ():
        cfg = parse_band(spec)
        rows.append(run_decider(
            "band rule %s, aliases, the alias's document at >= %g too (simulated)"
            % (cfg.name, eval_quality.UNRELATED), c, args.seed,
            BandRule(cfg, len(items), alias=True, floor=eval_quality.UNRELATED), items))
    for threshold in args.brute or ():
        cfg = bandsim.Config(threshold=threshold)
        rows.append(run_decider("every stored document a candidate, resemblance >= %g "
                                "(simulated)" % threshold, c, args.seed,
                                BandRule(cfg, len(items), brute=True), items))
    kinds = sorted({d.kind for d in c.docs}, key=lambda k: (k in corpus.HELD_OUT, k))
    print("%d documents, %d planted copies per edit model and rate, %d texts in the "
          "stream\n" % (len(c.docs), len(c.sample), len(items)))
    print(table(rows, "tuned") + "\n")
    if any(k in corpus.HELD_OUT for k in kinds):
        print(table(rows, "held out") + "\n")
    print(stored_table(rows) + "\n")
    print(kind_table(rows, kinds) + "\n")
    for row in rows:
        print("%s: unrelated flagged %d documents (%.4f%% of the corpus), %.0f s" % (
            row["method"], sum(row["flagged_by_kind"].values()), 100 * row["flagged"],
            row["seconds"]) + ("; %.2f candidates per query before confirmation" % (
                row["candidates_per_query"]) if "candidates_per_query" in row else ""))
    db = rows[0] if not args.study_only else None
    for row in rows:
        if db is not None and row["method"].endswith("(reference)"):
            stored, other = differences(db, row)
            print("the database and its reference: %d texts stored by one and skipped by the "
                  "other%s; %d skipped by both with other matches%s" % (
                      len(stored), " (%s)" % ", ".join(stored[:10]) if stored else "",
                      len(other), " (%s)" % ", ".join(other[:10]) if other else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in row.items() if not k.startswith("_")} for row in rows],
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
