"""Corpus-wide near-duplicates on Spark: every pair, the clusters, and one
document kept per cluster, for a DataFrame of (key, fingerprint) documents of
any size. The answers are those of :meth:`simhashdb.DB.find_all` and
:meth:`simhashdb.DB.clusters` on the same documents.

The method is the database's. Each document goes to every permutation table,
grouped by its fingerprint's leading blocks in that table (one shuffle, the
key along); each group is scanned by the native pair scanner over Arrow
batches (``mapInArrow``), which keeps a pair only in the first table whose
leading blocks it shares, so no pair is found twice and no global distinct is
needed. A group estimated
(from a sample) to hold more than ``split`` fingerprints is cut into parts,
and every pair of parts is scanned by a task of its own, so a template page
with a million near copies does not land on one task. Identical fingerprints
under different keys pair up at distance 0. Clusters are the connected
components of the pairs, found by alternating large-star and small-star
rounds (Kiveris et al., 2014) over DataFrames; a cluster is named by its
smallest key.

Fingerprint columns may be ``LongType`` (the 64 bits as a signed long: how
Arrow's uint64 arrives when cast to int64), ``DecimalType(20, 0)`` (how Spark
reads a Parquet UINT_64 column, e.g. from :meth:`DB.export_parquet`), or
8-byte big-endian ``BinaryType``. Keys are strings, binary or integers, and
identify documents, one row a key (a key on several rows is never paired
with itself). Runs on classic Spark sessions (it uses the SparkContext), not
Spark Connect.

A new segment is deduplicated against a corpus kept before (``against``),
whose documents are never paired among themselves. By the distance rule
(and up to SHIPPED_ROWS new rows), every task of one pass over the old
corpus scans its rows beside the new fingerprints, shipped with the task;
else each new document probes the old corpus's table and band keys as a
query of the database would, the old keys kept only where a new document
has the same (a broadcast of the new keys). The new rows left are clustered on the driver
when one scan task would hold them.
"""

try:
    import pyarrow
    from pyspark.sql import functions as F
except ImportError as exc:  # pragma: no cover - the spark extra is not installed
    raise ImportError("simhashdb.spark needs pyspark: pip install '.[spark]' in simhashdb's "
                      "source directory") from exc

from .. import rule
from ..errors import InputError, InvalidArgumentError
from .components import _components
from .incremental import _across, _dropped_in_memory
from .scan import _narrow, _prepare, _scan, _text_scan, choose_blocks
from .tasks import DEFAULT_SPLIT, _materialize

__all__ = ["choose_blocks", "clusters", "dedupe", "find_all", "from_records"]


