"""Text to 64-bit simhash fingerprints, and the simhash-py compatible helpers.

The default recipe of :func:`fingerprint` (named by :data:`RECIPE`, recipe 3):

1. normalise: bytes are decoded as UTF-8 (invalid bytes replaced), then
   Unicode NFKC and case folding (with ``html=True``, markup, scripts and
   styles are stripped first, by one compiled pattern: :func:`strip_html`);
2. tokenise into words: runs of letters and digits, and each CJK character
   (Han, Hiragana, Katakana, Hangul) on its own;
3. weigh each distinct word by the square root of its count times its
   inverse document frequency in a table shipped with the recipe
   (``words-idf.bin``: the 5,000 words found in the most documents of a
   public corpus; ``tools/build_idf.py``): words every document has (``the``,
   ``return``, a site's navigation) weigh little, so unrelated documents of
   one kind sit about 30 bits apart, not 15;
4. hash each word to 64 bits (a fast native hash) and take the weighted
   simhash. A text with no word gives 0.

Recipes 1 and 2 (counted character shingles; ``idf=None`` and the shingle
options) stay available for databases filled with them (:data:`RECIPES`),
with the HTML parser they were made with (:func:`html_to_text`).
The recipes were chosen by measurement (``tools/eval_quality.py``; docs/fingerprints.md).
The case folding (exactly ``str.casefold``'s) and steps 2 to 4 run natively,
in one pass, with no Python object per token.
"""

from __future__ import annotations

import functools
import hashlib
import html
import html.parser
import pathlib
import re
import struct
import sys
import unicodedata
from array import array
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Union

from . import _ext, _text
from .errors import InvalidArgumentError, SimhashDBError

Text = Union[str, bytes, bytearray, memoryview]
Html = Union[bool, Literal["main"]]  # how text is read: plain, HTML, or HTML's main content

DEFAULT_WINDOW = (2, 3, 4)
DEFAULT_CJK_WINDOW = (1, 2)
DEFAULT_MAX_RUN = 3
MAX_WINDOW = 32
SIGNATURE_SIZES = {8: _ext.SIGNATURE_BYTES, 16: _ext.WIDE_SIGNATURE_BYTES}  # bits a bin: bytes
DEFAULT_UNIT = "chars"
UNITS = ("chars", "words")
WORD_WEIGHTS = "words-idf-5000"
# name -> (file in the package, its sha256): a recipe's table never changes
WEIGHT_TABLES = {WORD_WEIGHTS: (
    "words-idf.bin", "8ea83c36ad5e2ab3b58b8125a9864de319e739537f7bbe7f3eaed4d265b39cb0")}
_TABLE_DIR = pathlib.Path(__file__).resolve().parent
RECIPE = "simhashdb-3/nfkc-casefold/words/distinct/sqrt-count-idf-5000/fast-hash"
RECIPES = {  # name -> the fingerprint() options that make it; older ones stay usable
    "simhashdb-1/nfkc-casefold/chars/window-3/cjk-window-2/counts/fast-hash": {
        "idf": None, "window": 3, "cjk_window": 2, "max_run": None},
    "simhashdb-2/nfkc-casefold/chars/runs-3/shingles-2-3-4/cjk-shingles-1-2/counts/fast-hash": {
        "idf": None, "window": DEFAULT_WINDOW, "cjk_window": DEFAULT_CJK_WINDOW,
        "max_run": DEFAULT_MAX_RUN},
    RECIPE: {"idf": WORD_WEIGHTS},
}


def recipe_named(name: str, ours: bool = False) -> str:
    """The recipe ``name`` names: one of simhashdb's, in full or by its first
    part ("simhashdb-3"), else ``name`` itself, a recipe of the caller's own.
    A short name of simhashdb's that this version does not know is refused,
    and with ``ours``, any name but one of simhashdb's."""
    named = [full for full in RECIPES if name in (full, full.split("/")[0])]
    if len(named) == 1:
        return named[0]
    if ours or name.startswith("simhashdb-") and "/" not in name:
        raise InvalidArgumentError(
            "%r is not one of simhashdb's recipes (%s, or their full names)%s"
            % (name, ", ".join(sorted(full.split("/")[0] for full in RECIPES)),
               "" if ours else "; a recipe of your own needs a name that does not start "
                               "with 'simhashdb-'"))
    return name


