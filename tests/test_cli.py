import io
import json
import os
import re
import subprocess
import sys
import time

import pytest

import simhashdb
from simhashdb import cli

from conftest import stored_value

storage = pytest.mark.usefixtures("backend")  # runs on each backend, subprocesses too


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    text = " ".join(words[i % 10] + str(i % 37) for i in range(600))
    (root / "a.txt").write_text(text)
    (root / "sub" / "a_copy.txt").write_text(text.replace("alpha0", "omega0", 1))
    other = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]
    (root / "b.txt").write_text(" ".join(other[i % 8] + str(i % 23) for i in range(500)))
    (root / "skip.log").write_text("not imported")
    return root


def test_every_command_has_help_with_an_example(capsys):
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"init", "import", "query", "delete", "get", "stats", "compact",
                             "check", "export", "find-all", "clusters", "fingerprint",
                             "expire", "spark", "export-parquet", "import-parquet", "upgrade",
                             "relayout", "serve"}
    for sub in commands.values():
        assert "Example:\n  simhashdb-cli " in sub.format_help()


@storage
def test_dec_import_query_get_delete(tmp_path, capsys, monkeypatch):
    db = tmp_path / "x.db"
    hashes = tmp_path / "h.txt"
    hashes.write_text("1\n3\n7\n\n1099511627776\n")
    assert run(capsys, "init", db, "--distance", "3", "--blocks", "5")[0] == 0
    code, out, _ = run(capsys, "import", db, hashes)
    assert code == 0 and out == [{"imported": 4, "invalid": 0, "near_duplicates": 0, "skipped_files": {}}]
    line = str(hashes) + ":%d"  # a line's key carries its file, so two imports never collide
    code, out, _ = run(capsys, "query", db, "2", "0x7", "--distance", "1")
    assert out == [{"query": 2, "matches": [{"key": line % 2, "fingerprint": 3, "distance": 1}]},
                   {"query": 7, "matches": [{"key": line % 3, "fingerprint": 7, "distance": 0},
                                            {"key": line % 2, "fingerprint": 3, "distance": 1}]}]
    monkeypatch.chdir(tmp_path)  # get and delete take the path as given to import, or absolute
    got = run(capsys, "get", db, "h.txt:5")[1]
    assert [{k: v for k, v in g.items() if k != "stored_at"} for g in got] == \
        [{"key": line % 5, "fingerprint": 1 << 40, "meta": None}]
    assert abs(got[0]["stored_at"] - time.time()) < 60
    assert run(capsys, "delete", db, "h.txt:1", line % 2, "h.txt:99")[1] == [
        {"deleted": 2, "requested": 3, "not_found": ["h.txt:99"]}]
    code, _, err = run(capsys, "get", db, line % 1)
    assert code == 1 and "no document with key" in err
    assert run(capsys, "stats", db)[1][0]["count"] == 2
    assert run(capsys, "check", db)[1] == [{"problems": []}]


@storage
def test_compact_reports_the_size_where_the_backend_keeps_it(tmp_path, capsys, backend):
    db = tmp_path / "x.db"
    with simhashdb.DB(str(db)) as handle:
        handle.insert_many((i, i * 7919) for i in range(9000))  # (as runs: past recent's limit)
    code, out, err = run(capsys, "compact", db)
    size = "memory_bytes" if backend == "redis" else "disk_bytes"  # Redis: RAM
    assert code == 0 and err == "" and set(out[0]) == {size + "_before", size + "_after"}
    assert 0 < out[0][size + "_after"] <= out[0][size + "_before"]
    stats = run(capsys, "stats", db)[1][0]
    assert stats[size] > 0 and stats["bytes_per_fingerprint_per_table"] > 0


@storage
def test_key_prefix_and_hex(tmp_path, capsys, monkeypatch):
    db = tmp_path / "x.db"
    code, out, _ = run(capsys, "import", db, "--format", "hex", "--key-prefix", "h",
                       stdin="ff\n0x10\n", monkeypatch=monkeypatch)
    assert code == 0
    assert sorted(r["key"] for r in run(capsys, "export", db)[1][1:]) == ["h1", "h2"]
    assert run(capsys, "get", db, "h2")[1][0]["fingerprint"] == 16


