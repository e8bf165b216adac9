"""The command line's faults found in a first hour beside it: an export that
import reads back whole, bounded keys, imports that report what they did,
messages in the command line's words."""

import io
import json
import os
import random
import subprocess
import sys
import time

import pytest

import simhashdb
from simhashdb import cli, records

WORDS = ["river", "bridge", "morning", "farmer", "cattle", "school", "valley", "water",
         "street", "official", "friday", "rain", "road", "north", "library", "town",
         "square", "reading", "children", "cafe", "hall", "lecture", "history", "market"]


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:  # a usage error, told by argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def text(rng, words=120):
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


def edited(rng, original, share):
    words = original.split()
    for i in rng.sample(range(len(words)), int(len(words) * share)):
        words[i] = "edit%d" % rng.randrange(10**6)
    return " ".join(words)


@pytest.mark.usefixtures("backend")
def test_export_then_import_keeps_a_text_database_whole(tmp_path, capsys):
    rng = random.Random(4)
    texts = [text(rng) for _ in range(30)]
    source, copy = str(tmp_path / "source.db"), str(tmp_path / "copy.db")
    with simhashdb.DB(source, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many((i, t) for i, t in enumerate(texts))
    code, dump, _ = run(capsys, "export", source)
    assert code == 0
    (tmp_path / "dump.jsonl").write_text(dump)
    code, _, err = run(capsys, "import", copy, tmp_path / "dump.jsonl")
    assert code == 0, err
    assert run(capsys, "export", copy)[1] == dump  # signatures and all
    probes = [edited(rng, t, share) for t in texts[:10] for share in (0.02, 0.1, 0.3)]
    probes += [text(rng) for _ in range(5)]
    decisions = []
    for path in (source, copy):
        with simhashdb.DB(path) as db:
            assert db.recipe == simhashdb.RECIPE
            decisions.append([[(m.key, m.distance, m.resemblance) for m in found]
                              for found in db.insert_text_if_new_many(
                                  ("probe%d" % i, p) for i, p in enumerate(probes))])
    assert decisions[0] == decisions[1]
    assert any(found and found[0][2] is not None for found in decisions[0])


@pytest.mark.usefixtures("backend")
def test_keys_longer_than_the_bound_are_refused_before_anything_is_written(tmp_path, capsys,
                                                                          monkeypatch):
    path = str(tmp_path / "db")
    longest = b"k" * (simhashdb.MAX_KEY_SIZE - 3)  # 3 bytes of header: MAX_KEY_SIZE stored
    url = "https://example.com/?q=" + "x" * simhashdb.MAX_KEY_SIZE
    with simhashdb.DB(path, recipe=simhashdb.RECIPE) as db:
        db.insert(longest, 1)
        assert db.get(longest).key == longest
        for call in (lambda: db.insert_many([("a", 2), (url, 3)]),
                     lambda: db.insert_text_many([("b", "some words"), (url, "more words")]),
                     lambda: db.insert(longest + b"k", 4)):
            with pytest.raises(simhashdb.InvalidKeyError, match="at most 8192.*MAX_KEY_SIZE"):
                call()
        assert len(db) == 1
        # a longer key stored before the bound is still read and removed
        with monkeypatch.context() as patched:
            patched.setattr(records, "MAX_KEY_SIZE", 2 * simhashdb.MAX_KEY_SIZE)
            db.insert(url, 7)
        assert db.get(url).fingerprint == 7 and url in db and db.delete(url)
        assert len(db) == 1
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"key": "c", "fingerprint": 5}) + "\n"
                     + json.dumps({"key": url, "fingerprint": 6}) + "\n")
    code, _, err = run(capsys, "import", path, lines)
    assert code == 1 and "in.jsonl:2: key 'https://example.com" in err and "at most 8192" in err
    assert len(err.strip().splitlines()) == 1
    with simhashdb.DB(path) as db:
        assert len(db) == 1


def test_an_empty_stdin_imports_nothing_and_makes_no_database(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").write_bytes(b"")
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "empty"))
    code, out, err = run(capsys, "import", tmp_path / "db")
    assert code == 0 and json.loads(out)["imported"] == 0 and "stdin is empty" in err
    assert not (tmp_path / "db").exists()