def find_all(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
             split=DEFAULT_SPLIT, signature=None, threshold=None, against=None,
             against_columns=None, short_words=None):
    """Every pair of documents within ``distance`` bits, each unordered pair
    once: a DataFrame ``(key_a, key_b, distance)`` with ``key_a < key_b``.

    Documents with identical fingerprints pair up at distance 0. Runs two
    quick jobs (validation, a sample for hot prefixes) when called; the
    pairs are computed when the result is.

    With ``signature``, the text rule decides, as in a database of texts
    (:meth:`simhashdb.DB.insert_text_if_new`): two texts are a pair when they
    share a band of their signatures or their fingerprints are within
    ``distance``, and their resemblance is at least ``threshold``; a document
    with a null signature (no text) pairs by its distance alone. The result
    has a fourth column, ``resemblance`` (null for a pair by distance alone).
    It runs a few more jobs when called (the band groups that hold more
    than one text, counted and checkpointed).

    :param df: a DataFrame with a ``key`` and a ``fingerprint`` column.
    :param int distance: the largest Hamming distance of a pair.
    :param int blocks: blocks per fingerprint, more than ``distance``
        (default: :func:`choose_blocks` for the number of documents).
    :param int split: a group of more fingerprints than this (estimated) is
        scanned in parts of about this size; a band group of more than
        ``split / BAND_SPLIT`` texts, in parts of about that size.
    :param str signature: the name of a binary column of resemblance
        signatures (128 or 256 bytes, from :func:`simhashdb.fingerprint_with_signature`
        with the fingerprint; null, or all zero, for a document without text).
    :param float threshold: the least resemblance of two texts that are
        near-duplicates, in [0, 1] (default: ``simhashdb.rule.THRESHOLD``);
        only with ``signature``.
    :param int short_words: texts of fewer words (read from their
        signatures) pair only at ``simhashdb.rule.NEAR_EXACT`` or more, as in
        :meth:`simhashdb.DB.insert_text_if_new` (default: 0, none); only with
        ``signature``.
    :param against: an old corpus (a DataFrame of key, fingerprint and, where
        it has one, signature columns): the result is then the pairs within
        ``df`` and those across, each of a row of ``df`` (``key_a``) and one
        of ``against`` (``key_b``), with a last column ``across`` that tells
        them apart (see :func:`dedupe`).
    :param dict against_columns: the names of ``against``'s columns, by
        ``"key"``, ``"fingerprint"`` and ``"signature"`` (default: those of
        ``df``; an old corpus without a signature column, when not named
        here, holds documents without text).
    :raises InvalidArgumentError: bad parameters, columns or column types
        (on either side), or a signature that is neither 128 nor 256 bytes.
    :raises InvalidFingerprintError: a row with no valid fingerprint (null,
        out of range, not 8 bytes).
    :raises InvalidKeyError: a row with a null key.
    """
    threshold = _text_rule(threshold, short_words)
    if against is None:
        return _pairs(df, distance, blocks, key, fingerprint, split, signature, threshold)
    narrow = _narrow(df, against, signature, against_columns)
    within = _pairs(df, distance, blocks, key, fingerprint, split, signature, threshold, narrow)
    return within.withColumn("across", F.lit(False)).unionByName(
        _across(df, against, distance, blocks, key, fingerprint, signature, threshold,
                against_columns, narrow).withColumn("across", F.lit(True)))


def _pairs(df, distance, blocks, key, fingerprint, split, signature, threshold, narrow=False):
    """find_all's pairs within ``df``; signatures meet in 8-bit bins with ``narrow``."""
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, split,
                                         signature, threshold, narrow=narrow)
    if least is None:
        pairs, columns = _scan(docs, layout, split, rows, "pairs"), ["distance"]
    else:
        pairs = _text_scan(docs, layout, split, rows, least, "pairs")
        columns = ["distance", "resemblance"]
    pairs = pairs.where(F.col("key_a") != F.col("key_b"))
    return pairs.select(F.least("key_a", "key_b").alias("key_a"),
                        F.greatest("key_a", "key_b").alias("key_b"), *columns)


def clusters(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
             split=DEFAULT_SPLIT, signature=None, threshold=None, short_words=None):
    """The cluster of every document: a DataFrame ``(key, cluster)`` where
    ``cluster`` is the smallest key of the document's connected component in
    the graph of pairs within ``distance`` (by the text rule with
    ``signature``: the pairs of :func:`find_all`; a document alone is its own).

    Finds the components when called (a few Spark jobs a round); the result
    is a DataFrame over them. Parameters and errors as :func:`find_all`.
    """
    docs, joined = _joined(df, key, fingerprint, distance, blocks, split, signature,
                           _text_rule(threshold, short_words))
    return docs.join(joined, "key", "left").select(
        "key", F.coalesce("cluster", "key").alias("cluster"))


