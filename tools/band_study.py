"""The band index design study (issue 21, item 1), by simulation (bandsim.py):
for each design, on the same corpus, edits and pairs,

- the S-curve: the share of edited copies (and of unrelated same-kind
  pairs) that share a band with their original, against the exact word
  5-shingle Jaccard similarity of the pair, beside 1 - (1 - J^r)^b;
- recall per edit model and rate: a copy is found when it shares a band
  with its original or their fingerprints are within k = 3 bits, and the
  estimated resemblance is at least the threshold (tuning kinds and,
  apart, the held-out ones);
- cost and false matches with the whole corpus stored: the unrelated
  candidates (exact Jaccard < 0.3) a document meets before confirmation,
  per kind, and the share of documents with an unrelated candidate that the
  threshold confirms;
- for the threshold: the estimated resemblance edited copies keep against
  the highest one unrelated candidates reach, per kind.

Designs are chosen on the tuning kinds; the held-out kinds only confirm.

Usage: python tools/band_study.py [--quick] [--seed N] [--recall N]
       [--no-held-out] [--json out.json]
"""

import argparse
import collections
import json
import random
import sys
import time

import numpy as np

import bandsim
import corpus
import eval_quality
from bandsim import Config

UNRELATED = eval_quality.UNRELATED
THRESHOLDS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55)
CURVE_RATES = (0.15, 0.2, 0.3, 0.45)  # foreign words, for the low part of the S-curve
J_BINS = np.arange(0.0, 1.0001, 0.05)
CONFIGS = [
    Config(128, 16, 32, 4, "skip"), Config(128, 16, 32, 4, "zero"),
    Config(128, 16, 32, 4, "densify"), Config(128, 16, 42, 3, "densify"),
    Config(128, 16, 25, 5, "densify"), Config(128, 16, 21, 6, "densify"),
    Config(128, 16, 16, 8, "densify"), Config(128, 16, 64, 2, "densify"),
    Config(128, 32, 32, 4, "densify"),
    Config(256, 16, 64, 4, "skip"), Config(256, 16, 64, 4, "densify"),
    Config(256, 16, 85, 3, "densify"), Config(256, 16, 51, 5, "densify"),
    Config(256, 16, 42, 6, "densify"), Config(256, 16, 32, 8, "densify"),
]
TODAY = "the rule before the band index: fingerprint within k+1, resemblance >= 0.4"
INDEX_ONLY = "fingerprint within k = 3 alone"


