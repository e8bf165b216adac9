"""Web archives (WARC, ARC, WET; plain or gzip) read record by record: told
apart by name or first bytes, each record framed and checked whole before
warcio parses it, and reading taken up again after a damaged one at the
next record that reads whole."""

import base64
import contextlib
import gzip
import hashlib
import io
import logging
import re
import zlib

from ..errors import InputError
from .streams import _opened, stdin

ARCHIVE_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".wet", ".wet.gz")
ARCHIVE_MAGIC = (b"WARC/", b"filedesc://")  # the first bytes of a WARC (or WET) and of an ARC
GZIP_MEMBER = b"\x1f\x8b\x08"  # how a gzip member begins: its magic and deflate
RECORD_START = re.compile(re.escape(GZIP_MEMBER) + rb"|WARC/")  # a gzip member, or a WARC record
BLOCK = 1 << 14  # what one read of an archive takes
HEADER_LIMIT = 1 << 20  # the longest header a record may have
SPACE = re.compile(rb"[ \t\r\n]*")
LINE_END = re.compile(rb"\n")
HEADER_END = re.compile(rb"\n\r?\n")  # the blank line after a WARC's header
RECORD_END = re.compile(rb"\r?\n\r?\n")  # the two line ends after a WARC record's block
CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*([0-9]+)[ \t]*\r?\n", re.I)
WARC_HEADER = re.compile(  # a version line, then fields (or values' continuations), no controls
    rb"WARC/[0-9]+\.[0-9]+\r?\n(?:(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:|[ \t])"
    rb"[^\x00-\x08\x0a-\x1f\x7f]*\r?\n)*\r?\n")
WARC_BLOCK_DIGEST = re.compile(rb"\nwarc-block-digest:[ \t]*([^\r\n]*)", re.I)
WARC_REQUIRED = (b"warc-record-id", b"content-length", b"warc-date", b"warc-type")
BASE32_AS_DIGITS = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
                                   b"0123456789ABCDEFGHIJKLMNOPQRSTUV")
# what warcio logs of a record it mends (spaces in a target URI) goes to the
# application's logging where it has some, not straight to stderr
logging.getLogger("warcio").addHandler(logging.NullHandler())


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


def archive_records(stream, progress=None):
    """(offset, item) of each record of the archive ``stream`` (WARC, ARC or
    WET, plain or gzip), read forward only: item is a (warcio record, its
    content) pair, or the InputError of a damaged or truncated record.

    A record is read whole and checked before warcio parses it: a gzip
    member must inflate with its checksum and hold one record, of the
    length its header gives; a plain WARC record must have a well formed
    header, a block that agrees with its ``WARC-Block-Digest`` and the two
    line ends after it. After a record that fails, one InputError notes it,
    and reading goes on at the next gzip member or ``WARC/`` that begins a
    record that reads whole; the bytes between are that damaged record's.
    ``progress`` (a tqdm-like bar) is updated with the bytes read.

    :raises InputError: warcio is not installed.
    """
    try:
        from warcio.recordloader import ArcWarcRecordLoader
    except ImportError:
        raise InputError("reading web archives needs warcio: pip install '.[warc]' in "
                         "simhashdb's source directory") from None
    loader = ArcWarcRecordLoader(verify_http=False, arc2warc=True)
    window = _Bytes(lambda: _read(stream))
    damaged, done = False, 0
    while window.skip_space():
        offset = window.at
        window.forget()
        try:
            framed = _gzip_record(window) if window.startswith(GZIP_MEMBER[:2]) else \
                _plain_record(window, plain=True)
            record = loader.parse_record_stream(io.BytesIO(framed))
            item = record, record.content_stream().read()
        except Exception as exc:  # framing's InputError or EOFError, or warcio's (no one base)
            if not damaged:
                yield offset, _damage_note(offset, exc)
            damaged = True
            window.seek(offset + 1)
            if not window.skip_to(RECORD_START):
                break
            continue
        damaged = False
        if progress is not None:
            progress.update(window.at - done)
            done = window.at
        yield offset, item
    if progress is not None:
        progress.update(window.at - done)