class _Default:
    def __repr__(self):
        return "default"


_DEFAULT = _Default()  # an option not given


def unsigned_hash(data: Union[bytes, bytearray, memoryview]) -> int:
    """The first 8 bytes of ``data``'s MD5 as a big-endian int (as simhash-py)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("unsigned_hash expects bytes, got %s" % type(data).__name__)
    return struct.unpack(">Q", hashlib.md5(data).digest()[:8])[0]


def shingle(tokens: Iterable[Any], window: int = 4) -> Iterator[list[Any]]:
    """Yield each run of ``window`` consecutive tokens as a list (as simhash-py);
    yields nothing when there are fewer tokens than ``window``."""
    window = _check_window(window)
    current = []
    for token in tokens:
        current.append(token)
        if len(current) > window:
            del current[0]
        if len(current) == window:
            yield list(current)


def normalize(text: Text) -> str:
    """NFKC-normalised, case-folded str of ``text`` (str, or UTF-8 bytes)."""
    return _nfkc(text).casefold()


def _nfkc(text):
    """NFKC-normalised str of ``text`` (str, or UTF-8 bytes): the first half
    of :func:`normalize`, whose case folding the native recipe 3 does itself."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        raise InvalidArgumentError("expected text as str or bytes, got %s" % type(text).__name__)
    if unicodedata.is_normalized("NFKC", text):  # the quick check is ~20x faster
        return text
    # a line break is never changed nor combined, so each line is normalised on its own
    return "\n".join(line if unicodedata.is_normalized("NFKC", line)
                     else unicodedata.normalize("NFKC", line) for line in text.split("\n"))


def tokenize(text: str, unit: str = "words") -> list[str]:
    """The native tokens of ``text`` (normalise it first). ``unit="words"``:
    words, and single CJK characters (punctuation, symbols, spaces and ``_``
    separate words); ``unit="chars"``: every character but white space."""
    if not isinstance(text, str):
        raise InvalidArgumentError("tokenize expects normalised text, a str (normalize() makes "
                                   "one of bytes), got %s" % type(text).__name__)
    return _text.tokens_utf8(text.encode("utf-8", "surrogatepass"), _check_unit(unit) == "chars")


def html_to_text(markup: Text) -> str:
    """The text of an HTML document: tags, comments, scripts and styles dropped,
    character references decoded, block elements separated by spaces."""
    markup = _as_markup(markup)
    parser = _TextExtractor()
    try:
        parser.feed(markup)
        parser.close()
    except AssertionError as exc:  # html.parser asserts on some malformed declarations
        raise InvalidArgumentError("the HTML cannot be read (%s); recipe 3 (the default) "
                                   "reads any markup" % (exc or "malformed markup")) from None
    return " ".join(parser.parts)


def _as_markup(markup):
    """``markup`` as a str (UTF-8 bytes decoded, invalid bytes replaced)."""
    if isinstance(markup, (bytes, bytearray, memoryview)):
        return bytes(markup).decode("utf-8", errors="replace")
    if not isinstance(markup, str):
        raise InvalidArgumentError("expected HTML as str or bytes, got %s"
                                   % type(markup).__name__)
    return markup


def strip_html(markup: Text) -> str:
    """The text of an HTML document, as recipe 3 reads it: comments, CDATA
    sections, script, style, template and noscript elements and tags each
    become one space; character references are decoded as :func:`html.unescape`.
    Markup left open (a tag, a quoted value, a comment) runs to the end of the
    document, and ``</script foo>`` ends a script, as in browsers; one native
    pass, linear in the document's length.

    It gives the words of :func:`html_to_text` ten times faster, but for those
    two cases, where html.parser shows some of the markup as text
    (tests/test_html.py)."""
    markup = _as_markup(markup)
    text = _text.strip_markup(markup.encode("utf-8", "surrogatepass")).decode(
        "utf-8", "surrogatepass")
    return unescape(text) if "&" in text else text


