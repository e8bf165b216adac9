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
- ``text``: each file one document, keyed by its path; a directory is walked.

Usage::

    reader = Reader(fingerprint=simhashdb.fingerprint)
    for source, line, record in reader.records({"pages/": "text", "-": "jsonl"}):
        ...  # a (key, fingerprint, meta, stored_at) tuple, a TextRecord,
             # a Skipped file, or the InputError of a bad line
"""

import base64
import bz2
import contextlib
import dataclasses
import fnmatch
import gzip
import io
import json
import lzma
import os
import re
import stat
import sys
from typing import Callable, Optional, Sequence

from . import _ext
from .errors import InputError, SimhashDBError
from .fingerprint import fingerprint as default_fingerprint

FORMATS = ("dec", "hex", "jsonl", "text")
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


class DamagedInput(InputError):
    """A compressed input whose data is damaged."""


class Skipped:
    """An input left out, and why (counted and noted, not an error)."""

    def __init__(self, why):
        self.why = why


class TextRecord(tuple):
    """A (key, text[, meta]) record, for the database's text methods."""


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
    :param fingerprint: a text's fingerprint, to tell a document with no text
        to fingerprint (empty, white space, markup alone): it is Skipped.

    ``unread_fields`` collects the fields of JSON lines that no record takes
    (a misspelt "metadata", say), for the caller to tell.
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    root: Optional[str] = None
    key_prefix: Optional[str] = None
    stdin_key: Optional[str] = "<stdin>"
    fingerprint: Callable = default_fingerprint
    unread_fields: set = dataclasses.field(default_factory=set)

    def records(self, formats, progress=None):
        """(source, line, record) of the inputs, ``formats`` mapping each to its
        format (see :func:`input_format`): a record is a (key, fingerprint,
        meta, stored_at) tuple, a :class:`TextRecord`, a :class:`Skipped`, or
        the :class:`InputError` of its line (reading goes on). ``progress``
        (a tqdm-like bar) is updated with the bytes read."""
        for given, fmt in formats.items():
            if fmt != "text":
                yield from self._line_records(given, fmt, progress)
                continue
            for path, data in self.documents([given]):
                source = "<stdin>" if path == "-" else path
                if progress is not None:
                    progress.update(_size(path))
                if not isinstance(data, Skipped):
                    fp = self.fingerprint_of(data)
                    data = fp if isinstance(fp, Skipped) else data
                if isinstance(data, Skipped):
                    yield source, 1, data
                    continue
                try:
                    yield source, 1, TextRecord((self.path_key(path), data))
                except InputError as exc:
                    yield source, 1, exc

    def documents(self, inputs):
        """(path, the text of the document or :class:`Skipped`) of each file of
        ``inputs`` (files, walked directories, ``"-"``)."""
        for given in inputs:
            if given != "-" and os.path.isdir(given):
                for path, unread in self._walk(given):
                    yield path, unread or _walked_text(path)
            else:
                yield given, read_text(given)

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

    def fingerprint_of(self, data):
        """The fingerprint of a document's text, or Skipped where it has no text
        to fingerprint (0, the fingerprint of nothing, would match every other
        empty document)."""
        fp = self.fingerprint(data)
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
            if isinstance(self.fingerprint_of(obj["text"]), Skipped):
                raise InputError('"text" is empty (no text to fingerprint)')
            return TextRecord((key, obj["text"], obj.get("meta")))
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
    if given != "-" and not _is_regular(given):  # a look would take what it read
        raise InputError("cannot tell the format of %s, which is not a regular file, without "
                         "reading it: name it (--format)" % given)
    try:
        with open_input(given, peek=True, decompressed=True) as stream:
            lines = [line.strip() for line in stream if line.strip()]
    except DamagedInput:
        return "text"  # which read_text skips, as damaged
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
    if {"path", "fingerprint", "hex", "recipe"} <= set(obj) and isinstance(obj["recipe"], str):
        return {"lines_recipe": obj["recipe"]}  # a line `fingerprint` wrote
    header = obj.get("simhashdb")
    return header if isinstance(header, dict) else {}


def read_text(path):
    """The text of a document file (``"-"``: stdin), decompressed where it is
    gzip, bzip2 or xz; Skipped where it is binary (like grep -I: NUL bytes in
    its first 64 KiB, or more than a tenth of them not UTF-8)."""
    with open_input(path) as stream:
        data = stream.read()
    for magic, name, decompress, errors, _ in DECOMPRESSORS:
        if data.startswith(magic):
            try:
                data = decompress(data)
            except errors:
                return Skipped("damaged %s data" % name)
            break
    sample = data[:BINARY_SAMPLE]
    if b"\0" in sample:
        return Skipped("binary (NUL bytes)")
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError:
        invalid = sample.decode("utf-8", "replace").count("\ufffd")
        if invalid * 10 > len(sample):
            return Skipped("binary (not UTF-8 text)")
    return data


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

    :raises DamagedInput: compressed data that is damaged.
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
    try:
        raw = open(given, "rb")
    except OSError as exc:
        raise InputError("cannot read %s: %s" % (given, exc.strerror)) from None
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
                raise DamagedInput("cannot read %s: damaged %s data" % (given, compression[1])
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
