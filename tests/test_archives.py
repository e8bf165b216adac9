"""Web archives in (WARC, ARC and WET, written by warcio and by wget), and
text decoded by the charset a document declares or the one detected."""

import gzip
import io
import random
import shutil
import subprocess
import uuid

import pytest

import simhashdb
from simhashdb import inputs

from local_http import QuietHandler, serve
from test_cli import run

warcio = pytest.importorskip("warcio", reason="the test extra is not installed")
from warcio.archiveiterator import ArchiveIterator  # noqa: E402
from warcio.statusandheaders import StatusAndHeaders  # noqa: E402
from warcio.warcwriter import WARCWriter  # noqa: E402

storage = pytest.mark.usefixtures("backend")
WORDS = ("river stone lantern harbor copper meadow signal orbit velvet quarry thistle beacon "
         "marble ember falcon glacier café naïve façade über straße").split()


def prose(seed, words=300):
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) + str(rnd.randrange(40)) for _ in range(words))


def page(text, head=""):
    return "<html><head>%s<title>t</title></head><body><p>%s</p></body></html>" % (head, text)


# (uri, record type, content type, body bytes, the text a reader should see, html)
RECORDS = [
    ("http://example.com/a", "response", "text/html; charset=ISO-8859-1",
     page(prose(1)).encode("latin-1"), prose(1), True),
    ("http://example.com/b", "response", "text/html",
     page(prose(2), '<meta charset="windows-1252">').encode("cp1252"), prose(2), True),
    ("http://example.com/c", "response", "text/html", page(prose(3)).encode(), prose(3), True),
    ("http://example.com/a-copy", "response", "text/html; charset=utf-8",
     page(prose(1) + " more").encode(), prose(1) + " more", True),
    ("http://example.com/logo.png", "response", "image/png",
     b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)), None, False),
    ("http://example.com/notes.txt", "resource", "text/plain", prose(4).encode(), prose(4),
     False),
    ("http://example.com/c", "revisit", None, b"", None, False),
    ("http://example.com/c", "request", None, b"GET /c HTTP/1.1\r\n\r\n", None, False),
]


def write_warc(path, records=RECORDS, gz=True):
    with open(path, "wb") as out:
        writer = WARCWriter(out, gzip=gz)
        for number, (uri, kind, content_type, body, _, _) in enumerate(records):
            headers = None
            if kind == "response":
                headers = StatusAndHeaders("200 OK", [("Content-Type", content_type)],
                                           protocol="HTTP/1.1")
            extra = {"WARC-Date": "2026-11-01T10:00:00Z",  # the same bytes every run
                     "WARC-Record-ID": "<urn:uuid:%s>" % uuid.UUID(int=number + 1)}
            if kind == "resource":
                record = writer.create_warc_record(uri, kind, payload=io.BytesIO(body),
                                                   warc_content_type=content_type,
                                                   warc_headers_dict=extra)
            else:
                record = writer.create_warc_record(uri, kind, payload=io.BytesIO(body),
                                                   http_headers=headers,
                                                   warc_headers_dict=extra)
            writer.write_record(record)
    return path


def pages(records=RECORDS):
    return [(uri, text, html) for uri, _, _, _, text, html in records if text is not None]


@storage
@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_import_of_a_warc_decides_as_the_api_on_the_true_texts(tmp_path, capsys, gz):
    archive = write_warc(tmp_path / ("crawl.warc" + (".gz" if gz else "")), gz=gz)
    code, out, err = run(capsys, "import", tmp_path / "db", archive, "--if-new")
    assert code == 0, err
    summary = out[-1]
    assert summary["skipped_records"] == {"content type image/png": 1, "a revisit record": 1,
                                          "a request record": 1}
    assert summary["decoded"] == {"http header": 2, "meta": 1, "utf-8": 2}
    with simhashdb.DB(str(tmp_path / "api"), recipe=simhashdb.RECIPE) as api:
        decisions = [bool(api.insert_text_if_new(uri, text, html=html))
                     for uri, text, html in pages()]
        expected = {r.key: (r.fingerprint, r.meta) for r in api}
    assert decisions == [False, False, False, True, False]  # a-copy: a near-duplicate of a
    assert [o["skipped"] for o in out[:-1]] == ["http://example.com/a-copy"]
    with simhashdb.DB(str(tmp_path / "db")) as db:
        stored = {r.key: (r.fingerprint, r.meta) for r in db}
    assert {k: fp for k, (fp, _) in stored.items()} == {k: fp for k, (fp, _) in expected.items()}
    assert stored["http://example.com/a"][1] == {"date": "2026-11-01T10:00:00Z", "status": 200}
    assert stored["http://example.com/notes.txt"][1] == {"date": "2026-11-01T10:00:00Z"}


