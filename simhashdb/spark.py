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

import functools
import math
from decimal import Decimal

from . import _ext, matching, rule
from .errors import (InputError, InvalidArgumentError, InvalidFingerprintError, InvalidKeyError,
                     SimhashDBError)
from .layout import Layout
from .matching import pair_chunks

try:
    import numpy
    import pyarrow
    import pyarrow.compute
    from pyspark.sql import DataFrame, Window, functions as F
    from pyspark.sql.types import (
        BinaryType, DecimalType, DoubleType, IntegerType, IntegralType, LongType, StringType,
        StructField, StructType)
except ImportError as exc:  # pragma: no cover - the spark extra is not installed
    raise ImportError("simhashdb.spark needs pyspark: pip install '.[spark]' in simhashdb's "
                      "source directory") from exc

DEFAULT_SPLIT = 20_000
ROWS_PER_TASK = 2_000_000   # rows one scan task holds, about 50 bytes each and the key
SAMPLE_PER_SPLIT = 16       # sampled rows expected from a group of ``split`` fingerprints
SHUFFLE_COST = 1000         # pair comparisons a row through a shuffle costs (see docs/spark.md)
MAX_ROUNDS = 64             # large-star / small-star rounds before giving up
PAIR_CHUNK = 1 << 20        # pairs per Arrow batch out of a scan
TEXT_ROWS_PER_TASK = 250_000  # rows with a signature one scan task holds, about 300 bytes each
BAND_SPLIT = 10             # a band group is split at split / BAND_SPLIT texts: a pair of texts
                            # costs a resemblance, ~0.4 us, ten times a pair of fingerprints
DECIDE_CHUNK = 1 << 16      # pairs of texts decided at once (their bins side by side)
OLD_ROWS_PER_SCAN = 1 << 18  # old rows scanned at once beside the new fingerprints
SHIPPED_ROWS = ROWS_PER_TASK  # new rows whose fingerprints go to every task of the old corpus
SMALL_GROUP = 32            # band groups of at most this many texts are decided in numpy
SIGNATURE_BYTES, BANDS = _ext.SIGNATURE_BYTES, _ext.BANDS  # a text's signature, its band keys

# The tag of a scanned row: table in bits 0-15, side in 16-17 (0: a whole
# group or the diagonal cell of a split one; 2 and 3: the two parts of an
# off-diagonal cell), cell (0 for a group not split) from bit 18. A task scans
# the rows of one tag but the low side bit together: cells of two hot groups
# may share a number, but then never a prefix, and one is off-diagonal only
# if the other is.
SIDE_SHIFT, CELL_SHIFT = 16, 18
TABLE_BITS, PART_BIT = (1 << SIDE_SHIFT) - 1, 1 << SIDE_SHIFT
TWO_63, TWO_64 = 1 << 63, 1 << 64


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
        signatures (256 bytes, from :func:`simhashdb.fingerprint_with_signature`
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
        (on either side), or a signature that is not 256 bytes.
    :raises InvalidFingerprintError: a row with no valid fingerprint (null,
        out of range, not 8 bytes).
    :raises InvalidKeyError: a row with a null key.
    """
    threshold = _text_rule(threshold, short_words)
    if against is not None:
        within = find_all(df, distance, blocks, key, fingerprint, split, signature, threshold)
        return within.withColumn("across", F.lit(False)).unionByName(
            _across(df, against, distance, blocks, key, fingerprint, signature, threshold,
                    against_columns).withColumn("across", F.lit(True)))
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, split,
                                         signature, threshold)
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
    near-duplicates. The old corpus is read (two passes; three with
    signatures) but not shuffled whole, and its documents are never paired
    among themselves (see the module's docstring). ``blocks`` is then that
    of the new rows' clusters; the probes of the old corpus take the
    database's blocks for their sizes."""
    threshold = _text_rule(threshold, short_words)
    if against is not None:
        across = _across(df, against, distance, None, key, fingerprint, signature, threshold,
                         against_columns)
        seen = across.select(F.col("key_a").alias(key)).distinct()
        df = _materialize(df.join(seen, key, "left_anti"))
        dropped = _dropped_in_memory(df, key, fingerprint, distance, blocks, signature,
                                     threshold)
        if dropped is not None:
            return df.join(F.broadcast(dropped), key, "left_anti")
    _, joined = _joined(df, key, fingerprint, distance, blocks, split, signature, threshold)
    return df.join(joined.select(F.col("key").alias(key)), key, "left_anti")


def _joined(df, key, fingerprint, distance, blocks, split, signature, threshold):
    """The documents, and (key, cluster) of each document whose cluster is
    another's key (the smallest of its component)."""
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, split,
                                         signature, threshold)
    found = _scan(docs, layout, split, rows, "edges") if least is None \
        else _text_scan(docs, layout, split, rows, least, "edges")
    found = found.where(F.col("key_a") != F.col("key_b"))
    edges = _materialize(found.select(F.greatest("key_a", "key_b").alias("u"),
                                      F.least("key_a", "key_b").alias("v")))
    return docs.select("key"), _components(edges)


