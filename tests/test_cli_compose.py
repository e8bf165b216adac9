"""Commands that compose: fingerprint | query | import, text keys, formats,
keys of digits, recipes through export and import, progress, big layouts."""

import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import termios

import pytest

import simhashdb

from test_cli import corpus, run  # noqa: F401 (a fixture)

storage = pytest.mark.usefixtures("backend")
EXE = [sys.executable, "-m", "simhashdb"]


def sh(*argv, stdin=None, cwd=None):
    done = subprocess.run(EXE + [str(a) for a in argv], input=stdin, capture_output=True,
                          cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def lines(out):
    return [json.loads(line) for line in out.decode().splitlines()]


@storage
def test_fingerprint_output_pipes_into_query_and_import(tmp_path, corpus):
    db = tmp_path / "p.db"
    printed = sh("fingerprint", corpus, "--include", "*.txt", cwd=tmp_path)
    assert [p["path"] for p in lines(printed)] == [str(corpus / "a.txt"), str(corpus / "b.txt"),
                                                   str(corpus / "sub" / "a_copy.txt")]
    assert lines(sh("import", db, stdin=printed))[-1]["imported"] == 3
    found = lines(sh("query", db, stdin=printed))
    assert [q["query"] for q in found] == [p["path"] for p in lines(printed)]
    assert found[0]["matches"][0] == {"key": str(corpus / "a.txt"), "distance": 0,
                                      "fingerprint": lines(printed)[0]["fingerprint"]}
    hexes = sh("fingerprint", "--format", "hex", corpus / "a.txt")
    assert lines(sh("query", db, stdin=hexes))[0]["matches"][0]["key"] == str(corpus / "a.txt")
    # relative paths from another directory become the same absolute keys
    relative = sh("fingerprint", "docs/a.txt", cwd=tmp_path)
    assert lines(sh("import", db, "--format", "jsonl", stdin=relative, cwd=tmp_path))[-1] == \
        {"imported": 1, "invalid": 0, "near_duplicates": 0, "skipped_files": {}}
    with simhashdb.DB(str(db)) as handle:
        assert len(handle) == 3 and handle.recipe == simhashdb.RECIPE  # the lines name it
    found = lines(sh("query", db, "--text", corpus / "a.txt"))  # so texts can be asked
    assert found[0]["matches"][0]["key"] == str(corpus / "a.txt")
    old = next(name for name in simhashdb.RECIPES if name != simhashdb.RECIPE)
    other = sh("fingerprint", "--recipe", old, corpus / "b.txt")
    done = subprocess.run(EXE + ["import", str(db)], input=other, capture_output=True,
                          timeout=120)
    assert done.returncode == 1 and b"cannot be compared" in done.stderr
    # a query of lines of another recipe is refused as well (it matched nothing, exit 0)
    short = simhashdb.RECIPE.split("/")[0]
    done = subprocess.run(EXE + ["query", str(db)], input=printed + other, capture_output=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == b"", done.stdout
    assert ("the fingerprint of %s was made with %r" % (corpus / "b.txt", old)).encode() \
        in done.stderr and done.stderr.endswith(b"--recipe %s\n" % short.encode())
    # which `fingerprint` takes, as init does, by that first part of its name
    assert lines(sh("fingerprint", "--recipe", short, corpus / "b.txt")) == \
        lines(sh("fingerprint", corpus / "b.txt"))


@storage
def test_text_keys_are_absolute_or_relative_to_root(tmp_path, capsys, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "k.db"
    for given in ("docs/a.txt", "./docs/a.txt", str(corpus / "a.txt"), "docs/sub/../a.txt"):
        assert run(capsys, "import", db, given, "--format", "text")[0] == 0
    with simhashdb.DB(str(db)) as handle:
        assert [r.key for r in handle] == [str(corpus / "a.txt")]
    rooted = tmp_path / "r.db"
    assert run(capsys, "import", rooted, "docs", "--root", "docs", "--include", "*.txt")[0] == 0
    with simhashdb.DB(str(rooted)) as handle:
        assert sorted(r.key for r in handle) == ["a.txt", "b.txt", os.path.join("sub", "a_copy.txt")]
    code, out, _ = run(capsys, "query", rooted, "--text", "docs/a.txt", "--root", "docs")
    assert out[0]["query"] == "a.txt" and out[0]["matches"][0]["key"] == "a.txt"
    code, _, err = run(capsys, "import", rooted, "docs/a.txt", "--root", "docs/sub")
    assert code == 1 and "is not under --root" in err


@storage
def test_query_text_takes_several_files_and_directories(tmp_path, capsys, corpus):
    db = tmp_path / "q.db"
    assert run(capsys, "import", db, corpus, "--include", "*.txt")[0] == 0
    code, out, _ = run(capsys, "query", db, "--text", corpus / "b.txt", corpus / "sub",
                       "--text", corpus / "a.txt")
    assert code == 0
    assert [q["query"] for q in out] == [str(corpus / "b.txt"), str(corpus / "sub" / "a_copy.txt"),
                                         str(corpus / "a.txt")]
    assert all({"key": q["query"], "fingerprint": q["fingerprint"], "distance": 0,
                "resemblance": 1.0} in q["matches"] for q in out)


@storage
def test_hex_is_accepted_wherever_decimal_is(tmp_path, capsys, monkeypatch):
    values = [0x0123456789012345, 0x0123456789012344, 0xfedcba9876543210]
    hashes = tmp_path / "h.txt"
    hashes.write_text("".join("%016x\n" % v for v in values))  # the first line is all digits
    db = tmp_path / "h.db"
    assert run(capsys, "import", db, hashes)[0] == 0
    with simhashdb.DB(str(db)) as handle:
        assert sorted(r.fingerprint for r in handle) == sorted(values)
    for command in ("find-all", "clusters"):
        code, out, _ = run(capsys, command, "--input", hashes, "--blocks", "4", "--distance", "1")
        assert code == 0 and out == [[values[1], values[0]]]
        code, out, err = run(capsys, command, "--input", hashes)  # a usage error: status 2
        assert code == 2 and out == [] and "give --blocks" in err
    code, out, err = run(capsys, "import", db, tmp_path, "--format", "dec")
    assert code == 2 and "is a directory" in err and "name the files" in err
    code, out, _ = run(capsys, "find-all", "--input", hashes, "--blocks", "4", "--format", "dec")
    assert code == 1
    # all lines are read one way: hex, as one of them has a letter
    code, out, _ = run(capsys, "query", db, "--distance", "0",
                       stdin="%016x\n%016x\n" % (values[0], values[2]), monkeypatch=monkeypatch)
    assert [q["matches"][0]["fingerprint"] for q in out] == [values[0], values[2]]
    code, out, _ = run(capsys, "query", db, "--distance", "0", "--format", "hex",
                       stdin="%016x\n" % values[0], monkeypatch=monkeypatch)
    assert out[0]["matches"][0]["fingerprint"] == values[0]
    code, out, _ = run(capsys, "query", db, "0x%x" % values[2], str(values[1]), "--distance", "0")
    assert [len(q["matches"]) for q in out] == [1, 1]


@storage
def test_format_is_never_guessed_when_given_and_guessed_from_more_than_one_line(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("2024\nwas the year the crawler met the decade of text\n")
    db = tmp_path / "f.db"
    code, out, _ = run(capsys, "import", db, text)
    assert code == 0 and out[-1]["imported"] == 1
    with simhashdb.DB(str(db)) as handle:
        assert [r.key for r in handle] == [str(text)]
    numbers = tmp_path / "numbers.txt"
    numbers.write_text("2024\n2025\n")
    code, out, _ = run(capsys, "import", db, numbers, "--format", "text")
    with simhashdb.DB(str(db)) as handle:
        assert str(numbers) in handle and 1 not in handle
    code, out, _ = run(capsys, "import", db, numbers)
    with simhashdb.DB(str(db)) as handle:
        assert handle.get(str(numbers) + ":1").fingerprint == 2024
        assert handle.get(str(numbers) + ":2").fingerprint == 2025


@storage
def test_stdin_text_is_stored_under_key(tmp_path, capsys, monkeypatch):
    db = tmp_path / "s.db"
    page = "a page of text that came from a crawler " * 10
    code, out, _ = run(capsys, "import", db, "--format", "text", "--key", "https://a/",
                       stdin=page, monkeypatch=monkeypatch)
    assert code == 0
    with simhashdb.DB(str(db)) as handle:
        assert handle.get("https://a/").fingerprint == simhashdb.fingerprint(page)
    code, _, err = run(capsys, "import", db, "--format", "text", stdin=page,
                       monkeypatch=monkeypatch)
    assert code == 1 and "--key" in err
    code, _, err = run(capsys, "import", db, "--key", "k", "--format", "dec", stdin="1\n",
                       monkeypatch=monkeypatch)
    assert code == 2 and "--key" in err


@storage
def test_get_and_delete_find_str_keys_made_of_digits(tmp_path, capsys):
    db = tmp_path / "d.db"
    with simhashdb.DB(str(db)) as handle:
        handle.insert_many([("2024", 1), (7, 2), ("7", 3), ("-5", 4)])
    assert run(capsys, "get", db, "2024")[1][0]["key"] == "2024"
    code, out, err = run(capsys, "get", db, "7")
    assert out[0]["key"] == 7 and "str key '7'" in err
    assert run(capsys, "get", db, "7", "--str-keys")[1][0]["key"] == "7"
    assert run(capsys, "get", db, "9" * 30)[0] == 1
    assert run(capsys, "delete", db, "2024", "-5", "7", "99")[1] == \
        [{"deleted": 3, "requested": 4, "not_found": ["99"]}]
    with simhashdb.DB(str(db)) as handle:
        assert [r.key for r in handle] == ["7"]
        handle.insert_many([(123, 5), ("0123", 6)])
    assert run(capsys, "get", db, "0123")[1][0]["key"] == "0123"  # not the int 123
    assert run(capsys, "get", db, "00123")[0] == 1
    assert run(capsys, "delete", db, "0123", "0123", "55", "55")[1] == \
        [{"deleted": 1, "requested": 2, "not_found": ["55"]}]  # a key given twice counts once
    with simhashdb.DB(str(db)) as handle:
        assert sorted(map(str, (r.key for r in handle))) == ["123", "7"]


@pytest.mark.parametrize("argv", [["import", "DB", "--format", "dec", "FILE"],
                                  ["import", "DB", "FILE", "--format", "dec", "FILE2"]])
def test_a_commands_list_may_go_on_after_its_options(tmp_path, capsys, argv):
    (tmp_path / "a.txt").write_text("1\n2\n")
    (tmp_path / "b.txt").write_text("3\n")
    db = tmp_path / "o.db"
    names = {"DB": db, "FILE": tmp_path / "a.txt", "FILE2": tmp_path / "b.txt"}
    code, out, err = run(capsys, *[names.get(a, a) for a in argv])
    assert code == 0, err
    assert out[0]["imported"] == (3 if "FILE2" in argv else 2)
    code, out, _ = run(capsys, "query", db, "--distance", "0", "2", "1")
    assert [o["query"] for o in out] == [2, 1] and all(len(o["matches"]) == 1 for o in out)
    code, out, _ = run(capsys, "delete", db, "--str-keys", "%s:1" % (tmp_path / "a.txt"))
    assert out == [{"deleted": 1, "requested": 1, "not_found": []}]
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run(capsys, "import", db, "--bogus", tmp_path / "a.txt")
    assert exited.value.code == 2


@storage
def test_init_recipe_and_export_import_carry_the_parameters(tmp_path, capsys, corpus):
    old = next(name for name in simhashdb.RECIPES if name != simhashdb.RECIPE)
    src = tmp_path / "src.db"
    code, out, _ = run(capsys, "init", src, "--recipe", old, "--distance", "2", "--blocks", "6")
    assert code == 0 and out[0]["recipe"] == old
    assert run(capsys, "import", src, corpus, "--include", "*.txt")[0] == 0
    dump = tmp_path / "dump.jsonl"
    code, out, _ = run(capsys, "export", src)
    assert out[0] == {"simhashdb": {"recipe": old, "distance": 2, "blocks": 6,
                                    "table_distance": 2}}
    dump.write_text("".join(json.dumps(o) + "\n" for o in out))
    assert run(capsys, "import", tmp_path / "copy.db", dump)[1][-1]["imported"] == 3
    with simhashdb.DB(str(src)) as a, simhashdb.DB(str(tmp_path / "copy.db")) as b:
        assert (b.recipe, b.distance, b.blocks) == (old, 2, 6) and list(a) == list(b)
    other = tmp_path / "other.db"
    with simhashdb.DB(str(other), recipe=simhashdb.RECIPE) as handle:
        handle.insert("x", 1)
    code, _, err = run(capsys, "import", other, dump)
    assert code == 1 and old in err and err.count("\n") == 1
    code, out, err = run(capsys, "init", tmp_path / "mine.db", "--recipe", "my-own")
    assert code == 0 and out[0]["recipe"] == "my-own" and "not a recipe this simhashdb knows" in err


def test_init_warns_when_it_makes_more_than_100_tables(tmp_path, capsys):
    code, out, err = run(capsys, "init", tmp_path / "big.db", "--distance", "7")
    assert code == 0 and out[0]["tables"] > 100 and "warning: table distance 7" in err
    code, out, err = run(capsys, "init", tmp_path / "big.db")
    assert code == 0 and "warning" not in err  # said once, when it was made
    code, out, err = run(capsys, "init", tmp_path / "small.db", "--distance", "3")
    assert code == 0 and err == ""


@pytest.mark.parametrize("command", ["export", "check", "compact"])
def test_long_commands_show_progress_on_a_terminal(tmp_path, command):
    db = str(tmp_path / "t.db")
    with simhashdb.DB(db) as handle:
        handle.insert_many((i, i * 7919) for i in range(20000))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm's width
    proc = subprocess.Popen(EXE + [command, db], stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        try:
            chunk = os.read(master, 4096) if ready else b""
        except OSError:  # the terminal closed
            chunk = b""
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    progress = (b"it/s" in shown or b"s]" in shown) if command == "export" else \
        b"running for 00:" in shown and b"it/s" not in shown
    assert command.encode() in shown and progress, shown
    quiet = subprocess.run(EXE + [command, db, "--quiet"], capture_output=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == b""


@storage
def test_key_alone_makes_stdin_one_text_document(tmp_path, capsys, monkeypatch):
    page = "12\n13\n"  # digits, but --key says it is a document
    code, out, _ = run(capsys, "import", tmp_path / "k.db", "--key", "page", stdin=page,
                       monkeypatch=monkeypatch)
    assert code == 0 and out[-1]["imported"] == 1
    with simhashdb.DB(str(tmp_path / "k.db")) as handle:
        assert handle["page"].fingerprint == simhashdb.fingerprint(page)
