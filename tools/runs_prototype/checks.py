"""The compressed-runs prototype of issue 22 (RUNS.md, tools/runs_prototype/_runs.pyx):
what a run holds reads back, every range scan counts what a sorted array
holds, and a merge is the union less what it drops.

Usage: python tools/build_runs_prototype.py && python -m pytest tools/runs_prototype/checks.py
"""

import os
import sys

import numpy as np
import pytest

from simhashdb.errors import DatabaseError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _runs  # noqa: E402  (built by tools/build_runs_prototype.py)

TOP = 2**64 - 1


def values(rng):
    """Sets of distinct uint64s a table may hold, adversarial ones included."""
    random = lambda n: rng.integers(0, 2**64, size=n, dtype=np.uint64)  # noqa: E731
    one_prefix = np.uint64(0x1234_5670_0000_0000) + np.arange(5000, dtype=np.uint64) * np.uint64(977)
    return [np.array([0], np.uint64), np.array([TOP], np.uint64), np.array([0, TOP], np.uint64),
            random(5), random(100_000),
            np.arange(70_000, dtype=np.uint64),  # offsets of 1: low width 0
            np.uint64(TOP - 9_999) + np.arange(10_000, dtype=np.uint64),  # up to 2**64 - 1
            np.concatenate([one_prefix, random(2000), np.array([0, TOP], np.uint64)])]


def ranges(rng, stored, n=4000):
    """Ranges of a 26-bit prefix, ranges at and around stored values, whole and empty ones."""
    starts = rng.integers(0, 2**64, size=n, dtype=np.uint64) & np.uint64(~((1 << 38) - 1) & TOP)
    at = stored[rng.integers(0, stored.size, size=n)]
    los = np.concatenate([starts, at, at - np.minimum(at, np.uint64(2)), np.array([0, 0, TOP], np.uint64)])
    his = np.concatenate([starts | np.uint64((1 << 38) - 1), at, np.minimum(at, np.uint64(TOP - 2)) + np.uint64(2),
                          np.array([TOP, 0, TOP], np.uint64)])
    return np.ascontiguousarray(los), np.ascontiguousarray(his)


def counts(stored, los, his):
    return np.searchsorted(stored, his, side="right") - np.searchsorted(stored, los)


def test_runs_read_back_and_scan_exactly(tmp_path):
    rng = np.random.default_rng(22)
    study = _runs.Study(str(tmp_path).encode(), 1 << 30)
    for run, stored in enumerate(values(rng), start=1):
        stored = np.unique(stored)
        study.write_run(run, stored)
        assert np.array_equal(np.frombuffer(study.values(run), np.uint64), stored)
        los, his = ranges(rng, stored)
        assert np.array_equal(np.frombuffer(study.scan(run, los, his), np.uint64),
                              counts(stored, los, his))
        order = np.argsort(los, kind="stable")
        los, his = los[order], his[order]
        assert np.array_equal(np.frombuffer(study.sweep(run, los, his), np.uint64),
                              counts(stored, los, his))
    with pytest.raises(ValueError):
        study.sweep(1, np.array([2, 1], np.uint64), np.array([2, 1], np.uint64))
    assert not any(study.sweep(run + 1, los, his))  # an empty run


def test_merge_is_the_union_less_the_dropped(tmp_path):
    rng = np.random.default_rng(7)
    study = _runs.Study(str(tmp_path).encode(), 1 << 30)
    # more than the writer's buffer (16k values), entries held by two runs, and
    # more extra values than a merge round takes from an array (4k)
    a, b = np.unique(rng.integers(0, 2**64, 400_000, dtype=np.uint64)), np.arange(3000, dtype=np.uint64)
    c = np.ascontiguousarray(np.concatenate([b[1000:], a[::7]]))
    extra = np.unique(np.concatenate([a[:100], rng.integers(0, 2**64, 20_000, dtype=np.uint64)]))
    drop = np.ascontiguousarray(np.concatenate([b[::3], a[::5]]))
    drop.sort()
    for run, stored in ((1, a), (2, b), (3, c)):
        study.write_run(run, stored)
    blocks = study.merge([1, 2, 3], 4, extra, drop)["blocks"]
    want = np.setdiff1d(np.union1d(np.union1d(a, b), extra), drop)
    assert np.array_equal(np.frombuffer(study.values(4), np.uint64), want)
    assert study.stat("runs")["entries"] == blocks  # the sources are gone
    los, his = ranges(rng, want)
    assert np.array_equal(np.frombuffer(study.scan(4, los, his), np.uint64), counts(want, los, his))
    with pytest.raises(ValueError):
        study.merge([4], 4 + _runs.SLOT_COUNT)  # into the slot it would drop


def test_merge_refuses_values_out_of_order(tmp_path):
    study = _runs.Study(str(tmp_path).encode(), 1 << 30)
    with pytest.raises(DatabaseError):
        study.write_run(1, np.array([5, 3], np.uint64))
    assert study.stat("runs")["entries"] == 0


def test_today_table_scans_as_the_run(tmp_path):
    rng = np.random.default_rng(3)
    study = _runs.Study(str(tmp_path).encode(), 1 << 30)
    stored = np.unique(rng.integers(0, 2**64, 20_000, dtype=np.uint64))
    study.write_run(1, stored)
    study.write_table(stored, True)
    los, his = ranges(rng, stored)
    assert np.array_equal(np.frombuffer(study.scan(0, los, his), np.uint64),
                          np.frombuffer(study.scan(1, los, his), np.uint64))
