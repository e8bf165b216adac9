"""Near-duplicate detection quality of fingerprint recipes, as a crawler feels it.

What this measures is the 64-bit fingerprint alone: the candidates the
database's fingerprint index finds within k bits. The database's text rule
(``DB.insert_text_if_new`` and the other text methods) takes as candidates
the documents that share a band of the MinHash signature too, and confirms
a candidate by its estimated resemblance (``simhashdb.rule.THRESHOLD``);
tools/eval_dedupe.py measures that rule, through the database, over a whole
corpus. The corpora, the edit models and the notion of unrelated documents
are shared: eval_dedupe and tests/test_quality.py take them from here.

Corpus (tools/corpus.py): by default ~8,000 real documents of several kinds
from Debian's documentation packages (English prose, HTML manuals that share a
site template, Python source, licences, man pages, Japanese and Chinese man
pages and Chinese, Japanese and Korean HTML; held out from tuning: Git release
notes and HTML in European languages, and the kinds of ``held_out_corpus``:
Perl pods, PostgreSQL's and the kernel's HTML, the kernel's reST, Debian
changelogs); ``--quick``: a small corpus from what any Python has (standard
library source, pydoc topics, pydoc's HTML pages, composed CJK text).

Edit models (EDIT_MODELS), each reported on its own, since they move a
fingerprint very differently:
- ``foreign words``: words deleted, inserted or substituted (a third each),
  the inserted and substituted words taken from OTHER documents of the
  corpus: new words, as a crawler sees them (a date, an ad, a comment);
- ``foreign block``: one run of another document's words inserted at one
  place (a sidebar, a comment, a new paragraph), 3, 5 or 10% of the words;
- ``same-document``: words deleted, inserted, substituted or swapped, the
  inserted and substituted words taken from the SAME document (the only
  model before; with distinct-word features it barely moves a fingerprint).

For each method, at k bits:
- false matches per document: every pair within k over ALL pairs of the
  corpus (``simhashdb.find_all_indices``), confirmed unrelated by exact word
  5-shingle Jaccard < 0.3, counted for both documents, divided by the number
  of documents (the unrelated documents an average document matches);
- the mean distance of unrelated pairs of one kind (independent
  fingerprints sit 32 bits apart);
- recall: a sample of documents against their edited variants, per edit
  model and rate (seeded; in HTML only the words of the text, not the markup);
- speed in MB/s of plain text (the documents that are not HTML) on one core.
Peers (PyPI ``simhash``, the simhash-py recipe, samecode's halo hash) get
the text of HTML documents, as they have no HTML mode.

Usage: python tools/eval_quality.py [--quick] [--seed N] [--only METHOD]
       [--ours] [--k K] [--recall N] [--no-held-out] [--json out.json]
"""

import argparse
import collections
import itertools
import json
import pydoc
import random
import re
import sys
import time

import corpus

import simhashdb

RATES = (0.01, 0.02, 0.05, 0.10)
BLOCK_RATES = (0.03, 0.05, 0.10)
FOREIGN_WORDS, FOREIGN_BLOCK, SAME_DOCUMENT = "foreign words", "foreign block", "same-document"
EDIT_MODELS = {FOREIGN_WORDS: RATES, FOREIGN_BLOCK: BLOCK_RATES, SAME_DOCUMENT: RATES}
K = 3
UNRELATED = 0.3  # word 5-shingle Jaccard below this: unrelated documents
RECIPE_1 = "simhashdb-1/nfkc-casefold/chars/window-3/cjk-window-2/counts/fast-hash"
RECIPE_2 = "simhashdb-2/nfkc-casefold/chars/runs-3/shingles-2-3-4/cjk-shingles-1-2/counts/fast-hash"
CJK_CHAR = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
# Separators of editable words: white space, and in HTML, markup.
TEXT_SEPARATOR = re.compile(r"(\s+)")
HTML_SEPARATOR = re.compile(r"(<script.*?</script>|<style.*?</style>|<!--.*?-->|<[^>]*>|\s+)",
                            re.S | re.I)
CJK_SPLIT = re.compile("([%s])" % CJK_CHAR)


