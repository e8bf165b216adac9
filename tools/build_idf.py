"""Build the word weight table of recipe 3 (simhashdb/words-idf.bin).

The table holds the WORDS words (NFKC, case-folded, as ``simhashdb.tokenize``
with ``unit="words"``: CJK characters are words) found in the most documents
of a public corpus: every other document of the Debian documentation corpus
(tools/corpus.py), of the kinds not held out from tuning. A word's weight is
its inverse document frequency, ln(N / df), in 16ths; a word not in the table
weighs ln(N), as a word seen once. Frequent words (``the``, ``return``,
``debian``, a site's navigation) thus weigh little, and unrelated documents
of one kind no longer share most of their weight.

Format: b"SHDBIDF1", uint32 count, uint8 weight of absent words, 3 zero
bytes, then count little-endian uint64 word hashes (``simhashdb.fast_hash``
of the word's UTF-8), sorted, then count uint8 weights.

Usage: python tools/build_idf.py [--words N] [--out PATH]
"""

import argparse
import collections
import hashlib
import math
import pathlib
import struct

import corpus

import simhashdb

WORDS = 5000
OUT = pathlib.Path(simhashdb.__file__).parent / "words-idf.bin"


def training_documents(raw):
    """Every other document of the kinds not held out."""
    return [d for i, d in enumerate(raw) if i % 2 == 0 and d["kind"] not in corpus.HELD_OUT]


def table(docs, words=WORDS):
    """(sorted hashes, weights, weight of an absent word) from ``docs``."""
    df = collections.Counter()
    for doc in docs:
        text = simhashdb.html_to_text(doc["text"]) if doc["html"] else doc["text"]
        df.update({simhashdb.fast_hash(w.encode("utf-8"))
                   for w in simhashdb.tokenize(simhashdb.normalize(text), "words")})
    n = len(docs)
    top = sorted(df.items(), key=lambda item: (-item[1], item[0]))[:words]
    entries = sorted((h, round(16 * math.log(n / count))) for h, count in top)
    return [h for h, _ in entries], [w for _, w in entries], round(16 * math.log(n))


def write(path, hashes, weights, absent):
    data = (b"SHDBIDF1" + struct.pack("<IB3x", len(hashes), absent)
            + struct.pack("<%dQ" % len(hashes), *hashes) + bytes(weights))
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=WORDS)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    docs = training_documents(corpus.debian_corpus())
    hashes, weights, absent = table(docs, args.words)
    digest = write(args.out, hashes, weights, absent)
    print("%s: %d words from %d documents, absent weight %d, sha256 %s"
          % (args.out, len(hashes), len(docs), absent, digest))


if __name__ == "__main__":
    main()
