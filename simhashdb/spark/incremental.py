"""A new segment deduplicated against a corpus kept before: the new documents
near an old one, found by one pass over the old corpus beside the new
fingerprints (up to SHIPPED_ROWS new rows) or by probes of the old corpus's
table and band keys; the new rows left, clustered on the driver where one
scan task would hold them."""

import functools

import numpy
import pyarrow
import pyarrow.compute
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from .. import _ext, matching, rule
from ..errors import InvalidArgumentError
from ..layout import Layout
from ..matching import pair_chunks
from .scan import _prepare
from .tasks import (
    BANDS,
    DEFAULT_SPLIT,
    PAIR_CHUNK,
    ROWS_PER_TASK,
    TEXT_ROWS_PER_TASK,
    _concatenated,
    _lead_masks,
    _materialize,
    _pair_schema,
    _signed,
)
from .text import _band_keys, _signature_size, _signatures

OLD_ROWS_PER_SCAN = 1 << 18  # old rows scanned at once beside the new fingerprints
SHIPPED_ROWS = ROWS_PER_TASK  # new rows whose fingerprints go to every task of the old corpus


def _dropped_in_memory(df, key, fingerprint, distance, blocks, signature, threshold, narrow):
    """The keys of ``df`` that are not the smallest of their cluster (a
    DataFrame of one column, named ``key``), found on the driver by
    :mod:`simhashdb.matching` where ``df`` has no more rows than one scan
    task holds (else None): a new segment's survivors, one job. Signatures
    meet in 8-bit bins with ``narrow``."""
    docs, layout, rows, least = _prepare(df, key, fingerprint, distance, blocks, DEFAULT_SPLIT,
                                         signature, threshold, narrow=narrow)
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


def _across(df, against, distance, blocks, key, fingerprint, signature, threshold, columns,
            narrow):
    """The pairs ``(key_a, key_b, distance[, resemblance])`` of a row of
    ``df`` (a) and a row of ``against`` (b, its columns named by
    ``columns``), by the rule :func:`find_all`
    applies, each pair once (rows of one key, fingerprint and signature are
    one row); signatures meet in 8-bit bins with ``narrow``."""
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
                                       DEFAULT_SPLIT, signature, threshold, "the new rows",
                                       narrow)
    old, _, old_rows, _ = _prepare(against, old_names["key"], old_names["fingerprint"], distance,
                                   distance + 1, DEFAULT_SPLIT, old_names["signature"], threshold,
                                   "the old corpus (against; against_columns names its columns)",
                                   narrow)
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
        size = _signature_size(batch.column(4), batch.column(5))
        a, has_a = _signatures(batch.column(4), size)
        b, has_b = _signatures(batch.column(5), size)
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