# a character reference as html.unescape reads one: a number, or up to 32
# characters of a name, each with or without its ";"
_REFERENCE = re.compile(r"(&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?))")
_unescaped = functools.lru_cache(maxsize=4096)(html.unescape)


def unescape(text: str) -> str:
    """:func:`html.unescape`, each distinct reference decoded once: the text
    is split at its references, which are decoded through a cache (its
    regular expression's call a reference took two thirds of fingerprinting
    escaped source code and HTML manuals)."""
    parts = _REFERENCE.split(text)
    parts[1::2] = map(_unescaped, parts[1::2])
    return "".join(parts)


_ROLE = r"<([a-z][a-z0-9-]*)\s[^<>]*\brole\s*=\s*[\"']?(?:%s)\b[^<>]*>"
_MAIN = re.compile(r"<(main)(?=[\s/>])[^<>]*>|" + _ROLE % "main", re.I)
_LEFT_OUT = re.compile(r"<(nav|header|footer|aside)(?=[\s/>])[^<>]*>|"
                       + _ROLE % "navigation|banner|contentinfo|complementary", re.I)


def main_content(markup: Text) -> str:
    """The markup of an HTML document's main content (``html="main"``): inside
    its first ``main`` element (or element of role ``main``) where it has
    one, without its ``nav``, ``header``, ``footer`` and ``aside`` elements
    and the elements of their roles (menus, banners, sidebars), found by
    their tags; an element left open loses its tag only."""
    markup = _as_markup(markup)
    start, stop = 0, len(markup)
    main = _MAIN.search(markup)
    if main:
        start = main.end()
        stop = _closing_tag(markup, main.group(1) or main.group(2), start, stop)[0]
    kept, position = [], start
    while found := _LEFT_OUT.search(markup, position, stop):
        kept.append(markup[position:found.start()])
        position = _closing_tag(markup, found.group(1) or found.group(2), found.end(), stop)[1]
    kept.append(markup[position:stop])
    return "".join(kept)


def _closing_tag(markup, name, position, stop):
    """(start, end) of the tag that closes the element ``name`` opened just
    before ``position``; (stop, position) when it is left open."""
    depth = 1
    for tag in _tag_of(name.lower()).finditer(markup, position, stop):
        depth += -1 if tag.group(1) else 1
        if not depth:
            return tag.start(), tag.end()
    return stop, position


@functools.lru_cache(maxsize=64)
def _tag_of(name):
    return re.compile(r"<(/?)%s(?=[\s/>])[^<>]*>" % re.escape(name), re.I)