class Document:
    """A text as words (``units``) and the separators between them; each CJK
    character is a word. Edits act on the words and keep the separators."""

    def __init__(self, text, kind, html=False):
        self.text, self.kind, self.html = text, kind, html
        units, seps = [], []
        parts = (HTML_SEPARATOR if html else TEXT_SEPARATOR).split(text)
        for i, part in enumerate(parts):
            if i % 2:
                seps.append(part)
                continue
            pieces = CJK_SPLIT.split(part) if CJK_SPLIT.search(part) else [part]
            words = [p for p in pieces if p] or [""]
            for j, word in enumerate(words):
                if j:
                    seps.append("")
                units.append(word)
        self.units, self.seps = units, seps
        self.editable = [i for i, u in enumerate(units) if u]

    def visible_text(self):
        return simhashdb.html_to_text(self.text) if self.html else self.text


def join(units, seps):
    return "".join(u + (seps[j] if j < len(seps) else "") for j, u in enumerate(units))


def edit(doc, rate, rng):
    """The text of ``doc`` with ``rate`` of its words deleted, inserted,
    substituted or swapped (seeded by ``rng``); separators are kept."""
    units = list(doc.units)
    if not doc.editable:
        return doc.text
    for _ in range(max(1, round(rate * len(doc.editable)))):
        i = rng.choice(doc.editable)
        op = rng.randrange(4)
        if op == 0:
            units[i] = ""
        elif op == 1:
            other = units[rng.choice(doc.editable)]
            joiner = "" if CJK_SPLIT.match(other) else " "
            units[i] = units[i] + joiner + other
        elif op == 2:
            units[i] = units[rng.choice(doc.editable)]
        elif i + 1 < len(units):
            units[i], units[i + 1] = units[i + 1], units[i]
    return join(units, doc.seps)


def _foreign_word(docs, i, rng):
    """A word of a random document of ``docs`` other than the ``i``-th."""
    while True:
        j = rng.randrange(len(docs))
        if j != i and docs[j].editable:
            return docs[j].units[rng.choice(docs[j].editable)]


def _joined(words):
    """Words as one run of text: spaces between them, none between CJK characters."""
    out = ""
    for word in words:
        if out and not (CJK_SPLIT.match(word) and CJK_SPLIT.match(out[-1])):
            out += " "
        out += word
    return out


def edit_foreign_words(docs, i, rate, rng):
    """The text of ``docs[i]`` with ``rate`` of its words deleted, inserted
    or substituted (a third each), new words taken from other documents."""
    doc = docs[i]
    units = list(doc.units)
    if not doc.editable:
        return doc.text
    for _ in range(max(1, round(rate * len(doc.editable)))):
        p = rng.choice(doc.editable)
        op = rng.randrange(3)
        if op == 0:
            units[p] = ""
        elif op == 1:
            units[p] = _joined([units[p], _foreign_word(docs, i, rng)])
        else:
            units[p] = _foreign_word(docs, i, rng)
    return join(units, doc.seps)


def edit_foreign_block(docs, i, rate, rng):
    """The text of ``docs[i]`` with one run of another document's words,
    ``rate`` of its own word count, inserted before a random word."""
    doc = docs[i]
    if not doc.editable:
        return doc.text
    want, words = max(1, round(rate * len(doc.editable))), []
    while len(words) < want:  # a short donor is followed by another
        j = rng.randrange(len(docs))
        donor = docs[j].editable
        if j == i or not donor:
            continue
        start = rng.randrange(max(1, len(donor) - (want - len(words)) + 1))
        words += [docs[j].units[e] for e in donor[start:start + want - len(words)]]
    units = list(doc.units)
    p = rng.choice(doc.editable)
    units[p] = _joined(words + [units[p]])
    return join(units, doc.seps)


def shingle_set(doc, n=5):
    """Hashes of the word 5-shingles of a document's text (CJK: characters)."""
    words = simhashdb.tokenize(simhashdb.normalize(doc.visible_text()), "words")
    return {hash(tuple(words[i:i + n])) for i in range(max(1, len(words) - n + 1))}


def jaccard(a, b):
    union = len(a | b)
    return len(a & b) / union if union else 1.0


# The quick corpus: what any Python installation has.