@storage
def test_export_then_import_round_trips_keys_and_meta(tmp_path, capsys):
    with simhashdb.DB(str(tmp_path / "src.db")) as db:
        db.insert_many([("s", 1, {"url": "https://a", "n": [1, 2]}), (b"\x00bin", 2, b"\xff"),
                        (-7, 2**64 - 1, None), ("next\x85line\u2028sep\u2029", 3, "\x85")])
    dump = tmp_path / "dump.jsonl"
    cli.main(["export", str(tmp_path / "src.db")])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 + 4  # no line break inside an answer, for any line reader
    dump.write_text(out)
    assert run(capsys, "import", tmp_path / "dst.db", dump)[0] == 0
    with simhashdb.DB(str(tmp_path / "src.db")) as a, simhashdb.DB(str(tmp_path / "dst.db")) as b:
        assert list(a) == list(b)


@storage
def test_expire_forgets_what_was_stored_long_ago_and_export_keeps_the_times(tmp_path, capsys):
    now = int(time.time())
    dump = tmp_path / "in.jsonl"
    dump.write_text("".join(json.dumps({"key": k, "fingerprint": fp, "stored_at": t}) + "\n"
                            for k, fp, t in [("old", 1, now - 40 * 86400), ("recent", 2**40, now - 3600),
                                             ("older", 2**50, now - 31 * 86400), ("new", 2**60, None)]))
    db = tmp_path / "r.db"
    assert run(capsys, "import", db, dump)[0] == 0
    times = {r["key"]: r["stored_at"] for r in run(capsys, "export", db)[1][1:]}
    assert times["old"] == now - 40 * 86400 and abs(times["new"] - now) < 60
    assert run(capsys, "expire", db, "--older-than", "30d")[1] == [{"expired": 2}]
    assert sorted(r["key"] for r in run(capsys, "export", db)[1][1:]) == ["new", "recent"]
    assert run(capsys, "expire", db, "--older-than", "0.5h")[1] == [{"expired": 1}]  # 30m
    for bad in ("30", "30 days", "-1d", "\u0663d", "1.5.5h", ".5h"):
        with pytest.raises(SystemExit) as usage:
            cli.main(["expire", str(db), "--older-than=" + bad])
        assert usage.value.code == 2 and "is not a duration" in capsys.readouterr().err


@storage
def test_import_if_new_refresh_keeps_what_is_seen_again(tmp_path, capsys, monkeypatch):
    db = tmp_path / "f.db"
    dump = tmp_path / "in.jsonl"
    dump.write_text(json.dumps({"key": "a", "fingerprint": 255, "stored_at": 1000}) + "\n")
    assert run(capsys, "import", db, dump)[0] == 0
    code, out, _ = run(capsys, "import", db, "--if-new", "--format", "dec", stdin="254\n",
                       monkeypatch=monkeypatch)
    assert out[0]["skipped"] == 1 and run(capsys, "get", db, "a")[1][0]["stored_at"] == 1000
    code, out, _ = run(capsys, "import", db, "--if-new", "--refresh", "--format", "dec",
                       stdin="254\n", monkeypatch=monkeypatch)
    assert out[0]["skipped"] == 1 and run(capsys, "get", db, "a")[1][0]["stored_at"] > 1000


@storage
def test_import_if_new_reports_a_key_whose_far_version_replaced_the_stored_one(tmp_path, capsys):
    db = tmp_path / "v.db"
    data = tmp_path / "in.jsonl"
    data.write_text('{"key": "u", "fingerprint": 255}\n')
    assert run(capsys, "import", db, data)[0] == 0
    data.write_text('{"key": "u", "fingerprint": 254}\n{"key": "u", "fingerprint": "0xff00"}\n')
    code, out, _ = run(capsys, "import", db, data, "--if-new", "--batch-size", "1")
    # u at 1 bit from its stored version is unchanged; at 0xff00, far, it replaces it
    assert out[0] == {"replaced": "u", "source": str(data), "line": 2, "fingerprint_before": 255}
    assert out[1]["imported"] == 1 and out[1]["unchanged"] == 1
    assert out[1]["near_duplicates"] == 0
    assert run(capsys, "get", db, "u")[1][0]["fingerprint"] == 0xff00