def _read(stream):
    """The next bytes of an archive's ``stream``.

    :raises InputError: it cannot be read.
    """
    try:
        return stream.read(BLOCK)
    except OSError as exc:
        raise InputError("cannot read the archive: %s" % (exc.strerror or exc)) from None


def _damage_note(offset, exc):
    """The InputError that notes the damaged or truncated record at byte ``offset``."""
    if isinstance(exc, EOFError):
        return InputError("a truncated archive record at byte %d" % offset)
    return InputError("a damaged archive record at byte %d (%s)"
                      % (offset, " ".join(str(exc).split())[:80] or type(exc).__name__))


def _gzip_record(window):
    """The inflated record of the gzip member at ``window``'s offset, which
    moves to the member's end.

    :raises InputError: the member is damaged, or does not hold one record.
    :raises EOFError: the archive ends inside it.
    """
    member = _member(window)
    try:
        framed = _plain_record(member, plain=False)
    except EOFError:
        if not member.ended:
            raise
        raise InputError("a record longer than its gzip member") from None
    if framed is None:
        raise InputError("an empty gzip member")
    if member.skip_space():
        raise InputError("more than one record in a gzip member (warcio recompress splits them)")
    return framed


def _member(window):
    """The inflated bytes of the gzip member at ``window``'s offset, as
    _Bytes that raise InputError where its data is damaged (its checksum
    too, at its end) and EOFError where the archive ends inside it."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def more():
        inflated = b""
        while not inflated and not inflater.eof:
            compressed = window.read(BLOCK)
            if not compressed:
                raise EOFError("the archive ends inside a gzip member")
            try:
                inflated = inflater.decompress(compressed)
            except zlib.error as exc:
                raise InputError("damaged gzip data: %s" % exc) from None
            if inflater.eof:  # the next member's bytes, read with this one's end
                window.seek(window.at - len(inflater.unused_data))
        return inflated
    return _Bytes(more)


def _plain_record(source, plain):
    """The bytes of the record at ``source``'s offset (after white space): a
    WARC's header and the block of its Content-Length, or an ARC's header
    line and the block of the length it ends with; None at the end.
    ``plain``: no gzip checksum covers the record, so a WARC's is checked
    (see :func:`_check_warc`).

    :raises InputError: the record does not frame, or fails a check.
    :raises EOFError: ``source`` ends inside it.
    """
    if not source.skip_space():
        return None
    if not source.startswith(b"WARC/"):
        line = source.read_through(LINE_END)
        length = (line.split() or [b""])[-1]
        if not length.isdigit():
            raise InputError("not a WARC or ARC record")
        return line + _block(source, int(length))
    header = source.read_through(HEADER_END)
    length = CONTENT_LENGTH.search(header)
    if length is None:
        raise InputError("a WARC record without a Content-Length")
    block = _block(source, int(length.group(1)))
    if plain:
        _check_warc(header, block, source)
    return header + block


def _block(source, length):
    """The next ``length`` bytes of ``source``.

    :raises EOFError: it ends before them.
    """
    block = source.read(length)
    if len(block) < length:
        raise EOFError("a record cut short")
    return block


def _check_warc(header, block, source):
    """Checks a plain WARC's record, its ``header`` and ``block`` read from
    ``source``: a header of well formed lines with each field every record
    has once, a block that agrees with its WARC-Block-Digest, then the two
    line ends that end a record (or the end of the archive).

    :raises InputError: a check fails.
    """
    named = header.lower()
    if not WARC_HEADER.fullmatch(header) or any(named.count(b"\n%s:" % name) != 1
                                                for name in WARC_REQUIRED):
        raise InputError("a malformed WARC header")
    digest = WARC_BLOCK_DIGEST.search(header)
    if digest and not _digest_agrees(block, digest.group(1)):
        raise InputError("a block that disagrees with its WARC-Block-Digest")
    tail = source.read(4)
    end = RECORD_END.match(tail)
    if end is None and (len(tail) == 4 or tail.strip()):   # (the archive may end sooner)
        raise InputError("a block not followed by two line ends (its Content-Length "
                         "disagrees)")
    source.seek(source.at - len(tail) + (end.end() if end else len(tail)))


def _digest_agrees(block, declared):
    """Whether ``block`` has the digest ``declared`` (``sha1:BASE32``, as
    WARC writers give it, or another hashlib algorithm's, in base 32, 16 or
    64); True where its algorithm is unknown."""
    algorithm, _, value = declared.partition(b":")
    try:
        digest = hashlib.new(algorithm.decode("ascii").replace("-", "").lower(), block).digest()
    except (ValueError, UnicodeDecodeError):
        return True
    value = value.strip().rstrip(b"=")
    base32 = -(-8 * len(digest) // 5)   # characters of 5 bits, the last padded with zeros
    if len(value) == 2 * len(digest):
        return value.lower() == digest.hex().encode()
    if len(value) != base32:
        return value == base64.b64encode(digest).rstrip(b"=")
    try:   # (int() reads base 32 in the digits 0-9A-V, fast)
        return int(value.upper().translate(BASE32_AS_DIGITS), 32) == \
            int.from_bytes(digest, "big") << (5 * base32 - 8 * len(digest))
    except ValueError:
        return False


class _Bytes:
    """Bytes read on as needed from ``more()`` (the next bytes; b"" at the
    end), by offset: those from the last :meth:`forget` on are kept, so
    that reading may go back to any of them."""

    def __init__(self, more):
        self._more, self.ended = more, False
        self.base = self.at = 0
        self.data = bytearray()

    def _have(self, end):
        """Whether the bytes up to offset ``end`` are here, read on for them."""
        while self.base + len(self.data) < end and not self.ended:
            more = self._more()
            self.data += more
            self.ended = not more
        return self.base + len(self.data) >= end

    def read(self, size):
        self._have(self.at + size)
        start = self.at - self.base
        with memoryview(self.data) as data:
            chunk = bytes(data[start:start + size])
        self.at += len(chunk)
        return chunk

    def read_through(self, pattern):
        """The bytes from the offset through the first match of ``pattern``
        (a compiled expression) in the next HEADER_LIMIT bytes.

        :raises InputError: none is there.
        :raises EOFError: the bytes end before one.
        """
        start = searched = self.at - self.base
        while not (found := pattern.search(self.data, searched, start + HEADER_LIMIT)):
            if len(self.data) >= start + HEADER_LIMIT:
                raise InputError("a header of more than %d bytes" % HEADER_LIMIT)
            searched = max(start, len(self.data) - 2)  # a match may span two reads
            if not self._have(self.base + len(self.data) + 1):
                raise EOFError("a record cut short in its header")
        return self.read(found.end() - start)

    def startswith(self, prefix):
        self._have(self.at + len(prefix))
        return self.data.startswith(prefix, self.at - self.base)

    def skip_space(self):
        """Moves past white space; whether anything follows it."""
        while True:
            self.at = self.base + SPACE.match(self.data, self.at - self.base).end()
            if self.at < self.base + len(self.data) or not self._have(self.at + 1):
                return self.at < self.base + len(self.data)

    def skip_to(self, pattern):
        """Moves to the next match of ``pattern`` (a compiled expression of
        a few bytes), forgetting the bytes before it; False where there is
        none before the end."""
        while not (found := pattern.search(self.data, self.at - self.base)):
            self.seek(max(self.at, self.base + len(self.data) - 8))  # a match may span two reads
            self.forget()
            if not self._have(self.base + len(self.data) + 1):
                return False
        self.seek(self.base + found.start())
        self.forget()
        return True

    def seek(self, offset):
        self.at = offset

    def forget(self):
        """Lets the bytes before the offset go."""
        del self.data[:self.at - self.base]
        self.base = self.at
