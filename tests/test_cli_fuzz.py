"""Fuzzing the command line's import and query with generated lines in every
format: only documented exits, one-line errors, and the database holding
exactly the batches that were committed (a failed batch writes nothing)."""

import base64
import contextlib
import io
import json
import sys
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import simhashdb
from simhashdb import cli

from conftest import brute_force

pytestmark = pytest.mark.usefixtures("backend")

MAX = 2**64 - 1
fingerprints = st.integers(0, MAX)
numbers = st.one_of(
    fingerprints.map(str),
    st.tuples(fingerprints, st.sampled_from(["%x", "0x%X", "%016x"])).map(lambda p: p[1] % p[0]))
json_keys = st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=6),
                      st.binary(max_size=4).map(lambda b: {"$bytes": base64.b64encode(b).decode()}))
json_lines = st.builds(
    lambda key, fp, meta, as_text: json.dumps(
        {"key": key, "fingerprint": ("%d" % fp) if as_text else fp, "meta": meta}),
    json_keys, fingerprints, st.one_of(st.none(), st.integers(), st.text(max_size=5)),
    st.booleans())
junk = st.sampled_from([
    "", "   ", "1_000", "+7", "-1", "0x", "ff_ff", "\u0663", "1e3", "true", "null", "{", "[]",
    "{}", '{"key": 1}', '{"key": [1], "fingerprint": 1}', '{"key": "a", "fingerprint": true}',
    '{"key": "a", "fingerprint": -1}', '{"key": "a", "fingerprint": 1, "meta": {"x": 1}}',
    '{"path": "p", "fingerprint": "0xff"}', '{"key": "t", "text": "some text here"}',
    '{"simhashdb": {"recipe": null, "distance": 3, "blocks": 5}}', "9" * 30, "f" * 17,
    "[" * 5000, '{"key": "\\ud800", "fingerprint": 1}', "\x00", "0xFFFFFFFFFFFFFFFF",
    "18446744073709551616"])
lines = st.lists(st.one_of(numbers, json_lines, junk, st.text(max_size=12).map(str.strip)),
                 max_size=12)
raw_lines = st.one_of(lines.map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass")),
                      st.binary(max_size=40))


def invoke(argv, stdin):
    """cli.main in this process with ``stdin`` bytes: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in argv])
            except SystemExit as exit_:
                code = exit_.code
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def contents(path):
    with simhashdb.DB(path, readonly=True) as db:
        assert db.check() == []
        return {r.key: r.fingerprint for r in db}


def assert_documented(code, err):
    assert code in (0, 1), (code, err)
    assert "Traceback" not in err
    if code == 1:
        errors = [line for line in err.splitlines() if not line.startswith("simhashdb-cli: note")]
        assert len(errors) == 1 and errors[0].startswith("simhashdb-cli: error: "), err


@given(data=raw_lines, fmt=st.sampled_from([None, "dec", "hex", "jsonl", "text"]),
       batch_size=st.integers(1, 4), if_new=st.booleans(), skip_invalid=st.booleans())
def test_fuzzed_import_exits_as_documented_and_writes_whole_batches(
        tmp_path_factory, data, fmt, batch_size, if_new, skip_invalid):
    path = str(tmp_path_factory.mktemp("fuzz") / "f.db")
    with simhashdb.DB(path, distance=3, blocks=5) as db:
        db.insert("seed", 12345)
    model, batches, stored = contents(path), [], []
    original = {name: getattr(simhashdb.DB, name) for name in ("insert_many", "insert_if_new_many")}

    def insert_many(self, records, **options):
        records = list(records)
        written = original["insert_many"](self, records, **options)  # raises: nothing written
        model.update((r[0], r[1]) for r in records)
        batches.append(len(records))
        stored.append(len(records))
        return written

    def insert_if_new_many(self, records, **options):
        records = list(records)
        results = original["insert_if_new_many"](self, records, **options)
        model.update((r[0], r[1]) for r, found in zip(records, results) if not found)
        batches.append(len(records))
        stored.append(sum(not found for found in results))
        return results

    argv = ["import", path, "--batch-size", batch_size] + (["--format", fmt] if fmt else []) + \
        (["--key", "doc"] if fmt == "text" else []) + (["--if-new"] if if_new else []) + \
        (["--skip-invalid"] if skip_invalid else [])
    with mock.patch.object(simhashdb.DB, "insert_many", insert_many), \
            mock.patch.object(simhashdb.DB, "insert_if_new_many", insert_if_new_many):
        code, out, err = invoke(argv, data)
    assert_documented(code, err)
    assert contents(path) == model
    assert all(size == batch_size for size in batches[:-1]) and batches[-1:] <= [batch_size]
    if code == 1 and "records were imported before" in err:  # a bad line stopped it
        assert "nothing of that batch was written" in err and not skip_invalid
        assert all(size == batch_size for size in batches)  # the bad line's batch never went
        assert int(err.split("(")[-1].split()[0]) == sum(stored)
    if code == 0:
        summary = json.loads(out.splitlines()[-1])
        assert set(summary) == {"imported", "invalid", "near_duplicates", "skipped_files"} | (
            {"unchanged"} if if_new else set())
        assert skip_invalid or summary["invalid"] == 0


@given(stored=st.lists(fingerprints, max_size=8), data=raw_lines,
       fmt=st.sampled_from([None, "dec", "hex"]), near=st.lists(st.integers(0, 63), max_size=3))
def test_fuzzed_query_exits_as_documented_and_answers_exactly(tmp_path_factory, stored, data,
                                                             fmt, near):
    path = str(tmp_path_factory.mktemp("fuzzq") / "q.db")
    with simhashdb.DB(path, distance=3, blocks=5) as db:
        db.insert_many(enumerate(stored))
    model = contents(path)
    probe = stored[0] if stored else 0
    for bit in near:
        probe ^= 1 << bit
    data = b"%d\n" % probe + data if fmt != "hex" else b"%x\n" % probe + data
    code, out, err = invoke(["query", path] + (["--format", fmt] if fmt else []), data)
    assert_documented(code, err)
    assert contents(path) == model
    if code == 0:
        answers = [json.loads(line) for line in out.splitlines()]
        for answer in answers:
            fp = answer.get("fingerprint", answer["query"])
            assert [tuple(m.values()) for m in answer["matches"]] == \
                [(k, f, d) for k, f, d in brute_force(model, fp, 3)]
        assert answers and (answers[0]["query"] != probe or answers[0]["matches"] == [
            {"key": k, "fingerprint": f, "distance": d} for k, f, d in brute_force(model, probe, 3)])
