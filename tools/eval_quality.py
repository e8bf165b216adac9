"""Near-duplicate detection quality of fingerprint recipes, measured.

Corpus: the Python standard library's files (>= 500 characters) and CJK
documents (>= 1,000 characters) composed from other standard-library files by
writing each word as a generated Chinese, Japanese or Korean word.
Positives: each sampled document against variants with 1, 2, 5, 10 and 20% of
its words edited (deletions, insertions, substitutions, swaps; seeded).
Negatives: pairs of distinct documents whose word 4-shingle Jaccard
similarity is below 0.3, and a quarter as many again among the CJK documents
alone.

For each method and k in 0..6: recall per edit rate (all documents, and CJK
apart), false-positive rate (all pairs, and CJK pairs apart), precision at a
1:100 mix of positives to negatives; speed in MB/s on one core.

Usage: python tools/eval_quality.py [--quick] [--seed N] [--docs N] [--cjk N]
       [--negatives N] [--only METHOD] [--json out.json]
"""

import argparse
import collections
import itertools
import json
import pathlib
import random
import re
import sysconfig
import time

import simhashdb

RATES = (0.01, 0.02, 0.05, 0.10, 0.20)
RECIPE_1 = "simhashdb-1/nfkc-casefold/chars/window-3/cjk-window-2/counts/fast-hash"
KS = range(7)


class Document:
    """A text with its words (``units``), the separators between them, and the
    joiner an inserted word gets; edits act on the words."""

    def __init__(self, units, seps, joiner, cjk):
        self.units, self.seps, self.joiner, self.cjk = units, seps, joiner, cjk
        self.text = join(units, seps)


def join(units, seps):
    return "".join(u + (seps[j] if j < len(seps) else "") for j, u in enumerate(units))