@storage
def test_directory_import_with_globs_query_text_and_clusters(tmp_path, capsys, corpus):
    db = tmp_path / "c.db"
    code, out, _ = run(capsys, "import", db, corpus, "--include", "*.txt")
    assert code == 0 and out[-1]["imported"] == 3
    code, out, _ = run(capsys, "query", db, "--text", corpus / "a.txt")
    keys = [m["key"] for m in out[0]["matches"]]
    assert keys[0] == str(corpus / "a.txt") and str(corpus / "sub" / "a_copy.txt") in keys
    assert str(corpus / "b.txt") not in keys
    assert run(capsys, "clusters", db)[1] == [[str(corpus / "a.txt"),
                                               str(corpus / "sub" / "a_copy.txt")]]
    code, pairs, err = run(capsys, "find-all", db)
    assert [p[:2] for p in pairs] == [[str(corpus / "a.txt"), str(corpus / "sub" / "a_copy.txt")]]
    assert "fingerprints within 3 bits" in err
    code, _, err = run(capsys, "clusters", db, "--distance", "1")
    assert code == 0 and "fingerprints within 1 bits" in err  # the distance asked for


@storage
def test_if_new_skips_near_duplicates_also_within_the_input(tmp_path, capsys, corpus):
    db = tmp_path / "n.db"
    code, out, _ = run(capsys, "import", db, corpus, "--exclude", "*.log", "--if-new")
    skipped = [o for o in out if "skipped" in o]
    assert code == 0 and len(skipped) == 1 and out[-1]["near_duplicates"] == 1
    assert skipped[0]["skipped"] == str(corpus / "sub" / "a_copy.txt")
    assert skipped[0]["matches"][0]["key"] == str(corpus / "a.txt")
    assert run(capsys, "stats", db)[1][0]["count"] == 2
    # the corpus again, all of it stored first: each document is there under its own
    # key, unchanged, though another is near it too (they were reported as skipped)
    assert run(capsys, "import", db, corpus, "--exclude", "*.log")[0] == 0
    code, out, _ = run(capsys, "import", db, corpus, "--exclude", "*.log", "--if-new")
    assert code == 0 and out == [{"imported": 0, "invalid": 0, "near_duplicates": 0,
                                  "skipped_files": {}, "unchanged": 3, "decoded": {"utf-8": 3}}]


@pytest.mark.parametrize("fmt,lines,message", [
    ("dec", "1\n2\nnot-a-number\n4\n", ":3: line 'not-a-number' is not a decimal"),
    ("dec", "1\n2\n18446744073709551616\n", ":3: expected a fingerprint in [0, 2**64)"),
    ("hex", "ff\nxyz\n", ":2: line 'xyz' is not a hex"),
    ("jsonl", '{"key": "a", "fingerprint": 1}\n{"key": "b", \n', ":2: not JSON"),
    ("jsonl", '{"key": "a", "fingerprint": 1}\n{"fingerprint": 2}\n', ':2: expected an object'),
    ("jsonl", '{"key": "a", "fingerprint": 1}\n{"key": 1.5, "fingerprint": 2}\n',
     ":2: keys must be str, bytes or int"),
    ("jsonl", '{"key": "a", "fingerprint": -1}\n', ":1: expected a fingerprint in"),
    ("jsonl", '{"key": "a"}\n', ':1: expected "fingerprint"'),
])
@storage
def test_bad_lines_stop_the_import_and_leave_the_batch_unwritten(tmp_path, capsys, fmt, lines,
                                                                  message):
    db = tmp_path / "bad.db"
    data = tmp_path / "in.txt"
    data.write_text(lines)
    with simhashdb.DB(str(db)) as d:
        d.insert("existing", 99)
    code, out, err = run(capsys, "import", db, data, "--format", fmt, "--batch-size", "2")
    assert code == 1 and out == []
    assert err.startswith("simhashdb-cli: error: %s" % data) and message in err
    assert "nothing of that batch was written" in err
    imported = int(re.search(r"\((\d+) records were imported", err).group(1))
    with simhashdb.DB(str(db)) as d:
        assert len(d) == 1 + imported and d.check() == []
    code, out, _ = run(capsys, "import", db, data, "--format", fmt, "--skip-invalid")
    assert code == 0 and out[-1]["invalid"] >= 1


