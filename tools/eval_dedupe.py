"""A crawler's dedupe over a whole corpus, measured: every document of the
corpus (tools/eval_quality.py) goes through ``insert_if_new`` in a shuffled
order, with edited copies (1, 2, 5 and 10% of the words) of a sample planted
at random places after their originals.

Per method: the share of the corpus flagged as a duplicate of unrelated
documents only (word 5-shingle Jaccard < 0.3 with every match), the planted
copies found (a match related to the copy), and documents per second through
the whole loop (fingerprinting, the check and the write, batches of 1,000).
``DB.insert_text_if_new_many`` is ours; the others pass 64-bit fingerprints
to ``DB.insert_if_new_many`` at k = 3.

Usage: python tools/eval_dedupe.py [--quick] [--ours] [--seed N]
"""

import argparse
import random
import tempfile
import time

import corpus
import eval_quality

import simhashdb

BATCH = 1000


def stream(c, seed):
    """(key, document index or None, text, html, (original, rate) or None) in
    insertion order: the corpus shuffled, each copy somewhere after its original."""
    rng = random.Random(seed)
    order = list(range(len(c.docs)))
    rng.shuffle(order)
    position = {i: p for p, i in enumerate(order)}
    planted = [[] for _ in order]
    for rate, texts in c.variants.items():
        for i, text in zip(c.sample, texts):
            planted[rng.randrange(position[i], len(order))].append((i, rate, text))
    for p, i in enumerate(order):
        doc = c.docs[i]
        yield "doc%d" % i, doc.text, doc.html, None
        for original, rate, text in planted[p]:
            yield "copy%d@%g" % (original, rate), text, c.docs[original].html, \
                (original, rate)


def run_method(name, c, seed, text_path, method=None):
    items = list(stream(c, seed))
    copies = {}
    flagged, found = 0, {rate: 0 for rate in eval_quality.RATES}
    planted = {rate: 0 for rate in eval_quality.RATES}
    with tempfile.TemporaryDirectory() as tmp:
        with simhashdb.DB(tmp + "/db", recipe=simhashdb.RECIPE if text_path else None) as db:
            start = time.perf_counter()
            for b in range(0, len(items), BATCH):
                batch = items[b:b + BATCH]
                html = [item for item in batch if item[2]]
                plain = [item for item in batch if not item[2]]
                results = {}
                for group, is_html in ((plain, False), (html, True)):
                    if text_path:
                        matches = db.insert_text_if_new_many(
                            [(key, text) for key, text, _, _ in group], html=is_html)
                    else:
                        matches = db.insert_if_new_many(
                            [(key, method(text, is_html)) for key, text, _, _ in group])
                    results.update(zip((item[0] for item in group), matches))
                for key, _, _, copy in batch:
                    copies[key] = (copy, results[key])
            seconds = time.perf_counter() - start
    for key, (copy, matches) in copies.items():
        if not matches:
            if copy:
                planted[copy[1]] += 1
            continue
        if copy is None:
            i = int(key[3:])
            if all(c.unrelated(i, _index(m.key)) for m in matches):
                flagged += 1
        else:
            original, rate = copy
            planted[rate] += 1
            if any(_index(m.key) == original or not c.unrelated(original, _index(m.key))
                   for m in matches):
                found[rate] += 1
    return {"method": name, "flagged": flagged / len(c.docs),
            "found": {rate: found[rate] / planted[rate] for rate in found},
            "docs_per_s": len(items) / seconds}


def _index(key):
    """The corpus index of a stored key: a document's, or a copy's original's
    (a copy is taken as related to what its original is related to)."""
    return int(key[3:] if key.startswith("doc") else key[4:].split("@")[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small Python corpus")
    parser.add_argument("--ours", action="store_true", help="leave the peers out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    raw = eval_quality.python_corpus(args.seed) if args.quick else corpus.debian_corpus()
    c = eval_quality.Corpus(raw, args.seed)
    rows = [run_method("simhashdb insert_text_if_new (recipe 3 + signature)", c, args.seed, True)]
    for name, method in eval_quality.methods(peers_too=not args.ours).items():
        rows.append(run_method(name + ", insert_if_new k = 3", c, args.seed, False, method))
    print("%d documents, %d planted copies per edit rate\n" % (len(c.docs), len(c.sample)))
    print("| method | unrelated flagged (share of corpus) | %s | docs/s |" % " | ".join(
        "copies found %g%%" % (100 * r) for r in eval_quality.RATES))
    print("|---|---:|" + "---:|" * (len(eval_quality.RATES) + 1))
    for row in rows:
        print("| %s | %.3f%% | %s | %.0f |" % (
            row["method"], 100 * row["flagged"],
            " | ".join("%.3f" % row["found"][r] for r in eval_quality.RATES), row["docs_per_s"]))


if __name__ == "__main__":
    main()
