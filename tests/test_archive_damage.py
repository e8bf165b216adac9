"""A web archive with one record damaged in many ways (a byte flipped, a run
of zeros, the record cut short, the whole record zeroed): every other record
is read as written, the damaged one is the reader's note at its offset (or
read as written, where the damage changed nothing it holds), and nothing is
printed or raised."""

import base64
import gzip
import io
import logging
import re
import sys

import pytest

from simhashdb import inputs

from test_archives import RECORDS, page, prose, write_warc  # (skips without warcio)

# records of every kind, and a page (the third) whose damaged gzip member warcio read as
# garbage, losing the record after it
ARCHIVE = RECORDS[:2] + [("http://example.com/d", "response", "text/html",
                          page(prose(32)).encode(), prose(32), True)] + RECORDS[2:]
HEAD = 400  # the bytes of the damaged record where every offset is damaged (its headers)
NOTE = re.compile(r"an? [a-z ]+ archive record at byte (\d+)")


def read(given):
    """(offset, what) of each record the reader gives of the archive
    ``given`` (a path, or "-": stdin): a page's (key, text, meta), a skipped
    record's reason, or ("note", offset) for the InputError that notes a
    damaged record."""
    got, reader = [], inputs.Reader(fingerprint=lambda text, html: 1)  # texts compared, not hashed
    for _, offset, item in reader.records({str(given): "warc"}):
        if isinstance(item, inputs.InputError):
            note = NOTE.fullmatch(str(item).split(" (")[0])
            item = ("note", int(note.group(1))) if note else str(item)
        got.append((offset, item.why if isinstance(item, inputs.Skipped) else item))
    return got


class Trickle(io.RawIOBase):
    """The bytes ``data``, at most ``most`` of them a read, as a pipe gives them."""

    def __init__(self, data, most):
        self.data, self.most = data, most

    def readable(self):
        return True

    def readinto(self, buffer):
        n = min(len(buffer), self.most, len(self.data))
        buffer[:n], self.data = self.data[:n], self.data[n:]
        return n


def damages(data, start, end):
    """(what was done, the archive ``data`` with it done to its record at
    [start, end), the bytes it took out of the archive): a byte flipped at
    each offset of the head and every 11th after it, zeros and a cut at
    every third of those."""
    offsets = [*range(start, min(start + HEAD, end)), *range(start + HEAD, end, 11)]
    for at in offsets:
        yield "byte %d flipped" % (at - start), \
            data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:], 0
    for at in offsets[::3]:
        yield "zeros from byte %d" % (at - start), \
            data[:at] + bytes(min(40, end - at)) + data[min(at + 40, end):], 0
        if at > start:
            yield "cut at byte %d" % (at - start), data[:at] + data[end:], end - at
    yield "zeroed", data[:start] + bytes(end - start) + data[end:], 0


