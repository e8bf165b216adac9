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
"""

import functools
import math
from decimal import Decimal

from . import _ext
from .errors import InvalidArgumentError, InvalidFingerprintError, InvalidKeyError, SimhashDBError
from .layout import Layout
from .matching import pair_chunks

try:
    import numpy
    import pyarrow
    from pyspark.sql import DataFrame, Window, functions as F
    from pyspark.sql.types import (
        BinaryType, DecimalType, IntegerType, IntegralType, LongType, StringType, StructField,
        StructType)
except ImportError as exc:  # pragma: no cover - the spark extra is not installed
    raise ImportError("simhashdb.spark needs pyspark: pip install '.[spark]' in simhashdb's "
                      "source directory") from exc

DEFAULT_SPLIT = 20_000
ROWS_PER_TASK = 2_000_000   # rows one scan task holds, about 50 bytes each and the key
SAMPLE_PER_SPLIT = 16       # sampled rows expected from a group of ``split`` fingerprints
SHUFFLE_COST = 1000         # pair comparisons a row through a shuffle costs (see README)
MAX_ROUNDS = 64             # large-star / small-star rounds before giving up
PAIR_CHUNK = 1 << 20        # pairs per Arrow batch out of a scan

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
             split=DEFAULT_SPLIT):
    """Every pair of documents within ``distance`` bits, each unordered pair
    once: a DataFrame ``(key_a, key_b, distance)`` with ``key_a < key_b``.

    Documents with identical fingerprints pair up at distance 0. Runs two
    quick jobs (validation, a sample for hot prefixes) when called; the
    pairs are computed when the result is.

    :param df: a DataFrame with a ``key`` and a ``fingerprint`` column.
    :param int distance: the largest Hamming distance of a pair.
    :param int blocks: blocks per fingerprint, more than ``distance``
        (default: :func:`choose_blocks` for the number of documents).
    :param int split: a group of more fingerprints than this (estimated) is
        scanned in parts of about this size.
    :raises InvalidArgumentError: bad parameters, columns or column types.
    :raises InvalidFingerprintError, InvalidKeyError: a row with no valid
        fingerprint (null, out of range, not 8 bytes) or a null key.
    """
    docs, layout, rows = _prepare(df, key, fingerprint, distance, blocks, split)
    pairs = _scan(docs, layout, split, rows, "pairs").where(F.col("key_a") != F.col("key_b"))
    return pairs.select(F.least("key_a", "key_b").alias("key_a"),
                        F.greatest("key_a", "key_b").alias("key_b"), "distance")


def clusters(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
             split=DEFAULT_SPLIT):
    """The cluster of every document: a DataFrame ``(key, cluster)`` where
    ``cluster`` is the smallest key of the document's connected component in
    the graph of pairs within ``distance`` (a document alone is its own).

    Finds the components when called (a few Spark jobs a round); the result
    is a DataFrame over them. Parameters and errors as :func:`find_all`.
    """
    docs, joined = _joined(df, key, fingerprint, distance, blocks, split)
    return docs.join(joined, "key", "left").select(
        "key", F.coalesce("cluster", "key").alias("cluster"))


def dedupe(df, distance=3, blocks=None, key="key", fingerprint="fingerprint",
           split=DEFAULT_SPLIT):
    """The rows of ``df`` less near-duplicates: of each cluster (see
    :func:`clusters`) only the document with the smallest key is kept, whatever
    the partitioning. Columns and types are ``df``'s."""
    _, joined = _joined(df, key, fingerprint, distance, blocks, split)
    return df.join(joined.select(F.col("key").alias(key)), key, "left_anti")


def _joined(df, key, fingerprint, distance, blocks, split):
    """The documents, and (key, cluster) of each document whose cluster is
    another's key (the smallest of its component)."""
    docs, layout, rows = _prepare(df, key, fingerprint, distance, blocks, split)
    found = _scan(docs, layout, split, rows, "edges").where(F.col("key_a") != F.col("key_b"))
    edges = _materialize(found.select(F.greatest("key_a", "key_b").alias("u"),
                                      F.least("key_a", "key_b").alias("v")))
    return docs, _components(edges)