WORD = re.compile(r"[^\W_]+|[.:;,!?]")
MARKS = {".": "。", ":": "。", "!": "！", "?": "？", ",": "，", ";": "，"}
PYDOC_MODULES = ("argparse asyncio.events base64 bisect calendar collections configparser "
                 "contextlib csv dataclasses datetime decimal difflib email.message enum "
                 "fileinput fnmatch fractions ftplib functools getopt gettext glob gzip "
                 "hashlib heapq hmac html.parser http.client http.server imaplib inspect "
                 "ipaddress json logging mailbox mimetypes netrc operator optparse pathlib "
                 "pickle pprint queue random re sched secrets selectors shelve shlex "
                 "shutil smtplib socket socketserver sqlite3 statistics string struct "
                 "subprocess tarfile tempfile textwrap threading timeit tokenize trace "
                 "traceback typing unittest.case urllib.parse uuid warnings wave weakref "
                 "xml.dom.minidom zipfile zipimport").split()


def python_corpus(seed=0, code=150, cjk=60):
    """A small corpus of four kinds from the standard library: ``code``
    (.py files), ``prose`` (pydoc topics), ``html`` (pydoc's pages of
    modules, one template) and ``cjk`` (composed, see cjk_documents)."""
    import importlib
    import pathlib
    import sysconfig

    from pydoc_data.topics import topics

    rng = random.Random(seed)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "test" not in p.parts)
    texts = [p.read_text("utf-8", "replace") for p in rng.sample(paths, len(paths))]
    docs = [{"kind": "code", "html": False, "text": t}
            for t in [t for t in texts if len(t) >= 500][:code]]
    docs += [{"kind": "prose", "html": False, "text": t}
             for _, t in sorted(topics.items()) if len(t) >= 500]
    for name in PYDOC_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a Python built without it
            continue
        page = pydoc.html.page(name, pydoc.html.document(module, name))
        docs.append({"kind": "html", "html": True, "text": page})
    docs += [{"kind": "cjk", "html": False, "text": d}
             for d in cjk_documents(texts[code:], cjk, rng)]
    return docs


def cjk_documents(texts, count, rng):
    """``count`` CJK texts of 1,000 characters or more, composed (no copied
    text) by writing each word of a standard-library file as a generated
    Chinese, Japanese or Korean word: real word statistics (Zipf
    frequencies, repetition, topics) in a CJK script; the more frequent a
    word, the shorter its CJK word; Chinese and Japanese without spaces."""
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
    out = []
    for i, words in enumerate(sources):
        (_, space), lexicon = languages[i % 3], lexicons[i % 3]
        units = []
        for word in words:
            if word in MARKS:
                if units:
                    units[-1] += word if space else MARKS[word]
            else:
                units.append(lexicon[word])
        text = space.join(units)
        if len(text) >= 1000:
            out.append(text)
    return out[:count]


def zipf_sampler(items, rng):
    """``k`` draws from ``items`` with Zipf-Mandelbrot weights by rank."""
    weights = [1 / (rank + 2.7) for rank in range(len(items))]
    cumulative = list(itertools.accumulate(weights))
    return lambda k: rng.choices(items, cum_weights=cumulative, k=k)


# Methods: name -> fingerprint(text, html).

def ours(**options):
    return lambda text, html: simhashdb.fingerprint(text, html=html, **options)


def peer(fn):
    """A peer's text-to-fingerprint function; HTML is given to it as text."""
    return lambda text, html: fn(simhashdb.html_to_text(text) if html else text)


def methods(peers_too=True):
    """name -> fingerprint(text, html), ours first, then the peers found."""
    out = {
        "simhashdb default (%s)" % simhashdb.RECIPE.split("/")[0]: ours(),
        "simhashdb recipe 2 (chars 2+3+4, counts)": ours(**simhashdb.RECIPES[RECIPE_2]),
        "simhashdb recipe 1 (chars 3, counts)": ours(**simhashdb.RECIPES[RECIPE_1]),
    }
    if not peers_too:
        return out
    try:
        import peers
        e0ng = peers.load("simhash_1e0ng")
        if e0ng:
            out["PyPI simhash (1e0ng) defaults"] = peer(lambda t: e0ng.Simhash(t).value)
        pybind = peers.load("simhash_pybind")
        if pybind:
            out["simhash-py recipe (md5 word 4-shingles)"] = peer(lambda t: pybind.compute(
                [pybind.unsigned_hash(" ".join(s).encode())
                 for s in pybind.shingle(t.split(), 4)]))
    except ImportError:
        pass
    try:
        from samecode.halohash import BitAverageHaloHash
        out["samecode halo 64 (words)"] = peer(lambda t: int(
            BitAverageHaloHash(t.encode().split(), size_in_bits=64).hexdigest(), 16))
    except ImportError:
        pass
    return out