def dedupe(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
           split=DEFAULT_SPLIT, signature=None, threshold=None, against=None,
           against_columns=None, short_words=None):
    """The rows of ``df`` less near-duplicates: of each cluster (see
    :func:`clusters`) only the document with the smallest key is kept, whatever
    the partitioning. Columns and types are ``df``'s.

    With ``against`` (an old corpus: a DataFrame of key, fingerprint and,
    where it has them, signature columns, named as ``df``'s or by
    ``against_columns`` as in :func:`find_all`, such as the Parquet of
    :meth:`simhashdb.DB.export_parquet` or of an earlier run), the
    rows of ``df`` that are near-duplicates of a document of ``against`` go
    (whatever their key), then the rest are deduplicated as above: the rows a
    database holding ``against`` keeps when it is asked for each row's
    near-duplicates. The old corpus is read (two passes; four with
    signatures) but not shuffled whole, and its documents are never paired
    among themselves (see the module's docstring). ``blocks`` is then that
    of the new rows' clusters; the probes of the old corpus take the
    database's blocks for their sizes."""
    threshold = _text_rule(threshold, short_words)
    narrow = against is not None and _narrow(df, against, signature, against_columns)
    if against is not None:
        across = _across(df, against, distance, None, key, fingerprint, signature, threshold,
                         against_columns, narrow)
        seen = across.select(F.col("key_a").alias(key)).distinct()
        df = _materialize(df.join(seen, key, "left_anti"))
        dropped = _dropped_in_memory(df, key, fingerprint, distance, blocks, signature,
                                     threshold, narrow)
        if dropped is not None:
            return df.join(F.broadcast(dropped), key, "left_anti")
    _, joined = _joined(df, key, fingerprint, distance, blocks, split, signature, threshold,
                        narrow)
    return df.join(joined.select(F.col("key").alias(key)), key, "left_anti")


def _text_rule(threshold, short_words):
    """The threshold the public functions pass on: as given, or with
    ``short_words`` a checked :class:`simhashdb.rule.Threshold`."""
    return threshold if short_words is None else rule.text_rule(threshold, short_words)


def _joined(df, key, fingerprint, distance, blocks, split, signature, threshold, narrow=False):
    """The documents, and (key, cluster) of each document whose cluster is
    another's key (the smallest of its component); signatures meet in 8-bit
    bins with ``narrow``."""
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, split,
                                         signature, threshold, narrow=narrow)
    found = _scan(docs, layout, split, rows, "edges") if least is None \
        else _text_scan(docs, layout, split, rows, least, "edges")
    found = found.where(F.col("key_a") != F.col("key_b"))
    edges = _materialize(found.select(F.greatest("key_a", "key_b").alias("u"),
                                      F.least("key_a", "key_b").alias("v")))
    return docs.select("key"), _components(edges)


def from_records(session, records, key="key", fingerprint="fingerprint", signature=None):
    """A DataFrame of ``records`` for :func:`find_all`, :func:`clusters` and
    :func:`dedupe`: (key, fingerprint, meta, signature or None) tuples, as
    :mod:`simhashdb.inputs` reads documents and a text's signature (from
    :func:`simhashdb.fingerprint_with_signature`). Columns ``key``,
    ``fingerprint`` (decimal(20, 0)), ``meta`` where any record has metadata
    (msgpack, as export_parquet writes it) and ``signature`` (default:
    "signature") where any is a text.

    :returns: (the DataFrame, the name of its signature column or None).
    :raises InputError: keys of mixed types, or integers from 2**63.
    :raises InvalidArgumentError: ``signature`` names another column.
    """
    from .. import parquet
    keys, fps, metas, signatures = (list(column) for column in zip(*records)) if records \
        else ([], [], [], [])
    try:
        key_array = pyarrow.array(keys)
    except (pyarrow.ArrowException, OverflowError, TypeError):
        raise InputError("keys must all be strings or all be integers below 2**63") from None
    columns = {key: key_array,
               fingerprint: pyarrow.array(fps, pyarrow.uint64()).cast(pyarrow.decimal128(20, 0))}
    if any(m is not None for m in metas):
        columns["meta"] = parquet.meta_column(metas)
    if not any(s is not None for s in signatures):
        return session.createDataFrame(pyarrow.table(columns)), None
    signature = signature or "signature"
    if signature in columns:
        raise InvalidArgumentError("signature %r names the key, fingerprint or meta column"
                                   % signature)
    columns[signature] = pyarrow.array(signatures, pyarrow.binary())
    return session.createDataFrame(pyarrow.table(columns)), signature


# Documents


# The scan


# The text rule


# Connected components