def _dropped_in_memory(df, key, fingerprint, distance, blocks, signature, threshold):
    """The keys of ``df`` that are not the smallest of their cluster (a
    DataFrame of one column, named ``key``), found on the driver by
    :mod:`simhashdb.matching` where ``df`` has no more rows than one scan
    task holds (else None): a new segment's survivors, one job."""
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, DEFAULT_SPLIT,
                                         signature, threshold)
    if rows > (ROWS_PER_TASK if least is None else TEXT_ROWS_PER_TASK):
        return None
    table = docs.toArrow()
    keys = table.column("key").combine_chunks()
    fps = table.column("fp").combine_chunks().to_numpy(zero_copy_only=False).view(numpy.uint64)
    if least is None:
        pairs = (numpy.frombuffer(chunk, numpy.uint64) for chunk in pair_chunks(fps, layout))
    else:
        found = numpy.array([(i, j) for i, j, _ in matching.text_pairs(
            fps.tolist(), table.column("sig").to_pylist(), layout, least)], numpy.uint64)
        pairs = [found.ravel()]
    distinct = keys.unique()
    order = pyarrow.compute.sort_indices(distinct)   # a key's node: its rank, so a
    rank = numpy.empty(len(distinct), numpy.uint64)  # component's label is its least key
    rank[order.to_numpy()] = numpy.arange(len(distinct), dtype=numpy.uint64)
    node = rank[pyarrow.compute.index_in(keys, distinct).to_numpy()]
    labels = numpy.frombuffer(matching.components(len(distinct), (
        numpy.ascontiguousarray(node[chunk.astype(numpy.intp)]) for chunk in pairs)), numpy.uint64)
    dropped = distinct.take(order).filter(labels != numpy.arange(len(distinct)))
    return df.sparkSession.createDataFrame(pyarrow.table({key: dropped}))


def _across(df, against, distance, blocks, key, fingerprint, signature, threshold, columns):
    """The pairs ``(key_a, key_b, distance[, resemblance])`` of a row of
    ``df`` (a) and a row of ``against`` (b, its columns named by
    ``columns``), by the rule :func:`find_all` applies, each pair once (rows
    of one key, fingerprint and signature are one row)."""
    named = dict(key=key, fingerprint=fingerprint, signature=signature)
    if columns is not None and (not isinstance(columns, dict) or set(columns) - set(named)):
        raise InvalidArgumentError("against_columns maps 'key', 'fingerprint' and 'signature' "
                                   "to the old corpus's column names, got %r" % (columns,))
    old_names = dict(named, **(columns or {}))
    if signature is None:
        old_names["signature"] = None
    elif old_names["signature"] not in against.columns and "signature" not in (columns or {}):
        against = against.withColumn(old_names["signature"], F.lit(None).cast(BinaryType()))
    new, _, new_rows, least = _prepare(df, key, fingerprint, distance, distance + 1,
                                       DEFAULT_SPLIT, signature, threshold, "the new rows")
    old, _, old_rows, _ = _prepare(against, old_names["key"], old_names["fingerprint"], distance,
                                   distance + 1, DEFAULT_SPLIT, old_names["signature"], threshold,
                                   "the old corpus (against; against_columns names its columns)")
    types = [docs.schema["key"].dataType.simpleString() for docs in (new, old)]
    if types[0] != types[1]:
        raise InvalidArgumentError("the key columns of the new rows (%s) and of the old ones (%s) "
                                   "must be of one type" % tuple(types))
    if least is None and new_rows <= SHIPPED_ROWS:
        return _across_by_distance(new, old, distance)
    layout = Layout(blocks or Layout.choose_blocks(distance, new_rows + old_rows), distance)
    text = least is not None
    ids = [F.xxhash64("key", "fp", *(["sig"] if text else [])).alias("u1"),
           F.xxhash64(F.lit(BANDS), "key", "fp", *(["sig"] if text else [])).alias("u2")]
    new, old = (docs.select("*", *ids) for docs in (new, old))
    candidates = _probe_pairs(_table_keys(new, layout), _table_keys(old, layout), False)
    if text:
        candidates = candidates.unionByName(_probe_pairs(*(
            docs.where(F.col("sig").isNotNull()).select("sig", "u1", "u2").mapInArrow(
                _band_keys, "bk long, u1 long, u2 long").select(
                F.col("bk").alias("probe"), "u1", "u2") for docs in (new, old)), True))
    found = _materialize(candidates.groupBy("u1_a", "u2_a", "u1_b", "u2_b").agg(
        F.max("banded").alias("banded")))
    pairs = found.join(_renamed(new, "a"), ["u1_a", "u2_a"]).join(
        _renamed(old.join(F.broadcast(found.select(F.col("u1_b").alias("u1"),
                                                   F.col("u2_b").alias("u2")).distinct()),
                          ["u1", "u2"], "left_semi"), "b"), ["u1_b", "u2_b"])
    between = F.bit_count(F.col("fp_a").bitwiseXOR(F.col("fp_b"))).cast("int").alias("distance")
    if not text:
        return pairs.select("key_a", "key_b", between).where(F.col("distance") <= distance)
    return pairs.select("key_a", "key_b", between, "banded", "sig_a", "sig_b").mapInArrow(
        functools.partial(_resemblance_partition, least, distance),
        _pair_schema(new.select("key"), True))


def _across_by_distance(new, old, distance):
    """The pairs ``(key_a, key_b, distance)`` of a new and an old row within
    ``distance``, each once: the new rows' distinct fingerprints go to every
    task of one pass over the old rows, which scans them beside its own (the
    old rows are neither shuffled nor paired among themselves)."""
    values = new.select("fp").distinct().toArrow().column(0).combine_chunks()
    values = numpy.sort(values.to_numpy(zero_copy_only=False).view(numpy.uint64))
    cores = new.sparkSession.sparkContext.defaultParallelism
    if old.rdd.getNumPartitions() < cores:   # a corpus in one Parquet row group: one task
        old = old.repartition(cores)
    schema = StructType([StructField("fp_a", LongType()),
                         StructField("key_b", old.schema["key"].dataType),
                         StructField("distance", IntegerType())])
    near = old.select(F.col("key").alias("key_b"), "fp").mapInArrow(
        functools.partial(_near_partition, values, distance), schema)
    return near.join(new.select(F.col("key").alias("key_a"), F.col("fp").alias("fp_a")), "fp_a") \
        .select("key_a", "key_b", "distance").distinct()


def _near_partition(values, distance, batches):
    """mapInArrow over old (key_b, fp) rows: (fp_a, key_b, distance) of each
    of ``values`` (the new fingerprints, sorted) within ``distance`` of a row,
    the rows taken in scans of at least as many as ``values``."""
    pending, rows = [], 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= max(len(values), OLD_ROWS_PER_SCAN):
            yield from _near_rows(values, distance, pending)
            pending, rows = [], 0
    if pending:
        yield from _near_rows(values, distance, pending)