class Corpus:
    """Documents, their shingle sets, the recall sample and its variants,
    and the same-kind pairs whose distances are averaged."""

    def __init__(self, raw, seed=0, recall_per_kind=150, pairs_per_kind=3000, models=None):
        rng = random.Random(seed)
        self.docs = [Document(d["text"], d["kind"], d["html"]) for d in raw]
        self.kinds = sorted({d.kind for d in self.docs},
                            key=lambda k: (k in corpus.HELD_OUT, k))
        self.sets = [shingle_set(d) for d in self.docs]
        by_kind = collections.defaultdict(list)
        for i, d in enumerate(self.docs):
            by_kind[d.kind].append(i)
        self.sample = [i for kind in self.kinds for i in
                       rng.sample(by_kind[kind], min(recall_per_kind, len(by_kind[kind])))]
        self.variants = {rate: [edit(self.docs[i], rate, rng) for i in self.sample]
                         for rate in RATES}
        self.kind_pairs = {}
        for kind in self.kinds:
            members, pairs = by_kind[kind], []
            for _ in range(pairs_per_kind):
                a, b = rng.sample(members, 2)
                if jaccard(self.sets[a], self.sets[b]) < UNRELATED:
                    pairs.append((a, b))
            self.kind_pairs[kind] = pairs
        # edits[model][rate]: the variants of the sample; same-document is
        # self.variants (drawn first, as before: the same texts for a seed)
        self.edits = {SAME_DOCUMENT: self.variants}
        models = EDIT_MODELS if models is None else models
        for model, fn in ((FOREIGN_WORDS, edit_foreign_words), (FOREIGN_BLOCK, edit_foreign_block)):
            if model in models:
                rng = random.Random("%s/%d" % (model, seed))
                self.edits[model] = {rate: [fn(self.docs, i, rate, rng) for i in self.sample]
                                     for rate in EDIT_MODELS[model]}
        self.edits = {m: self.edits[m] for m in EDIT_MODELS if m in self.edits}
        self._related = {}

    def unrelated(self, a, b):
        pair = (a, b) if a < b else (b, a)
        if pair not in self._related:
            self._related[pair] = jaccard(self.sets[a], self.sets[b]) >= UNRELATED
        return not self._related[pair]


def evaluate(name, method, c, ks=(K,)):
    """The row of one method: figures overall, per kind and per k."""
    docs = c.docs
    fps, seconds = [None] * len(docs), 0.0
    for html in (False, True):  # speed: plain text alone, HTML parsing is not timed
        start = time.perf_counter()
        for i, d in enumerate(docs):
            if d.html == html:
                fps[i] = method(d.text, d.html)
        seconds = seconds or time.perf_counter() - start
    megabytes = sum(len(d.text.encode()) for d in docs if not d.html) / 1e6
    row = {"method": name, "mb_per_s": megabytes / seconds, "kinds": {}, "false": {},
           "recall": {}}
    kind_of = [d.kind for d in docs]
    size = collections.Counter(kind_of)
    for k in ks:
        false = collections.Counter()
        for a, b in simhashdb.find_all_indices(fps, k + 2, k):
            if c.unrelated(a, b):
                false[kind_of[a]] += 1
                false[kind_of[b]] += 1
        row["false"][k] = {"all": sum(false.values()) / len(docs),
                           **{kind: false[kind] / size[kind] for kind in c.kinds}}
    row["recall_by_model"] = {}
    for model, variants in c.edits.items():
        recall = row["recall_by_model"][model] = {}
        for rate, texts in variants.items():
            dists = [(kind_of[i], bin(fps[i] ^ method(t, docs[i].html)).count("1"))
                     for i, t in zip(c.sample, texts)]
            recall[rate] = {k: {"all": _mean([d <= k for _, d in dists]),
                                "tuned": _mean([d <= k for x, d in dists
                                                if x not in corpus.HELD_OUT]),
                                "held out": _mean([d <= k for x, d in dists
                                                   if x in corpus.HELD_OUT]),
                                **{kind: _mean([d <= k for x, d in dists if x == kind])
                                   for kind in c.kinds}} for k in ks}
    row["recall"] = row["recall_by_model"][SAME_DOCUMENT]
    row["distance"] = {kind: _mean([bin(fps[a] ^ fps[b]).count("1")
                                    for a, b in c.kind_pairs[kind]]) for kind in c.kinds}
    return row