class Study:
    def __init__(self, raw, seed=0, recall_per_kind=150):
        start = time.perf_counter()
        self.c = c = eval_quality.Corpus(raw, seed, recall_per_kind=recall_per_kind,
                                         pairs_per_kind=300)
        self.kind = np.array([d.kind for d in c.docs])
        self.n = len(c.docs)
        t = self.t = bandsim.Texts()
        for d in c.docs:
            t.add(d.text, d.html, keep=True)
        # copies: (text index, original, model, rate, exact Jaccard)
        rng = random.Random("curve/%d" % seed)
        edits = dict(c.edits)
        edits["foreign words (curve)"] = {
            rate: [eval_quality.edit_foreign_words(c.docs, i, rate, rng) for i in c.sample]
            for rate in CURVE_RATES}
        rows = []
        for model, variants in edits.items():
            for rate, texts in variants.items():
                for i, text in zip(c.sample, texts):
                    j, hashes = t.add(text, c.docs[i].html)
                    rows.append((j, i, model, rate,
                                 bandsim.exact_jaccard(t.shingles[i], hashes)))
        t.freeze()
        self.copy_text = np.array([r[0] for r in rows])
        self.copy_orig = np.array([r[1] for r in rows])
        self.copy_model = np.array([r[2] for r in rows])
        self.copy_rate = np.array([r[3] for r in rows])
        self.copy_j = np.array([r[4] for r in rows])
        self.held = np.array([k in corpus.HELD_OUT for k in self.kind])
        self._jaccard = {}
        self.seconds = time.perf_counter() - start

    def jaccard(self, a, b):
        pair = (a, b) if a < b else (b, a)
        if pair not in self._jaccard:
            self._jaccard[pair] = bandsim.exact_jaccard(self.t.shingles[pair[0]],
                                                        self.t.shingles[pair[1]])
        return self._jaccard[pair]

    def fp_pairs(self, k):
        import simhashdb
        fps = [int(x) for x in self.t.fp[:self.n]]
        return {(a, b) if a < b else (b, a) for a, b in simhashdb.find_all_indices(fps, k + 2, k)
                if a != b}

    def evaluate(self, cfg):
        """Figures of one design, for every threshold of THRESHOLDS."""
        t = self.t
        sig, key, valid = cfg.signatures(t.least[cfg.bins])
        # copies against their originals
        ct, co = self.copy_text, self.copy_orig
        band = ((key[ct] == key[co]) & valid[ct] & valid[co]).any(axis=1)
        near = bandsim.popcount(t.fp[ct] ^ t.fp[co]) <= cfg.k
        est = bandsim.estimate(sig[ct], sig[co])
        out = {"config": cfg.name, "bands_per_doc": float(valid[:self.n].sum(axis=1).mean()),
               "no_band_share": float((valid[:self.n].sum(axis=1) == 0).mean())}
        out["curve"] = self._curve(band, cfg)
        out["recall"] = self._recall(band | near, est)
        out["band_only_recall"] = self._recall(band, np.ones_like(est))
        out.update(self._unrelated(cfg, sig, key, valid))
        return out

    def _curve(self, band, cfg):
        """Empirical share sharing a band, per Jaccard bin, beside the theory:
        copies of the tuning kinds and unrelated same-kind pairs."""
        tuned = ~self.held[self.copy_orig]
        js, hits = list(self.copy_j[tuned]), list(band[tuned])
        return {"bins": J_BINS.tolist(), "copies": _binned(js, hits),
                "theory": [cfg.s_curve(x) for x in (J_BINS[:-1] + 0.025)]}

    def _recall(self, candidate, est):
        """recall[model][rate][group or kind][threshold]"""
        out = collections.defaultdict(dict)
        kinds = self.kind[self.copy_orig]
        held = self.held[self.copy_orig]
        for model in sorted(set(self.copy_model)):
            for rate in sorted(set(self.copy_rate[self.copy_model == model])):
                sel = (self.copy_model == model) & (self.copy_rate == rate)
                cell = {}
                for label, mask in [("tuned", ~held), ("held out", held)] + [
                        (k, kinds == k) for k in sorted(set(kinds))]:
                    m = sel & mask
                    if m.any():
                        cell[label] = {th: float((candidate[m] & (est[m] >= th)).mean())
                                       for th in THRESHOLDS}
                out[model][float(rate)] = cell
        return dict(out)

    def _unrelated(self, cfg, sig, key, valid):
        """With the whole corpus stored: unrelated candidates per document, per
        kind, and per threshold the documents with an unrelated match."""
        n = self.n
        k, v = key[:n], valid[:n]
        pairs = set()
        for b in range(cfg.bands):
            docs = np.flatnonzero(v[:, b])
            order = docs[np.argsort(k[docs, b], kind="stable")]
            keys = k[order, b]
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            ends = np.r_[starts[1:], len(order)]
            for s, e in zip(starts, ends):
                if e - s > 1:
                    members = order[s:e].tolist()
                    pairs.update((a, b2) for x, a in enumerate(members) for b2 in members[x + 1:])
        band_pairs = len(pairs)
        pairs |= self._fp_pairs_cache(cfg.k)
        pairs = np.array(sorted(pairs), dtype=np.intp).reshape(-1, 2)
        est = bandsim.estimate(sig[pairs[:, 0]], sig[pairs[:, 1]]) if len(pairs) else np.zeros(0)
        # exact Jaccard where the estimate leaves doubt; below 0.2 taken as unrelated
        unrelated = np.ones(len(pairs), bool)
        for x in np.flatnonzero(est >= 0.2):
            unrelated[x] = self.jaccard(*pairs[x]) < UNRELATED
        up, ue = pairs[unrelated], est[unrelated]
        per_doc = np.bincount(up.ravel(), minlength=n)
        kinds = sorted(set(self.kind))
        out = {"candidate_pairs": len(pairs), "band_pairs": band_pairs,
               "unrelated_candidates_per_doc": {
                   "tuned": float(per_doc[~self.held].mean()),
                   "held out": float(per_doc[self.held].mean()) if self.held.any() else None,
                   **{kd: float(per_doc[self.kind == kd].mean()) for kd in kinds}},
               "unrelated_est_max": {kd: float(max(ue[(self.kind[up[:, 0]] == kd)
                                                     | (self.kind[up[:, 1]] == kd)], default=0))
                                     for kd in kinds},
               "unrelated_est_p999": float(np.quantile(ue, 0.999)) if len(ue) else 0.0,
               "flagged": {}}
        for th in THRESHOLDS:
            bad = up[ue >= th]
            docs = np.zeros(n, bool)
            docs[bad.ravel()] = True
            out["flagged"][th] = {"tuned": float(docs[~self.held].mean()),
                                  "held out": float(docs[self.held].mean())
                                  if self.held.any() else None,
                                  **{kd: int(docs[self.kind == kd].sum()) for kd in kinds}}
        return out

    def _fp_pairs_cache(self, k):
        if not hasattr(self, "_fp"):
            self._fp = {}
        if k not in self._fp:
            self._fp[k] = self.fp_pairs(k)
        return self._fp[k]

    def today(self):
        """The rule before the band index (simhashdb 0.2's) and the fingerprint
        alone, on the same copies and pairs."""
        t = self.t
        sig = bandsim.values(t.least[128], 16)
        ct, co = self.copy_text, self.copy_orig
        dist = bandsim.popcount(t.fp[ct] ^ t.fp[co])
        est = bandsim.estimate(sig[ct], sig[co])
        return {TODAY: self._recall(dist <= 4, est),
                INDEX_ONLY: self._recall(dist <= 3, np.ones_like(est))}

    def resemblance_left(self):
        """Per edit model and rate (tuning kinds): quantiles of the estimated
        resemblance (128x16) and of the exact Jaccard a copy keeps."""
        t = self.t
        sig = bandsim.values(t.least[128], 16)
        est = bandsim.estimate(sig[self.copy_text], sig[self.copy_orig])
        tuned = ~self.held[self.copy_orig]
        out = {}
        for model in sorted(set(self.copy_model)):
            for rate in sorted(set(self.copy_rate[self.copy_model == model])):
                m = (self.copy_model == model) & (self.copy_rate == rate) & tuned
                out["%s %g%%" % (model, 100 * rate)] = {
                    "J mean": float(self.copy_j[m].mean()),
                    "J p1": float(np.quantile(self.copy_j[m], 0.01)),
                    "est p1": float(np.quantile(est[m], 0.01)),
                    "est p5": float(np.quantile(est[m], 0.05)),
                    "est mean": float(est[m].mean())}
        return out