def choose_blocks(distance, documents):
    """The block count of :meth:`Layout.choose_blocks` where a table costs
    SHUFFLE_COST pair comparisons a row: each table sends every fingerprint
    through a shuffle, then compares the pairs of each group (half of the
    candidates a database probe meets). Fewer tables than the database's."""
    return Layout.choose_blocks(distance, documents, table_cost=2 * SHUFFLE_COST)


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
        blocks = choose_blocks(distance, rows)
    layout = Layout(blocks, distance)
    return df.select(F.col(key).alias("key"), fp.alias("fp")), layout, rows


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


def _scan(docs, layout, split, documents, mode):
    """Pairs of keys within the layout's distance, as ``(key_a, key_b,
    distance)`` in no order: every pair (``mode="pairs"``), or (``"edges"``)
    enough of them to connect what the pairs connect: one pair of keys for
    each pair of fingerprints, and the keys of a fingerprint joined to one of
    them. ``docs`` has ``documents`` rows."""
    session = docs.sparkSession
    tables = layout.tables
    rows = docs.select(F.explode(F.sequence(F.lit(0), F.lit(tables - 1))).alias("t"), "fp", "key")
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
            .select(rows.t, "fp", "key", "parts")
        part = F.pmod(F.xxhash64("fp"), F.col("parts"))
        rows = rows.withColumn("part", part).withColumn("q", F.explode(
            F.when(F.col("parts").isNull(), F.array(F.lit(0)))
            .otherwise(F.sequence(F.lit(0), F.col("parts") - 1))))
        lo, hi = F.least("part", "q"), F.greatest("part", "q")
        side = F.when(F.col("parts").isNull() | (lo == hi), 0) \
            .when(F.col("part") == lo, 2).otherwise(3)
        cell = F.when(F.col("parts").isNull(), 0).otherwise(1 + lo * F.col("parts") + hi)
        tag = tag.bitwiseOR(F.shiftleft(side.cast("long"), SIDE_SHIFT)) \
            .bitwiseOR(F.shiftleft(cell.cast("long"), CELL_SHIFT))
    rows = rows.select(tag.alias("tag"), "fp", "key")
    group = F.col("tag").bitwiseAND(F.lit(~PART_BIT))
    prefix = F.col("fp").bitwiseAND(
        F.element_at(prefix_masks, F.col("tag").bitwiseAND(F.lit(TABLE_BITS)).cast("int") + 1))
    cores = session.sparkContext.defaultParallelism   # tasks in a wave: whole waves only
    partitions = cores * math.ceil((documents * tables + replicated) / ROWS_PER_TASK / cores)
    key_type = docs.schema["key"].dataType
    schema = StructType([StructField("key_a", key_type), StructField("key_b", key_type),
                         StructField("distance", IntegerType())])
    scan = functools.partial(_scan_partition, layout, mode == "pairs")
    return rows.repartition(partitions, group, prefix).mapInArrow(scan, schema)


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
    group = tag & ~PART_BIT
    order = numpy.argsort(group, kind="stable")
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
            if every_pair:
                a, b = _expand(a, b, counts, offsets)
            else:
                a, b = offsets[a], offsets[b]
            between = numpy.frombuffer(
                _ext.num_differing_bits_many(fp[by_value[a]], fp[by_value[b]]), numpy.uint8)
            yield _key_pairs(key, by_value[a], by_value[b], between)
        if table == 0 and not across:  # identical fingerprints, once: in table 0
            a, b = _identical(counts, offsets, every_pair)
            if len(a):
                yield _key_pairs(key, by_value[a], by_value[b], numpy.zeros(len(a), numpy.uint8))


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