def slowly(records, seconds):
    """Reader.records that takes ``seconds`` to read each record, then is
    interrupted (Ctrl-C) after the 12th."""
    def read(self, formats, progress=None):
        for count, item in enumerate(records(self, formats, progress)):
            if count == 12:
                raise KeyboardInterrupt
            time.sleep(seconds)
            yield item
    return read


def test_an_import_reports_progress_without_a_terminal_and_an_interrupt_tells_the_truth(
        tmp_path, capsys, monkeypatch):
    lines = tmp_path / "in.dec"
    lines.write_text("".join("%d\n" % (i * 0x9E3779B97F4A7C15 % 2**64) for i in range(50)))
    monkeypatch.setattr(cli, "PROGRESS_SECONDS", 0, raising=False)
    code, out, err = run(capsys, "import", tmp_path / "a.db", lines, "--batch-size", 10)
    reports = [json.loads(line.split("import: ")[1].rsplit(" so far")[0])["imported"]
               for line in err.splitlines() if "so far" in line]
    assert code == 0 and reports == [10, 20, 30, 40, 50]
    monkeypatch.setattr(cli, "BATCH_SECONDS", 0.2, raising=False)
    monkeypatch.setattr(simhashdb.inputs.Reader, "records",
                        slowly(simhashdb.inputs.Reader.records, 0.05))
    code, out, err = run(capsys, "import", tmp_path / "b.db", lines)  # a batch of 10,000
    with simhashdb.DB(str(tmp_path / "b.db")) as db:
        stored = len(db)
    assert code == 130 and stored >= 4 and "%d records were imported" % stored in err


def test_make_run_says_what_it_does_before_it_compiles():
    makefile = os.path.join(os.path.dirname(__file__), os.pardir, "Makefile")
    steps = subprocess.run(["make", "-n", "--always-make", "-f", makefile, ".venv/.built"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    build = next(i for i, step in enumerate(steps) if "pip install" in step and "-e ." in step)
    assert any(step.startswith("echo") and "building" in step for step in steps[:build])


@pytest.mark.usefixtures("backend")
def test_messages_and_help_speak_the_command_lines_words(tmp_path, capsys):
    path = tmp_path / "db"
    assert run(capsys, "init", path, "--distance", 3)[0] == 0
    for argv, said in (
            (["init", path, "--distance", 5], "created with --distance 3, not 5: leave "
                                              "--distance out, or give --distance 3"),
            (["find-all", path, "--distance", 5], "--distance 5 is above the distance"),
            (["clusters", path, "--distance", 4], "--distance 4 is above the distance"),
            (["query", path, "1", "--distance", 70], "--distance takes a number of bits in "
                                                     "[0, 64], got 70"),
            (["init", tmp_path / "new", "--distance", 70], "--distance takes a number of bits "
                                                           "in [0, 63], got 70"),
            (["init", path, "--table-distance", 1], "created with --table-distance 3, not 1: "
                                                    "leave --table-distance out"),
            (["init", tmp_path / "new", "--table-distance", 4], "--table-distance must be at "
                                                                "most --distance (3), got 4"),
            (["init", tmp_path / "new", "--table-distance", -1], "--table-distance must be an "
                                                                 "int in [0, 63], got -1"),
            (["init", tmp_path / "new", "--distance", 4, "--table-distance", 0],
             "tables built for distance 0; ask for a larger table distance"),
            (["relayout", path, "--table-distance", 5], "--table-distance must be at most "
                                                        "--distance (3), got 5"),
            (["relayout", path, "--blocks", 2], "--blocks must be more than the distance the "
                                                "tables are built for (3)"),
            (["relayout", path, "--expected-size", 0], "--expected-size must be an int in [1, "
                                                    "18446744073709551616], got 0")):
        code, _, err = run(capsys, *argv)
        assert code in (1, 2) and said in err and err.count("\n") == 1, err
        assert "distance=" not in err and "find_all" not in err
    for command in ("query", "delete", "upgrade", "export", "clusters"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        usage = capsys.readouterr().out
        description = usage.split("\n\n")[1]
        assert not any(line.startswith(" ") for line in description.splitlines()), usage
        if command == "clusters":
            assert "find-all" not in usage