class _TextExtractor(html.parser.HTMLParser):
    _SKIPPED = {"script", "style", "template", "noscript"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self._skipping = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self._SKIPPED:
            self._skipping += 1

    def handle_endtag(self, tag):
        if tag in self._SKIPPED and self._skipping:
            self._skipping -= 1

    def handle_data(self, data):
        if not self._skipping:
            self.parts.append(data)


def fingerprint(text: Text, window: Any = _DEFAULT, unit: Any = _DEFAULT,
                tokenizer: Optional[Callable[[str], list[str]]] = None,
                hasher: Optional[Callable[[bytes], int]] = None, html: Html = False,
                cjk_window: Any = _DEFAULT, max_run: Any = _DEFAULT, idf: Any = _DEFAULT) -> int:
    """64-bit simhash fingerprint of a document (see the module docstring).

    By default, the distinct words weighted by ``idf``; the shingle options
    (``window``, ``unit``, ``tokenizer``, ``hasher``, ``cjk_window``,
    ``max_run``) or ``idf=None`` select counted shingles instead (recipes 1
    and 2), with recipe 2's options where not given.

    :param text: the document, str or UTF-8 bytes.
    :param html: strip HTML markup, scripts and styles first; ``"main"``: and
        read the main content only (:func:`main_content`) (default: False).
    :param idf: the name of a word weight table (default: ``WORD_WEIGHTS``),
        or None for counted shingles.
    :param window: tokens per shingle, an int, or several ints for one shingle
        of each length from each position (default: (2, 3, 4)).
    :param str unit: ``"chars"`` or ``"words"``, the native tokens (default: "chars").
    :param tokenizer: callable from normalised str to a list of str tokens,
        instead of ``unit`` (default: None).
    :param hasher: callable from bytes to a 64-bit int, applied to each shingle's
        tokens joined by one space (default: None, the native fast hash).
        ``unit="words", window=4, hasher=unsigned_hash`` is simhash-py's recipe.
    :param cjk_window: as ``window``, for shingles that start with a CJK
        character (default: (1, 2); None: as ``window``). Not used with ``hasher``.
    :param max_run: drop each token that repeats the ``max_run`` tokens before
        it (default: 3; None: keep every token). Not used with ``hasher``.
    :raises InvalidArgumentError: for text that is neither str nor bytes, a
        window not an int from 1 to 32 (or a sequence of them), a bad
        ``max_run``, an unknown unit or table, or a table with shingle options.
    """
    extract, method = _method(window, unit, tokenizer, hasher, cjk_window, max_run, idf)
    return method(_read(text, html, extract))[0]


def fingerprint_with_signature(text: Text, html: Html = False, signature_bits: int = 8,
                               **options: Any) -> tuple[int, bytes]:
    """(:func:`fingerprint`, :func:`resemblance` signature) of one text,
    normalised once; ``options`` as for fingerprint.

    The signature is a one-permutation MinHash of the text's word
    5-shingles, whatever the options: 128 bins of ``signature_bits`` (8: 128
    bytes, the default; 16: 256 bytes, the form of databases made before
    simhashdb 0.15, which keep it)."""
    if isinstance(signature_bits, bool) or not isinstance(signature_bits, int) or \
            signature_bits not in SIGNATURE_SIZES:
        raise InvalidArgumentError("signature_bits must be 8 or 16, got %s"
                                   % _ext.shown(signature_bits))
    extract, method = _method(**options)
    fp, signature = method(_read(text, html, extract), True)
    return fp, _ext.narrow(signature) if signature_bits == 8 else signature


def _read(text, html, extract):
    """The NFKC-normalised text of ``text``, its markup read by ``extract``
    when ``html`` (True, or "main": its main content only)."""
    if isinstance(html, str) and html != "main":
        raise InvalidArgumentError('html must be True, False or "main", got %r' % html)
    if html == "main":
        text = main_content(text)
    return _nfkc(extract(text) if html else text)


def resemblance(signature_a: bytes, signature_b: bytes) -> float:
    """The estimated word 5-shingle Jaccard similarity of two texts, from
    their signatures (:func:`fingerprint_with_signature`): 1.0 for copies,
    about 0.6 with 1 word in 20 edited, 0.4 with 1 in 10, under 0.3 for
    unrelated texts. A signature of 16-bit bins is narrowed to meet one of 8."""
    return _ext.resemblance(signature_a, signature_b)


def _method(window=_DEFAULT, unit=_DEFAULT, tokenizer=None, hasher=None, cjk_window=_DEFAULT,
            max_run=_DEFAULT, idf=_DEFAULT):
    """(the function from HTML to text, the function from NFKC-normalised
    text and ``signature=False`` to (fingerprint, signature or None)) that
    the options name."""
    shingle_options = [name for name, value in (
        ("window", window), ("unit", unit), ("tokenizer", tokenizer), ("hasher", hasher),
        ("cjk_window", cjk_window), ("max_run", max_run)) if value not in (_DEFAULT, None)
        or (value is None and name in ("cjk_window", "max_run"))]
    if idf is _DEFAULT:
        idf = None if shingle_options else WORD_WEIGHTS
    if idf is not None:
        if shingle_options:
            raise InvalidArgumentError("%s shape counted shingles, not weighted words: pass "
                                       "idf=None with them" % ", ".join(shingle_options))
        if not isinstance(idf, str) or idf not in WEIGHT_TABLES:
            raise InvalidArgumentError("unknown word weight table %r; known: %s"
                                       % (idf, ", ".join(sorted(WEIGHT_TABLES))))
        hashes, weights, absent = _word_weights(idf)
        starts = _table_starts(idf)
        return strip_html, lambda nfkc, signature=False: _text.casefold_fingerprint(
            nfkc, hashes, weights, starts, absent, signature)
    lengths = _shingle_lengths(DEFAULT_WINDOW if window is _DEFAULT else window)
    cjk_window = DEFAULT_CJK_WINDOW if cjk_window is _DEFAULT else cjk_window
    cjk_lengths = lengths if cjk_window is None else _shingle_lengths(cjk_window)
    unit = _check_unit(DEFAULT_UNIT if unit is _DEFAULT else unit)
    run_cap = _check_max_run(DEFAULT_MAX_RUN if max_run is _DEFAULT else max_run)

    def counted_shingles(normalized):  # recipes 1 and 2
        if tokenizer is None and hasher is None:
            return _text.fingerprint_utf8(normalized.encode("utf-8", "surrogatepass"),
                                         _mask(lengths), unit == "chars", _mask(cjk_lengths),
                                         run_cap)
        tokens = tokenizer(normalized) if tokenizer else tokenize(normalized, unit)
        if hasher is None:
            return _text.fingerprint_tokens([t.encode("utf-8", "surrogatepass") for t in tokens],
                                           _mask(lengths), _mask(cjk_lengths), run_cap)
        shingles = [s for length in lengths for s in shingle(tokens, length)] or [tokens]
        return _text.compute(hasher(" ".join(s).encode("utf-8")) for s in shingles if s)

    def shingles_and_signature(nfkc, signature=False):
        normalized = nfkc.casefold()
        return counted_shingles(normalized), (_text.word_minhash(
            normalized.encode("utf-8", "surrogatepass")) if signature else None)
    return html_to_text, shingles_and_signature


@functools.lru_cache(maxsize=None)
def _word_weights(name):
    """(sorted word hashes, weights, weight of an absent word) of a shipped table."""
    filename, digest = WEIGHT_TABLES[name]
    data = (_TABLE_DIR / filename).read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise SimhashDBError("%s is damaged (its checksum differs): reinstall simhashdb"
                             % filename)
    count, absent = struct.unpack_from("<IB", data, 8)
    hashes = array("Q", data[16:16 + 8 * count])
    if sys.byteorder == "big":
        hashes.byteswap()
    return hashes, array("B", data[16 + 8 * count:]), absent


@functools.lru_cache(maxsize=None)
def _table_starts(name):
    return _text.table_starts(_word_weights(name)[0])


def fingerprint_many(texts: Iterable[Text], **options: Any) -> list[int]:
    """:func:`fingerprint` of each text, as a list; ``options`` as for fingerprint."""
    return [fingerprint(text, **options) for text in texts]


def _check_unit(unit):
    if unit not in UNITS:
        raise InvalidArgumentError("unit must be one of %s, got %s" % (UNITS, _ext.shown(unit)))
    return unit


def _check_window(window):
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise InvalidArgumentError("window must be an int from 1 to %d, got %s"
                                   % (MAX_WINDOW, _ext.shown(window)))
    return window


def _shingle_lengths(window):
    """The shingle lengths ``window`` names (an int or a sequence of ints), sorted."""
    if isinstance(window, int):
        return (_check_window(window),)
    try:
        lengths = tuple(sorted({_check_window(length) for length in window}))
    except TypeError:
        lengths = ()
    if not lengths:
        raise InvalidArgumentError("window must be an int from 1 to %d or a sequence of them, "
                                   "got %s" % (MAX_WINDOW, _ext.shown(window)))
    return lengths


def _check_max_run(max_run):
    """``max_run`` for the native code, where 0 keeps every token."""
    if max_run is None:
        return 0
    if not isinstance(max_run, int) or isinstance(max_run, bool) or max_run < 1:
        raise InvalidArgumentError("max_run must be an int >= 1 or None, got %s"
                                   % _ext.shown(max_run))
    return max_run


def _mask(lengths):
    return sum(1 << length for length in lengths)