@storage
def test_keys_by_uri_and_date_or_record_id(tmp_path, capsys):
    archive = write_warc(tmp_path / "crawl.warc.gz")
    ids = [r.rec_headers.get_header("WARC-Record-ID")
           for r in ArchiveIterator(open(archive, "rb"))
           if r.rec_type in ("response", "resource")]
    for option, expected in (("uri-date", {uri + " 2026-11-01T10:00:00Z" for uri, _, _ in pages()}),
                             ("record-id", {ids[i] for i in (0, 1, 2, 3, 5)})):
        db = tmp_path / option
        assert run(capsys, "import", db, archive, "--archive-key", option)[0] == 0
        with simhashdb.DB(str(db)) as handle:
            assert {r.key for r in handle} == expected
            assert {r.meta["url"] for r in handle} == {uri for uri, _, _ in pages()}


def test_wet_and_arc_records_are_read(tmp_path):
    wet = tmp_path / "crawl.warc.wet.gz"
    with open(wet, "wb") as out:
        writer = WARCWriter(out, gzip=True)
        for i in range(3):
            writer.write_record(writer.create_warc_record(
                "http://example.com/%d" % i, "conversion", payload=io.BytesIO(prose(i).encode()),
                warc_content_type="text/plain"))
    arc = tmp_path / "old.arc.gz"
    body = page(prose(9)).encode()
    http = b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n" + body
    version = b"1 0 simhashdb\nURL IP-address Archive-date Content-type Archive-length\n"
    header = b"filedesc://old.arc 0.0.0.0 20260101000000 text/plain %d\n" % len(version) + \
        version + b"\n"
    line = b"http://example.com/old 127.0.0.1 20260101000000 text/html %d\n" % len(http)
    arc.write_bytes(gzip.compress(header) + gzip.compress(line + http + b"\n"))
    reader = inputs.Reader()
    assert inputs.input_format(str(wet)) == inputs.input_format(str(arc)) == "warc"
    records = [r for _, _, r in reader.records({str(wet): "warc", str(arc): "warc"})]
    assert [r.why for r in records if isinstance(r, inputs.Skipped)] == ["a warcinfo record"]
    got = [r for r in records if not isinstance(r, inputs.Skipped)]
    assert [(r[0], r[1], r.html) for r in got] == [
        ("http://example.com/%d" % i, prose(i), False) for i in range(3)] + [
        ("http://example.com/old", body.decode(), True)]


@storage
def test_truncated_and_malformed_records_are_reported_by_offset(tmp_path, capsys):
    whole = write_warc(tmp_path / "whole.warc.gz", RECORDS[:3]).read_bytes()
    starts = [o for o in range(len(whole)) if whole.startswith(b"\x1f\x8b\x08", o)]
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(whole[:starts[2] + 60])   # the third record cut short
    code, out, err = run(capsys, "import", tmp_path / "db", cut)
    assert code == 1 and "a truncated archive record at byte %d" % starts[2] in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, "import", tmp_path / "db2", cut, "--skip-invalid")
    assert code == 0 and out[-1]["imported"] == 2 and out[-1]["invalid"] == 1
    damaged = tmp_path / "damaged.warc.gz"   # the second record's data overwritten
    middle = (starts[1] + starts[2]) // 2
    damaged.write_bytes(whole[:middle] + b"\x00" * 40 + whole[middle + 40:])
    code, out, err = run(capsys, "import", tmp_path / "db3", damaged, "--skip-invalid")
    assert code == 0 and out[-1]["imported"] == 2 and out[-1]["invalid"] == 1
    with simhashdb.DB(str(tmp_path / "db3")) as db:   # read on past it, at the next record
        assert {r.key for r in db} == {"http://example.com/a", "http://example.com/c"}
    code, out, err = run(capsys, "query", tmp_path / "db3", "--text", cut)
    assert code == 1 and "truncated archive record at byte %d" % starts[2] in err


