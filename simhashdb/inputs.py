"""Records from files, directories and standard input: what
``simhashdb-cli`` and :mod:`simhashdb.spark` read, as library code.

Formats of an input (``"-"`` is standard input):

- ``dec`` / ``hex``: one fingerprint a line, keyed ``file:line`` (the file's
  path as a text document's; from stdin, by the line number alone);
- ``jsonl``: one object a line, with ``"key"`` (or ``"path"``, keyed as a
  file would be), ``"fingerprint"`` (an int, or a string of digits) or
  ``"text"``, and optionally ``"meta"``, ``"stored_at"`` and (with a
  fingerprint, as ``export`` writes a text's) ``"signature"``; the header line
  of an export (``{"simhashdb": {...}}``) is skipped;
- ``text``: each file one document, keyed by its path; a directory is walked
  (its files named as web archives, ``*.warc``, ``*.arc``, ``*.wet`` and
  their ``.gz``, read as archives);
- ``warc``: a web archive (WARC, ARC or WET, plain or gzip, read by warcio):
  each response, resource or conversion record of a page (HTML or plain
  text) one document, keyed by its target URI (or URI and date, or record
  id: ``archive_key``), with its date and HTTP status as metadata.

Bytes become text by the charset the document declares (its HTTP header's,
else its HTML ``<meta>``), else as UTF-8, else in the encoding chardet
detects; ``encoding`` forces one (:func:`decode_text`).

Usage::

    reader = Reader(fingerprint=simhashdb.fingerprint)
    for source, line, record in reader.records({"pages/": "text", "-": "jsonl"}):
        ...  # a (key, fingerprint, meta, stored_at) tuple, a TextRecord,
             # a Skipped file, or the InputError of a bad line
"""

import base64
import bz2
import codecs
import contextlib
import dataclasses
import fnmatch
import gzip
import io
import json
import lzma
import mmap
import os
import re
import stat
import sys
from typing import Callable, Optional, Sequence

import chardet

from . import _ext
from .errors import DamagedInputError, InputError, SimhashDBError
from .fingerprint import fingerprint as default_fingerprint

FORMATS = ("dec", "hex", "jsonl", "text", "warc")
ARCHIVE_KEYS = ("uri", "uri-date", "record-id")  # what keys an archive's records
ARCHIVE_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".wet", ".wet.gz")
ARCHIVE_MAGIC = (b"WARC/", b"filedesc://")  # the first bytes of a WARC (or WET) and of an ARC
PAGE_RECORDS = ("response", "resource", "conversion")  # conversion: a WET's text of a page
CRAWLER_SCHEMES = ("metadata:", "dns:")  # records of the crawl itself (wget's log, Heritrix's DNS)
HTML_TYPES = ("text/html", "application/xhtml+xml")
PAGE_TYPES = HTML_TYPES + ("text/plain",)
CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
PRESCAN = 1024  # the bytes of a page searched for its <meta> charset, as browsers do
# labels that mean another encoding on the web (the WHATWG Encoding Standard)
WEB_ENCODINGS = {"iso8859-1": "cp1252", "ascii": "cp1252", "gb2312": "gb18030",
                 "gbk": "gb18030"}
LEAST_CONFIDENCE = 0.02  # chardet's for noise is below (a page in Latin-1 is 0.05 or more)
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
DEC = re.compile(r"[0-9]{1,40}")
HEX = re.compile(r"(0[xX])?([0-9a-fA-F]{1,40})")
DEC_BYTES = re.compile(DEC.pattern.encode())
HEX_BYTES = re.compile(HEX.pattern.encode())
BOM = "\ufeff".encode()  # a UTF-8 byte order mark, which some editors begin a file with
MAGIC = 6  # the longest compression magic (xz's)
JSON_FIELDS = {"key", "path", "fingerprint", "text", "meta", "stored_at", "signature",
               "hex", "recipe"}  # what a JSON line's record is made of, or `fingerprint` writes