def _near_rows(values, distance, batches):
    """The pairs of :func:`_near_partition` of one scan's old rows."""
    key, fp = _concatenated(batches)
    fp = fp.to_numpy().view(numpy.uint64)
    if not len(values) or not len(fp):
        return
    both = numpy.concatenate([values, fp])
    sides = numpy.repeat(numpy.array([0, 1], numpy.uint8), [len(values), len(fp)])
    layout = Layout(Layout.choose_blocks(distance, len(both)), distance)
    for pairs in pair_chunks(both, layout, chunk=PAIR_CHUNK, sides=sides):
        positions = numpy.frombuffer(pairs, numpy.uint64).astype(numpy.intp).reshape(-1, 2)
        a, b = positions.min(axis=1), positions.max(axis=1) - len(values)
        between = numpy.frombuffer(_ext.num_differing_bits_many(values[a], fp[b]), numpy.uint8)
        yield pyarrow.RecordBatch.from_arrays(
            [pyarrow.array(values[a].view(numpy.int64)), key.take(pyarrow.array(b)),
             pyarrow.array(between.astype("int32"))], names=["fp_a", "key_b", "distance"])


def _table_keys(docs, layout):
    """(probe, u1, u2): a hash of each table and the document's leading blocks in it."""
    masks = F.array(*[F.lit(_signed(m)) for m in _lead_masks(layout)])
    table = F.explode(F.sequence(F.lit(0), F.lit(layout.tables - 1))).alias("t")
    rows = docs.select(table, "fp", "u1", "u2")
    return rows.select(F.xxhash64("t", F.col("fp").bitwiseAND(
        F.element_at(masks, F.col("t") + 1))).alias("probe"), "u1", "u2")


def _probe_pairs(new, old, banded):
    """(u1_a, u2_a, u1_b, u2_b, banded) of each new and old document that share
    a probe key (a band key: ``banded``): the old rows first kept by a
    broadcast of the new rows' keys."""
    shared = old.join(F.broadcast(new.select("probe").distinct()), "probe", "left_semi")
    return new.select("probe", F.col("u1").alias("u1_a"), F.col("u2").alias("u2_a")).join(
        shared.select("probe", F.col("u1").alias("u1_b"), F.col("u2").alias("u2_b")),
        "probe").select("u1_a", "u2_a", "u1_b", "u2_b", F.lit(banded).alias("banded"))


def _renamed(docs, side):
    return docs.select(*[F.col(c).alias("%s_%s" % (c, side)) for c in docs.columns])


def _resemblance_partition(threshold, distance, batches):
    """mapInArrow: of (key_a, key_b, distance, banded, sig_a, sig_b) candidate
    pairs, those the text rule keeps: two texts that share a band or are
    within ``distance`` by their resemblance, any other pair by its distance."""
    for batch in batches:
        a, has_a = _signatures(batch.column(4))
        b, has_b = _signatures(batch.column(5))
        texts = has_a & has_b
        rows = numpy.arange(len(texts))
        scores = numpy.full(len(texts), numpy.nan)
        both, x, y = numpy.concatenate([a, b]), rows[texts], rows[texts] + len(texts)
        scores[texts] = rule.resemblances(both, x, y)
        passed = numpy.zeros(len(texts), bool)
        passed[texts] = rule.passing(both, x, y, scores[texts], threshold)
        between, banded = batch.column(2).to_numpy(), batch.column(3).to_numpy(False)
        near = between <= distance
        keep = rule.kept_pairs(texts, banded, near, passed)
        if keep.any():
            kept = pyarrow.array(numpy.flatnonzero(keep))
            yield pyarrow.RecordBatch.from_arrays(
                [batch.column(0).take(kept), batch.column(1).take(kept),
                 batch.column(2).take(kept),
                 pyarrow.array(scores[keep], mask=numpy.isnan(scores[keep]))],
                names=["key_a", "key_b", "distance", "resemblance"])


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
    from . import parquet
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


def choose_blocks(distance, documents):
    """The block count of :meth:`Layout.choose_blocks` where a table costs
    SHUFFLE_COST pair comparisons a row: each table sends every fingerprint
    through a shuffle, then compares the pairs of each group (half of the
    candidates a database probe meets). Fewer tables than the database's."""
    return Layout.choose_blocks(distance, documents, table_cost=2 * SHUFFLE_COST)


# Documents


def _text_rule(threshold, short_words):
    """The threshold the public functions pass on: as given, or with
    ``short_words`` a checked :class:`simhashdb.rule.Threshold`."""
    return threshold if short_words is None else rule.text_rule(threshold, short_words)