def _mean(values):
    return sum(values) / len(values) if values else float("nan")


def summary(rows, k, kinds):
    tuned = [x for x in kinds if x not in corpus.HELD_OUT]
    lines = ["| method (k = %d) | false matches / doc | min / mean same-kind distance | MB/s |"
             % k, "|---|---:|---:|---:|"]
    for row in rows:
        dist = [row["distance"][x] for x in tuned]
        lines.append("| %s | %.4f | %.1f / %.1f | %.1f |" % (
            row["method"], row["false"][k]["all"], min(dist), _mean(dist), row["mb_per_s"]))
    return "\n".join(lines)


def recall_table(rows, k, kinds):
    """Recall within k bits, one column per edit model and rate, over the
    tuning kinds and, apart, the held-out ones."""
    held_out = any(x in corpus.HELD_OUT for x in kinds)
    cells = [(m, r) for m, rates in EDIT_MODELS.items() for r in rates]
    lines = []
    for group in ("tuned",) + (("held out",) if held_out else ()):
        lines += ["| recall within k = %d (%s kinds) | %s |" % (k, group, " | ".join(
            "%s %g%%" % (m, 100 * r) for m, r in cells)), "|---|" + "---:|" * len(cells)]
        for row in rows:
            lines.append("| %s | %s |" % (row["method"], " | ".join(
                "%.3f" % row["recall_by_model"][m][r][k][group] for m, r in cells)))
        lines.append("")
    return "\n".join(lines)


def by_kind(rows, k, kinds):
    lines = ["| method (k = %d) | figure | %s |" % (k, " | ".join(
        x + (" (held out)" if x in corpus.HELD_OUT else "") for x in kinds)),
        "|---|---|" + "---:|" * len(kinds)]
    for row in rows:
        figures = [("false matches / doc", row["false"][k]), ("unrelated distance", row["distance"])]
        for model, recall in row["recall_by_model"].items():
            figures += [("recall %s %g%%" % (model, 100 * r), recall[r][k])
                        for r in (EDIT_MODELS[model][0], 0.05)]
        for label, values in figures:
            lines.append("| %s | %s | %s |" % (row["method"], label, " | ".join(
                "%.1f" % values[x] if label == "unrelated distance" else "%.3f" % values[x]
                for x in kinds)))
    return "\n".join(lines)


def run(raw, seed=0, only=None, ks=(K,), peers_too=True, **sizes):
    """Evaluate every method (or those named in ``only``) on the documents ``raw``."""
    c = Corpus(raw, seed, **sizes)
    table = methods(peers_too and not (only and all(n.startswith("simhashdb") for n in only)))
    rows = [evaluate(name, fn, c, ks) for name, fn in table.items()
            if only is None or name in only]
    return rows, c.kinds


def load_corpus(quick=False, seed=0, held_out=True, rebuild=False):
    """The documents of a run: the quick corpus, or Debian's with (by
    default) the held-out kinds."""
    if quick:
        return python_corpus(seed)
    return corpus.debian_corpus(rebuild) + (corpus.held_out_corpus(rebuild) if held_out else [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small Python corpus")
    parser.add_argument("--only", action="append", help="evaluate only this method (repeatable)")
    parser.add_argument("--ours", action="store_true", help="leave the peers out")
    parser.add_argument("--k", type=int, action="append", help="distances (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="draws another sample")
    parser.add_argument("--rebuild", action="store_true", help="render the corpus anew")
    parser.add_argument("--recall", type=int, default=150,
                        help="documents of each kind edited (default: 150)")
    parser.add_argument("--no-held-out", action="store_true",
                        help="leave out the held-out kinds of corpus.held_out_corpus")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    raw = load_corpus(args.quick, args.seed, not args.no_held_out, args.rebuild)
    ks = tuple(args.k or (K,))
    rows, kinds = run(raw, args.seed, args.only, ks, peers_too=not args.ours,
                      recall_per_kind=args.recall)
    print("%d documents: %s\n" % (len(raw), ", ".join(
        "%s %d" % kv for kv in sorted(collections.Counter(d["kind"] for d in raw).items()))))
    for k in ks:
        print(summary(rows, k, kinds) + "\n")
        print(recall_table(rows, k, kinds))
        print(by_kind(rows, k, kinds) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kinds": kinds, "rows": rows}, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
