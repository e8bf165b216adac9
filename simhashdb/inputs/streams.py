"""An input opened: a file, a compressed file (gzip, bzip2, xz) or standard
input, with its first bytes peeked at and a stream that gives them back."""

import bz2
import contextlib
import gzip
import io
import lzma
import os
import stat
import sys

from ..errors import DamagedInputError, InputError

BOM = "\ufeff".encode()  # a UTF-8 byte order mark, which some editors begin a file with
MAGIC = 6  # the longest compression magic (xz's)
PEEK = 1 << 16  # what format detection and an export's header read of an input
# (magic bytes, name, decompress whole, its errors, a stream of the content)
DECOMPRESSORS = ((b"\x1f\x8b", "gzip", gzip.decompress, (OSError, EOFError),
                  lambda raw: gzip.GzipFile(fileobj=raw)),
                 (b"BZh", "bzip2", bz2.decompress, (OSError, ValueError, EOFError), bz2.BZ2File),
                 (b"\xfd7zXZ\x00", "xz", lzma.decompress, (lzma.LZMAError, EOFError),
                  lzma.LZMAFile))


@contextlib.contextmanager
def open_input(given, peek=False, decompressed=False):
    """A binary stream of a file or stdin ("-"); with ``peek``, the complete
    lines of its first 64 KiB, leaving stdin unread; with ``decompressed``,
    lines of records: those of a named gzip, bzip2 or xz file's content, a
    byte order mark before the first left out.

    :raises DamagedInputError: compressed data that is damaged.
    """
    if given == "-":
        stream = stdin()
        head = stream.peek(MAGIC)[:MAGIC] if decompressed and hasattr(stream, "peek") else b""
        compression = next((c[1] for c in DECOMPRESSORS if head.startswith(c[0])), None)
        if compression:
            raise InputError("stdin is %s data: decompress it on the way in (| %s -dc |) or "
                             "name the file, which is read decompressed"
                             % (compression, compression))
        if peek:
            yield _lines(_complete_lines(stream.peek(PEEK) if hasattr(stream, "peek") else b""),
                         decompressed)
        else:
            yield _lines(stream, decompressed)
        return
    raw = _opened(given)
    with raw:
        head = raw.peek(MAGIC) if decompressed else b""  # not read: a pipe cannot seek back
        if 0 < len(head) < MAGIC:  # a pipe's first read was short: wait for the rest
            head = raw.read(MAGIC)
            raw = io.BufferedReader(_Rejoined(head, raw))
        compression = next((c for c in DECOMPRESSORS if head.startswith(c[0])), None)
        stream = compression[4](raw) if compression else raw
        try:
            yield _lines(_complete_lines(stream.read(PEEK)) if peek else stream, decompressed)
        except (OSError, EOFError, lzma.LZMAError) as exc:
            if compression:
                raise DamagedInputError("cannot read %s: damaged %s data" % (given, compression[1])
                                   ) from None
            raise InputError("cannot read %s: %s" % (given, exc.strerror)) from None


class _Rejoined(io.RawIOBase):
    """The bytes ``head``, read from ``rest`` already, then the rest of it."""

    def __init__(self, head, rest):
        self._head, self._rest = head, rest

    def readable(self):
        return True

    def readinto(self, buffer):
        if not self._head:
            return self._rest.readinto1(buffer)  # what one read gives: a pipe's lines as they come
        n = min(len(buffer), len(self._head))
        buffer[:n], self._head = self._head[:n], self._head[n:]
        return n


def stdin():
    """Standard input, binary."""
    if sys.stdin is None:
        raise InputError("standard input is closed: give the input as arguments or files, "
                         "or pipe it in")
    return sys.stdin.buffer


def stdin_is_empty():
    """Whether standard input is known to hold nothing (False where it cannot be
    told without reading it)."""
    stream = stdin()
    return hasattr(stream, "peek") and not stream.peek(1)


def _complete_lines(head):
    """The lines of ``head``, less an unfinished last one (a read may have cut it)."""
    lines = head[:PEEK].splitlines()
    return lines[:-1] if not head.endswith(b"\n") and len(lines) > 1 else lines


def _size(path):
    """The size of a file (0 for stdin, or one that cannot be read)."""
    try:
        return os.path.getsize(path) if path != "-" else 0
    except OSError:
        return 0


def _utf8(path):
    """Whether ``path`` can be a key: a str key is UTF-8 (a name of other bytes
    reaches Python with surrogates in it)."""
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _is_regular(path):
    """Whether ``path`` is a regular file (or a link to one); True where it
    cannot be seen (reading it reports why)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def _opened(path):
    """The file ``path``, open to read bytes.

    :raises InputError: it cannot be read.
    """
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError("cannot read %s: %s" % (path, exc.strerror)) from None


def _lines(lines, records):
    """``lines`` as they are (a document's stream), or, for ``records``, less
    a byte order mark before the first line."""
    return _without_bom(lines) if records else lines


def _without_bom(lines):
    lines = iter(lines)
    for first in lines:
        yield first[len(BOM):] if first.startswith(BOM) else first
        break
    yield from lines  # (the rest without a Python step a line)