def _prepare(df, key, fingerprint, distance, blocks, split, signature=None, threshold=None,
             whose="the DataFrame"):
    """Check the arguments and every row; the documents as (key, fp: signed
    long, and with ``signature`` sig: 256 bytes or null), the layout, the
    number of rows, and the text rule's threshold (None without ``signature``).
    ``whose`` names the DataFrame in the errors of its columns."""
    if not isinstance(df, DataFrame):
        raise InvalidArgumentError("expected a pyspark DataFrame, got %s" % type(df).__name__)
    if not isinstance(split, int) or isinstance(split, bool) or split < 2:
        raise InvalidArgumentError("split must be an int >= 2, got %r" % (split,))
    Layout(distance + 1 if blocks is None and isinstance(distance, int) else blocks, distance)
    if signature is None and threshold is not None:
        raise InvalidArgumentError("threshold is the text rule's: name the signature column too")
    least = None if signature is None else threshold if isinstance(
        threshold, rule.Threshold) else rule.text_rule(threshold)
    fields = {f.name: f.dataType for f in df.schema.fields}
    named = ((key, "key"), (fingerprint, "fingerprint")) + (
        ((signature, "signature"),) if signature is not None else ())
    for name, what in named:
        if not isinstance(name, str) or name not in fields:
            raise InvalidArgumentError("%s: no %s column %r (its columns: %s)"
                                       % (whose, what, name, ", ".join(fields)))
    if not isinstance(fields[key], (StringType, BinaryType, IntegralType, DecimalType)):
        raise InvalidArgumentError("key column %r is %s; keys must be strings, binary or "
                                   "integers" % (key, fields[key].simpleString()))
    fp, bad = _fingerprint_column(F.col(fingerprint), fields[fingerprint], fingerprint)
    sig, bad_sig = F.lit(None), F.lit(False)
    if signature is not None:
        if not isinstance(fields[signature], BinaryType):
            raise InvalidArgumentError(
                "signature column %r is %s; expected binary (the 256 bytes of "
                "simhashdb.fingerprint_with_signature, or null)"
                % (signature, fields[signature].simpleString()))
        sig = F.col(signature)
        bad_sig = sig.isNotNull() & (F.length(sig) != SIGNATURE_BYTES)
        sig = F.when(sig != F.lit(bytearray(SIGNATURE_BYTES)), sig)  # all zero: no text
    rows, null_keys, bad_rows, example, bad_sigs, sig_example = df.agg(
        F.count(F.lit(1)), F.count_if(F.col(key).isNull()), F.count_if(bad),
        F.first(F.when(bad, F.col(key).cast("string")), ignorenulls=True),
        F.count_if(bad_sig),
        F.first(F.when(bad_sig, F.col(key).cast("string")), ignorenulls=True)).first()
    if null_keys:
        raise InvalidKeyError("%d rows have a null key; every document needs one" % null_keys)
    if bad_rows:
        raise InvalidFingerprintError(
            "%d rows have no valid fingerprint in column %r (null, or not 64 bits: a long, a "
            "decimal in [0, 2**64) or 8 bytes), e.g. the row of key %s"
            % (bad_rows, fingerprint, example))
    if bad_sigs:
        raise InvalidArgumentError(
            "%d rows have a signature in column %r that is not %d bytes (null is a document "
            "without text), e.g. the row of key %s"
            % (bad_sigs, signature, SIGNATURE_BYTES, sig_example))
    if blocks is None:
        blocks = choose_blocks(distance, rows)
    layout = Layout(blocks, distance)
    columns = [F.col(key).alias("key"), fp.alias("fp")] + (
        [sig.alias("sig")] if signature is not None else [])
    return df.select(*columns), layout, rows, least


def _fingerprint_column(col, dtype, name):
    """The fingerprint as a signed long, and the test of a bad value."""
    if isinstance(dtype, LongType):
        return col, col.isNull()
    if isinstance(dtype, DecimalType) and dtype.scale == 0 and dtype.precision <= 20:
        wrapped = (col - F.lit(Decimal(TWO_64))).cast("long")
        signed = F.when(col >= F.lit(Decimal(TWO_63)), wrapped).otherwise(col.cast("long"))
        return signed, col.isNull() | (col < 0) | (col >= F.lit(Decimal(TWO_64)))
    if isinstance(dtype, BinaryType):
        return F.conv(F.hex(col), 16, -10).cast("long"), col.isNull() | (F.length(col) != 8)
    raise InvalidArgumentError(
        "fingerprint column %r is %s; expected long (the 64 bits as a signed long), "
        "decimal(20,0) or 8-byte binary" % (name, dtype.simpleString()))


# The scan


def _scan(docs, layout, split, documents, mode, threshold=None):
    """Pairs of keys within the layout's distance, as ``(key_a, key_b,
    distance)`` in no order: every pair (``mode="pairs"``), or (``"edges"``)
    enough of them to connect what the pairs connect: one pair of keys for
    each pair of fingerprints, and the keys of a fingerprint joined to one of
    them. ``docs`` has ``documents`` rows.

    With a ``threshold``, the distance half of the text rule over the ``sig``
    column (see :func:`_text_scan`): ``(key_a, key_b, distance,
    resemblance)``, a pair of two texts kept when they share no band and
    their resemblance reaches the threshold, any other pair by its distance."""
    session = docs.sparkSession
    tables = layout.tables
    carried = ["fp", "key"] + (["sig"] if threshold is not None else [])
    rows = docs.select(F.explode(F.sequence(F.lit(0), F.lit(tables - 1))).alias("t"), *carried)
    prefix_masks = F.array(*[F.lit(_signed(m)) for m in _lead_masks(layout)])
    hot = _hot_groups(docs, layout, split, prefix_masks, documents)
    tag = F.col("t").cast("long")
    replicated = 0
    if hot:
        # each part of a hot group goes to every cell (pair of parts) it belongs to
        replicated = sum(n * parts for _, _, parts, n in hot)
        groups = session.createDataFrame([row[:3] for row in hot], "t int, g long, parts int")
        rows = rows.join(F.broadcast(groups), (rows.t == groups.t) & (
            rows.fp.bitwiseAND(F.element_at(prefix_masks, rows.t + 1)) == groups.g), "left") \
            .select(rows.t, *carried, "parts")
        rows, cell = _cells(rows, F.pmod(F.xxhash64("fp"), F.col("parts")))
        tag = tag.bitwiseOR(cell)
    rows = rows.select(tag.alias("tag"), *carried)
    group = F.col("tag").bitwiseAND(F.lit(~PART_BIT))
    prefix = F.col("fp").bitwiseAND(
        F.element_at(prefix_masks, F.col("tag").bitwiseAND(F.lit(TABLE_BITS)).cast("int") + 1))
    per_task = ROWS_PER_TASK if threshold is None else TEXT_ROWS_PER_TASK
    partitions = _partitions(session, documents * tables + replicated, per_task)
    schema = _pair_schema(docs, threshold is not None)
    if threshold is None:
        scan = functools.partial(_scan_partition, layout, mode == "pairs")
    else:
        scan = functools.partial(_scan_text_partition, layout, mode == "pairs", threshold)
    return rows.repartition(partitions, group, prefix).mapInArrow(scan, schema)


