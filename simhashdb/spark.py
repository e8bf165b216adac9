"""Corpus-wide near-duplicates on Spark: every pair, the clusters, and one
document kept per cluster, for a DataFrame of (key, fingerprint) documents of
any size. The answers are those of :meth:`simhashdb.DB.find_all` and
:meth:`simhashdb.DB.clusters` on the same documents.

The method is the database's. Each distinct fingerprint goes to every
permutation table, grouped by the table's leading blocks; each group is
scanned by the native pair scanner over Arrow batches (``mapInArrow``), which
keeps a pair only in the first table whose leading blocks it shares, so no
pair is found twice and no global distinct is needed. A group estimated
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
identify documents (one row a key).
"""

import functools
import math
from decimal import Decimal

from . import _ext
from .errors import InvalidArgumentError, InvalidFingerprintError, InvalidKeyError, SimhashDBError
from .layout import Layout

try:
    from pyspark.sql import DataFrame, Window, functions as F
    from pyspark.sql.types import BinaryType, DecimalType, IntegralType, LongType, StringType
except ImportError as exc:  # pragma: no cover - the spark extra is not installed
    raise ImportError("simhashdb.spark needs pyspark: pip install 'simhashdb[spark]'") from exc

DEFAULT_SPLIT = 20_000
ROWS_PER_TASK = 2_000_000   # (table, fingerprint) rows one scan task holds, about 50 bytes each
SAMPLE_PER_SPLIT = 16       # sampled rows expected from a group of ``split`` fingerprints
MAX_ROUNDS = 64             # large-star / small-star rounds before giving up
PAIR_CHUNK = 1 << 20        # pairs per Arrow batch out of a scan

# The tag of a scanned row: table in bits 0-15, side in 16-17 (0: a whole
# group or the diagonal cell of a split one; 1 and 2: the two parts of an
# off-diagonal cell), cell (0 for a group not split) from bit 18.
SIDE_SHIFT, CELL_SHIFT = 16, 18
TABLE_BITS, SIDE_BITS = (1 << SIDE_SHIFT) - 1, 3 << SIDE_SHIFT
TWO_63, TWO_64 = 1 << 63, 1 << 64


def find_all(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
             split=DEFAULT_SPLIT):
    """Every pair of documents within ``distance`` bits, each unordered pair
    once: a DataFrame ``(key_a, key_b, distance)`` with ``key_a < key_b``.

    Documents with identical fingerprints pair up at distance 0. Runs two
    quick jobs (validation, a sample for hot prefixes) when called; the
    pairs are computed when the result is.

    :param df: a DataFrame with a ``key`` and a ``fingerprint`` column.
    :param int distance: the largest Hamming distance of a pair.
    :param int blocks: blocks per fingerprint, more than ``distance``
        (default: chosen for the number of documents, as the database does).
    :param int split: a group of more fingerprints than this (estimated) is
        scanned in parts of about this size.
    :raises InvalidArgumentError: bad parameters, columns or column types.
    :raises InvalidFingerprintError, InvalidKeyError: a row with no valid
        fingerprint (null, out of range, not 8 bytes) or a null key.
    """
    docs, layout, rows = _prepare(df, key, fingerprint, distance, blocks, split)
    near = _fingerprint_pairs(docs, layout, split, rows)
    a = docs.select(F.col("key").alias("key_a"), F.col("fp").alias("a"))
    b = docs.select(F.col("key").alias("key_b"), F.col("fp").alias("b"))
    expanded = near.join(a, "a").join(b, "b").select(
        F.least("key_a", "key_b").alias("key_a"), F.greatest("key_a", "key_b").alias("key_b"),
        "distance")
    identical = a.join(b, F.col("a") == F.col("b")).where(F.col("key_a") < F.col("key_b")) \
        .select("key_a", "key_b", F.lit(0).alias("distance"))
    return expanded.unionByName(identical)


def clusters(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
             split=DEFAULT_SPLIT):
    """The cluster of every document: a DataFrame ``(key, cluster)`` where
    ``cluster`` is the smallest key of the document's connected component in
    the graph of pairs within ``distance`` (a document alone is its own).

    Finds the components when called (a few Spark jobs a round); the result
    is a DataFrame over them. Parameters and errors as :func:`find_all`.
    """
    docs, layout, rows = _prepare(df, key, fingerprint, distance, blocks, split)
    edges = _materialize(_fingerprint_pairs(docs, layout, split, rows).select(
        F.greatest("a", "b").alias("u"), F.least("a", "b").alias("v")))
    labels = _components(edges)
    labelled = docs.join(labels, "fp", "left").select(
        "key", F.coalesce("label", "fp").alias("label"))
    smallest = labelled.groupBy("label").agg(F.min("key").alias("cluster"))
    return labelled.join(smallest, "label").select("key", "cluster")