@storage
def test_unreadable_text_file_and_bad_stdin_format(tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "import", tmp_path / "t.db", tmp_path / "missing.txt",
                       "--format", "text")
    assert code == 1 and "cannot read" in err and "missing.txt" in err
    code, _, err = run(capsys, "import", tmp_path / "t.db", stdin="hello world\n",
                       monkeypatch=monkeypatch)
    assert code == 1 and "--format" in err


@storage
def test_errors_exit_codes_and_debug(tmp_path, capsys):
    assert run(capsys, "stats", tmp_path / "none.db")[0] == 1
    with pytest.raises(SystemExit) as usage:
        cli.main(["query"])
    assert usage.value.code == 2
    with pytest.raises(cli.CliError, match="no database at"):
        cli.main(["--debug", "stats", str(tmp_path / "none.db")])
    with simhashdb.DB(str(tmp_path / "d.db"), distance=2):
        pass
    code, _, err = run(capsys, "import", tmp_path / "d.db", "--distance", "3", "--format", "dec")
    assert code == 1 and "--distance 2" in err and "Traceback" not in err


def test_fingerprint_command(tmp_path, capsys, corpus):
    code, out, _ = run(capsys, "fingerprint", corpus / "a.txt")
    assert out == [{"path": str(corpus / "a.txt"),
                    "fingerprint": simhashdb.fingerprint((corpus / "a.txt").read_bytes()),
                    "hex": "%016x" % simhashdb.fingerprint((corpus / "a.txt").read_bytes()),
                    "recipe": simhashdb.RECIPE}]


@storage
def test_pipeline_in_subprocesses_matches_the_library(tmp_path, corpus):
    """fingerprint | import, query --text, find-all as the reference binary, export | import."""
    exe = [sys.executable, "-m", "simhashdb"]
    db, copy = str(tmp_path / "p.db"), str(tmp_path / "copy.db")
    subprocess.run(exe + ["import", db, str(corpus), "--include", "*.txt"], check=True,
                   capture_output=True)
    out = subprocess.run(exe + ["query", db, "--text", str(corpus / "a.txt")], check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out)["matches"][0]["distance"] == 0
    fps = subprocess.run(exe + ["fingerprint", "--format", "dec"] +
                         [str(p) for p in sorted(corpus.rglob("*.txt"))],
                         check=True, capture_output=True, text=True).stdout
    hashes = tmp_path / "hashes.txt"
    hashes.write_text(fps + "5\n4\n1\n")
    result = tmp_path / "pairs.txt"
    subprocess.run(exe + ["find-all", "--input", str(hashes), "--output", str(result),
                          "--blocks", "6", "--distance", "3"], check=True)
    values = [int(v) for v in hashes.read_text().split()]
    assert [tuple(json.loads(line)) for line in result.read_text().splitlines()] == \
        [(a, b) for a, b in simhashdb.find_all(values, 6, 3) if a != b]  # as the reference
    clusters = subprocess.run(exe + ["clusters", "--input", str(hashes), "--blocks", "6"],
                              check=True, capture_output=True, text=True).stdout
    assert [json.loads(line) for line in clusters.splitlines()] == \
        simhashdb.find_clusters(values, 6, 3)
    stdin_db = str(tmp_path / "stdin.db")
    out = subprocess.run(exe + ["import", stdin_db], input=b"\n\n12\n13\n", check=True,
                         capture_output=True).stdout  # the format is read past blank lines
    assert json.loads(out)["imported"] == 2
    dump = subprocess.run(exe + ["export", db], check=True, capture_output=True).stdout
    subprocess.run(exe + ["import", copy, "--format", "jsonl"], input=dump, check=True,
                   capture_output=True)
    assert subprocess.run(exe + ["export", copy], check=True, capture_output=True).stdout == dump