def _cells(rows, part):
    """Rows with ``parts`` (null for a group not split) and their ``part`` of
    it, sent to every cell (pair of parts) their part belongs to; and the tag
    bits of their side and cell."""
    rows = rows.withColumn("part", part).withColumn("q", F.explode(
        F.when(F.col("parts").isNull(), F.array(F.lit(0)))
        .otherwise(F.sequence(F.lit(0), F.col("parts") - 1))))
    lo, hi = F.least("part", "q"), F.greatest("part", "q")
    side = F.when(F.col("parts").isNull() | (lo == hi), 0) \
        .when(F.col("part") == lo, 2).otherwise(3)
    cell = F.when(F.col("parts").isNull(), 0).otherwise(1 + lo * F.col("parts") + hi)
    return rows, F.shiftleft(side.cast("long"), SIDE_SHIFT) \
        .bitwiseOR(F.shiftleft(cell.cast("long"), CELL_SHIFT))


def _partitions(session, rows, per_task):
    """Scan tasks for ``rows`` rows, ``per_task`` a task, in whole waves."""
    cores = session.sparkContext.defaultParallelism   # tasks in a wave
    return cores * max(1, math.ceil(rows / per_task / cores))


def _pair_schema(docs, text):
    key_type = docs.schema["key"].dataType
    return StructType([StructField("key_a", key_type), StructField("key_b", key_type),
                       StructField("distance", IntegerType())] +
                      ([StructField("resemblance", DoubleType())] if text else []))


# The text rule


def _text_scan(docs, layout, split, documents, threshold, mode):
    """The pairs of the text rule, ``(key_a, key_b, distance, resemblance)``,
    as :func:`_scan`'s ``mode`` says: those of two texts that share a band
    (the band stage), and those within the distance (the table scan with the
    signatures along, which leaves out two texts that share a band). A pair
    comes from one stage only, and from one group in it."""
    return _band_scan(docs, split, threshold, mode).unionByName(
        _scan(docs, layout, split, documents, mode, threshold))


