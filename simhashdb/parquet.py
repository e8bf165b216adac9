"""Documents to and from Parquet (pyarrow, from the ``spark`` extra): the way
between a database and batch tools such as :mod:`simhashdb.spark`.

A file has a ``key`` column (string, binary or int64: one type for all
keys), a ``fingerprint`` column, ``meta``, the metadata as msgpack bytes
(null for none), and ``stored_at``, the UNIX time the document was stored
(int64, null where unknown); the export of a database of texts also has
``signature``, each text's resemblance signature (binary, null for a
document without one), and names its recipe in the file's metadata
(``simhashdb.recipe``), so that Spark and an import decide by the text rule. Fingerprints are written as uint64, which Spark reads as
``decimal(20,0)``; reading takes uint64, int64 (the 64 bits as a signed
long), decimal(20,0) and 8-byte binary.
"""

import errno
import itertools
import os

import msgpack

from . import _ext
from .errors import DiskFullError, InvalidArgumentError, InvalidFingerprintError, InvalidKeyError

try:
    import pyarrow
    import pyarrow.compute
    import pyarrow.dataset
    import pyarrow.parquet
except ImportError as exc:  # pragma: no cover - the spark extra is not installed
    raise ImportError("Parquet needs pyarrow: pip install '.[spark]' in simhashdb's source "
                      "directory") from exc

BATCH = 100_000
KEY_TYPES = {str: pyarrow.string(), bytes: pyarrow.binary(), int: pyarrow.int64()}


RECIPE_KEY = b"simhashdb.recipe"


def export(records, path, recipe=None):
    """Write ``(key, fingerprint, meta, stored_at)`` records to the Parquet
    file ``path``; returns how many. All keys must be of one type (str, bytes
    or int). With a ``recipe``, the records are ``(key, fingerprint, meta,
    stored_at, signature)`` and the file names the recipe.

    :raises InvalidArgumentError: ``path`` is not a path, or no file can be made there.
    :raises DiskFullError: the disk filled up (no file is left).
    """
    path = _path(path)
    records, writer, written = iter(records), None, 0
    try:
        while True:
            batch = list(itertools.islice(records, BATCH))
            if not batch and writer is not None:
                writer.close()
                return written
            table = _table(batch, writer.schema.field("key").type if writer else None,
                           recipe is not None)
            if writer is None:
                if recipe is not None:
                    table = table.replace_schema_metadata({RECIPE_KEY: recipe.encode()})
                writer = pyarrow.parquet.ParquetWriter(path, table.schema)
            writer.write_table(table)
            written += len(batch)
    except BaseException as exc:
        if writer is not None:  # no half-written file is left behind
            writer.close()
            os.remove(path)
        if isinstance(exc, OSError):
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError("cannot write Parquet to %s: the disk is full: free some "
                                    "space, then retry" % path) from None
            raise InvalidArgumentError("cannot write Parquet to %s: %s"
                                       % (path, exc.strerror or exc)) from None
        raise


def _path(path):
    """``path``, a file's or directory's path, as a str."""
    try:
        return os.fsdecode(path)
    except TypeError:
        raise InvalidArgumentError("expected the path of a Parquet file or directory (str, "
                                   "bytes or os.PathLike), got %s" % _ext.shown(path)) from None


def _table(records, key_type, signatures):
    """An Arrow table of records; keys of ``key_type`` (default: the first
    key's); with their ``signatures`` (the fifth item) or not."""
    if key_type is None:
        key_type = KEY_TYPES.get(type(records[0][0]), pyarrow.string()) if records \
            else pyarrow.string()
    keys = [r[0] for r in records]
    try:
        key_array = pyarrow.array(keys, key_type)
    except (pyarrow.ArrowException, OverflowError, TypeError):
        kinds = sorted({type(k).__name__ for k in keys} | {_type_name(key_type)})
        raise InvalidKeyError(
            "keys of one Parquet column must share a type and int keys must fit int64; found "
            "%s" % ", ".join(kinds)) from None
    columns = {
        "key": key_array,
        "fingerprint": pyarrow.array([r[1] for r in records], pyarrow.uint64()),
        "meta": meta_column([r[2] for r in records]),
        "stored_at": pyarrow.array([r[3] for r in records], pyarrow.int64())}
    if signatures:
        columns["signature"] = pyarrow.array([r[4] for r in records], pyarrow.binary())
    return pyarrow.table(columns)


