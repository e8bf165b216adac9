"""Signatures of 8-bit bins (format 10) beside those of 16 (databases made
before it): the narrowing, the corrected estimate and the band keys against
plain references, both widths where they meet, and a database of each width
on every backend."""

import random

import msgpack
import numpy
import pytest
from hypothesis import given, strategies as st

import simhashdb
from simhashdb import InvalidArgumentError, _ext, matching, rule
from simhashdb.db import FORMAT_VERSION
from simhashdb.layout import Layout

from conftest import records_as_in_format_10, stored_params, store_params, stored_value

BIN_VALUES = st.one_of(st.just(0), st.just(1), st.just(255), st.just(256), st.just(0xFFFF),
                       st.integers(0, 0xFFFF))
WIDE = st.lists(BIN_VALUES, min_size=128, max_size=128).map(
    lambda bins: b"".join(v.to_bytes(2, "big") for v in bins))


def reference_narrow(wide):
    values = [int.from_bytes(wide[2 * i:2 * i + 2], "big") for i in range(128)]
    return bytes(1 + (v - 1) % 255 if v else 0 for v in values)


def reference_resemblance(a, b):
    bins = (lambda s: list(s)) if len(a) == 128 else (
        lambda s: [int.from_bytes(s[2 * i:2 * i + 2], "big") for i in range(128)])
    used = [(x, y) for x, y in zip(bins(a), bins(b)) if x or y]
    if not used:
        return 1.0
    share = sum(x == y for x, y in used) / len(used)
    return share if len(a) == 256 else max(0.0, (share * 255 - 1) / 254)


@given(WIDE)
def test_narrowing_keeps_a_filled_bin_filled_and_an_empty_one_empty(wide):
    narrow = _ext.narrow(wide)
    assert narrow == reference_narrow(wide) and _ext.narrow(narrow) == narrow
    assert [b == 0 for b in narrow] == [wide[2 * i:2 * i + 2] == b"\0\0" for i in range(128)]


@given(WIDE, WIDE, st.integers(0, 128))
def test_resemblance_of_either_width_is_the_reference_and_widths_meet_narrowed(a, b, shared):
    b = a[:2 * shared] + b[2 * shared:]  # a share of equal bins
    narrow_a, narrow_b = _ext.narrow(a), _ext.narrow(b)
    assert simhashdb.resemblance(a, b) == reference_resemblance(a, b)
    assert simhashdb.resemblance(narrow_a, narrow_b) == reference_resemblance(narrow_a, narrow_b)
    assert simhashdb.resemblance(a, narrow_b) == simhashdb.resemblance(narrow_a, narrow_b) \
        == simhashdb.resemblance(narrow_a, b)
    for size, pair in ((256, (a, b)), (128, (narrow_a, narrow_b))):
        rows = numpy.frombuffer(b"".join(pair), numpy.uint8).reshape(2, size)
        assert rule.resemblances(rows, [0], [1])[0] == simhashdb.resemblance(*pair)


@given(WIDE)
def test_band_keys_of_8_bit_bins_hash_their_codes_as_16_bit_bins_would(wide):
    narrow = _ext.narrow(wide)
    codes_as_wide = b"".join(code.to_bytes(2, "big") for code in narrow)
    assert list(_ext.bands(narrow)) == list(_ext.bands(codes_as_wide))
    assert (len(_ext.bands(narrow)) == 32) == any(wide)


def test_a_signature_of_another_size_is_refused():
    _, signature = simhashdb.fingerprint_with_signature("some words to sign")
    for bad in (signature[:100], signature + signature[:1], b""):
        for call in (lambda: simhashdb.resemblance(signature, bad), lambda: _ext.bands(bad),
                     lambda: _ext.shares_a_band(bad, signature)):
            with pytest.raises(InvalidArgumentError, match="128 bytes"):
                call()
    with pytest.raises(InvalidArgumentError, match="signature_bits"):
        simhashdb.fingerprint_with_signature("words", signature_bits=12)


def pages(n, seed=0):
    rng = random.Random(seed)
    vocabulary = ["w%d" % i for i in range(3000)]
    return [" ".join(rng.choice(vocabulary) for _ in range(200)) for _ in range(n)]


def edit(text, rate, seed=1):
    rng = random.Random(seed)
    words = text.split(" ")
    for _ in range(int(rate * len(words))):
        words[rng.randrange(len(words))] = "new%d" % rng.randrange(10**6)
    return " ".join(words)


def test_pairs_of_mixed_widths_are_decided_as_all_narrowed():
    texts = pages(6, seed=2)
    texts += [edit(t, 0.05, seed=i) for i, t in enumerate(texts[:3])]
    signed = [simhashdb.fingerprint_with_signature(t, signature_bits=16) for t in texts]
    fps = [fp for fp, _ in signed]
    mixed = [s if i % 2 else _ext.narrow(s) for i, (_, s) in enumerate(signed)]
    narrowed = [_ext.narrow(s) for _, s in signed]
    layout = Layout(4, 3)
    found = sorted(matching.text_pairs(fps, mixed, layout, 0.45))
    assert found == sorted(matching.text_pairs(fps, narrowed, layout, 0.45))
    assert {(i, j) for i, j, _ in found} >= {(0, 6), (1, 7), (2, 8)}