@storage
def test_html_documents_are_fingerprinted_by_their_text(tmp_path, capsys):
    page = tmp_path / "p.html"
    page.write_text("<html><script>var a = 1;</script><p>Fish &amp; chips</p></html>")
    code, out, _ = run(capsys, "fingerprint", "--html", page)
    assert out[0]["fingerprint"] == simhashdb.fingerprint("Fish & chips")
    db = tmp_path / "h.db"
    assert run(capsys, "import", db, page, "--html")[0] == 0
    assert run(capsys, "query", db, "--text", page, "--html")[1][0]["matches"][0]["distance"] == 0


@storage
def test_text_goes_in_by_the_recipe_the_database_was_filled_with(tmp_path, capsys, corpus):
    old = next(name for name in simhashdb.RECIPES if name != simhashdb.RECIPE)
    text = (corpus / "a.txt").read_bytes()
    by_old = simhashdb.fingerprint(text, **simhashdb.RECIPES[old])
    assert by_old != simhashdb.fingerprint(text)
    db = tmp_path / "old.db"
    with simhashdb.DB(db, recipe=old) as handle:
        handle.insert("seed", 1)
    assert run(capsys, "import", db, corpus / "a.txt")[0] == 0
    code, out, _ = run(capsys, "query", db, "--text", corpus / "a.txt")
    assert out[0]["fingerprint"] == by_old and out[0]["matches"][0]["key"] == str(corpus / "a.txt")
    code, out, _ = run(capsys, "fingerprint", "--recipe", old, corpus / "a.txt")
    assert out[0]["fingerprint"] == by_old
    # a new database takes the current recipe; one of an unknown recipe refuses text
    assert run(capsys, "import", tmp_path / "new.db", corpus / "a.txt")[0] == 0
    with simhashdb.DB(tmp_path / "new.db") as handle:
        assert handle.recipe == simhashdb.RECIPE
    with simhashdb.DB(tmp_path / "custom.db", recipe="my-recipe") as handle:
        handle.insert("seed", 1)
    code, _, err = run(capsys, "import", tmp_path / "custom.db", corpus / "a.txt")
    assert code == 1 and "my-recipe" in err


def test_the_console_script_is_where_the_readme_says():
    """After `make`, .venv/bin/simhashdb-cli (beside the venv's python) runs."""
    script = os.path.join(os.path.dirname(sys.executable), "simhashdb-cli")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "expire" in done.stdout and "fingerprint" in done.stdout


def test_text_goes_through_the_databases_text_methods(tmp_path, capsys):
    db = str(tmp_path / "db")
    pages = tmp_path / "pages"
    pages.mkdir()
    text = " ".join("word%d topic%d" % (i % 53, i % 7) for i in range(800))
    (pages / "a.txt").write_text(text)
    (pages / "a_copy.txt").write_text(text.replace("word5 ", "word6 ", 3))
    code, out, _ = run(capsys, "import", db, str(pages), "--if-new")
    assert code == 0 and out[-1]["imported"] == 1 and out[-1]["near_duplicates"] == 1
    with simhashdb.DB(db, readonly=True) as opened:
        stored = opened.get(str(pages / "a.txt"))
        assert [m.key for m in opened.query_text(text)] == [stored.key]
        # the signature rides in the stored value
        assert len(simhashdb.records.unpack(stored_value(opened, stored.key))) == 4
    code, out, _ = run(capsys, "query", db, "--text", str(pages / "a_copy.txt"))
    assert out[0]["matches"][0]["key"] == stored.key
    code, _, err = run(capsys, "query", db, "--text", str(pages / "a.txt"), "--distance", "2")
    assert code == 2 and "--distance is for fingerprints" in err