def _binned(js, hits):
    idx = np.clip(np.digitize(js, J_BINS) - 1, 0, len(J_BINS) - 2)
    out = []
    for b in range(len(J_BINS) - 1):
        sel = [h for i, h in zip(idx, hits) if i == b]
        out.append((len(sel), float(np.mean(sel)) if sel else None))
    return out


# Reports

def recall_table(results, group, th, models=None):
    models = models or list(eval_quality.EDIT_MODELS)
    cells = [(m, r) for m in models for r in eval_quality.EDIT_MODELS[m]]
    lines = ["| design (%s kinds, threshold %g) | %s |" % (group, th, " | ".join(
        "%s %g%%" % (m, 100 * r) for m, r in cells)), "|---|" + "---:|" * len(cells)]
    for name, rec in results:
        lines.append("| %s | %s |" % (name, " | ".join(
            "%.3f" % rec[m][r][group][th] if group in rec[m][r] else "-" for m, r in cells)))
    return "\n".join(lines)


def cost_table(rows, th, kinds):
    lines = ["| design | bands a doc | docs with no band | unrelated candidates / doc (tuned, held out) "
             "| %s | docs flagged at %g (tuned, held out) | highest unrelated estimate |" % (
                 " | ".join(kinds), th),
             "|---|---:|---:|---:|" + "---:|" * len(kinds) + "---:|---:|"]
    for r in rows:
        u = r["unrelated_candidates_per_doc"]
        f = r["flagged"][th]
        lines.append("| %s | %.1f | %.3f | %.3f, %s | %s | %.5f, %s | %.3f |" % (
            r["config"], r["bands_per_doc"], r["no_band_share"], u["tuned"],
            "-" if u["held out"] is None else "%.3f" % u["held out"],
            " | ".join("%.2f" % u[k] for k in kinds), f["tuned"],
            "-" if f["held out"] is None else "%.5f" % f["held out"],
            max(r["unrelated_est_max"].values(), default=0)))
    return "\n".join(lines)