def as_made_before_format_10(db):
    """Make ``db``'s stored parameters those of format 9 (no signature_bits)."""
    params = msgpack.unpackb(stored_params(db))
    del params["signature_bits"]
    store_params(db, msgpack.packb(dict(params, format=9)))


def stored_signature(db, key):
    return simhashdb.records.signature(stored_value(db, key))


def test_new_databases_sign_in_8_bits_and_earlier_ones_keep_16(tmp_path, backend):
    originals = pages(20, seed=3)
    copies = [edit(t, 0.03, seed=i) for i, t in enumerate(originals)]
    with simhashdb.DB(tmp_path / "new", backend=backend) as db:
        db.insert_text_many([("p%d" % i, t) for i, t in enumerate(originals)])
        assert len(stored_signature(db, "p0")) == 128
        assert msgpack.unpackb(stored_params(db))["signature_bits"] == 8
    with simhashdb.DB(tmp_path / "old", backend=backend) as db:
        as_made_before_format_10(db)
    if backend != "redis":  # (and its documents a record an id, as 0.14 keeps them)
        records_as_in_format_10(str(tmp_path / "old"))
    with simhashdb.DB(tmp_path / "old", backend=backend) as db:
        db.insert_text_many([("p%d" % i, t) for i, t in enumerate(originals)])
        assert len(stored_signature(db, "p0")) == 256
        assert db.stats()["format"] == 9 and db.check() == []  # 0.14 still writes it
    for name, size in (("new", 128), ("old", 256)):
        with simhashdb.DB(tmp_path / name, backend=backend) as db:
            found = db.insert_text_if_new_many([("c%d" % i, t) for i, t in enumerate(copies)])
            assert [[m.key for m in d] for d in found] == [["p%d" % i] for i in range(20)]
            assert all(0.5 < d[0].resemblance < 1 for d in found)
            fresh = pages(1, seed=4)[0]
            assert db.insert_text_if_new("fresh", fresh) == []
            assert len(stored_signature(db, "fresh")) == size


def test_imported_signatures_take_the_database_s_width(tmp_path, backend):
    text = pages(1, seed=5)[0]
    fp, wide = simhashdb.fingerprint_with_signature(text, signature_bits=16)
    record = ("page", fp, {"status": 200}, 1_700_000_000, wide)
    with simhashdb.DB(tmp_path / "new", backend=backend) as db:
        assert db.import_records([record]) == 1
        assert stored_signature(db, "page") == _ext.narrow(wide)
        assert [m.key for m in db.query_text(edit(text, 0.03))] == ["page"]
    with simhashdb.DB(tmp_path / "old", backend=backend) as db:
        as_made_before_format_10(db)
    with simhashdb.DB(tmp_path / "old", backend=backend) as db:
        assert db.import_records([record]) == 1
        assert stored_signature(db, "page") == wide
        with pytest.raises(InvalidArgumentError, match="8-bit bins"):
            db.import_records([record[:4] + (_ext.narrow(wide),)])
        assert [m.key for m in db.query_text(edit(text, 0.03))] == ["page"]


def test_export_and_import_carry_a_16_bit_database_into_8_bits(tmp_path, capsys):
    """`export old | import new` (and export_parquet / import_parquet) give
    an older database's texts 8-bit signatures, found as before."""
    from simhashdb import cli
    originals = pages(10, seed=6)
    with simhashdb.DB(tmp_path / "old") as db:
        as_made_before_format_10(db)
    with simhashdb.DB(tmp_path / "old") as db:
        db.insert_text_many([("p%d" % i, t) for i, t in enumerate(originals)])
    capsys.readouterr()
    assert cli.main(["export", str(tmp_path / "old")]) == 0
    (tmp_path / "old.jsonl").write_text(capsys.readouterr().out)
    assert cli.main(["--quiet", "import", str(tmp_path / "new"),
                     str(tmp_path / "old.jsonl")]) == 0
    capsys.readouterr()
    with simhashdb.DB(tmp_path / "old", readonly=True) as old, \
            simhashdb.DB(tmp_path / "new") as new:
        assert old.stats()["signature_bits"] == 16 and new.stats()["signature_bits"] == 8
        for key in ("p0", "p9"):
            assert stored_signature(new, key) == _ext.narrow(stored_signature(old, key))
        copies = [edit(t, 0.03, seed=i) for i, t in enumerate(originals)]
        assert [[m.key for m in found] for found in new.query_text_many(copies)] == \
            [["p%d" % i] for i in range(10)]
