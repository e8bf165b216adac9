"""Text to 64-bit simhash fingerprints, and the simhash-py compatible helpers.

The default recipe of :func:`fingerprint` (named by :data:`RECIPE`):

1. normalise: bytes are decoded as UTF-8 (invalid bytes replaced), then
   Unicode NFKC and case folding (with ``html=True``, markup, scripts and
   styles are stripped first);
2. tokenise: each character but white space is a token (``unit="chars"``);
   with ``unit="words"``, runs of letters and digits are words and each CJK
   character (Han, Hiragana, Katakana, Hangul) is a token of its own;
3. cap runs: a token that repeats the 3 before it is dropped (``max_run``),
   so rules, underlines and padding (``-----``, ``=====``) weigh no more
   than three characters of text;
4. shingle: from each position, the next 2, 3 and 4 tokens are three
   features (``window=(2, 3, 4)``), each occurrence counted; from a CJK
   character, the next 1 and 2 (``cjk_window=(1, 2)``): a CJK character
   carries about what a Latin-script pair of letters does; a text too short
   for any shingle is one feature;
5. hash each feature to 64 bits (a fast native hash) and :func:`compute` the
   simhash. A text with no token gives 0.

The defaults were chosen by measurement (``tools/eval_quality.py``; README).
Steps 2 to 5 run natively, with no Python object per token.
"""

import hashlib
import html.parser
import struct
import unicodedata

from . import _ext
from .errors import InvalidArgumentError

DEFAULT_WINDOW = (2, 3, 4)
DEFAULT_CJK_WINDOW = (1, 2)
DEFAULT_MAX_RUN = 3
MAX_WINDOW = 32
DEFAULT_UNIT = "chars"
UNITS = ("chars", "words")
RECIPE = "simhashdb-2/nfkc-casefold/chars/runs-3/shingles-2-3-4/cjk-shingles-1-2/counts/fast-hash"
RECIPES = {  # name -> the fingerprint() options that make it; older ones stay usable
    "simhashdb-1/nfkc-casefold/chars/window-3/cjk-window-2/counts/fast-hash": {
        "window": 3, "cjk_window": 2, "max_run": None},
    RECIPE: {"window": DEFAULT_WINDOW, "cjk_window": DEFAULT_CJK_WINDOW,
             "max_run": DEFAULT_MAX_RUN},
}


def unsigned_hash(data):
    """The first 8 bytes of ``data``'s MD5 as a big-endian int (as simhash-py)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("unsigned_hash expects bytes, got %s" % type(data).__name__)
    return struct.unpack(">Q", hashlib.md5(data).digest()[:8])[0]


def shingle(tokens, window=4):
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


def normalize(text):
    """NFKC-normalised, case-folded str of ``text`` (str, or UTF-8 bytes)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        raise InvalidArgumentError("expected text as str or bytes, got %s" % type(text).__name__)
    return unicodedata.normalize("NFKC", text).casefold()


def tokenize(text, unit="words"):
    """The native tokens of ``text`` (normalise it first). ``unit="words"``:
    words, and single CJK characters (punctuation, symbols, spaces and ``_``
    separate words); ``unit="chars"``: every character but white space."""
    return _ext.tokens_utf8(text.encode("utf-8", "surrogatepass"), _check_unit(unit) == "chars")


def html_to_text(markup):
    """The text of an HTML document: tags, comments, scripts and styles dropped,
    character references decoded, block elements separated by spaces."""
    if isinstance(markup, (bytes, bytearray, memoryview)):
        markup = bytes(markup).decode("utf-8", errors="replace")
    elif not isinstance(markup, str):
        raise InvalidArgumentError("expected HTML as str or bytes, got %s"
                                   % type(markup).__name__)
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    return " ".join(parser.parts)


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


def fingerprint(text, window=DEFAULT_WINDOW, unit=DEFAULT_UNIT, tokenizer=None, hasher=None,
                html=False, cjk_window=DEFAULT_CJK_WINDOW, max_run=DEFAULT_MAX_RUN):
    """64-bit simhash fingerprint of a document (see the module docstring).

    :param text: the document, str or UTF-8 bytes.
    :param window: tokens per shingle, an int, or several ints for one shingle
        of each length from each position (default: (2, 3, 4)).
    :param str unit: ``"chars"`` or ``"words"``, the native tokens (default: "chars").
    :param tokenizer: callable from normalised str to a list of str tokens,
        instead of ``unit`` (default: None).
    :param hasher: callable from bytes to a 64-bit int, applied to each shingle's
        tokens joined by one space (default: None, the native fast hash).
        ``unit="words", window=4, hasher=unsigned_hash`` is simhash-py's recipe.
    :param bool html: strip HTML markup, scripts and styles first (default: False).
    :param cjk_window: as ``window``, for shingles that start with a CJK
        character (default: (1, 2); None: as ``window``). Not used with ``hasher``.
    :param max_run: drop each token that repeats the ``max_run`` tokens before
        it (default: 3; None: keep every token). Not used with ``hasher``.
    :raises InvalidArgumentError: for text that is neither str nor bytes, a
        window not an int from 1 to 32 (or a sequence of them), a bad
        ``max_run`` or an unknown unit.
    """
    lengths = _shingle_lengths(window)
    cjk_lengths = lengths if cjk_window is None else _shingle_lengths(cjk_window)
    chars = _check_unit(unit) == "chars"
    run_cap = _check_max_run(max_run)
    normalized = normalize(html_to_text(text) if html else text)
    if tokenizer is None and hasher is None:
        return _ext.fingerprint_utf8(normalized.encode("utf-8", "surrogatepass"),
                                     _mask(lengths), chars, _mask(cjk_lengths), run_cap)
    tokens = tokenizer(normalized) if tokenizer else tokenize(normalized, unit)
    if hasher is None:
        return _ext.fingerprint_tokens([t.encode("utf-8", "surrogatepass") for t in tokens],
                                       _mask(lengths), _mask(cjk_lengths), run_cap)
    shingles = [s for length in lengths for s in shingle(tokens, length)] or [tokens]
    return _ext.compute(hasher(" ".join(s).encode("utf-8")) for s in shingles if s)


def fingerprint_many(texts, **options):
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
