"""Web archives (WARC, ARC, WET; plain or gzip) opened for warcio: told apart
by name or first bytes, opened at a record's offset, and a damaged gzip
member skipped to the next record."""

import contextlib
import gzip
import mmap

from .streams import PEEK, _opened, stdin

ARCHIVE_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".wet", ".wet.gz")
ARCHIVE_MAGIC = (b"WARC/", b"filedesc://")  # the first bytes of a WARC (or WET) and of an ARC


def is_archive(path):
    """Whether the file ``path`` is a web archive: named so (``*.warc``,
    ``*.arc``, ``*.wet``, each maybe ``.gz``), or beginning as a WARC or an
    ARC does (gzip or plain)."""
    if path.lower().endswith(ARCHIVE_SUFFIXES):
        return True
    try:
        with open(path, "rb") as raw:
            head = raw.read(len(ARCHIVE_MAGIC[1]))
            if head.startswith(b"\x1f\x8b"):
                raw.seek(0)
                head = gzip.GzipFile(fileobj=raw).read(len(ARCHIVE_MAGIC[1]))
    except (OSError, EOFError):
        return False
    return head.startswith(ARCHIVE_MAGIC)


@contextlib.contextmanager
def open_archive(given, start=0):
    """A binary stream of an archive (``"-"``: stdin) from byte ``start``."""
    if given == "-":
        yield stdin()
        return
    with _opened(given) as stream:
        stream.seek(start)
        yield stream


def _member_cut(reader):
    """Whether warcio's ``reader`` stopped inside a gzip member: the data of a
    record may be whole while the member's end (and its checksum) is missing."""
    decompressor = reader.decompressor
    return decompressor is not None and not getattr(decompressor, "eof", True)


def _rest_is_data(path, offset):
    """Whether the file ``path`` holds more than white space after ``offset``."""
    with open(path, "rb") as raw:
        raw.seek(offset)
        return bool(raw.read(PEEK).strip())


def _next_record_start(path, after):
    """The offset of the first record of the archive ``path`` that may begin
    after byte ``after`` (a gzip member, or a WARC header at the start of a
    line); None where there is none."""
    with open(path, "rb") as raw, mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:2] == b"\x1f\x8b":
            found = data.find(b"\x1f\x8b\x08", after + 1)
        else:
            found = data.find(b"\nWARC/", after)
            found = found + 1 if found >= 0 else found
    return found if found > after else None
