"""Text to 64-bit simhash fingerprints, and the simhash-py compatible helpers.

The default recipe of :func:`fingerprint`:

1. normalise: bytes are decoded as UTF-8 (invalid bytes replaced), then
   Unicode NFKC and case folding;
2. tokenise: runs of letters and digits are words; each CJK character
   (Han, Hiragana, Katakana, Hangul) is a token of its own, so Chinese or
   Japanese text without spaces still gives many features;
3. shingle: every run of ``window`` consecutive tokens (default 4) is a
   feature; a text with fewer tokens than ``window`` is one feature;
4. hash each feature to 64 bits (a fast native hash by default) and
   :func:`compute` the simhash. A text with no token gives 0.
"""

import hashlib
import re
import struct
import unicodedata

from . import _ext
from .errors import InvalidArgumentError

DEFAULT_WINDOW = 4

_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han
    "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"  # Hangul
)
TOKEN_PATTERN = re.compile(r"[%s]|[^\W_%s]+" % (_CJK, _CJK))


def unsigned_hash(data):
    """The first 8 bytes of ``data``'s MD5 as a big-endian int (as simhash-py)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("unsigned_hash expects bytes, got %s" % type(data).__name__)
    return struct.unpack(">Q", hashlib.md5(data).digest()[:8])[0]


def shingle(tokens, window=DEFAULT_WINDOW):
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


def tokenize(text):
    """The default tokens of normalised ``text``: words, and single CJK characters."""
    return TOKEN_PATTERN.findall(text)


def fingerprint(text, window=DEFAULT_WINDOW, tokenizer=tokenize, hasher=None):
    """64-bit simhash fingerprint of a document (see the module docstring).

    :param text: the document, str or UTF-8 bytes.
    :param int window: tokens per shingle (default: 4).
    :param tokenizer: callable from normalised str to a list of str tokens
        (default: :func:`tokenize`).
    :param hasher: callable from bytes to a 64-bit int, applied to each shingle's
        tokens joined by one space (default: None, the native fast hash).
        ``hasher=unsigned_hash`` gives simhash-py's recipe.
    :raises InvalidArgumentError: for text that is neither str nor bytes, or a
        window below 1.
    """
    window = _check_window(window)
    tokens = tokenizer(normalize(text))
    if hasher is None:
        return _ext.fingerprint_tokens([t.encode("utf-8") for t in tokens], window)
    if 0 < len(tokens) < window:
        window = len(tokens)
    return _ext.compute(hasher(" ".join(s).encode("utf-8")) for s in shingle(tokens, window))


def _check_window(window):
    if not isinstance(window, int) or window < 1:
        raise InvalidArgumentError("window must be an int >= 1, got %r" % (window,))
    return window