def dedupe(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
           split=DEFAULT_SPLIT):
    """The rows of ``df`` less near-duplicates: of each cluster (see
    :func:`clusters`) only the document with the smallest key is kept, whatever
    the partitioning. Columns and types are ``df``'s."""
    kept = clusters(df, distance, blocks, key, fingerprint, split) \
        .where(F.col("key") == F.col("cluster")).select(F.col("key").alias(key))
    return df.join(kept, key, "left_semi")


# Documents


def _prepare(df, key, fingerprint, distance, blocks, split):
    """Check the arguments and every row; the documents as (key, fp: signed
    long), the layout, and the number of rows."""
    if not isinstance(df, DataFrame):
        raise InvalidArgumentError("expected a pyspark DataFrame, got %s" % type(df).__name__)
    if not isinstance(split, int) or isinstance(split, bool) or split < 2:
        raise InvalidArgumentError("split must be an int >= 2, got %r" % (split,))
    Layout(distance + 1 if blocks is None and isinstance(distance, int) else blocks, distance)
    fields = {f.name: f.dataType for f in df.schema.fields}
    for name, what in ((key, "key"), (fingerprint, "fingerprint")):
        if name not in fields:
            raise InvalidArgumentError("the DataFrame has no %s column %r (its columns: %s)"
                                       % (what, name, ", ".join(fields)))
    if not isinstance(fields[key], (StringType, BinaryType, IntegralType, DecimalType)):
        raise InvalidArgumentError("key column %r is %s; keys must be strings, binary or "
                                   "integers" % (key, fields[key].simpleString()))
    fp, bad = _fingerprint_column(F.col(fingerprint), fields[fingerprint], fingerprint)
    rows, null_keys, bad_rows, example = df.agg(
        F.count(F.lit(1)), F.count_if(F.col(key).isNull()), F.count_if(bad),
        F.first(F.when(bad, F.col(key).cast("string")), ignorenulls=True)).first()
    if null_keys:
        raise InvalidKeyError("%d rows have a null key; every document needs one" % null_keys)
    if bad_rows:
        raise InvalidFingerprintError(
            "%d rows have no valid fingerprint in column %r (null, or not 64 bits: a long, a "
            "decimal in [0, 2**64) or 8 bytes), e.g. the row of key %s"
            % (bad_rows, fingerprint, example))
    if blocks is None:
        blocks = Layout.choose_blocks(distance, max(rows, 1))
    layout = Layout(blocks, distance)
    return df.select(F.col(key).alias("key"), fp.alias("fp")), layout, rows


def _fingerprint_column(col, dtype, name):
    """The fingerprint as a signed long, and the test of a bad value."""
    if isinstance(dtype, LongType):
        return col, col.isNull()
    if isinstance(dtype, DecimalType) and dtype.scale == 0 and dtype.precision <= 20:
        signed = F.when(col >= F.lit(Decimal(TWO_63)), (col - F.lit(Decimal(TWO_64))).cast("long")) \
            .otherwise(col.cast("long"))
        return signed, col.isNull() | (col < 0) | (col >= F.lit(Decimal(TWO_64)))
    if isinstance(dtype, BinaryType):
        return F.conv(F.hex(col), 16, -10).cast("long"), col.isNull() | (F.length(col) != 8)
    raise InvalidArgumentError(
        "fingerprint column %r is %s; expected long (the 64 bits as a signed long), "
        "decimal(20,0) or 8-byte binary" % (name, dtype.simpleString()))


# Pairs of fingerprints


