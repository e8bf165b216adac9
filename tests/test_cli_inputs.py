"""The command line on bad input, signals, closed and full streams: one-line
errors, documented exit statuses, the database as of the last committed batch."""

import bz2
import gzip
import json
import lzma
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import simhashdb
from simhashdb import cli

from test_cli import run

storage = pytest.mark.usefixtures("backend")
EXE = [sys.executable, "-m", "simhashdb"]


def one_line_error(err):
    return err.startswith("simhashdb-cli: error: ") and err.count("\n") == 1 and \
        "Traceback" not in err


def test_ctrl_c_exits_130_with_one_line_and_keeps_committed_batches(tmp_path):
    db = str(tmp_path / "c.db")
    # as from a terminal, whatever this process inherited (a job started in the
    # background of a script ignores SIGINT, and so would the child)
    proc = subprocess.Popen(EXE + ["import", db, "--format", "dec", "--batch-size", "2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.stdin.write(b"1\n2\n3\n")  # one batch committed, one record waiting for more input
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while True:
        try:
            with simhashdb.DB(db, readonly=True) as handle:
                if len(handle) == 2:
                    break
        except simhashdb.DatabaseError:
            pass  # not created yet
        assert time.monotonic() < deadline, "the first batch was never committed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.decode().count("\n") == 1 and "interrupted: 2 records were imported" in \
        err.decode()
    assert b"Traceback" not in err and out == b""
    with simhashdb.DB(db, readonly=True) as handle:
        assert sorted(r.key for r in handle) == [1, 2] and handle.check() == []


def test_closed_stdin_is_one_line(tmp_path):
    for argv in (["import", str(tmp_path / "s.db"), "--format", "dec"],
                 ["query", str(tmp_path / "s.db")], ["fingerprint"]):
        if argv[0] == "query":
            simhashdb.DB(str(tmp_path / "s.db")).close()
        done = subprocess.run(EXE + argv, capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: os.close(0))
        assert done.returncode == 1 and one_line_error(done.stderr), done.stderr
        assert "standard input is closed" in done.stderr


@pytest.mark.parametrize("argv", [["export", "DB"], ["stats", "DB"], ["fingerprint"],
                                  ["find-all", "DB", "--output", "/dev/full"]])
def test_a_full_disk_on_output_is_one_line_naming_the_output(tmp_path, argv):
    db = str(tmp_path / "f.db")
    with simhashdb.DB(db) as handle:
        handle.insert_many((i, i) for i in range(5000))
    argv = [db if a == "DB" else a for a in argv]
    with open("/dev/full", "w") as full:
        done = subprocess.run(EXE + argv, stdout=full, stderr=subprocess.PIPE, text=True,
                              input="a line of text to fingerprint\n", timeout=60)
    assert done.returncode == 1 and one_line_error(done.stderr), done.stderr
    output = "/dev/full" if "--output" in argv else "stdout"
    assert "cannot write to %s: No space left on device" % output in done.stderr


def test_a_fifo_in_a_directory_is_skipped_with_a_note(tmp_path):
    root = tmp_path / "dir"
    root.mkdir()
    (root / "a.txt").write_text("some words of text to fingerprint " * 20)
    os.mkfifo(root / "pipe")
    done = subprocess.run(EXE + ["import", str(tmp_path / "d.db"), str(root)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["imported"] == 1 and summary["skipped_files"] == {"not a regular file": 1}
    assert "note: skipped %s: not a regular file" % (root / "pipe") in done.stderr


def test_files_and_directories_of_a_walk_that_cannot_be_read_are_skipped_with_a_note(tmp_path):
    """A broken link, a file and a directory the process may not read, met in a
    walked directory, are skipped and counted as a FIFO is (a broken link
    stopped the import, and an unreadable directory was left out silently);
    a file named on the command line that cannot be read is still an error."""
    root = tmp_path / "dir"
    (root / "locked").mkdir(parents=True)
    (root / "a.txt").write_text("some words of text to fingerprint " * 20)
    (root / "locked" / "b.txt").write_text("other words of another text " * 20)
    (root / "c.txt").write_text("a third text that nobody may read " * 20)
    os.symlink(tmp_path / "nowhere", root / "dangling")
    os.chmod(root / "locked", 0)
    os.chmod(root / "c.txt", 0)
    # without root's right to read what it may not (os.setuid would not drop it for root)
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] \
        if os.geteuid() == 0 else []
    if drop and subprocess.run(drop + ["true"]).returncode != 0:
        pytest.skip("root here cannot drop its capabilities")
    try:
        done = subprocess.run(drop + EXE + ["import", str(tmp_path / "d.db"), str(root)],
                              capture_output=True, text=True, timeout=60)
        named = subprocess.run(EXE + ["import", str(tmp_path / "e.db"), str(root / "dangling")],
                               capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(root / "locked", 0o755)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["imported"] == 1 and summary["skipped_files"] == {
        "a broken link": 1, "cannot be read (Permission denied)": 1,
        "a directory that cannot be read (Permission denied)": 1}
    for path, why in (("dangling", "a broken link"), ("c.txt", "cannot be read"),
                      ("locked", "a directory that cannot be read")):
        assert "note: skipped %s: %s" % (root / path, why) in done.stderr
    assert named.returncode == 1 and one_line_error(named.stderr), named.stderr
    assert "cannot read %s: No such file or directory" % (root / "dangling") in named.stderr


@pytest.mark.parametrize("fmt,line", [
    ("dec", "1_000"), ("dec", "+7"), ("dec", "-7"), ("dec", "\u0663\u0664"), ("dec", "\uff17"),
    ("dec", "7 8"), ("dec", "0x10"), ("hex", "ff_ff"), ("hex", "+ff"), ("hex", "0x"),
    ("hex", "f" * 4300), ("dec", "9" * 4300), ("hex", "1" + "0" * 16), ("dec", "7.0"),
    ("jsonl", '{"key": "k", "fingerprint": true}'),
    ("jsonl", '{"key": "k", "fingerprint": "1_000"}'),
    ("jsonl", '{"key": "k", "fingerprint": 1e3}'),
    ("jsonl", '{"key": "k", "fingerprint": %s}' % ("9" * 5000)),
    ("jsonl", '{"key": "k", "fingerprint": 1, "meta": %s1%s}' % ("[" * 100000, "]" * 100000)),
    ("jsonl", '{"key": "k\\ud800", "fingerprint": 1}'),
    ("jsonl", '{"key": true, "fingerprint": 1}'),
    ("jsonl", '{"key": "k", "fingerprint": 1, "stored_at": "yesterday"}'),
    ("jsonl", b'{"key": "caf\xe9", "fingerprint": 1}'),
])
@storage
def test_malformed_lines_are_one_line_errors_and_change_nothing(tmp_path, capsys, fmt, line):
    db = tmp_path / "m.db"
    with simhashdb.DB(str(db)) as handle:
        handle.insert("seed", 1)
    data = tmp_path / "in"
    data.write_bytes(b"5\n" if fmt != "jsonl" else b'{"key": "first", "fingerprint": 5}\n')
    with open(data, "ab") as f:
        f.write(line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass"))
    code, out, err = run(capsys, "import", db, data, "--format", fmt)
    assert code == 1 and out == [] and one_line_error(err) and ":2: " in err, err
    assert len(err) < 600
    with simhashdb.DB(str(db)) as handle:
        assert [r.key for r in handle] == ["seed"]
    code, out, err = run(capsys, "import", db, data, "--format", fmt, "--skip-invalid")
    assert code == 0 and out[-1]["invalid"] == 1 and out[-1]["imported"] == 1


def test_invalid_utf8_keys_are_errors_not_substitutions(tmp_path, capsys):
    db = tmp_path / "u.db"
    data = tmp_path / "in.jsonl"
    data.write_bytes(b'{"key": "a\xff", "fingerprint": 1}\n{"key": "a\xfe", "fingerprint": 2}\n')
    code, _, err = run(capsys, "import", db, data)
    assert code == 1 and "not valid UTF-8" in err and one_line_error(err)
    code, out, _ = run(capsys, "import", db, data, "--skip-invalid")
    assert out[-1]["invalid"] == 2 and out[-1]["imported"] == 0


@pytest.mark.parametrize("argv", [
    ["import", "X", "--batch-size", "0"], ["import", "X", "--batch-size", "-3"],
    ["import", "X", "--batch-size", "1e3"], ["expire", "X", "--older-than", "soon"],
])
def test_bad_options_are_usage_errors(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as usage:
        cli.main([str(tmp_path / "x.db") if a == "X" else a for a in argv])
    assert usage.value.code == 2
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("value", ["1_000", "+7", "ff_ff", "\u0663", "0x", "-1", "f" * 4300])
@storage
def test_query_arguments_are_plain_decimal_or_hex(tmp_path, capsys, value):
    db = tmp_path / "q.db"
    simhashdb.DB(str(db)).close()
    code, out, err = run(capsys, "query", db, value)
    assert code == 1 and out == [] and one_line_error(err) and "is not a" in err


@pytest.mark.parametrize("compress", ["gzip", "bz2", "lzma"])
def test_a_compressed_export_or_list_imports_as_what_it_holds(tmp_path, capsys, compress):
    opener = {"gzip": gzip.open, "bz2": bz2.open, "lzma": lzma.open}[compress]
    src = str(tmp_path / "src.db")
    with simhashdb.DB(src) as db:
        db.insert_many([("a", 1, {"m": 1}), (2, 2**64 - 1), (b"c", 12345)])
    code, exported, _ = run(capsys, "export", src)
    backup = tmp_path / "backup.jsonl.x"  # no telling name: the first bytes decide
    with opener(backup, "wt") as out:
        out.write("".join(json.dumps(line) + "\n" for line in exported))
    assert run(capsys, "import", tmp_path / "back.db", backup)[1][0]["imported"] == 3
    assert run(capsys, "export", tmp_path / "back.db")[1] == exported
    listed = tmp_path / "fps.x"
    with opener(listed, "wt") as out:
        out.write("7\n0x1f\n")
    assert run(capsys, "import", tmp_path / "list.db", listed)[1][0]["imported"] == 2
    with simhashdb.DB(str(tmp_path / "list.db")) as db:
        assert sorted(record.fingerprint for record in db) == [7, 31]
    cut = tmp_path / "cut.x"
    cut.write_bytes(backup.read_bytes()[:-12])
    code, out, err = run(capsys, "import", tmp_path / "cut.db", cut)  # damaged in its first
    assert code == 0 and out[0]["skipped_files"] == {"damaged %s data" % {  # 64 KiB: skipped
        "gzip": "gzip", "bz2": "bzip2", "lzma": "xz"}[compress]: 1}, err


def test_a_list_of_fingerprints_with_a_bad_line_is_an_error_naming_it(tmp_path, capsys):
    listed = tmp_path / "fps.txt"
    listed.write_text("7400300736057530684\n1234\n12x\n55\n")
    code, _, err = run(capsys, "import", tmp_path / "l.db", listed)
    assert code == 1 and one_line_error(err)
    assert "fps.txt:3:" in err and "--format text" in err and "--skip-invalid" in err
    code, out, _ = run(capsys, "import", tmp_path / "l.db", listed, "--skip-invalid")
    assert out[0]["imported"] == 3 and out[0]["invalid"] == 1


def test_a_byte_order_mark_before_the_first_line_is_ignored(tmp_path, capsys):
    bom = "\ufeff"
    (tmp_path / "fps.txt").write_text(bom + "7400300736057530684\n1234\n")
    (tmp_path / "docs.jsonl").write_text(bom + '{"key": "a", "fingerprint": 5}\n')
    code, out, err = run(capsys, "import", tmp_path / "b.db", tmp_path / "fps.txt",
                         tmp_path / "docs.jsonl")
    assert code == 0 and out[0]["imported"] == 3, err
    with simhashdb.DB(str(tmp_path / "b.db")) as db:
        assert sorted(r.fingerprint for r in db) == [5, 1234, 7400300736057530684]


def test_a_warning_is_one_line_once(tmp_path, capsys, monkeypatch):
    def warns(args):
        """Warn twice."""
        for _ in range(2):
            warnings.warn("a warning\n  written on two lines", simhashdb.MaintenanceWarning)

    monkeypatch.setattr(cli, "cmd_stats", warns)
    code, _, err = run(capsys, "stats", tmp_path / "w.db")
    assert code == 0 and err == "simhashdb-cli: warning: a warning written on two lines\n"


@pytest.mark.parametrize("closed", ["stdout", "stderr", "both"])
def test_a_closed_stdout_or_stderr_is_no_traceback(tmp_path, closed):
    db = str(tmp_path / "c.db")
    (tmp_path / "n.txt").write_text("1\n2\n")
    for argv in (["import", db, str(tmp_path / "n.txt")], ["export", db]):
        done = subprocess.run(EXE + argv, capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: [os.close(fd) for fd in
                                                  {"stdout": [1], "stderr": [2],
                                                   "both": [1, 2]}[closed]])
        if closed == "stderr":
            assert done.returncode == 0 and done.stdout and done.stderr == ""
        else:
            assert done.returncode == 1, done
            assert done.stderr in ("", "simhashdb-cli: error: cannot write to stdout: it is "
                                       "closed\n")
    with simhashdb.DB(db) as handle:
        assert len(handle) == 2


def test_stdin_lines_keyed_by_number_into_a_filled_database_say_they_replace(
        tmp_path, capsys, monkeypatch):
    db = tmp_path / "s.db"
    code, _, err = run(capsys, "import", db, "--format", "dec", stdin="1\n2\n",
                       monkeypatch=monkeypatch)
    assert code == 0 and "replace" not in err
    code, _, err = run(capsys, "import", db, "--format", "dec", stdin="3\n",
                       monkeypatch=monkeypatch)
    assert code == 0 and "they replace the records stored under those numbers" in err
    code, _, err = run(capsys, "import", db, "--format", "dec", "--key-prefix", "b:",
                       stdin="4\n", monkeypatch=monkeypatch)
    assert code == 0 and "replace" not in err
    with simhashdb.DB(str(db)) as handle:
        assert sorted((r.key, r.fingerprint) for r in handle if isinstance(r.key, int)) == \
            [(1, 3), (2, 2)]


def test_a_walked_file_whose_name_is_not_utf8_is_skipped_with_a_note(tmp_path, capsys):
    root = tmp_path / "odd"
    root.mkdir()
    (root / "good.txt").write_text("another document, with words of its own")
    with open(os.path.join(os.fsencode(root), b"bad\xffname.txt"), "w") as odd:
        odd.write("some text of a document here")
    code, out, err = run(capsys, "import", tmp_path / "o.db", root)
    assert code == 0 and out[0]["imported"] == 1
    assert out[0]["skipped_files"] == {"its name is not UTF-8": 1} and "skipped" in err
    code, out, _ = run(capsys, "fingerprint", root)
    assert code == 0 and [o["path"] for o in out] == [str(root / "good.txt")]


@pytest.mark.parametrize("line, why", [
    ('{"key": "a", "fingerprint": 5, "meta": NaN}', "NaN is not JSON"),
    ('{"key": "a", "fingerprint": 5, "meta": [Infinity]}', "Infinity is not JSON"),
    ('{"key": "a", "fingerprint": 5, "text": "words"}', '"fingerprint" or "text", not both')])
def test_json_lines_python_reads_but_json_has_not_are_errors(tmp_path, capsys, line, why):
    (tmp_path / "in.jsonl").write_text(line + "\n")
    code, _, err = run(capsys, "import", tmp_path / "j.db", tmp_path / "in.jsonl")
    assert code == 1 and "in.jsonl:1:" in err and why in err


def test_an_interrupted_read_says_interrupted_alone(tmp_path, capsys, monkeypatch):
    def interrupted(args):
        """Be interrupted."""
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_export", interrupted)
    code, _, err = run(capsys, "export", tmp_path / "i.db")
    assert code == 130 and err == "simhashdb-cli: interrupted\n"


def test_an_interrupt_while_the_command_line_is_read_is_one_line(monkeypatch, capsys):
    """Ctrl-C before a command begins (while its parser is built) exits 130
    with one line, not a KeyboardInterrupt traceback."""
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    monkeypatch.setattr(sys, "argv", ["simhashdb-cli", "stats", "x.db"])
    with pytest.raises(SystemExit) as exited:
        cli.main_exit()
    assert exited.value.code == 130 and capsys.readouterr().err == "simhashdb-cli: interrupted\n"


def feeding(fifo, data, first=0):
    """Make the named pipe ``fifo`` and a thread that writes ``data`` into it
    once a reader opens it (its ``first`` bytes alone, then the rest after a
    pause, as a slow producer would)."""
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb", buffering=0) as out:
            if first:
                out.write(data[:first])
                time.sleep(0.5)
            out.write(data[first:])

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return writer


@pytest.mark.parametrize("compressed,first", [(False, 0), (True, 0), (True, 1), (False, 1)])
def test_a_named_pipe_with_its_format_given_is_read_whole(tmp_path, compressed, first):
    """Also when the pipe's first read gives one byte (half of gzip's magic)."""
    fifo = tmp_path / "fifo"
    data = "".join("%d\n" % i for i in range(1, 5001)).encode()
    writer = feeding(fifo, gzip.compress(data) if compressed else data, first)
    done = subprocess.run(EXE + ["import", str(tmp_path / "p.db"), "--format", "dec",
                                 str(fifo)], capture_output=True, text=True, timeout=60)
    writer.join(60)
    assert not writer.is_alive()
    assert done.returncode == 0 and json.loads(done.stdout)["imported"] == 5000, done.stderr


def test_a_pipe_of_json_lines_is_read_whole_and_one_of_unknown_format_is_refused(tmp_path):
    lines = "".join(json.dumps({"key": "k%05d" % i, "fingerprint": i}) + "\n"
                    for i in range(20000)).encode()  # over the 64 KiB a look at a file takes
    for given, compress in (("--format", False), ("--format", True), (None, False)):
        fifo = tmp_path / ("fifo%s%s" % (given, compress))
        writer = feeding(fifo, gzip.compress(lines) if compress else lines)
        argv = ["import", str(tmp_path / "j.db"), str(fifo)] + \
            (["--format", "jsonl"] if given else [])
        done = subprocess.run(EXE + argv, capture_output=True, text=True, timeout=60)
        if given is None:  # nothing read, so the writer is let go by a reader of its own
            assert done.returncode == 1 and "name it (--format)" in done.stderr
            with open(fifo, "rb") as drain:
                drain.read()
        else:
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["imported"] == 20000
        writer.join(60)
        assert not writer.is_alive()


def test_a_damaged_compressed_document_is_skipped_and_a_damaged_list_says_what_was_kept(
        tmp_path, capsys):
    (tmp_path / "doc.txt.gz").write_bytes(gzip.compress(b"words of a document " * 50)[:-20])
    (tmp_path / "ok.txt").write_text("another document with words of its own")
    code, out, _ = run(capsys, "import", tmp_path / "d.db", tmp_path / "doc.txt.gz",
                       tmp_path / "ok.txt")
    assert code == 0 and out[0]["imported"] == 1
    assert out[0]["skipped_files"] == {"damaged gzip data": 1}
    listed = gzip.compress("".join("%d\n" % i for i in range(1, 300001)).encode())
    (tmp_path / "cut.gz").write_bytes(listed[:len(listed) * 3 // 4])
    code, _, err = run(capsys, "import", tmp_path / "l.db", tmp_path / "cut.gz",
                       "--batch-size", "10000")
    kept = len(simhashdb.DB(str(tmp_path / "l.db"), readonly=True))
    assert code == 1 and one_line_error(err) and "damaged gzip data" in err
    assert kept > 0 and "%d records were imported before" % kept in err


def test_a_text_of_mostly_numbers_is_a_text_and_a_directory_named_redis_a_directory(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lotto.txt").write_text("Lottery results\n12\n7\n33\n41\n5\nDrawn on Saturday\n")
    code, out, err = run(capsys, "import", "redis", "lotto.txt")
    assert code == 0 and out[0]["imported"] == 1, err
    with simhashdb.DB("redis") as db:
        assert db.backend != "redis" and [r.key for r in db] == [str(tmp_path / "lotto.txt")]


def test_an_export_behind_a_byte_order_mark_keeps_its_parameters(tmp_path, capsys):
    with simhashdb.DB(str(tmp_path / "s.db"), distance=5, recipe=simhashdb.RECIPE) as db:
        db.insert("a", 1)
    _, exported, _ = run(capsys, "export", tmp_path / "s.db")
    (tmp_path / "bom.jsonl").write_text("\ufeff" + "".join(json.dumps(o) + "\n"
                                                          for o in exported))
    assert run(capsys, "import", tmp_path / "b.db", tmp_path / "bom.jsonl")[0] == 0
    with simhashdb.DB(str(tmp_path / "b.db")) as db:
        assert (db.distance, db.recipe, len(db)) == (5, simhashdb.RECIPE, 1)


def test_fingerprint_lines_go_into_a_database_of_no_recipe_that_has_documents(
        tmp_path, capsys, monkeypatch):
    db = tmp_path / "r.db"
    assert run(capsys, "import", db, "--format", "dec", stdin="1\n2\n",
               monkeypatch=monkeypatch)[0] == 0
    (tmp_path / "a.txt").write_text("a document with some words in it")
    _, printed, _ = run(capsys, "fingerprint", tmp_path / "a.txt")
    (tmp_path / "fp.jsonl").write_text(json.dumps(printed[0]) + "\n")
    code, out, err = run(capsys, "import", db, tmp_path / "fp.jsonl")
    assert code == 0 and out[0]["imported"] == 1, err
    with simhashdb.DB(str(db)) as handle:
        assert handle.recipe is None and len(handle) == 3


def test_a_database_that_cannot_be_made_in_an_empty_directory_writes_nothing(tmp_path, capsys):
    (tmp_path / "e.db").mkdir()
    code, _, _ = run(capsys, "init", tmp_path / "e.db", "--blocks", "64", "--distance", "3")
    assert code == 2 and os.listdir(tmp_path / "e.db") == []


def test_query_text_takes_every_file_after_its_options(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("the first document, about rivers and bridges")
    (tmp_path / "b.txt").write_text("the second document, about libraries and books")
    db = tmp_path / "q.db"
    assert run(capsys, "import", db, tmp_path / "a.txt", tmp_path / "b.txt")[0] == 0
    code, out, err = run(capsys, "query", db, "--text", tmp_path / "a.txt", "--html",
                         tmp_path / "b.txt")
    assert code == 0 and [o["query"] for o in out] == [str(tmp_path / "a.txt"),
                                                      str(tmp_path / "b.txt")], err
    code, _, err = run(capsys, "query", db, "5", "--text", tmp_path / "a.txt")
    assert code == 2 and "not both" in err


def test_compressed_stdin_says_to_decompress_it_and_a_walk_that_takes_nothing_says_so(tmp_path):
    """gzip data on stdin (only named files are read decompressed) is one line
    that says so, where it was 'line is not valid UTF-8 (byte 1)'; an
    --include that takes no file of a directory is a note, where the import
    said nothing."""
    lines = b"".join(b'{"key": %d, "fingerprint": %d}\n' % (i, i * 7919) for i in range(50))
    for fmt in ([], ["--format", "jsonl"]):
        done = subprocess.run(EXE + ["import", str(tmp_path / "z.db")] + fmt,
                              input=gzip.compress(lines), capture_output=True, timeout=60)
        assert done.returncode == 1 and done.stderr == (
            b"simhashdb-cli: error: stdin is gzip data: decompress it on the way in "
            b"(| gzip -dc |) or name the file, which is read decompressed\n"), done.stderr
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_text("<p>some words of a page</p>")
    done = subprocess.run(EXE + ["import", str(tmp_path / "p.db"), str(tmp_path / "pages"),
                                 "--include", "*.htm"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["imported"] == 0
    assert "note: no file below %s matches --include *.htm" % (tmp_path / "pages") in done.stderr