def curve_table(rows):
    bins = J_BINS
    lines = ["| Jaccard | copies | " + " | ".join(r["config"].rsplit(" t", 1)[0] + " (theory)"
                                                  for r in rows) + " |",
             "|---|---:|" + "---:|" * len(rows)]
    for b in range(len(bins) - 1):
        n = rows[0]["curve"]["copies"][b][0]
        if not n:
            continue
        lines.append("| %.2f-%.2f | %d | %s |" % (bins[b], bins[b + 1], n, " | ".join(
            "%.3f (%.3f)" % (r["curve"]["copies"][b][1], r["curve"]["theory"][b]) for r in rows)))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small Python corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recall", type=int, default=150, help="documents edited per kind")
    parser.add_argument("--no-held-out", action="store_true")
    parser.add_argument("--threshold", type=float, default=0.4, help="for the tables")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    raw = eval_quality.load_corpus(args.quick, args.seed, not args.no_held_out)
    study = Study(raw, args.seed, args.recall)
    print("%d documents, %d edited texts; signatures in %.0f s\n" % (
        study.n, len(study.copy_text), study.seconds))
    rows = []
    for cfg in CONFIGS:
        start = time.perf_counter()
        rows.append(study.evaluate(cfg))
        print("%s: %.0f s" % (cfg.name, time.perf_counter() - start), file=sys.stderr)
    today = study.today()
    th = args.threshold
    kinds = sorted(set(study.kind), key=lambda k: (k in corpus.HELD_OUT, k))
    results = [(TODAY, today[TODAY]), (INDEX_ONLY, today[INDEX_ONLY])] + [
        (r["config"].rsplit(" t", 1)[0], r["recall"]) for r in rows]
    print("## Recall (band or fingerprint within 3, then resemblance)\n")
    for group in ("tuned", "held out"):
        if group == "held out" and not study.held.any():
            continue
        print(recall_table(results, group, th) + "\n")
    print("## Cost and false matches, the whole corpus stored\n")
    print(cost_table(rows, th, kinds) + "\n")
    print("## S-curve (copies of the tuning kinds sharing a band with their original)\n")
    print(curve_table(rows) + "\n")
    print("## Resemblance left by the edits (tuning kinds, 128x16)\n")
    print("| edit | J mean | J p1 | estimate mean | estimate p5 | estimate p1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, q in study.resemblance_left().items():
        print("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
            name, q["J mean"], q["J p1"], q["est mean"], q["est p5"], q["est p1"]))
    print("\n## Thresholds (each design)\n")
    print("| design | " + " | ".join("t=%g: recall fw 5%% / fw 10%% / flagged" % x
                                      for x in THRESHOLDS) + " |")
    print("|---|" + "---:|" * len(THRESHOLDS))
    for r in rows:
        print("| %s | %s |" % (r["config"].rsplit(" t", 1)[0], " | ".join(
            "%.3f / %.3f / %.5f" % (r["recall"]["foreign words"][0.05]["tuned"][x],
                                    r["recall"]["foreign words"][0.1]["tuned"][x],
                                    r["flagged"][x]["tuned"]) for x in THRESHOLDS)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "today": today, "kinds": kinds,
                       "resemblance_left": study.resemblance_left()}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