@pytest.mark.parametrize("lost", [4, 12], ids=["checksum", "data-end"])
def test_a_last_gzip_member_cut_short_is_reported_not_dropped(tmp_path, capsys, lost):
    whole = write_warc(tmp_path / "whole.warc.gz", RECORDS[:3]).read_bytes()
    last = whole.rfind(b"\x1f\x8b\x08")
    cut = tmp_path / "cut.warc.gz"   # the record's text may be whole, its member's end is not
    cut.write_bytes(whole[:-lost])
    read = list(inputs.Reader().records({str(cut): "warc"}))
    assert [offset for _, offset, _ in read][-1] == last
    assert isinstance(read[-1][2], inputs.InputError) and "truncated" in str(read[-1][2])
    assert [type(r) for _, _, r in read[:-1]] == [inputs.TextRecord] * 2
    code, out, err = run(capsys, "import", tmp_path / "db", cut)
    assert code == 1 and "a truncated archive record at byte %d" % last in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, "import", tmp_path / "db2", cut, "--skip-invalid")
    assert code == 0 and out[-1]["imported"] == 2 and out[-1]["invalid"] == 1


@storage
def test_query_fingerprint_and_walked_directories_read_archives(tmp_path, capsys):
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    archive = write_warc(crawl / "seg.warc.gz")
    (crawl / "note.txt").write_text(prose(5))
    code, out, err = run(capsys, "import", tmp_path / "db", crawl)
    assert code == 0 and out[-1]["imported"] == 6
    code, out, err = run(capsys, "fingerprint", archive)
    with simhashdb.DB(str(tmp_path / "db")) as db:
        stored = {r.key: r.fingerprint for r in db}
    assert {o["key"]: o["fingerprint"] for o in out} == {
        k: v for k, v in stored.items() if k.startswith("http")}
    code, out, err = run(capsys, "query", tmp_path / "db", "--text", archive)
    assert code == 0 and [o["query"] for o in out] == [uri for uri, _, _ in pages()]
    assert all(o["matches"][0]["distance"] == 0 for o in out)
    assert "decoded 2 by their HTTP header's charset, 1 by their <meta> charset, 2 as UTF-8" \
        in err


def test_charset_decisions():
    text = "Un café naïve à la façade"
    assert inputs.decode_text(text.encode("cp1252"), "ISO-8859-1") == (text, "http header")
    marked = ('<meta http-equiv="Content-Type" content="text/html; charset=koi8-r">' +
              "Река поднялась").encode("koi8-r")
    assert inputs.decode_text(marked) == (marked.decode("koi8-r"), "meta")
    assert inputs.decode_text(marked, "utf-8")[1] == "http header"   # the header comes first
    assert inputs.decode_text(text.encode()) == (text, "utf-8")
    detected = (prose(3) + " " + text).encode("cp1252")
    assert inputs.decode_text(detected) == (detected.decode("cp1252"), "detected")
    assert inputs.decode_text(text.encode("utf-16")) == (text, "bom")
    assert inputs.decode_text(text.encode("cp1252"), forced="latin-1") == (text, "forced")
    assert inputs.decode_text(b"\x89PNG\r\n\x1a\n\x00\x00")[0].why == "binary (NUL bytes)"
    for label in ("hex", "zlib", "base64", "rot13"):  # codecs, not charsets: not taken
        page = b"<meta charset=%s><p>caf\xc3\xa9</p>" % label.encode()
        assert inputs.web_encoding(label) is None
        assert inputs.decode_text(page, label) == (page.decode(), "utf-8")
    rng = random.Random(0)
    noise = bytes(rng.randrange(1, 256) for _ in range(5000))
    assert inputs.decode_text(noise)[0].why == "binary (no text encoding fits)"