@pytest.mark.parametrize("damaged", [0, 2], ids=["first", "third"])
@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_a_damaged_record_is_noted_and_every_other_read(tmp_path, capfd, monkeypatch, gz,
                                                        damaged):
    archive = write_warc(tmp_path / ("crawl.warc" + (".gz" if gz else "")), ARCHIVE, gz)
    data = archive.read_bytes()
    starts = [m.start() for m in re.finditer(rb"\x1f\x8b\x08" if gz else rb"WARC/1\.", data)]
    start, end = starts[damaged], starts[damaged + 1]
    whole = read(archive)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert read("-") == whole   # stdin (read here, fast), as the file is
    assert [offset for offset, _ in whole] == starts and whole[2][1][0] == ARCHIVE[2][0]
    failed = []
    for what, bad, removed in damages(data, start, end):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bad)))
        got = read("-")
        rest = whole[:damaged] + [(offset - removed, item) for offset, item in whole[damaged + 1:]]
        noted = (start, ("note", start))
        # a plain WARC's header has no checksum: a value changed in it is read as it is
        fine = got[damaged] in (noted, whole[damaged]) or not gz and got[damaged][0] == start
        if got[:damaged] + got[damaged + 1:] != rest or not fine:
            failed.append("%s: %s" % (what, [(offset, item if isinstance(item, str) or
                                              item[0] == "note" else item[0])
                                             for offset, item in got]))
    assert not failed, "%d damages lose or garble records: %s" % (len(failed), failed[:3])
    assert capfd.readouterr().err == ""   # neither warcio's warnings nor anything else


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_records_read_the_same_however_the_reads_cut_the_archive(tmp_path, monkeypatch, gz):
    archive = write_warc(tmp_path / ("crawl.warc" + (".gz" if gz else "")), ARCHIVE, gz)
    data = archive.read_bytes()
    middle = len(data) // 2   # a record damaged: another noted, the rest read
    damaged = data[:middle] + bytes(40) + data[middle + 40:]
    (tmp_path / "damaged").write_bytes(damaged)
    expected = [read(archive), read(tmp_path / "damaged")]
    assert [len([o for o, item in got if item[0] == "note"]) for got in expected] == [0, 1]
    for most in (1, 7, 1000):
        got = []
        for whole in (data, damaged):
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(Trickle(whole, most)))
            got.append(read("-"))
        assert got == expected, most


def test_a_damaged_arc_member_is_noted_and_the_next_read(tmp_path):
    version = b"1 0 simhashdb\nURL IP-address Archive-date Content-type Archive-length\n"
    members = [b"filedesc://old.arc 0.0.0.0 20260101000000 text/plain %d\n" % len(version) +
               version + b"\n"]
    for i in range(3):
        http = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + prose(i).encode()
        members.append(b"http://example.com/%d 127.0.0.1 20260101000000 text/plain %d\n"
                       % (i, len(http)) + http + b"\n")
    members = [gzip.compress(member) for member in members]
    members[2] = members[2][:10] + bytes(20) + members[2][30:]   # the second page's member
    (tmp_path / "old.arc.gz").write_bytes(b"".join(members))
    starts = [sum(map(len, members[:i])) for i in range(len(members))]
    meta = {"date": "2026-01-01T00:00:00Z", "status": 200}
    assert read(tmp_path / "old.arc.gz") == [
        (0, "a warcinfo record"), (starts[1], ("http://example.com/0", prose(0), meta)),
        (starts[2], ("note", starts[2])), (starts[3], ("http://example.com/2", prose(2), meta))]


@pytest.mark.parametrize("encode", [base64.b32encode, base64.b16encode, base64.b64encode],
                         ids=["base32", "base16", "base64"])
def test_a_block_digest_in_each_base_is_checked(tmp_path, encode):
    data = write_warc(tmp_path / "crawl.warc", RECORDS[:1], gz=False).read_bytes()
    declared = re.search(rb"WARC-Block-Digest: sha1:(\S+)", data).group(1)
    data = data.replace(declared, encode(base64.b32decode(declared)))
    (tmp_path / "crawl.warc").write_bytes(data)
    at = data.rindex(b"</p>")   # a byte of the page flipped
    (tmp_path / "damaged.warc").write_bytes(data[:at] + b"X" + data[at + 1:])
    assert read(tmp_path / "crawl.warc")[0][1][0] == RECORDS[0][0]
    assert read(tmp_path / "damaged.warc") == [(0, ("note", 0))]


def test_what_warcio_logs_of_a_record_it_mends_is_not_printed(tmp_path, capfd, monkeypatch):
    """A target URI with a space, which warcio mends and logs: where the
    application has set no logging up (pytest's own taken off here), nothing
    reaches stderr."""
    archive = write_warc(tmp_path / "crawl.warc", RECORDS[:1], gz=False)
    archive.write_bytes(archive.read_bytes().replace(b"example.com/a", b"example.com/a b", 1))
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    assert read(archive)[0][1][0] == "http://example.com/a%20b"
    assert capfd.readouterr().err == ""