def _fingerprint_pairs(docs, layout, split, documents):
    """Every pair (a, b, distance) of distinct fingerprints of ``docs`` (that
    many ``documents``) within the layout's distance, once, as signed longs."""
    session = docs.sparkSession
    tables = layout.tables
    rows = docs.select("fp").distinct().select(
        F.explode(F.sequence(F.lit(0), F.lit(tables - 1))).alias("t"), "fp")
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
            .select(rows.t, "fp", "parts")
        part = F.pmod(F.xxhash64("fp"), F.col("parts"))
        rows = rows.withColumn("part", part).withColumn("q", F.explode(
            F.when(F.col("parts").isNull(), F.array(F.lit(0)))
            .otherwise(F.sequence(F.lit(0), F.col("parts") - 1))))
        lo, hi = F.least("part", "q"), F.greatest("part", "q")
        side = F.when(F.col("parts").isNull() | (lo == hi), 0) \
            .when(F.col("part") == lo, 1).otherwise(2)
        cell = F.when(F.col("parts").isNull(), 0).otherwise(1 + lo * F.col("parts") + hi)
        tag = tag.bitwiseOR(F.shiftleft(side.cast("long"), SIDE_SHIFT)) \
            .bitwiseOR(F.shiftleft(cell.cast("long"), CELL_SHIFT))
    rows = rows.select(tag.alias("tag"), "fp")
    group = F.col("tag").bitwiseAND(F.lit(~SIDE_BITS))
    prefix = F.col("fp").bitwiseAND(
        F.element_at(prefix_masks, F.col("tag").bitwiseAND(F.lit(TABLE_BITS)).cast("int") + 1))
    estimate = documents * tables + replicated
    partitions = max(session.sparkContext.defaultParallelism,
                     math.ceil(estimate / ROWS_PER_TASK))
    scan = functools.partial(_scan_partition, _LayoutArrays(layout))
    return rows.repartition(partitions, group, prefix).mapInArrow(
        scan, "a long, b long, distance int")


def _hot_groups(docs, layout, split, prefix_masks, documents):
    """(table, prefix, parts, estimated size) of each group a sample of the
    documents says holds more than ``split`` fingerprints."""
    if documents <= split:
        return []
    fraction = min(1.0, SAMPLE_PER_SPLIT / split)
    sample = docs.select("fp").sample(fraction=fraction, seed=0).select(
        F.explode(F.sequence(F.lit(0), F.lit(layout.tables - 1))).alias("t"), "fp")
    counts = sample.groupBy("t", sample.fp.bitwiseAND(
        F.element_at(prefix_masks, sample.t + 1)).alias("g")).count() \
        .where(F.col("count") > SAMPLE_PER_SPLIT).collect()
    hot = []
    for t, g, count in counts:
        size = count / fraction
        hot.append((t, g, math.ceil(size / split), math.ceil(size)))
    return hot


class _LayoutArrays:
    """What a scan task needs of the layout: the arrays of each table alone."""

    def __init__(self, layout):
        blocks, spec = layout.blocks, layout.spec
        self.distance, self.block_masks = layout.distance, layout.block_masks
        self.tables = [(spec[3 * blocks * t:3 * blocks * (t + 1)], layout.prefixes[t:t + 1],
                        layout.leading_masks[t:t + 1]) for t in range(layout.tables)]


def _scan_partition(layout, batches):
    """mapInArrow: the pairs of each group (table and cell) of a partition's rows."""
    import numpy
    import pyarrow

    tags, fps = [], []
    for batch in batches:
        tags.append(batch.column(0).to_numpy())
        fps.append(batch.column(1).to_numpy().view(numpy.uint64))
    if not tags:
        return
    tag, fp = numpy.concatenate(tags), numpy.concatenate(fps)
    group = tag & ~SIDE_BITS
    order = numpy.argsort(group, kind="stable")
    group = group[order]
    starts = numpy.flatnonzero(numpy.diff(group)) + 1
    for start, end in zip([0, *starts], [*starts, len(group)]):
        rows = order[start:end]
        values = fp[rows]
        spec, prefixes, leading = layout.tables[int(group[start]) & TABLE_BITS]
        sides = ((tag[rows] >> SIDE_SHIFT) & 3).astype(numpy.uint8)
        scanner = _ext.PairScanner(values, spec, prefixes, leading, layout.block_masks,
                                   layout.distance, sides if sides[0] else None)
        while True:
            pairs = scanner.next_chunk(PAIR_CHUNK)
            if pairs is None:
                break
            positions = numpy.frombuffer(pairs, dtype=numpy.uint64)
            a, b = values[positions[0::2]], values[positions[1::2]]
            between = numpy.frombuffer(_ext.num_differing_bits_many(a, b), dtype=numpy.uint8)
            yield pyarrow.RecordBatch.from_arrays(
                [pyarrow.array(a.view(numpy.int64)), pyarrow.array(b.view(numpy.int64)),
                 pyarrow.array(between.astype(numpy.int32))], names=["a", "b", "distance"])


# Connected components


def _components(edges):
    """(fp, label) of every fingerprint in an edge (u, v), u > v; the label is
    the component's smallest fingerprint. Alternates large-star and
    small-star until every component is a star around its smallest node."""
    for _ in range(MAX_ROUNDS):
        if _stars(edges):
            centres = edges.select(F.col("v").alias("fp"), F.col("v").alias("label")).distinct()
            return edges.select(F.col("u").alias("fp"), F.col("v").alias("label")) \
                .unionByName(centres)
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