@pytest.mark.parametrize("seed", range(3))
def test_text_that_is_utf8_fingerprints_as_before(seed):
    """Decoding changes no fingerprint of a document of UTF-8 that declares no
    other charset: it is what the text methods made of the bytes."""
    data = (prose(seed) + " ünïcödé ✓ 漢字").encode()
    text, how = inputs.decode_text(data)
    assert how == "utf-8" and simhashdb.fingerprint(text) == simhashdb.fingerprint(data)


@storage
def test_encoding_forces_one_and_latin1_files_import(tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes(prose(6).encode("latin-1"))
    code, out, err = run(capsys, "import", tmp_path / "db", tmp_path / "latin1.txt")
    assert code == 0 and out[-1]["imported"] == 1 and out[-1]["decoded"] == {"detected": 1}
    code, out, err = run(capsys, "fingerprint", tmp_path / "latin1.txt", "--encoding", "latin-1")
    assert out[0]["fingerprint"] == simhashdb.fingerprint(prose(6))
    assert "decoded 1 by --encoding" in err
    with pytest.raises(SystemExit) as exit:
        run(capsys, "import", tmp_path / "db", tmp_path / "latin1.txt", "--encoding", "klingon")
    assert exit.value.code == 2 and "'klingon' is not an encoding" in capsys.readouterr().err


# A crawl by Debian's wget of a site on 127.0.0.1


SITE = {
    "index.html": page('<a href="a.html">a</a> <a href="b.html">b</a> <a href="c.html">c</a> '
                       '<a href="copy.html">copy</a> <img src="logo.png"> ' + prose(20)),
    "a.html": page(prose(21)),
    "b.html": page(prose(22), '<meta charset="iso-8859-1">'),
    "c.html": page(prose(23)),
    "copy.html": page(prose(21) + " updated"),
}


class Handler(QuietHandler):
    extensions_map = {".html": "text/html", ".png": "image/png"}

    def guess_type(self, path):
        if path.endswith("c.html"):
            return "text/html; charset=windows-1252"   # its charset in the HTTP header
        return super().guess_type(path)


@storage
@pytest.mark.skipif(shutil.which("wget") is None,
                    reason="Debian's wget is not installed (apt-get install wget), so no "
                           "crawl of a local site is written")
def test_a_wget_crawl_imports_keyed_by_url_deciding_as_the_api(tmp_path, capsys):
    root = tmp_path / "site"
    root.mkdir()
    for name, html in SITE.items():
        encoding = "cp1252" if name in ("b.html", "c.html") else "utf-8"
        (root / name).write_bytes(html.encode(encoding))
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)))
    with serve(root, Handler) as url:
        subprocess.run(["wget", "--recursive", "--level=2", "--no-verbose", "-e", "robots=off",
                        "--warc-file=%s" % (tmp_path / "crawl"), "--directory-prefix",
                        str(tmp_path / "mirror"), url], check=True, capture_output=True,
                       timeout=60)
    archive = tmp_path / "crawl.warc.gz"
    order = [r.rec_headers.get_header("WARC-Target-URI")
             for r in ArchiveIterator(open(archive, "rb")) if r.rec_type == "response"]
    names = {url + name: name for name in SITE}
    names[url] = "index.html"
    code, out, err = run(capsys, "import", tmp_path / "db", archive, "--if-new")
    assert code == 0, err
    with simhashdb.DB(str(tmp_path / "api"), recipe=simhashdb.RECIPE) as api:
        skipped = [uri for uri in order if uri in names and api.insert_text_if_new(
            uri, SITE[names[uri]], html=True)]
        expected = {r.key: r.fingerprint for r in api}
    assert [o["skipped"] for o in out[:-1]] == skipped == [url + "copy.html"]
    with simhashdb.DB(str(tmp_path / "db")) as db:
        assert {r.key: r.fingerprint for r in db} == expected
        assert set(expected) == {url, url + "a.html", url + "b.html", url + "c.html"}
    assert out[-1]["skipped_records"]["content type image/png"] == 1
    assert out[-1]["skipped_records"]["a crawler's own record (metadata:)"] == 2
    assert out[-1]["decoded"] == {"http header": 1, "meta": 1, "utf-8": 3}
