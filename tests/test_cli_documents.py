"""Input that is not text: compressed files are read as their text, binary
files are skipped like grep -I, empty documents are reported, not stored."""

import bz2
import gzip
import json
import lzma
import random

import pytest

import simhashdb

from test_cli import run

storage = pytest.mark.usefixtures("backend")


def prose(seed, words=400):
    rnd = random.Random(seed)
    vocabulary = ["river", "stone", "lantern", "harbor", "copper", "meadow", "signal", "orbit",
                  "velvet", "quarry", "thistle", "beacon", "marble", "ember", "falcon", "glacier"]
    return " ".join(rnd.choice(vocabulary) + str(rnd.randrange(50)) for _ in range(words))


@pytest.fixture
def mixed(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    texts = {"plain.txt": prose(1), "manual.gz": prose(2), "notes.bz2": prose(3),
             "log.xz": prose(4), "latin1.txt": prose(5) + " caf\xe9 na\xefve"}
    (root / "plain.txt").write_text(texts["plain.txt"])
    (root / "manual.gz").write_bytes(gzip.compress(texts["manual.gz"].encode()))
    (root / "notes.bz2").write_bytes(bz2.compress(texts["notes.bz2"].encode()))
    (root / "log.xz").write_bytes(lzma.compress(texts["log.xz"].encode()))
    (root / "latin1.txt").write_bytes(texts["latin1.txt"].encode("latin-1"))
    rnd = random.Random(0)
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + rnd.randbytes(5000))
    (root / "noise.bin").write_bytes(bytes(rnd.randrange(1, 256) for _ in range(5000)))
    (root / "archive.tar.gz").write_bytes(gzip.compress(b"name\x00\x00\x00" + b"x" * 500))
    (root / "cut.gz").write_bytes(gzip.compress(prose(6).encode())[:40])
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.txt").write_text(" \n\t\n")
    (root / "nothing.gz").write_bytes(gzip.compress(b""))
    return root, texts


SKIPPED = {"binary (NUL bytes)": 2, "binary (no text encoding fits)": 1, "damaged gzip data": 1,
           "empty (no text to fingerprint)": 3}


@storage
def test_import_reads_compressed_text_and_skips_binary_and_empty_files(tmp_path, capsys, mixed):
    root, texts = mixed
    db = tmp_path / "m.db"
    code, out, err = run(capsys, "import", db, root)
    assert code == 0 and out[-1]["imported"] == 5 and out[-1]["skipped_files"] == SKIPPED
    assert err.count("note: skipped") == sum(SKIPPED.values())
    with simhashdb.DB(str(db)) as handle:
        stored = {r.key: r.fingerprint for r in handle}
    # the Latin-1 file as its text (its encoding detected), not as UTF-8 with U+FFFD
    assert stored == {str(root / name): simhashdb.fingerprint(text)
                      for name, text in texts.items()}
    assert stored[str(root / "latin1.txt")] != simhashdb.fingerprint(
        (root / "latin1.txt").read_bytes())
    assert len(set(stored.values())) == 5  # compressed files no longer share one fingerprint
    assert 0 not in stored.values()


def test_fingerprint_prints_only_documents_with_text(capsys, mixed):
    root, texts = mixed
    code, out, err = run(capsys, "fingerprint", root)
    assert code == 0 and {o["path"] for o in out} == {str(root / name) for name in texts}
    assert out[[o["path"] for o in out].index(str(root / "manual.gz"))]["fingerprint"] == \
        simhashdb.fingerprint(texts["manual.gz"])
    assert "note: skipped 7 file(s): 2 binary (NUL bytes)" in err


@storage
def test_query_text_reads_compressed_documents_and_skips_the_rest(tmp_path, capsys, mixed):
    root, texts = mixed
    db = tmp_path / "q.db"
    assert run(capsys, "import", db, root / "plain.txt", root / "manual.gz")[0] == 0
    code, out, err = run(capsys, "query", db, "--text", root / "manual.gz", root / "noise.bin",
                         root / "blank.txt")
    assert code == 0 and [q["query"] for q in out] == [str(root / "manual.gz")]
    assert out[0]["matches"][0] == {"key": str(root / "manual.gz"), "distance": 0,
                                    "fingerprint": simhashdb.fingerprint(texts["manual.gz"]),
                                    "resemblance": 1.0}
    assert "noise.bin: binary" in err and "blank.txt: empty" in err


@storage
def test_html_with_no_text_is_empty(tmp_path, capsys, monkeypatch):
    page = tmp_path / "shell.html"
    page.write_text("<html><head><script>var x = 1;</script></head><body><div></div></body>")
    code, out, _ = run(capsys, "import", tmp_path / "h.db", page, "--html")
    assert code == 0 and out[-1]["imported"] == 0
    assert out[-1]["skipped_files"] == {"empty (no text to fingerprint)": 1}
    code, out, _ = run(capsys, "import", tmp_path / "h.db", "--format", "text", "--key", "k",
                       stdin="", monkeypatch=monkeypatch)
    assert out[-1]["skipped_files"] == {"empty (no text to fingerprint)": 1}
    with simhashdb.DB(str(tmp_path / "h.db")) as handle:
        assert len(handle) == 0
    assert json.dumps(out)  # the summary is JSON