def meta_column(metas):
    """The ``meta`` column of documents' metadata: msgpack bytes, null for none."""
    return pyarrow.array([None if m is None else msgpack.packb(m) for m in metas],
                         pyarrow.binary())


def meta_value(packed):
    """The metadata of a ``meta`` column's value."""
    return None if packed is None else msgpack.unpackb(packed, strict_map_key=False)


def _type_name(arrow_type):
    return {pyarrow.string(): "str", pyarrow.binary(): "bytes", pyarrow.int64(): "int"}[arrow_type]


def read(path, key="key", fingerprint="fingerprint"):
    """A Parquet file or a directory of them (as Spark writes): the recipe it
    names (an export of a database of texts; else None), and an iterator of
    its ``(key, fingerprint, meta, stored_at, signature)`` records, ``meta``,
    ``stored_at`` and ``signature`` read where those columns are there, else
    None.

    :raises InvalidArgumentError: ``path`` is not a path or holds no Parquet, or
        a column name is not a str or not in it.
    """
    path = _path(path)
    for name in (key, fingerprint):
        if not isinstance(name, str):
            raise InvalidArgumentError("column names are str, got %s" % _ext.shown(name))
    try:
        dataset = pyarrow.dataset.dataset(path, format="parquet")
    except (pyarrow.ArrowException, OSError) as exc:
        raise InvalidArgumentError("cannot read Parquet from %s: %s" % (path, exc)) from None
    names = dataset.schema.names
    for name in (key, fingerprint):
        if name not in names:
            raise InvalidArgumentError("%s has no column %r (its columns: %s)"
                                       % (path, name, ", ".join(names)))
    recipe = (dataset.schema.metadata or {}).get(RECIPE_KEY, b"").decode() or None
    return recipe, _records(dataset, key, fingerprint)


def _records(dataset, key, fingerprint):
    names = dataset.schema.names
    optional = [name for name in ("meta", "stored_at", "signature") if name in names]
    for batch in dataset.to_batches(columns=[key, fingerprint] + optional):
        keys = batch.column(0).to_pylist()
        fps = _unsigned(batch.column(1), fingerprint)
        metas = [None] * len(keys)
        if "meta" in optional:
            metas = [meta_value(m) for m in batch.column("meta").to_pylist()]
        times, signatures = ([None] * len(keys) if name not in optional
                             else batch.column(name).to_pylist()
                             for name in ("stored_at", "signature"))
        yield from zip(keys, fps, metas, times, signatures)


def _unsigned(column, name):
    """Fingerprints as Python ints in [0, 2**64) from any of the column types."""
    kind = column.type
    if column.null_count:
        raise InvalidFingerprintError("column %r has %d null fingerprints"
                                      % (name, column.null_count))
    if kind == pyarrow.uint64():
        return column.to_pylist()
    if kind == pyarrow.int64():
        return column.cast(pyarrow.uint64(), safe=False).to_pylist()
    if pyarrow.types.is_decimal(kind) and kind.scale == 0:
        try:
            return column.cast(pyarrow.uint64()).to_pylist()
        except pyarrow.ArrowInvalid:
            raise InvalidFingerprintError("column %r holds a decimal outside [0, 2**64)"
                                          % name) from None
    if pyarrow.types.is_binary(kind) or pyarrow.types.is_fixed_size_binary(kind):
        values = column.to_pylist()
        if any(len(v) != 8 for v in values):
            raise InvalidFingerprintError("column %r holds binary fingerprints that are not "
                                          "8 bytes" % name)
        return [int.from_bytes(v, "big") for v in values]
    raise InvalidFingerprintError("column %r is %s; expected uint64, int64, decimal(20,0) or "
                                  "8-byte binary" % (name, kind))
