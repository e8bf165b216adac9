"""Fingerprints one a line (``dec``, ``hex``) and the JSON lines of documents:
parsed and checked, with errors that name the line."""

import base64
import json
import re

from .. import _ext
from ..errors import InputError, SimhashDBError
from .streams import open_input, stdin

DEC = re.compile(r"[0-9]{1,40}")
HEX = re.compile(r"(0[xX])?([0-9a-fA-F]{1,40})")
DEC_BYTES = re.compile(DEC.pattern.encode())
HEX_BYTES = re.compile(HEX.pattern.encode())


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


def _from_json(obj):
    if len(obj) == 1 and isinstance(obj.get("$bytes"), str):
        try:
            return base64.b64decode(obj["$bytes"], validate=True)
        except ValueError:
            raise InputError("bad base64 in {\"$bytes\": ...}") from None
    return obj