def stdlib_texts(rng):
    """The standard library's .py files, in a seeded random order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    for path in rng.sample(paths, len(paths)):
        yield path.read_text("utf-8", "replace")


def latin_documents(texts, count):
    """``count`` of ``texts`` of 500 characters or more, split into words."""
    docs = []
    for text in texts:
        if len(text) >= 500:
            parts = re.split(r"(\s+)", text)
            docs.append(Document(parts[0::2], parts[1::2], " ", cjk=False))
            if len(docs) == count:
                break
    return docs


WORD = re.compile(r"[^\W_]+|[.:;,!?]")
MARKS = {".": "。", ":": "。", "!": "！", "?": "？", ",": "，", ";": "，"}


def cjk_documents(texts, count, rng):
    """``count`` CJK documents of 1,000 characters or more, composed (no copied
    text) by writing each word of a standard-library file as a generated
    Chinese, Japanese or Korean word: the documents keep real text's word
    statistics (Zipf frequencies, repetition, topics that differ from file to
    file) in a CJK script. The more frequent a word, the shorter its CJK word,
    as in real languages; Chinese and Japanese are written without spaces
    (Japanese: frequent words in hiragana, some in katakana), Korean with."""
    sources = []
    for text in texts:
        words = WORD.findall(text.lower())
        if len(words) >= 600:
            sources.append(words)
            if len(sources) == count + count // 4:  # some come out under 1,000 characters
                break
    ranked = [w for w, _ in collections.Counter(w for ws in sources for w in ws).most_common()]
    han = zipf_sampler([chr(c) for c in rng.sample(range(0x4E00, 0x9FA6), 3500)], rng)
    hangul = zipf_sampler([chr(c) for c in rng.sample(range(0xAC00, 0xD7A4), 2000)], rng)
    hiragana = zipf_sampler([chr(c) for c in range(0x3041, 0x3094)], rng)
    katakana = zipf_sampler([chr(c) for c in range(0x30A1, 0x30F7)], rng)

    def chinese(rank):
        return han(1 if rank < 300 else rng.choices((1, 2, 3, 4), (10, 65, 18, 7))[0])

    def japanese(rank):
        if rank < 100:
            return hiragana(rng.choice((1, 2, 2, 3)))
        if rng.random() < 0.2:
            return katakana(rng.randint(3, 6))
        return han(rng.choices((1, 2, 3), (20, 70, 10))[0])

    def korean(rank):
        weights = (30, 40, 20, 10) if rank < 300 else (5, 50, 30, 15)
        return hangul(rng.choices((1, 2, 3, 4), weights)[0])

    languages = [(chinese, ""), (japanese, ""), (korean, " ")]
    lexicons = []
    for write, _ in languages:
        taken, lexicon = set(), {}
        for rank, word in enumerate(ranked):
            if word in MARKS:
                continue
            new = "".join(write(rank))
            while new in taken:
                new += "".join(write(rank))[:1]
            taken.add(new)
            lexicon[word] = new
        lexicons.append(lexicon)
    docs = []
    for i, words in enumerate(sources):
        (_, space), lexicon = languages[i % 3], lexicons[i % 3]
        units = []
        for word in words:
            if word in MARKS:
                if units:
                    units[-1] += word if space else MARKS[word]
            else:
                units.append(lexicon[word])
        docs.append(Document(units, [space] * (len(units) - 1), space, cjk=True))
    return [d for d in docs if len(d.text) >= 1000][:count]


def zipf_sampler(items, rng):
    """``k`` draws from ``items`` with Zipf-Mandelbrot weights by rank."""
    weights = [1 / (rank + 2.7) for rank in range(len(items))]
    cumulative = list(itertools.accumulate(weights))
    return lambda k: rng.choices(items, cum_weights=cumulative, k=k)


def edit(doc, rate, rng):
    """The text of ``doc`` with ``rate`` of its words deleted, inserted,
    substituted or swapped (seeded by ``rng``); separators are kept."""
    units = list(doc.units)
    vocabulary = [u for u in units if u]
    for _ in range(max(1, round(rate * len(units)))):
        i = rng.randrange(len(units))
        op = rng.randrange(4)
        if op == 0:
            units[i] = ""
        elif op == 1:
            units[i] = units[i] + doc.joiner + rng.choice(vocabulary)
        elif op == 2:
            units[i] = rng.choice(vocabulary)
        elif i + 1 < len(units):
            units[i], units[i + 1] = units[i + 1], units[i]
    return join(units, doc.seps)


def shingle_set(doc, n=4):
    words = [u for u in doc.units if u.strip()]
    return {hash(tuple(words[i:i + n])) for i in range(max(1, len(words) - n + 1))}


def negatives(docs, count, rng, among=None):
    """``count`` pairs of distinct documents (of those indexed by ``among``)
    whose word 4-shingle Jaccard similarity is below 0.3."""
    among = range(len(docs)) if among is None else among
    sets = {}
    pairs, tries = [], 0
    while len(pairs) < count and tries < 20 * count:
        tries += 1
        a, b = rng.sample(among, 2)
        for i in (a, b):
            if i not in sets:
                sets[i] = shingle_set(docs[i])
        union = len(sets[a] | sets[b])
        if union and len(sets[a] & sets[b]) / union < 0.3:
            pairs.append((a, b))
    return pairs


def methods(peers_too=True):
    """name -> text-to-fingerprint function, ours first, then the peers found."""
    out = {"simhashdb default (chars n=2+3+4, CJK n=1+2)": simhashdb.fingerprint,
           "simhashdb chars n=2+3+4 (CJK too)": (
               lambda t: simhashdb.fingerprint(t, cjk_window=None)),
           "simhashdb chars n=2+3+4, CJK n=2": (
               lambda t: simhashdb.fingerprint(t, cjk_window=2)),
           "simhashdb chars n=2+3+4, CJK n=1+2, runs kept": (
               lambda t: simhashdb.fingerprint(t, max_run=None)),
           "simhashdb chars n=2+3, CJK n=1+2": (
               lambda t: simhashdb.fingerprint(t, window=(2, 3))),
           "simhashdb recipe 1 (chars n=3, CJK n=2)": (
               lambda t: simhashdb.fingerprint(t, **simhashdb.RECIPES[RECIPE_1]))}
    for n in (1, 2, 3, 4):
        out["simhashdb words n=%d" % n] = (
            lambda t, n=n: simhashdb.fingerprint(t, window=n, unit="words", cjk_window=None))
    for n in (1, 2, 4):
        out["simhashdb chars n=%d" % n] = (
            lambda t, n=n: simhashdb.fingerprint(t, window=n, unit="chars", cjk_window=None))
    if not peers_too:
        return out
    try:
        import peers
        e0ng = peers.load("simhash_1e0ng")
        if e0ng:
            out["PyPI simhash (1e0ng) defaults"] = lambda t: e0ng.Simhash(t).value
        pybind = peers.load("simhash_pybind")
        if pybind:
            out["seed-000 recipe (md5 word 4-shingles)"] = lambda t: pybind.compute(
                [pybind.unsigned_hash(" ".join(s).encode()) for s in pybind.shingle(t.split(), 4)])
    except ImportError:
        pass
    try:
        from samecode.halohash import BitAverageHaloHash
        out["samecode halo 64 (words)"] = lambda t: int(
            BitAverageHaloHash(t.encode().split(), size_in_bits=64).hexdigest(), 16)
    except ImportError:
        pass
    return out


def evaluate(name, method, docs, variants, pairs, cjk_pairs):
    start = time.perf_counter()
    fps = [method(d.text) for d in docs]
    seconds = time.perf_counter() - start
    megabytes = sum(len(d.text.encode()) for d in docs) / 1e6
    row = {"method": name, "mb_per_s": megabytes / seconds, "recall": {}, "recall_cjk": {}}
    cjk = [d.cjk for d in docs]
    for rate, texts in variants.items():
        dists = [(bin(fps[i] ^ method(t)).count("1"), cjk[i]) for i, t in texts]
        row["recall"][rate] = {k: sum(d <= k for d, _ in dists) / len(dists) for k in KS}
        cjk_dists = [d for d, is_c in dists if is_c]
        row["recall_cjk"][rate] = {k: sum(d <= k for d in cjk_dists) / max(1, len(cjk_dists))
                                   for k in KS}
    for key, sample in (("fpr", pairs), ("fpr_cjk", cjk_pairs)):
        neg = [bin(fps[a] ^ fps[b]).count("1") for a, b in sample]
        row[key] = {k: sum(d <= k for d in neg) / max(1, len(neg)) for k in KS}
    recall5 = row["recall"][0.05]
    row["precision_1_100"] = {k: recall5[k] / (recall5[k] + 100 * row["fpr"][k])
                              if recall5[k] else 0.0 for k in KS}
    return row


def markdown(rows, k):
    lines = ["| method (k = %d) | %s | CJK recall 5%% | FPR | CJK FPR | precision 1:100 (5%%) "
             "| MB/s |" % (k, " | ".join("recall %g%%" % (100 * r) for r in RATES)),
             "|---|" + "---:|" * (len(RATES) + 5)]
    for row in rows:
        lines.append("| %s | %s | %.3f | %.1e | %.1e | %.3f | %.1f |" % (
            row["method"], " | ".join("%.3f" % row["recall"][r][k] for r in RATES),
            row["recall_cjk"][0.05][k], row["fpr"][k], row["fpr_cjk"][k],
            row["precision_1_100"][k], row["mb_per_s"]))
    return "\n".join(lines)


QUICK = {"doc_count": 300, "cjk_count": 100, "negative_count": 20000}


def run(doc_count, cjk_count, negative_count, seed=0, only=None):
    """Evaluate every method (or those named in ``only``); returns the rows."""
    rng = random.Random(seed)
    texts = stdlib_texts(rng)
    docs = latin_documents(texts, doc_count)
    latin = len(docs)
    docs += cjk_documents(texts, cjk_count, rng)
    variants = {rate: [(i, edit(d, rate, rng)) for i, d in enumerate(docs)] for rate in RATES}
    pairs = negatives(docs, negative_count, rng)
    cjk_pairs = negatives(docs, negative_count // 4, rng, among=range(latin, len(docs)))
    ours_only = only is not None and all(name.startswith("simhashdb") for name in only)
    return [evaluate(name, fn, docs, variants, pairs, cjk_pairs)
            for name, fn in methods(peers_too=not ours_only).items()
            if only is None or name in only]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small sample (seconds)")
    parser.add_argument("--only", action="append", help="evaluate only this method (repeatable)")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--cjk", type=int, default=200)
    parser.add_argument("--negatives", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0, help="draws another sample")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.docs, args.cjk, args.negatives = QUICK.values()
    rows = run(args.docs, args.cjk, args.negatives, seed=args.seed, only=args.only)
    for k in (2, 3, 4):
        print(markdown(rows, k) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