@pytest.mark.parametrize("missing", ["pyarrow", "pyspark"])
def test_spark_without_its_extras_says_what_to_install(tmp_path, capsys, monkeypatch, missing):
    for name in list(sys.modules):
        if name == missing or name.startswith(missing + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    (tmp_path / "in.txt").write_text("1\n2\n")
    code, _, err = run(capsys, "spark", "find-all", tmp_path / "in.txt", "-")
    assert code == 1
    assert err.startswith("simhashdb-cli: error: spark needs pyspark, pyarrow")
    assert "report it" not in err and "\n" not in err.strip()


def test_parquet_without_pyarrow_says_what_to_install_not_to_report_it(tmp_path, capsys,
                                                                      monkeypatch):
    for name in list(sys.modules):
        if name == "pyarrow" or name.startswith("pyarrow.") or name == "simhashdb.parquet":
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import raises ImportError
    with simhashdb.DB(str(tmp_path / "p.db")) as db:
        db.insert("a", 1)
    code, _, err = run(capsys, "export-parquet", tmp_path / "p.db", tmp_path / "out.parquet")
    assert code == 1 and err.startswith("simhashdb-cli: error: Parquet needs pyarrow: pip install")
    assert "report it" not in err and "\n" not in err.strip()


def test_init_with_a_mistyped_recipe_is_a_usage_error_and_creates_nothing(tmp_path, capsys):
    mistyped = simhashdb.RECIPE.replace("idf", "ifd")
    code, _, err = run(capsys, "init", tmp_path / "r.db", "--recipe", mistyped)
    assert code == 2 and "is not one of simhashdb's recipes" in err and simhashdb.RECIPE in err
    assert not (tmp_path / "r.db").exists()
    code, out, _ = run(capsys, "init", tmp_path / "own.db", "--recipe", "my-shop/v1")
    assert code == 0 and out[0]["recipe"] == "my-shop/v1"


@pytest.mark.parametrize("argv", [["init", "DB", "--distance", "70"],
                                  ["init", "DB", "--blocks", "64", "--distance", "3"],
                                  ["init", "DB", "--expected-size", "0"],
                                  ["init", "redis:/localhost/x"],
                                  ["import", "DB", "FILE", "--threshold", "0.5"],
                                  ["import", "DB", "FILE", "--refresh"],
                                  ["find-all", "--input", "FILE", "--blocks", "64"]])
def test_option_values_that_cannot_be_are_usage_errors_that_make_nothing(tmp_path, capsys,
                                                                         monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "n.txt").write_text("1\n")
    code, out, err = run(capsys, *[{"DB": "u.db", "FILE": "n.txt"}.get(a, a) for a in argv])
    assert code == 2 and out == [] and err.startswith("simhashdb-cli: error: "), err
    assert sorted(os.listdir(tmp_path)) == ["n.txt"]


def test_a_query_distance_that_cannot_be_is_a_usage_error(tmp_path, capsys):
    db = str(tmp_path / "q.db")
    assert run(capsys, "init", db)[0] == 0
    code, out, err = run(capsys, "query", db, "5", "--distance", "70")
    assert code == 2 and out == [] and "--distance takes a number of bits in [0, 64]" in err, err


def test_mistakes_of_a_first_hour_are_one_line_that_says_what_to_do(tmp_path, capsys,
                                                                     monkeypatch):
    """Options for a file of hashes given with a database (ignored before),
    a distance above the database's (refused only after a note saying the
    pairs were within it), a file given to query as a fingerprint, and a
    key and a fingerprint on a line of a list of fingerprints."""
    db = tmp_path / "m.db"
    page = tmp_path / "page.txt"
    page.write_text("some words of a page to fingerprint")
    assert run(capsys, "import", db, page)[0] == 0
    code, out, err = run(capsys, "find-all", db, "--input", page)
    assert code == 2 and out == [] and err == (
        "simhashdb-cli: error: --input is for a file of hashes, and %s names a database: give "
        "one or the other\n" % db)
    code, out, err = run(capsys, "clusters", db, "--distance", "6")
    assert code == 2 and err.count("\n") == 1 and "above the distance" in err, err
    code, out, err = run(capsys, "query", db, page)
    assert code == 2 and err == ("simhashdb-cli: error: %s is a file, not a fingerprint: to query "
                                 "the text of files, name them after --text\n" % page)
    code, _, err = run(capsys, "import", db, "--format", "dec", stdin="1\t7919\n",
                       monkeypatch=monkeypatch)
    assert code == 1 and "line '1\\t7919' is not a decimal fingerprint (a key and a fingerprint? " \
        "write JSON lines: {\"key\": 1, \"fingerprint\": 7919})" in err, err


def test_an_argument_too_many_shows_the_commands_usage(tmp_path, capsys):
    """`get PATH KEY` given two keys: the error shows get's usage, not the
    list of commands."""
    with pytest.raises(SystemExit) as usage:
        cli.main(["get", str(tmp_path / "k.db"), "a", "b"])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and err.startswith("usage: simhashdb-cli get ")
    assert err.endswith("simhashdb-cli get: error: unrecognized arguments: b\n")


def test_a_batch_that_cannot_be_stored_says_what_earlier_batches_committed(
        tmp_path, capsys, monkeypatch):
    db = tmp_path / "full.db"
    stored = simhashdb.DB.insert_many

    def fills_the_disk(self, records, **kwargs):
        if len(self):
            raise simhashdb.DiskFullError("cannot write to %s: the disk is full (0 bytes free): "
                                          "free some space, then retry; nothing of this was "
                                          "written" % db)
        return stored(self, records, **kwargs)
    monkeypatch.setattr(simhashdb.DB, "insert_many", fills_the_disk)
    code, _, err = run(capsys, "import", db, "--format", "dec", "--batch-size", "2",
                       stdin="1\n2\n3\n4\n", monkeypatch=monkeypatch)
    assert code == 1 and "the disk is full" in err
    assert "the 2 records imported before, in batches that were committed, stay" in err
    with simhashdb.DB(str(db)) as opened:
        assert sorted(record.key for record in opened) == [1, 2]


def test_json_lines_fields_no_record_takes_are_told(tmp_path, capsys, monkeypatch):
    lines = ('{"key": "m", "fingerprint": 5, "metadata": {"x": 1}}\n'
             '{"key": "n", "fingerprint": 6, "meta": 1}\n')
    code, out, err = run(capsys, "import", tmp_path / "j.db", "--format", "jsonl",
                         stdin=lines, monkeypatch=monkeypatch)
    assert code == 0 and out[-1]["imported"] == 2
    assert "fields 'metadata' were not read" in err and "'meta'" not in err


def test_a_file_of_fingerprints_with_hex_letters_past_the_first_look_is_all_hex(
        tmp_path, capsys):
    listed = tmp_path / "fps.txt"
    digits = ["%016d" % (10**15 + i) for i in range(25000)]  # > 64 KiB of digits only
    listed.write_text("\n".join(digits + ["abcdef0123456789"]) + "\n")
    code, out, err = run(capsys, "import", tmp_path / "h.db", listed)
    assert code == 0 and out[-1]["imported"] == 25001, err
    with simhashdb.DB(str(tmp_path / "h.db")) as db:
        assert db.get("%s:1" % listed).fingerprint == int(digits[0], 16)
        assert db.get("%s:25001" % listed).fingerprint == 0xabcdef0123456789


def test_an_empty_stdin_imports_nothing_and_white_space_alone_too(tmp_path, capsys, monkeypatch):
    def run_on(given):  # a stdin that can be looked at without taking its lines, as sys.stdin
        buffered = io.BufferedReader(io.BytesIO(given.encode()))
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(buffered))
        return run(capsys, "import", tmp_path / "e.db")
    for given in ("", "\n  \n"):
        code, out, err = run_on(given)
        assert code == 0 and out[-1]["imported"] == 0 and "error" not in err
    code, _, err = run_on("a few words\n")
    assert code == 1 and "cannot tell the format of stdin" in err


def test_a_threshold_where_no_texts_are_paired_is_told(tmp_path, capsys, monkeypatch):
    (tmp_path / "h.txt").write_text("1\n3\n")
    code, _, err = run(capsys, "find-all", "--input", tmp_path / "h.txt", "--blocks", "4",
                       "--threshold", "0.4")
    assert code == 2 and "--threshold is for the texts of a database" in err
    run(capsys, "import", tmp_path / "k.db", "--format", "dec", stdin="1\n3\n",
        monkeypatch=monkeypatch)
    code, out, err = run(capsys, "find-all", tmp_path / "k.db", "--threshold", "0.5")
    assert code == 0 and out == [[1, 2, 1]] and "--threshold has no say here" in err
    code, out, err = run(capsys, "find-all", tmp_path / "k.db")
    assert code == 0 and out == [[1, 2, 1]] and err == ""
