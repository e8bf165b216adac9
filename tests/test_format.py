"""The LMDB file format has one owner, simhashdb/storage/lmdb/format.py."""

import pathlib
import re

import pytest

from simhashdb.storage.lmdb import format as lmdb_format

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [path for folder in ("simhashdb", "ext", "tests")
           for path in sorted((ROOT / folder).rglob("*"))
           if path.suffix in (".py", ".pyx", ".pxi", ".pxd", ".h") and path.name != "test_format.py"]
KINDS = [value for value in vars(lmdb_format).values() if isinstance(value, lmdb_format.SubDatabase)]


def test_native_constants_agree_with_the_format():
    """ext/_format.pxi is what tools/write_format_pxi.py writes from format.py."""
    assert (ROOT / "ext" / "_format.pxi").read_text() == lmdb_format.native_constants()


@pytest.mark.parametrize("name", sorted({spelled for kind in KINDS
                                         for spelled in (kind.pattern, kind.first) if spelled}))
def test_each_sub_database_name_is_spelled_in_one_file(name):
    """A name (or, for a family, its pattern up to the first number) appears as
    a bytes literal in format.py alone (and here, spelled out to check it)."""
    stem = name.split(b"%")[0].decode()
    literal = re.compile(r"""b["']%s%s""" % (re.escape(stem), "" if b"%" in name else "[\"']"))
    spelled_in = [str(path.relative_to(ROOT)) for path in SOURCES
                  if literal.search(path.read_text(errors="replace"))]
    assert spelled_in == ["simhashdb/storage/lmdb/format.py"]


def test_names_and_room():
    """The names the backends open, and max_dbs room for each of them."""
    assert lmdb_format.INDEX.names() == [b"fingerprints"] + [b"index:%02d" % s for s in range(1, 8)]
    assert lmdb_format.TABLE_RUNS.names(7)[3] == b"runs:007:03"
    assert lmdb_format.BAND_RUNS.names(31)[7] == b"band:31:07"
    assert lmdb_format.OLD_BAND.names()[31] == b"band:31"
    assert lmdb_format.META.names() == [b"meta"]
    tables, bands = 10, lmdb_format.BANDS
    opened = sum(len(kind.names(0 if kind.per_table or kind.per_band else None))
                 * (tables if kind.per_table else bands if kind.per_band else 1)
                 for kind in lmdb_format.SUB_DATABASES)
    assert lmdb_format.max_dbs(tables) == opened + lmdb_format.SPARE_DBS


def test_directory_records_round_trip():
    runs = [(7, 0, 1000), (9, 3, 12), (2**32 - 1, 7, 2**64 - 1)]
    raw = lmdb_format.directory_record(runs)
    assert len(raw) == len(runs) * lmdb_format.RUN_RECORD_BYTES
    assert lmdb_format.directory_runs(raw) == runs
    assert lmdb_format.directory_runs(raw[:-1]) is None  # cut short
    assert lmdb_format.directory_runs(raw + raw[:13]) is None  # a slot twice
    assert lmdb_format.directory_runs(lmdb_format.directory_record([(1, 8, 5)])) is None
