"""The scan of the permutation tables on Spark: documents prepared (their
fingerprint column read, the layout chosen), grouped by their leading blocks
in each table, hot groups cut into cells, and each group or cell scanned by
the native pair scanner over Arrow batches."""

import functools
import math
from decimal import Decimal

import numpy
import pyarrow
from pyspark.sql import DataFrame, functions as F
from pyspark.sql.types import BinaryType, DecimalType, IntegralType, LongType, StringType

from .. import _ext, rule
from ..errors import InvalidArgumentError, InvalidFingerprintError, InvalidKeyError
from ..layout import Layout
from .tasks import (
    PART_BIT,
    ROWS_PER_TASK,
    SIGNATURE_BYTES,
    TABLE_BITS,
    TEXT_ROWS_PER_TASK,
    TWO_63,
    TWO_64,
    WIDE_SIGNATURE_BYTES,
    _cells,
    _key_pairs,
    _lead_masks,
    _pair_schema,
    _partitions,
    _row_pairs,
    _signed,
)
from .text import _band_scan, _scan_text_partition

SAMPLE_PER_SPLIT = 16       # sampled rows expected from a group of ``split`` fingerprints
SHUFFLE_COST = 1000         # pair comparisons a row through a shuffle costs (see docs/spark.md)


def _prepare(df, key, fingerprint, distance, blocks, split, signature=None, threshold=None,
             whose="the DataFrame", narrow=False):
    """Check the arguments and every row; the documents as (key, fp: signed
    long, and with ``signature`` sig: binary or null, of one width), the
    layout, the number of rows and the text rule's threshold (None without
    ``signature``). Signatures of 16-bit bins are narrowed where some have
    8-bit ones (or ``narrow``). ``whose`` names the DataFrame in the errors
    of its columns."""
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
                "signature column %r is %s; expected binary (the 128 or 256 bytes of "
                "simhashdb.fingerprint_with_signature, or null)"
                % (signature, fields[signature].simpleString()))
        sig = F.col(signature)
        bad_sig = sig.isNotNull() & ~F.length(sig).isin(SIGNATURE_BYTES, WIDE_SIGNATURE_BYTES)
        sig = F.when(~sig.isin(F.lit(bytearray(SIGNATURE_BYTES)),  # all zero: no text
                               F.lit(bytearray(WIDE_SIGNATURE_BYTES))), sig)
    rows, null_keys, bad_rows, example, bad_sigs, sig_example, narrow_sigs, wide_sigs = df.agg(
        F.count(F.lit(1)), F.count_if(F.col(key).isNull()), F.count_if(bad),
        F.first(F.when(bad, F.col(key).cast("string")), ignorenulls=True),
        F.count_if(bad_sig),
        F.first(F.when(bad_sig, F.col(key).cast("string")), ignorenulls=True),
        F.count_if(F.length(sig) == SIGNATURE_BYTES),
        F.count_if(F.length(sig) == WIDE_SIGNATURE_BYTES)).first()
    if null_keys:
        raise InvalidKeyError("%d rows have a null key; every document needs one" % null_keys)
    if bad_rows:
        raise InvalidFingerprintError(
            "%d rows have no valid fingerprint in column %r (null, or not 64 bits: a long, a "
            "decimal in [0, 2**64) or 8 bytes), e.g. the row of key %s"
            % (bad_rows, fingerprint, example))
    if bad_sigs:
        raise InvalidArgumentError(
            "%d rows have a signature in column %r that is neither %d nor %d bytes (null is "
            "a document without text), e.g. the row of key %s"
            % (bad_sigs, signature, SIGNATURE_BYTES, WIDE_SIGNATURE_BYTES, sig_example))
    if blocks is None:
        blocks = choose_blocks(distance, rows)
    layout = Layout(blocks, distance)
    if (narrow or narrow_sigs) and wide_sigs:
        sig = _narrowed(sig)
    columns = [F.col(key).alias("key"), fp.alias("fp")] + (
        [sig.alias("sig")] if signature is not None else [])
    return df.select(*columns), layout, rows, least


def _narrow(df, against, signature, columns):
    """Whether the signatures of ``df`` (column ``signature``) and of an old
    corpus ``against`` (its columns renamed by ``columns``, as for
    find_all) meet in 8-bit bins: where either has some (a job each, which
    stops at the first)."""
    old_signature = columns.get("signature", signature) if isinstance(columns, dict) \
        else signature
    return signature is not None and any(
        isinstance(frame, DataFrame) and name in frame.columns
        and isinstance(frame.schema[name].dataType, BinaryType)
        and frame.where((F.length(name) == SIGNATURE_BYTES)
                        & (F.col(name) != F.lit(bytearray(SIGNATURE_BYTES)))).limit(1).count()
        for frame, name in ((df, signature), (against, old_signature)))


def _narrowed(sig):
    """A binary column of signatures with those of 16-bit bins narrowed."""
    narrow = F.udf(lambda s: s if s is None or len(s) == SIGNATURE_BYTES
                   else _ext.narrow(bytes(s)), BinaryType())
    return F.when(F.length(sig) == WIDE_SIGNATURE_BYTES, narrow(sig)).otherwise(sig)


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


def _text_scan(docs, layout, split, documents, threshold, mode):
    """The pairs of the text rule, ``(key_a, key_b, distance, resemblance)``,
    as :func:`_scan`'s ``mode`` says: those of two texts that share a band
    (the band stage), and those within the distance (the table scan with the
    signatures along, which leaves out two texts that share a band). A pair
    comes from one stage only, and from one group in it."""
    return _band_scan(docs, split, threshold, mode).unionByName(
        _scan(docs, layout, split, documents, mode, threshold))


def choose_blocks(distance, documents):
    """The block count of :meth:`Layout.choose_blocks` where a table costs
    SHUFFLE_COST pair comparisons a row: each table sends every fingerprint
    through a shuffle, then compares the pairs of each group (half of the
    candidates a database probe meets). Fewer tables than the database's."""
    return Layout.choose_blocks(distance, documents, table_cost=2 * SHUFFLE_COST)
