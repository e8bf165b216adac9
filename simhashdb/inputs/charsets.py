"""Bytes to text: by the charset a document declares (its HTTP header's, else
its HTML ``<meta>``), else as UTF-8, else in the encoding chardet detects, the
labels read as browsers read them; for the CLI and Spark alike."""

import codecs
import re

import chardet

from .streams import DECOMPRESSORS, open_input

UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
BINARY_SAMPLE = 1 << 16
CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
PRESCAN = 1024  # the bytes of a page searched for its <meta> charset, as browsers do
# labels that mean another encoding on the web (the WHATWG Encoding Standard)
WEB_ENCODINGS = {"iso8859-1": "cp1252", "ascii": "cp1252", "gb2312": "gb18030",
                 "gbk": "gb18030"}
LEAST_CONFIDENCE = 0.02  # chardet's for noise is below (a page in Latin-1 is 0.05 or more)


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


class Skipped:
    """An input left out, and why (counted and noted, not an error);
    ``routine``: an archive's record that is not a page (a request, an
    image), counted only."""

    def __init__(self, why, routine=False):
        self.why = why
        self.routine = routine
