"""What a user meets in the first hour with the command line: help that reads
whole, paths that must exist, folders that are not databases, progress that
knows its total."""

import os

import pytest

import simhashdb
from simhashdb import cli, inputs

pytestmark = pytest.mark.usefixtures("backend")


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_gives_whole_summaries_and_public_names(capsys):
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    for action in commands._choices_actions:
        doc = " ".join(commands.choices[action.dest].description.split())
        after = doc[len(action.help):]
        assert doc.startswith(action.help) and after[:1] in ("", "."), action.dest  # a sentence
    for command in ("import", "init", "query", "import-parquet"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        usage = capsys.readouterr().out
        assert "CREATE_" not in usage and "redis://" in usage


@pytest.mark.parametrize("command", [["delete", "k"], ["expire", "--older-than", "1d"],
                                     ["compact"], ["get", "k"], ["stats"], ["check"],
                                     ["query", "1"], ["export"], ["find-all"]])
def test_a_mistyped_path_is_an_error_and_creates_nothing(tmp_path, capsys, command):
    path = tmp_path / "crawl.bd"
    code, out, err = run(capsys, command[0], path, *command[1:])
    assert code == 1 and "no database at" in err and err.count("\n") == 1
    assert not path.exists()


def test_a_directory_of_other_files_is_not_offered_to_init(tmp_path, capsys):
    """``init`` refuses a directory of other files, so the error for one named
    as a database does not suggest it."""
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "p0.html").write_text("<html>a page</html>")
    code, out, err = run(capsys, "stats", tmp_path / "pages")
    assert code == 1 and "no database at" in err and "init" not in err
    assert "directory of other files" in err and err.count("\n") == 1


@pytest.mark.lmdb_only
def test_a_folder_of_other_files_is_never_made_a_database(tmp_path, capsys):
    folder = tmp_path / "licences"
    folder.mkdir()
    (folder / "GPL").write_text("the licence")
    (tmp_path / "db").mkdir()  # an empty directory may become one
    code, _, err = run(capsys, "import", folder, tmp_path / "db")
    assert code == 1 and "holds other files" in err
    assert sorted(os.listdir(folder)) == ["GPL"]
    assert run(capsys, "init", tmp_path / "db")[0] == 0


def test_progress_knows_the_bytes_of_named_files(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 100)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_text("y" * 50)
    (tmp_path / "d" / "c.md").write_text("z" * 20)
    reader = inputs.Reader(include=["*.txt"])
    assert reader.size([str(tmp_path / "a.txt"), str(tmp_path / "d")]) == 150
    assert reader.size(["-"]) is None


def test_a_list_of_fingerprints_with_a_bad_line_is_an_error_naming_the_line(tmp_path, capsys):
    hashes = tmp_path / "h.txt"
    hashes.write_text("".join("%d\n" % (i * 7919) for i in range(1, 20)) + "12x4\n")
    code, _, err = run(capsys, "import", tmp_path / "db", hashes)
    assert code == 1 and "h.txt:20: line '12x4' is not a" in err
    with simhashdb.DB(str(tmp_path / "db")) as db:
        assert len(db) == 0


def test_line_keys_of_two_files_never_collide(tmp_path, capsys):
    for name, values in (("a.txt", "1\n2\n"), ("b.txt", "3\n4\n")):
        (tmp_path / name).write_text(values)
        assert run(capsys, "import", tmp_path / "db", tmp_path / name)[0] == 0
    with simhashdb.DB(str(tmp_path / "db")) as db:
        assert len(db) == 4 and db.get(str(tmp_path / "b.txt") + ":1").fingerprint == 3


def test_python_dash_m_of_the_cli_module_runs_it(tmp_path):
    """``python -m simhashdb.cli`` is the command line too, not a silent no-op."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "simhashdb.cli", "stats", str(tmp_path / "no.db")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "no database at" in done.stderr