def _band_scan(docs, split, threshold, mode):
    """The band stage: pairs of texts whose first shared band is the band of
    their group, with their resemblance at least ``threshold``.

    Each text has a band key in each of the BANDS bands; only the (band, band
    key) groups of two texts or more need their signatures, so first the
    groups are counted over (band key, document id) rows of 24 bytes (the id
    two 64-bit hashes of key, fingerprint and signature), those of one text
    dropped and the rest checkpointed; then the signatures are joined to them
    by id, and each group is scanned natively (``_ext.band_pairs`` with
    ``only_band``). A group of more than ``split / BAND_SPLIT`` texts (counted
    exactly) is cut into parts by document id, every pair of parts a task of
    its own, as the table scan cuts a hot prefix."""
    session = docs.sparkSession
    texts = docs.where(F.col("sig").isNotNull()).select(
        "key", "fp", "sig", F.xxhash64("key", "fp", "sig").alias("u1"),
        F.xxhash64(F.lit(BANDS), "key", "fp", "sig").alias("u2"))
    keyed = texts.select("sig", "u1", "u2").mapInArrow(
        _band_keys, "bk long, u1 long, u2 long")
    sharing = F.count(F.lit(1)).over(Window.partitionBy("bk"))
    shared = _materialize(keyed.withColumn("n", sharing).where(F.col("n") > 1))
    shared_rows, hot = _hot_bands(shared, max(2, split // BAND_SPLIT))
    rows = shared.join(texts, ["u1", "u2"]).select("bk", "u1", "u2", "key", "fp", "sig")
    tag, replicated = F.lit(0).cast("long"), 0
    if hot:
        replicated = sum(n * parts for _, parts, n in hot)
        groups = session.createDataFrame([row[:2] for row in hot], "bk long, parts int")
        rows = rows.join(F.broadcast(groups), "bk", "left")
        rows, tag = _cells(rows, F.pmod(F.col("u1"), F.col("parts")))
    rows = rows.select("bk", tag.alias("tag"), "u1", "u2", "key", "fp", "sig")
    partitions = _partitions(session, shared_rows + replicated, TEXT_ROWS_PER_TASK)
    scan = functools.partial(_band_partition, threshold, mode == "pairs", SMALL_GROUP)
    return rows.repartition(partitions, "bk", F.col("tag").bitwiseAND(F.lit(~PART_BIT))) \
        .mapInArrow(scan, _pair_schema(docs, True))


def _hot_bands(shared, most):
    """The rows of ``shared`` (bk, u1, u2, n), and (band << 32 | band key,
    parts, texts) of each band group of more than ``most`` texts, counted
    exactly (the counts are on the rows already): one job."""
    groups = shared.groupBy("bk").agg(F.max("n").alias("n"))
    total, hot = groups.agg(F.sum("n"), F.collect_list(
        F.when(F.col("n") > most, F.struct("bk", "n")))).first()
    return total or 0, [(bk, math.ceil(n / most), n) for bk, n in hot]


def _band_keys(batches):
    """mapInArrow: (band << 32 | band key, u1, u2) of each band of each text."""
    for batch in batches:
        signatures, _ = _signatures(batch.column(0))
        keys = numpy.empty((len(signatures), BANDS), numpy.int64)
        for i, signature in enumerate(signatures):
            keys[i] = numpy.frombuffer(_ext.bands(signature.tobytes()), numpy.uint32)
        keys |= numpy.arange(BANDS, dtype=numpy.int64) << 32
        yield pyarrow.RecordBatch.from_arrays(
            [pyarrow.array(keys.ravel())] +
            [pyarrow.array(numpy.repeat(batch.column(c).to_numpy(), BANDS)) for c in (1, 2)],
            names=["bk", "u1", "u2"])


def _band_partition(threshold, every_pair, small_group, batches):
    """mapInArrow: the text pairs of each band group (and cell) of a
    partition's (bk, tag, u1, u2, key, fp, sig) rows: every pair, or (edges)
    for a large group one pair for each pair of distinct signatures, and in
    band 0 the texts of one signature joined to one of them.

    Most groups are small (two copies of a page share a dozen bands): those
    of at most ``small_group`` texts are decided together in numpy, as
    ``band_pairs`` decides (a pair only in its first shared band, kept when
    its resemblance reaches the threshold); larger ones one by one, natively."""
    columns = _concatenated(batches)
    if columns is None:
        return
    bk, tag, u1, u2 = (columns[c].to_numpy() for c in range(4))
    key, fp = columns[4], columns[5].to_numpy().view(numpy.uint64)
    signatures, _ = _signatures(columns[6])
    band, side, group = bk >> 32, (tag >> SIDE_SHIFT) & 3, tag & ~PART_BIT
    # rows by group; a document repeated (same key, fingerprint and signature) once
    order = numpy.lexsort((u2, u1, group, bk))
    first = numpy.ones(len(order), bool)   # the first row of its group
    first[1:] = (bk[order][1:] != bk[order][:-1]) | (group[order][1:] != group[order][:-1])
    repeated = ~first
    repeated[1:] &= (u1[order][1:] == u1[order][:-1]) & (u2[order][1:] == u2[order][:-1])
    order, first = order[~repeated], first[~repeated]
    starts = numpy.flatnonzero(first)
    sizes = numpy.diff(numpy.append(starts, len(order)))
    small = (sizes > 1) & (sizes <= small_group)
    bands = _BandKeys(signatures)
    for size in numpy.unique(sizes[small]):
        at = starts[small & (sizes == size)]
        i, j = numpy.triu_indices(size, 1)
        a, b = order[(at[:, None] + i).ravel()], order[(at[:, None] + j).ravel()]
        yield from _band_decided(key, fp, signatures, bands, band, side, a, b, threshold)
    for start, size in zip(starts[sizes > small_group], sizes[sizes > small_group]):
        yield from _large_group(key, fp, signatures, side, order[start:start + size],
                                int(band[order[start]]), threshold, every_pair)


def _band_decided(key, fp, signatures, bands, band, side, a, b, threshold):
    """Of the pairs (a, b) of rows of one band group each, those (across the
    parts of a cell of two) whose first shared band is their group's and
    whose resemblance reaches ``threshold``."""
    for start in range(0, len(a), DECIDE_CHUNK):
        x, y = a[start:start + DECIDE_CHUNK], b[start:start + DECIDE_CHUNK]
        keep = (side[x] == 0) | (side[x] != side[y])
        x, y = x[keep], y[keep]
        earlier = numpy.arange(BANDS) < band[x][:, None]
        keep = ~((bands.of(x) == bands.of(y)) & earlier).any(axis=1)
        x, y = x[keep], y[keep]
        alike = rule.resemblances(signatures, x, y)
        near = rule.passing(signatures, x, y, alike, threshold)
        if near.any():
            yield _text_key_pairs(key, fp, x[near], y[near], alike[near])


def _large_group(key, fp, signatures, side, rows, band, threshold, every_pair):
    """The pairs of one large band group (or cell), by ``_ext.band_pairs``."""
    across = bool(side[rows[0]])
    if not every_pair:  # one text of each signature (on each side of a cell)
        same = numpy.concatenate([side[rows, None].astype(numpy.uint8), signatures[rows]],
                                 axis=1)
        _, first, inverse = numpy.unique(_rows_as_void(same), return_index=True,
                                         return_inverse=True)
        if band == 0 and not across and len(first) < len(rows):
            copies = numpy.flatnonzero(first[inverse] != numpy.arange(len(rows)))
            a, b = rows[first[inverse[copies]]], rows[copies]
            yield _text_key_pairs(key, fp, a, b, numpy.ones(len(a)))
        rows = rows[numpy.sort(first)]
    if len(rows) < 2:
        return
    pairs, scores = _ext.band_pairs(signatures[rows].tobytes(), threshold.least, only_band=band)
    if not len(scores):
        return
    positions = numpy.frombuffer(pairs, numpy.uint64).astype(numpy.intp)
    a, b = rows[positions[0::2]], rows[positions[1::2]]
    scores = numpy.frombuffer(scores, numpy.float64)
    keep = rule.passing(signatures, a, b, scores, threshold)
    if across:  # a cell of two parts: only the pairs across them
        keep &= side[a] != side[b]
    a, b, scores = a[keep], b[keep], scores[keep]
    if len(a):
        yield _text_key_pairs(key, fp, a, b, scores)


def _scan_text_partition(layout, every_pair, threshold, batches):
    """mapInArrow: the distance half of the text rule over a partition's
    (tag, fp, key, sig) rows: pairs within the distance (as
    :func:`_scan_partition` finds them), of which a pair of two texts that
    share a band is left to the band stage and one that shares none is kept
    when its resemblance reaches ``threshold``. Edges: one member for each
    (group, fingerprint, signature), the others without a signature joined
    to it; the members' pairs as above."""
    columns = _concatenated(batches)
    if columns is None:
        return
    tag, fp, key = columns[0].to_numpy(), columns[1].to_numpy().view(numpy.uint64), columns[2]
    signatures, has = _signatures(columns[3])
    group = tag & ~PART_BIT
    members = numpy.arange(len(tag))
    if not every_pair:
        unit = _units(group, fp, signatures)
        copies = numpy.flatnonzero(unit != members)
        # the copies of a document without text pair with it at distance 0, in table 0
        linked = copies[~has[copies] & (tag[copies] & TABLE_BITS == 0) &
                        ((tag[copies] >> SIDE_SHIFT) & 3 == 0)]
        if len(linked):
            yield _text_key_pairs(key, fp, unit[linked], linked, numpy.full(len(linked), numpy.nan))
        members = numpy.flatnonzero(unit == members)
    bands = _BandKeys(signatures)
    for a, b in _row_pairs(layout, tag, fp, group, members, True):
        yield from _decided(key, fp, signatures, has, bands, a, b, threshold)


def _units(group, fp, signatures):
    """For each row, the first row of its (group, fingerprint, signature)."""
    n = len(fp)
    order = numpy.lexsort((signatures[:, :8].copy().view(numpy.uint64).ravel(), fp, group))
    same = numpy.zeros(n, bool)   # same as the row before it in that order
    maybe = numpy.flatnonzero((group[order][1:] == group[order][:-1]) &
                              (fp[order][1:] == fp[order][:-1])) + 1
    same[maybe] = (signatures[order[maybe]] == signatures[order[maybe - 1]]).all(axis=1)
    firsts = order[~same]
    unit = numpy.empty(n, numpy.intp)
    unit[order] = firsts[numpy.cumsum(~same) - 1]
    return unit


class _BandKeys:
    """The band keys of rows' signatures, computed when first asked for."""

    def __init__(self, signatures):
        self.signatures = signatures
        self.keys = numpy.zeros((len(signatures), BANDS), numpy.uint32)
        self.known = numpy.zeros(len(signatures), bool)

    def of(self, rows):
        missing = numpy.unique(rows[~self.known[rows]])
        for i in missing:
            self.keys[i] = numpy.frombuffer(_ext.bands(self.signatures[i].tobytes()),
                                            numpy.uint32)
        self.known[missing] = True
        return self.keys[rows]


def _decided(key, fp, signatures, has, bands, a, b, threshold):
    """The key pairs of the row pairs (a, b) within the distance that the text
    rule keeps: with a document without text, all; of two texts, those that
    share no band and whose resemblance reaches ``threshold``."""
    for start in range(0, len(a), DECIDE_CHUNK):
        x, y = a[start:start + DECIDE_CHUNK], b[start:start + DECIDE_CHUNK]
        scores = numpy.full(len(x), numpy.nan)
        keep = ~(has[x] & has[y])
        texts = numpy.flatnonzero(~keep)
        if len(texts):
            apart = texts[~(bands.of(x[texts]) == bands.of(y[texts])).any(axis=1)]
            alike = rule.resemblances(signatures, x[apart], y[apart])
            near = rule.passing(signatures, x[apart], y[apart], alike, threshold)
            keep[apart[near]] = True
            scores[apart[near]] = alike[near]
        if keep.any():
            yield _text_key_pairs(key, fp, x[keep], y[keep], scores[keep])


def _text_key_pairs(key, fp, a, b, scores):
    """A batch of key pairs, their distance and resemblance (NaN: null)."""
    between = numpy.frombuffer(_ext.num_differing_bits_many(fp[a], fp[b]), numpy.uint8)
    return pyarrow.RecordBatch.from_arrays(
        [key.take(a), key.take(b), pyarrow.array(between.astype("int32")),
         pyarrow.array(scores, mask=numpy.isnan(scores))],
        names=["key_a", "key_b", "distance", "resemblance"])


def _concatenated(batches):
    """The columns of a partition's Arrow batches, each one array; None if none."""
    batches = list(batches)
    if not batches:
        return None
    table = pyarrow.Table.from_batches(batches)
    return [column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            for column in table.columns]


def _signatures(column):
    """A binary column's signatures as an (n, 256) uint8 array (zeros where
    null), and which rows have one."""
    has = column.is_valid().to_numpy(zero_copy_only=False)
    fixed = column.fill_null(pyarrow.scalar(bytes(SIGNATURE_BYTES), column.type)) \
        .cast(pyarrow.binary(SIGNATURE_BYTES))
    data = numpy.frombuffer(fixed.buffers()[1], numpy.uint8)
    start = fixed.offset * SIGNATURE_BYTES
    return data[start:start + len(fixed) * SIGNATURE_BYTES].reshape(-1, SIGNATURE_BYTES), has


def _rows_as_void(matrix):
    """Each row of a 2-d uint8 array as one opaque value (to compare rows whole)."""
    matrix = numpy.ascontiguousarray(matrix)
    return matrix.view(numpy.dtype((numpy.void, matrix.shape[1]))).ravel()


def _hot_groups(docs, layout, split, prefix_masks, documents):
    """(table, prefix, parts, estimated size) of each group a sample of the
    documents says holds more than ``split`` distinct fingerprints."""
    if documents <= split:
        return []
    fraction = min(1.0, SAMPLE_PER_SPLIT / split)
    sample = docs.select("fp").sample(fraction=fraction, seed=0).select(
        F.explode(F.sequence(F.lit(0), F.lit(layout.tables - 1))).alias("t"), "fp")
    counts = sample.groupBy("t", sample.fp.bitwiseAND(
        F.element_at(prefix_masks, sample.t + 1)).alias("g")) \
        .agg(F.count_distinct("fp").alias("count")) \
        .where(F.col("count") > SAMPLE_PER_SPLIT).collect()
    hot = []
    for t, g, count in counts:
        size = count / fraction
        hot.append((t, g, math.ceil(size / split), math.ceil(size)))
    return hot


def _scan_partition(layout, every_pair, batches):
    """mapInArrow: the key pairs of each group (table and cell) of a
    partition's (tag, fp, key) rows."""
    tags, fps, keys = [], [], []
    for batch in batches:
        tags.append(batch.column(0).to_numpy())
        fps.append(batch.column(1).to_numpy().view(numpy.uint64))
        keys.append(batch.column(2))
    if not tags:
        return
    tag, fp, key = numpy.concatenate(tags), numpy.concatenate(fps), pyarrow.concat_arrays(keys)
    for a, b in _row_pairs(layout, tag, fp, tag & ~PART_BIT, numpy.arange(len(tag)), every_pair):
        between = numpy.frombuffer(_ext.num_differing_bits_many(fp[a], fp[b]), numpy.uint8)
        yield _key_pairs(key, a, b, between)


def _row_pairs(layout, tag, fp, group, rows, every_pair):
    """The pairs of ``rows`` within the distance in each group (table and
    cell), as arrays of rows (a, b), a chunk at a time; then, in table 0
    only, those of identical fingerprints. Rows of one fingerprint in a
    group pair with every row of the other (``every_pair``) or only through
    their fingerprint's first row."""
    order = rows[numpy.argsort(group[rows], kind="stable")]
    starts = numpy.flatnonzero(numpy.diff(group[order])) + 1
    for rows in numpy.split(order, starts):
        table = int(group[rows[0]]) & TABLE_BITS
        values, first, inverse, counts = numpy.unique(
            fp[rows], return_index=True, return_inverse=True, return_counts=True)
        by_value = rows[numpy.argsort(inverse, kind="stable")]   # rows of value 0, 1, ...
        offsets = numpy.cumsum(counts) - counts
        sides = ((tag[rows[first]] >> SIDE_SHIFT) & 3).astype(numpy.uint8)
        across = bool(sides[0])
        for pairs in pair_chunks(values, layout, chunk=PAIR_CHUNK, table=table,
                                 sides=sides if across else None):
            positions = numpy.frombuffer(pairs, dtype=numpy.uint64).astype(numpy.intp)
            a, b = positions[0::2], positions[1::2]
            a, b = _expand(a, b, counts, offsets) if every_pair else (offsets[a], offsets[b])
            yield by_value[a], by_value[b]
        if table == 0 and not across:  # identical fingerprints, once: in table 0
            a, b = _identical(counts, offsets, every_pair)
            if len(a):
                yield by_value[a], by_value[b]


def _expand(a, b, counts, offsets):
    """Every pair of rows of the value pairs (a, b): rows sorted by value, value
    v in rows offsets[v] to offsets[v] + counts[v]."""
    across = counts[a] * counts[b]
    if (across == 1).all():
        return offsets[a], offsets[b]
    pair = numpy.repeat(numpy.arange(len(a)), across)
    nth = numpy.arange(len(pair)) - numpy.repeat(numpy.cumsum(across) - across, across)
    width = counts[b][pair]
    return offsets[a][pair] + nth // width, offsets[b][pair] + nth % width


def _identical(counts, offsets, every_pair):
    """Pairs of rows of one value: all of them, or each row with the value's first."""
    n = int(counts.sum())
    nth = numpy.arange(n) - numpy.repeat(offsets, counts)   # a row's place among its value's
    if not every_pair:
        later = numpy.flatnonzero(nth > 0)
        return later - nth[later], later
    after = numpy.repeat(counts, counts) - 1 - nth           # rows after it of the same value
    a = numpy.repeat(numpy.arange(n), after)
    b = a + 1 + numpy.arange(len(a)) - numpy.repeat(numpy.cumsum(after) - after, after)
    return a, b


def _key_pairs(key, a, b, between):
    return pyarrow.RecordBatch.from_arrays(
        [key.take(a), key.take(b), pyarrow.array(between.astype("int32"))],
        names=["key_a", "key_b", "distance"])


# Connected components


def _components(edges):
    """(key, cluster) of every node of an edge (u, v), u > v, but the smallest
    of each component, which is the cluster. Alternates large-star and
    small-star until every component is a star around its smallest node."""
    for _ in range(MAX_ROUNDS):
        if _stars(edges):
            return edges.select(F.col("u").alias("key"), F.col("v").alias("cluster"))
        edges = _materialize(_small_star(_large_star(edges)))
    raise SimhashDBError("connected components did not settle in %d rounds" % MAX_ROUNDS)


def _large_star(edges):
    """Join every node's larger neighbours to its smallest neighbour (or itself)."""
    both = edges.unionByName(edges.select(F.col("v").alias("u"), F.col("u").alias("v")))
    smallest = F.least(F.min("v").over(Window.partitionBy("u")), F.col("u"))
    return both.withColumn("m", smallest).where(F.col("v") > F.col("u")) \
        .select(F.col("v").alias("u"), F.col("m").alias("v"))


def _small_star(edges):
    """Join every node and its smaller neighbours to the smallest of them."""
    linked = edges.withColumn("m", F.min("v").over(Window.partitionBy("u")))
    return linked.select(F.explode(F.array("u", "v")).alias("u"), F.col("m").alias("v")) \
        .where(F.col("u") != F.col("v")).distinct()


def _stars(edges):
    """True when every node has at most one smaller neighbour and no node has
    both a smaller and a larger one: each component a star around its minimum."""
    roles = edges.select(F.col("u").alias("node"), F.lit(1).alias("up"), F.lit(0).alias("down")) \
        .unionByName(edges.select(F.col("v").alias("node"), F.lit(0).alias("up"),
                                  F.lit(1).alias("down")))
    counts = roles.groupBy("node").agg(F.sum("up").alias("up"), F.max("down").alias("down"))
    return counts.where((F.col("up") > 1) | ((F.col("up") > 0) & (F.col("down") > 0))).isEmpty()


def _materialize(df):
    """``df`` computed once and cut from its lineage (a checkpoint where the
    context has a checkpoint directory, else a local one)."""
    if df.sparkSession.sparkContext.getCheckpointDir():
        return df.checkpoint()
    return df.localCheckpoint()


# Layout helpers


def _lead_masks(layout):
    """Per table, the mask of the bits of its leading blocks (in fingerprint order)."""
    return [sum(layout.block_masks[b] for b in lead) for lead in layout.leading]


def _signed(x):
    """A uint64 as the signed long with the same bits."""
    return x - TWO_64 if x >= TWO_63 else x
