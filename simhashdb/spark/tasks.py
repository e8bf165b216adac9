"""What the scans on Spark share: rows cut into cells and tasks, the schema of
their pairs, the pairs of one group's rows, and the lineage cut."""

import math

import numpy
import pyarrow
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, StructField, StructType

from .. import _ext
from ..matching import pair_chunks

ROWS_PER_TASK = 2_000_000   # rows one scan task holds, about 50 bytes each and the key
PAIR_CHUNK = 1 << 20        # pairs per Arrow batch out of a scan
TEXT_ROWS_PER_TASK = 250_000  # rows with a signature one scan task holds, about 300 bytes each
SIGNATURE_BYTES, BANDS = _ext.SIGNATURE_BYTES, _ext.BANDS  # a text's signature, its band keys
WIDE_SIGNATURE_BYTES = _ext.WIDE_SIGNATURE_BYTES  # a signature of 16-bit bins
# The tag of a scanned row: table in bits 0-15, side in 16-17 (0: a whole
# group or the diagonal cell of a split one; 2 and 3: the two parts of an
# off-diagonal cell), cell (0 for a group not split) from bit 18. A task scans
# the rows of one tag but the low side bit together: cells of two hot groups
# may share a number, but then never a prefix, and one is off-diagonal only
# if the other is.
SIDE_SHIFT, CELL_SHIFT = 16, 18
TABLE_BITS, PART_BIT = (1 << SIDE_SHIFT) - 1, 1 << SIDE_SHIFT
TWO_63, TWO_64 = 1 << 63, 1 << 64
DEFAULT_SPLIT = 20_000


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


def _concatenated(batches):
    """The columns of a partition's Arrow batches, each one array; None if none."""
    batches = list(batches)
    if not batches:
        return None
    table = pyarrow.Table.from_batches(batches)
    return [column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            for column in table.columns]


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


def _materialize(df):
    """``df`` computed once and cut from its lineage (a checkpoint where the
    context has a checkpoint directory, else a local one)."""
    if df.sparkSession.sparkContext.getCheckpointDir():
        return df.checkpoint()
    return df.localCheckpoint()


def _lead_masks(layout):
    """Per table, the mask of the bits of its leading blocks (in fingerprint order)."""
    return [sum(layout.block_masks[b] for b in lead) for lead in layout.leading]


def _signed(x):
    """A uint64 as the signed long with the same bits."""
    return x - TWO_64 if x >= TWO_63 else x