PEEK = 1 << 16  # what format detection and an export's header read of an input
BINARY_SAMPLE = 1 << 16
# (magic bytes, name, decompress whole, its errors, a stream of the content)
DECOMPRESSORS = ((b"\x1f\x8b", "gzip", gzip.decompress, (OSError, EOFError),
                  lambda raw: gzip.GzipFile(fileobj=raw)),
                 (b"BZh", "bzip2", bz2.decompress, (OSError, ValueError, EOFError), bz2.BZ2File),
                 (b"\xfd7zXZ\x00", "xz", lzma.decompress, (lzma.LZMAError, EOFError),
                  lzma.LZMAFile))


class Skipped:
    """An input left out, and why (counted and noted, not an error);
    ``routine``: an archive's record that is not a page (a request, an
    image), counted only."""

    def __init__(self, why, routine=False):
        self.why = why
        self.routine = routine


class TextRecord(tuple):
    """A (key, text[, meta]) record, for the database's text methods;
    ``html``: whether its text is HTML (a file's as the Reader's ``html``
    says, an archived page's by its content type)."""

    html = False

    def __new__(cls, items, html=False):
        record = super().__new__(cls, items)
        record.html = html
        return record


@dataclasses.dataclass
class Reader:
    """How inputs become records.

    :param include: glob patterns of the files of a walked directory to read
        (by name or path below the directory; default: all).
    :param exclude: glob patterns of those to leave out.
    :param root: key text documents by their path relative to it (default:
        their absolute path).
    :param key_prefix: put this before every key made from a path or a line number.
    :param stdin_key: the key of a text document read from standard input;
        None: such a document is an InputError (default: ``"<stdin>"``).
    :param fingerprint: ``fingerprint(text, html=...)``, to tell a document
        with no text to fingerprint (empty, white space, markup alone): it is
        Skipped.
    :param html: text documents are HTML (archived pages: by their content type).
    :param encoding: decode every document with this encoding (default: as
        :func:`decode_text` decides).
    :param archive_key: what keys an archive's records: ``"uri"``, its
        target URI; ``"uri-date"``, the URI, a space and the record's date;
        ``"record-id"``, its WARC-Record-ID (default: ``"uri"``).

    ``unread_fields`` collects the fields of JSON lines that no record takes
    (a misspelt "metadata", say), for the caller to tell; ``decoded`` counts
    how documents' bytes were decoded (see :func:`decode_text`).
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    root: Optional[str] = None
    key_prefix: Optional[str] = None
    stdin_key: Optional[str] = "<stdin>"
    fingerprint: Callable = default_fingerprint
    html: bool = False
    encoding: Optional[str] = None
    archive_key: str = "uri"
    unread_fields: set = dataclasses.field(default_factory=set)
    decoded: dict = dataclasses.field(default_factory=dict)

    def records(self, formats, progress=None):
        """(source, line, record) of the inputs, ``formats`` mapping each to its
        format (see :func:`input_format`): a record is a (key, fingerprint,
        meta, stored_at) tuple, a :class:`TextRecord`, a :class:`Skipped`, or
        the :class:`InputError` of its line (reading goes on). An archive's
        records have their byte offset for a line. ``progress`` (a tqdm-like
        bar) is updated with the bytes read."""
        for given, fmt in formats.items():
            if fmt == "warc":
                yield from self._archive_records(given, progress)
            elif fmt == "text":
                yield from self._text_records(given, progress)
            else:
                yield from self._line_records(given, fmt, progress)

    def text_formats(self, inputs):
        """``inputs`` (files, directories, ``"-"``) as :meth:`records` takes
        texts: a named archive as one, anything else as text documents."""
        return {given: "warc" if given != "-" and not os.path.isdir(given) and
                _is_regular(given) and is_archive(given) else "text" for given in inputs}

    def _text_records(self, given, progress):
        """The records of the text documents of a file, walked directory or stdin."""
        walked = given != "-" and os.path.isdir(given)
        for path, unread in self._walk(given) if walked else [(given, None)]:
            if walked and unread is None and path.lower().endswith(ARCHIVE_SUFFIXES) and \
                    _is_regular(path):
                yield from self._archive_records(path, progress)
                continue
            source = "<stdin>" if path == "-" else path
            if progress is not None:
                progress.update(_size(path))
            data = unread or (_walked_text(path) if walked else read_text(path))
            data = self._page(data, None, self.html)
            if isinstance(data, Skipped):
                yield source, 1, data
                continue
            try:
                yield source, 1, TextRecord((self.path_key(path), data), self.html)
            except InputError as exc:
                yield source, 1, exc

    def _page(self, data, declared, html):
        """The text of a document's bytes, or Skipped where it has none (binary,
        damaged, nothing to fingerprint); the decision counted."""
        if isinstance(data, Skipped):
            return data
        text, how = decode_text(data, declared, self.encoding)
        if isinstance(text, Skipped):
            return text
        self.decoded[how] = self.decoded.get(how, 0) + 1
        fp = self.fingerprint_of(text, html)
        return fp if isinstance(fp, Skipped) else text

    def _archive_records(self, given, progress):
        """The records of a web archive, read by warcio; from a malformed
        record's InputError, reading goes on at the next record that starts
        well (a named file's next gzip member or WARC header)."""
        start = 0
        while start is not None:
            start = yield from self._archive_from(given, start, progress)

    def _archive_from(self, given, start, progress):
        """The records of an archive from byte ``start``; returns where to go on
        after a malformed record (None: the end)."""
        try:
            from warcio.archiveiterator import ArchiveIterator
        except ImportError:
            raise InputError("reading web archives needs warcio: pip install '.[warc]' in "
                             "simhashdb's source directory") from None
        source = "<stdin>" if given == "-" else given
        with open_archive(given, start) as stream:
            records = ArchiveIterator(stream, arc2warc=True)
            offset = done = start
            while True:
                try:
                    record = next(records, None)
                    if record is None:
                        break
                    body = record.content_stream().read()
                    truncated = getattr(record.raw_stream, "limit", 1) > 0 or not (
                        record.rec_headers.get_header("Content-Length") or "").strip().isdigit()
                    offset = records.get_record_offset()
                    truncated = truncated or _member_cut(records.reader)
                except Exception as exc:  # warcio's errors on damaged data have no one base
                    offset = records.offset
                    yield source, offset, InputError(
                        "a malformed archive record at byte %d (%s)"
                        % (offset, " ".join(str(exc).split())[:80] or type(exc).__name__))
                    return None if given == "-" else _next_record_start(given, offset)
                if progress is not None:
                    progress.update(records.offset - done)
                    done = records.offset
                if truncated:
                    yield source, offset, InputError("a truncated archive record at byte %d"
                                                     % offset)
                    return None
                yield source, offset, self._archived_page(record, body, offset)
            if given != "-" and _rest_is_data(given, records.offset):  # a record cut in its header
                yield source, records.offset, InputError("a truncated archive record at byte %d"
                                                         % records.offset)
        return None

    def _archived_page(self, record, body, offset):
        """The TextRecord of an archive's record of a page, its Skipped, or an InputError."""
        if record.rec_type not in PAGE_RECORDS:
            return Skipped("a %s record" % record.rec_type, routine=True)
        headers, fields = record.http_headers, record.rec_headers
        content_type = (headers or fields).get_header("Content-Type") or ""
        kind = content_type.split(";")[0].strip().lower()
        if kind not in PAGE_TYPES:
            return Skipped("content type %s" % (kind or "not given"), routine=True)
        uri = fields.get_header("WARC-Target-URI")
        if uri and uri.startswith(CRAWLER_SCHEMES):
            return Skipped("a crawler's own record (%s)" % uri.split("/")[0], routine=True)
        date = fields.get_header("WARC-Date")
        key = {"uri": uri, "uri-date": uri and date and "%s %s" % (uri, date),
               "record-id": fields.get_header("WARC-Record-ID")}[self.archive_key]
        if not key:
            return InputError("the record at byte %d has no %s to key it by" % (
                offset, "WARC-Record-ID" if self.archive_key == "record-id" else
                "WARC-Target-URI and WARC-Date" if uri else "WARC-Target-URI"))
        meta = {"date": date}
        if headers is not None and headers.get_statuscode().isdigit():
            meta["status"] = int(headers.get_statuscode())
        if self.archive_key != "uri":
            meta["url"] = uri
        charset = CHARSET.search(content_type)
        html = self.html or kind in HTML_TYPES
        text = self._page(body, charset and charset.group(1), html)
        if isinstance(text, Skipped):
            return text
        return TextRecord(((self.key_prefix or "") + key, text, meta), html)

    def size(self, inputs):
        """The bytes of the files ``inputs`` name (walked directories too), or
        None where one is stdin: what :meth:`records` reports as progress."""
        if "-" in inputs:
            return None
        return sum(_size(path) for given in inputs
                   for path, _ in (self._walk(given) if os.path.isdir(given) else [(given, None)]))

    def walks_a_file(self, root):
        """Whether the walk of the directory ``root`` takes any file."""
        return any(unread is None for _, unread in self._walk(root))

    def fingerprint_of(self, data, html=False):
        """The fingerprint of a document's text (``html``: of HTML), or Skipped
        where it has no text to fingerprint (0, the fingerprint of nothing,
        would match every other empty document)."""
        fp = self.fingerprint(data, html=html)
        return Skipped("empty (no text to fingerprint)") if fp == 0 else fp

    def path_key(self, path):
        """The key of the text document at ``path``: its absolute path, or its
        path relative to ``root``; standard input's is ``stdin_key``. Both
        after ``key_prefix``."""
        if path == "-":
            if self.stdin_key is None:
                raise InputError("text from stdin needs a key to store it under (--key KEY)")
            key = self.stdin_key
        else:
            key = os.path.abspath(path)
            if self.root is not None:
                key = os.path.relpath(key, os.path.abspath(self.root))
                if key == os.pardir or key.startswith(os.pardir + os.sep):
                    raise InputError("%s is not under --root %s" % (path, self.root))
        return (self.key_prefix or "") + key

    def _line_records(self, given, fmt, progress):
        source = "<stdin>" if given == "-" else given
        with open_input(given, decompressed=True) as stream:
            for number, raw in enumerate(stream, 1):
                if progress is not None:
                    progress.update(len(raw))
                try:
                    line = decode(raw, "line").strip()
                    if not line:
                        continue
                    if fmt == "jsonl":
                        record = self._json_record(line)
                        if record is None:
                            continue  # the header of an export
                    else:
                        fp = parse_fingerprint(line, fmt, "line")
                        if given != "-":
                            key = "%s:%d" % (self.path_key(given), number)
                        elif self.key_prefix is None:
                            key = number
                        else:
                            key = "%s%d" % (self.key_prefix, number)
                        record = key, fp
                except SimhashDBError as exc:
                    record = exc
                yield source, number, record

    def _json_record(self, line):
        """The record of a JSON line; None for the header line of an export."""
        obj = json_object(line)
        if list(obj) == ["simhashdb"]:
            return None
        self.unread_fields.update(obj.keys() - JSON_FIELDS)
        if "key" in obj:
            key = obj["key"]
        elif isinstance(obj.get("path"), str) and obj["path"] != "-":
            key = self.path_key(obj["path"])
        else:
            raise InputError('expected an object with "key" (or "path") and "fingerprint" or '
                             '"text"')
        if "fingerprint" in obj and "text" in obj:
            raise InputError('give "fingerprint" or "text", not both')
        if "fingerprint" in obj:
            fp = json_fingerprint(obj["fingerprint"])
        elif isinstance(obj.get("text"), str):
            if isinstance(self.fingerprint_of(obj["text"], self.html), Skipped):
                raise InputError('"text" is empty (no text to fingerprint)')
            return TextRecord((key, obj["text"], obj.get("meta")), self.html)
        else:
            raise InputError('expected "fingerprint" (an int) or "text" (a string)')
        record = key, fp, obj.get("meta"), obj.get("stored_at")
        return record + (obj["signature"],) if obj.get("signature") is not None else record

    def _walk(self, root):
        """(path, None) of each file below ``root`` that the patterns take, and
        (path, Skipped) of each directory that cannot be read."""
        unread = []
        for directory, subdirs, files in os.walk(root, onerror=unread.append):
            yield from _unread_directories(unread)
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                if self.include and not any(fnmatch.fnmatch(relative, g) or
                                            fnmatch.fnmatch(name, g) for g in self.include):
                    continue
                if any(fnmatch.fnmatch(relative, g) or fnmatch.fnmatch(name, g)
                       for g in self.exclude):
                    continue
                yield path, None
        yield from _unread_directories(unread)


def _unread_directories(errors):
    """(directory, Skipped) of each error os.walk met listing one, taken out of ``errors``."""
    while errors:
        error = errors.pop(0)
        yield error.filename, Skipped("a directory that cannot be read (%s)" % error.strerror)


def _walked_text(path):
    """The text of a file met in a directory walk, or Skipped: one that cannot
    be a document or cannot be read is noted and the walk goes on (a file
    given by name that cannot be read is an error)."""
    if not _utf8(path):
        return Skipped("its name is not UTF-8")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return Skipped("a broken link" if os.path.islink(path) else
                       "cannot be read (%s)" % exc.strerror)
    if not stat.S_ISREG(mode):  # a FIFO, socket or device: reading it may never end
        return Skipped("not a regular file")
    try:
        return read_text(path)
    except InputError as exc:
        return Skipped("cannot be read (%s)" % str(exc).rsplit(": ", 1)[-1])


def path_keys(name):
    """The keys an import without ``--root`` gives what ``name`` names, where
    it names a file that exists: its absolute path, or for ``PATH:LINE`` the
    key of that line of the file, ``/absolute/PATH:LINE``."""
    path, _, line = name.rpartition(":")
    named = ((name, ""), (path, ":" + line)) if line.isdigit() else ((name, ""),)
    return [os.path.abspath(file) + suffix for file, suffix in named
            if file and os.path.exists(file)]


def is_parquet(given):
    """Whether an input is Parquet: a .parquet file, or a directory of them."""
    return given.endswith(".parquet") or (
        os.path.isdir(given) and any(n.endswith(".parquet") for n in os.listdir(given)))


def input_format(given, fmt=None):
    """The format of an input: ``fmt`` where given, "text" for a directory;
    else jsonl for a .jsonl file; else, from every line of its first 64 KiB
    (decompressed), jsonl if each starts with "{", dec if each is decimal
    digits, dec or hex as :func:`values_format` says if the first line and
    more than half are decimal or hex (the others are then bad lines); any
    other named regular file is one text document (damaged compressed data
    too, which read_text skips), while stdin must be given a format (but
    when it is empty). A file whose first 64 KiB are decimal digits is hex
    where any of its lines is hex with letters (and no 0x).

    :raises InputError: stdin whose format cannot be told, a named pipe (a
        look would take what it read), or an unreadable file.
    """
    if given != "-" and os.path.isdir(given):
        return "text"
    if fmt:
        return fmt
    if given.endswith(".jsonl"):
        return "jsonl"
    if given.lower().endswith(ARCHIVE_SUFFIXES):
        return "warc"
    if given != "-" and not _is_regular(given):  # a look would take what it read
        raise InputError("cannot tell the format of %s, which is not a regular file, without "
                         "reading it: name it (--format)" % given)
    try:
        with open_input(given, peek=True, decompressed=True) as stream:
            lines = [line.strip() for line in stream if line.strip()]
    except DamagedInputError:
        return "text"  # which read_text skips, as damaged
    if lines and lines[0].startswith(ARCHIVE_MAGIC):
        return "warc"
    if lines and all(line.startswith(b"{") for line in lines):
        return "jsonl"
    numbers = [line for line in lines if DEC_BYTES.fullmatch(line) or HEX_BYTES.fullmatch(line)]
    if numbers and numbers[0] is lines[0] and 2 * len(numbers) > len(lines):
        # fingerprints, maybe with bad lines
        if len(numbers) == len(lines) and all(DEC_BYTES.fullmatch(line) for line in lines):
            return "hex" if given != "-" and _hex_further(given) else "dec"
        return values_format(numbers) or "dec or hex"
    if given == "-" and not lines and hasattr(stdin(), "peek"):
        return "dec"  # nothing to read: no records, in any format
    if given == "-":
        raise InputError("cannot tell the format of stdin from its first lines; name it "
                         "(--format)")
    return "text"


def _hex_further(given):
    """Whether a line of file ``given`` is hex with letters and no 0x: the
    values of a file of fingerprints are then all hex, wherever that line is."""
    try:
        with open_input(given, decompressed=True) as lines:
            return values_format(line for line in lines if not line.rstrip().isdigit()) == "hex"
    except InputError:  # damaged compressed data: the import reads up to it, and says so
        pass
    return False


def export_header(formats):
    """The parameters in the first line of the first JSON lines input: those
    of the header an export writes ({"simhashdb": {...}}), or as
    ``lines_recipe`` the recipe a line of `fingerprint` names; else {}."""
    given = next((g for g, fmt in formats.items() if fmt == "jsonl"), None)
    if given is None or given != "-" and not _is_regular(given):  # a pipe: a look would take
        return {}                                                    # what it read
    with open_input(given, peek=True, decompressed=True) as lines:
        first = next((line for line in lines if line.strip()), b"")
    try:
        obj = json.loads(first) if first.lstrip().startswith(b"{") else None
    except (ValueError, RecursionError):
        return {}  # reported with its line number when the records are read
    if not isinstance(obj, dict):
        return {}
    if {"fingerprint", "hex", "recipe"} <= set(obj) and ("path" in obj or "key" in obj) and \
            isinstance(obj["recipe"], str):
        return {"lines_recipe": obj["recipe"]}  # a line `fingerprint` wrote
    header = obj.get("simhashdb")
    return header if isinstance(header, dict) else {}


def read_text(path):
    """The bytes of a document file (``"-"``: stdin), decompressed where it is
    gzip, bzip2 or xz; Skipped where that data is damaged."""
    with open_input(path) as stream:
        data = stream.read()
    for magic, name, decompress, errors, _ in DECOMPRESSORS:
        if data.startswith(magic):
            try:
                data = decompress(data)
            except errors:
                return Skipped("damaged %s data" % name)
            break
    return data


def decode_text(data, declared=None, forced=None):
    """The text of a document's bytes, and how it was decoded: with the
    ``forced`` encoding ("forced"); else by a UTF-16 byte order mark ("bom");
    else by the ``declared`` charset (an HTTP header's: "http header"); else
    by the charset of an HTML ``<meta>`` in its first 1024 bytes ("meta");
    else as UTF-8 where it is ("utf-8"); else in the encoding chardet detects
    with some confidence ("detected"). Labels are read as browsers read them (ISO-8859-1 is
    windows-1252). (Skipped, None) where it is binary, like grep -I: NUL
    bytes in its first 64 KiB, or no text encoding fits.

    Only bytes that are not UTF-8, or declare another charset, decode
    otherwise than as UTF-8 with U+FFFD for bad bytes (what the text
    methods do with bytes)."""
    if forced:
        return data.decode(forced, "replace"), "forced"
    if data.startswith(UTF16_BOMS):
        return data.decode("utf-16", "replace"), "bom"
    sample = data[:BINARY_SAMPLE]
    if b"\0" in sample:
        return Skipped("binary (NUL bytes)"), None
    meta = META_CHARSET.search(data[:PRESCAN])
    for label, how in ((declared, "http header"), (meta and meta.group(1).decode(), "meta")):
        encoding = web_encoding(label)
        if encoding:
            return data.decode(encoding, "replace"), how
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    guess = chardet.detect(sample)
    encoding = web_encoding(guess["encoding"]) if guess["confidence"] >= LEAST_CONFIDENCE else None
    if encoding is None:
        return Skipped("binary (no text encoding fits)"), None
    return data.decode(encoding, "replace"), "detected"


def web_encoding(label):
    """The Python codec of a charset label as browsers read it, or None for
    none, one unknown, or a codec of bytes to bytes (hex, zlib, base64...)."""
    try:
        name = codecs.lookup(label.strip()).name if label else None
        if name:
            b"a".decode(name, "ignore")  # one of bytes to bytes is "not a text encoding"
    except LookupError:
        return None
    return WEB_ENCODINGS.get(name, name)


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


def _opened(path):
    """The file ``path``, open to read bytes.

    :raises InputError: it cannot be read.
    """
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError("cannot read %s: %s" % (path, exc.strerror)) from None


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


def read_hashes(given, fmt=None):
    """The fingerprints of a file (or stdin) of one fingerprint a line.

    :raises InputError: for the first bad line, naming it.
    """
    with open_input(given, decompressed=True) as stream:
        lines = [(number, raw.strip()) for number, raw in enumerate(stream, 1) if raw.strip()]
    fmt = values_format([line for _, line in lines], fmt)
    hashes = []
    for number, line in lines:
        try:
            hashes.append(parse_fingerprint(decode(line, "line"), fmt, "line"))
        except SimhashDBError as exc:
            raise InputError("%s:%d: %s" % (given, number, exc)) from None
    return hashes


def stdin_lines():
    """The lines of stdin that are not blank, stripped."""
    lines = (decode(raw, "stdin line").strip() for raw in stdin())
    return [line for line in lines if line]


def probes(lines, fmt=None):
    """(label or None, fingerprint, recipe or None) of query input: fingerprints,
    or JSON lines with "fingerprint" (and "path" or "key" as the label, and
    the "recipe" that made it, as `fingerprint` prints them)."""
    plain = [line for line in lines if not line.startswith("{")]
    fmt = values_format(plain, fmt)
    found = []
    for line in lines:
        if line.startswith("{"):
            obj = json_object(line)
            if "fingerprint" not in obj:
                raise InputError('a JSON query line needs "fingerprint", as `fingerprint` '
                                 'prints: %s' % line[:60])
            found.append((obj.get("path", obj.get("key")), json_fingerprint(obj["fingerprint"]),
                          obj.get("recipe")))
        else:
            found.append((None, parse_fingerprint(line, fmt, "argument"), None))
    return found


def values_format(values, fmt=None):
    """How to read a list of fingerprints (str or bytes): ``fmt`` where given;
    else hex where a value has hex letters and no 0x (as `fingerprint --format
    hex` prints them), so that its values of digits only are hex too; else
    None: digits only are decimal, 0x or letters hex."""
    if fmt:
        return fmt
    for value in values:
        value = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        value = value.strip()
        if HEX.fullmatch(value) and not DEC.fullmatch(value) and value[:2].lower() != "0x":
            return "hex"
    return None


def parse_fingerprint(text, fmt, what):
    """A fingerprint written as plain decimal or hex digits (hex may start with
    0x); where ``fmt`` is neither "dec" nor "hex", digits only are decimal. No
    signs, underscores, spaces inside or non-ASCII digits."""
    text = text.strip()
    if fmt != "hex" and DEC.fullmatch(text):
        value = int(text, 10)
    elif fmt != "dec" and HEX.fullmatch(text):
        value = int(HEX.fullmatch(text).group(2), 16)
    else:
        pair = len(text.split()) == 2 and all(DEC.fullmatch(t) or HEX.fullmatch(t)
                                              for t in text.split())
        raise InputError("%s %r is not a %s fingerprint%s" % (
            what, text[:40], {"dec": "decimal", "hex": "hex"}.get(fmt, "decimal or hex"),
            ' (a key and a fingerprint? write JSON lines: {"key": 1, "fingerprint": 7919})'
            if pair else ""))
    return _ext.check_fingerprint(value)


def json_object(line):
    """The JSON object of a line (``{"$bytes": base64}`` read as bytes)."""
    try:
        obj = json.loads(line, object_hook=_from_json, parse_constant=_not_a_number)
    except json.JSONDecodeError as exc:
        raise InputError("not JSON: %s" % exc.msg) from None
    except RecursionError:
        raise InputError("JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an int of more digits than Python converts
        raise InputError("not usable JSON: %s" % exc) from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object, got %s" % type(obj).__name__)
    return obj


def _not_a_number(name):
    """NaN and Infinity, which Python reads but JSON does not have."""
    raise ValueError("%s is not JSON (a number must be finite)" % name)


def json_fingerprint(value):
    """A JSON "fingerprint": an int, or a string of decimal or hex digits."""
    return parse_fingerprint(value, None, "fingerprint") if isinstance(value, str) else value


def decode(raw, what):
    """``raw`` bytes as UTF-8 text (``what`` they are, for the message)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("%s is not valid UTF-8 (byte %d): keys and fingerprints must be "
                         "UTF-8 text" % (what, exc.start)) from None


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


def _from_json(obj):
    if len(obj) == 1 and isinstance(obj.get("$bytes"), str):
        try:
            return base64.b64decode(obj["$bytes"], validate=True)
        except ValueError:
            raise InputError("bad base64 in {\"$bytes\": ...}") from None
    return obj
