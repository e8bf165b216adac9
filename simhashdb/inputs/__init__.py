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

import dataclasses
import fnmatch
import json
import os
import stat
from typing import Callable, Optional, Sequence

from ..errors import DamagedInputError, InputError, SimhashDBError
from ..fingerprint import fingerprint as default_fingerprint
from .archives import ARCHIVE_MAGIC, ARCHIVE_SUFFIXES, archive_records, is_archive, open_archive
from .charsets import CHARSET, Skipped, decode_text, read_text, web_encoding
from .streams import _is_regular, _size, _utf8, open_input, stdin, stdin_is_empty
from .values import (
    DEC,
    DEC_BYTES,
    HEX,
    HEX_BYTES,
    decode,
    json_fingerprint,
    json_object,
    parse_fingerprint,
    probes,
    read_hashes,
    stdin_lines,
    values_format,
)

__all__ = ["ARCHIVE_KEYS", "DEC", "FORMATS", "HEX", "Reader", "Skipped", "TextRecord",
           "decode_text", "export_header", "input_format", "is_archive", "is_parquet",
           "open_archive", "open_input", "path_keys", "probes", "read_hashes", "read_text",
           "stdin_is_empty", "stdin_lines", "web_encoding"]
FORMATS = ("dec", "hex", "jsonl", "text", "warc")
ARCHIVE_KEYS = ("uri", "uri-date", "record-id")  # what keys an archive's records
PAGE_RECORDS = ("response", "resource", "conversion")  # conversion: a WET's text of a page
CRAWLER_SCHEMES = ("metadata:", "dns:")  # records of the crawl itself (wget's log, Heritrix's DNS)
HTML_TYPES = ("text/html", "application/xhtml+xml")
PAGE_TYPES = HTML_TYPES + ("text/plain",)
JSON_FIELDS = {"key", "path", "fingerprint", "text", "meta", "stored_at", "signature",
               "hex", "recipe"}  # what a JSON line's record is made of, or `fingerprint` writes


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
        """The records of a web archive, read by warcio; a damaged or
        truncated record is its InputError, and reading goes on at the next
        record that reads whole (see :func:`archive_records`)."""
        source = "<stdin>" if given == "-" else given
        with open_archive(given) as stream:
            for offset, item in archive_records(stream, progress):
                yield source, offset, item if isinstance(item, InputError) else \
                    self._archived_page(*item, offset)

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
