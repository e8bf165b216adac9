"""Pairs of texts on Spark, by the text rule (:mod:`simhashdb.rule`): texts
grouped by their band keys, each group decided by resemblance (small groups
in numpy, large ones by the native pair scanner), beside the scan of the
permutation tables for fingerprints within the distance."""

import functools
import math

import numpy
import pyarrow
import pyarrow.compute
from pyspark.sql import Window, functions as F

from .. import _ext, rule
from .tasks import (
    BANDS,
    PART_BIT,
    SIDE_SHIFT,
    SIGNATURE_BYTES,
    TABLE_BITS,
    TEXT_ROWS_PER_TASK,
    _cells,
    _concatenated,
    _materialize,
    _pair_schema,
    _partitions,
    _row_pairs,
)

BAND_SPLIT = 10             # a band group is split at split / BAND_SPLIT texts: a pair of texts
                            # costs a resemblance, ~0.4 us, ten times a pair of fingerprints
DECIDE_CHUNK = 1 << 16      # pairs of texts decided at once (their bins side by side)
SMALL_GROUP = 32            # band groups of at most this many texts are decided in numpy


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
    pairs, scores = _ext.band_pairs(signatures[rows].tobytes(), signatures.shape[1],
                                    threshold.least, only_band=band)
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


def _signatures(column, size=None):
    """A binary column's signatures, all of one width (``size``: by default
    the column's), as an (n, 128 or 256) uint8 array (zeros where null), and
    which rows have one."""
    has = column.is_valid().to_numpy(zero_copy_only=False)
    size = size or _signature_size(column)
    fixed = column.fill_null(pyarrow.scalar(bytes(size), column.type)) \
        .cast(pyarrow.binary(size))
    data = numpy.frombuffer(fixed.buffers()[1], numpy.uint8)
    start = fixed.offset * size
    return data[start:start + len(fixed) * size].reshape(-1, size), has


def _signature_size(*columns):
    """The size of the signatures of binary ``columns`` (of one width; 128
    where all are null)."""
    return max(pyarrow.compute.max(pyarrow.compute.binary_length(column)).as_py() or
               SIGNATURE_BYTES for column in columns)


def _rows_as_void(matrix):
    """Each row of a 2-d uint8 array as one opaque value (to compare rows whole)."""
    matrix = numpy.ascontiguousarray(matrix)
    return matrix.view(numpy.dtype((numpy.void, matrix.shape[1]))).ravel()
