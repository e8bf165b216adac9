"""The stored document: how a key and a document are written as bytes, and
read back. Every part of simhashdb that writes or reads a document calls this
module; backends read no more of a value than its leading fingerprint
(:func:`value_fingerprint`).

A key is ``msgpack(key)`` (a str, bytes or int), of at most
:data:`MAX_KEY_SIZE` bytes. A key longer than the
backend's ``max_key_bytes`` encoded is stored under its digest (a msgpack
extension of type 1: the first 20 bytes of its SHA-256), its whole encoding
kept as the value's 5th item. A document value is a msgpack array:

- ``[fingerprint, meta]``: written by simhashdb before 0.2;
- ``[fingerprint, meta, stored_at]``: ``stored_at`` a UNIX time in whole seconds;
- ``[fingerprint, meta, stored_at, signature]``: a text document, with its
  resemblance signature (:func:`simhashdb.fingerprint_with_signature`: 128
  bytes, or 256 in a database made before simhashdb 0.15);
- ``[fingerprint, meta, stored_at, signature or None, key]``: a document of
  a long key.

The fingerprint always leads, as a msgpack unsigned int, so a backend can
index a document without decoding the rest. Plain records (no metadata) are
encoded natively (:mod:`simhashdb._records`), to the same bytes.
"""

import datetime
import hashlib
import math
import sys
import threading
from array import array
from typing import Any, NamedTuple, Optional, Union

import msgpack

from . import _ext, _records
from .errors import (
    DatabaseError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidMetadataError,
)

MAX_KEY_BYTES = 511  # the largest encoded key every backend takes (LMDB's limit)
# The largest key simhashdb stores, encoded: 8 KiB holds any URL a web server
# takes (RFC 9110 asks for at least 8,000 octets; Apache and nginx stop at 8 KiB
# a request line). Past MAX_KEY_BYTES a key lives in its document's value
# (under its digest), so this also bounds a document to a few LMDB pages.
MAX_KEY_SIZE = 8192

class Record(NamedTuple):
    """A stored document: ``stored_at`` is the UNIX time (whole seconds) it was
    stored, or None for one stored by a simhashdb that did not record it."""

    key: Union[str, bytes, int]
    fingerprint: int
    meta: Any = None
    stored_at: Optional[int] = None


_packers = threading.local()
KEPT_PACKER_BYTES = 1 << 20  # a Packer whose buffer grew past this is let go


def _pack(obj):
    """msgpack(obj), by this thread's Packer: making one (as msgpack.packb
    does) costs more than packing a record. The Packer is out of reach while
    it packs, so a call inside (a dict subclass's items()) makes its own."""
    pack = getattr(_packers, "pack", None) or msgpack.Packer().pack
    _packers.pack = None
    packed = pack(obj)
    if len(packed) <= KEPT_PACKER_BYTES:
        _packers.pack = pack
    return packed


def encode_key(key, limit=MAX_KEY_BYTES):
    """``key`` as stored: msgpack(key), or its digest where that is longer
    than ``limit`` (see :func:`long_key`).

    A key is looked up (read, removed) whatever its size, so that one stored
    before MAX_KEY_SIZE bounded them stays reachable; writes refuse longer ones.

    :raises InvalidKeyError: not a str, bytes or int.
    """
    encoded = _whole_key(key, bounded=False)
    return _digest(encoded) if len(encoded) > limit else encoded


def _whole_key(key, bounded=True):
    """msgpack(key), checked (``bounded``: at most MAX_KEY_SIZE bytes)."""
    if not isinstance(key, (str, bytes, int)) or isinstance(key, bool):
        raise InvalidKeyError("keys must be str, bytes or int, got %s %s%s"
                              % (type(key).__name__, _ext.shown(key),
                                 " (int(key) makes it one)" if hasattr(key, "__index__")
                                 and not isinstance(key, bool) else ""))
    try:
        encoded = _pack(key)
    except OverflowError:
        raise InvalidKeyError("int keys must be in [-2**63, 2**64), got %s"
                              % _ext.shown(key)) from None
    except UnicodeEncodeError:
        raise InvalidKeyError("str key %s is not valid Unicode (a lone surrogate?): keys must "
                              "encode as UTF-8" % _ext.shown(key)) from None
    if bounded and len(encoded) > MAX_KEY_SIZE:
        raise InvalidKeyError("key %s takes %d bytes; keys take at most %d (MAX_KEY_SIZE): "
                              "key the document by a digest of it and keep the whole in its "
                              "metadata" % (_ext.shown(key), len(encoded), MAX_KEY_SIZE))
    return encoded


def _digest(encoded):
    """The stored form of a long key's encoding: ExtType(1, its SHA-256's first 20 bytes)."""
    return b"\xc7\x14\x01" + hashlib.sha256(encoded).digest()[:20]


def is_digest(key_bytes):
    """Whether a stored key is a long key's digest (the key is in its value)."""
    return key_bytes[:3] == b"\xc7\x14\x01" and len(key_bytes) == 23


def encode_documents(records, limit, now):
    """(encoded key, fingerprint, value) of each ``(key, fingerprint)``, ``(key,
    fingerprint, meta)`` or ``(key, fingerprint, meta, stored_at)`` record,
    stored ``now`` unless it says when (natively where every record is plain).

    :raises InvalidKeyError, InvalidFingerprintError, InvalidMetadataError,
        InvalidArgumentError: for the first bad record.
    """
    plain = _records.encode_plain_documents(records, limit, now) \
        if isinstance(records, list) else None
    if plain is not None:
        return plain
    encoded = []
    for record in records:
        if not isinstance(record, (tuple, list)) or len(record) not in (2, 3, 4):
            raise InvalidArgumentError(
                "expected a (key, fingerprint), (key, fingerprint, meta) or (key, fingerprint, "
                "meta, stored_at) record, got %s" % _ext.shown(record))
        whole, fp = _whole_key(record[0]), _ext.check_fingerprint(record[1])
        meta = record[2] if len(record) > 2 else None
        stored_at = _whole_seconds(record[3]) if len(record) > 3 and record[3] is not None \
            else now
        key = whole if len(whole) <= limit else _digest(whole)
        try:
            value = _pack([fp, meta, stored_at] + ([None, whole] if key is not whole else []))
            msgpack.unpackb(value, raw=False, strict_map_key=False)  # it must read back
        except (TypeError, ValueError, OverflowError, RecursionError,
                msgpack.UnpackException) as exc:
            raise InvalidMetadataError(
                "metadata of key %s cannot be stored: %s (use values that msgpack writes and "
                "reads back: None, bool, int, float, str, bytes, lists, and dicts whose keys "
                "are not lists or tuples)" % (_ext.shown(record[0]), exc)) from None
        encoded.append((key, fp, value))
    return encoded


_INT_FORMATS = frozenset("bBhHiIlLqQnN")
_NATIVE_ORDER = ("@", "=", "<" if sys.byteorder == "little" else ">")


def int_arrays(keys, fingerprints):
    """``keys``, a 1-d buffer of ints in [0, 2**64) (numpy, array.array) or an
    iterable of them, and ``fingerprints``, a uint64 buffer or an iterable of
    ints, checked: (their length, ``encode``), where ``encode(start, stop,
    now)`` gives the documents :func:`encode_documents` makes of the records
    ``start`` to ``stop`` of ``zip(keys, fingerprints)`` stored ``now``.

    :raises InvalidKeyError, InvalidFingerprintError, InvalidArgumentError:
        for a bad key, fingerprint, or arrays of different lengths.
    """
    fps = _ext.as_fingerprints(fingerprints)
    view = _key_buffer(keys)
    if len(view) != len(fps):
        raise InvalidArgumentError("keys and fingerprints must have the same length, got %d "
                                   "keys and %d fingerprints" % (len(view), len(fps)))
    raw, width, signed = view.cast("B"), view.itemsize, view.format[-1].islower()
    i = _records.first_negative(raw, width, signed)
    if i >= 0:
        raise InvalidKeyError("keys of an array must be ints in [0, 2**64), got %d at index %d"
                              % (int.from_bytes(raw[i * width:(i + 1) * width], sys.byteorder,
                                                signed=True), i))
    return len(fps), lambda start, stop, now: _records.encode_int_documents(
        raw, width, signed, fps, start, stop, now)


def _key_buffer(keys):
    """``keys`` as a C-contiguous 1-d memoryview of native ints."""
    if isinstance(keys, (str, bytes)):
        raise InvalidKeyError("expected keys as an array of ints, got %s" % _ext.shown(keys))
    try:
        view = memoryview(keys)
    except TypeError:
        return _key_list(keys)
    form = view.format[1:] if view.format[:1] in _NATIVE_ORDER else view.format
    if form not in _INT_FORMATS or view.ndim != 1:
        raise InvalidKeyError("expected keys as a 1-d array of ints (numpy or array.array), "
                              "got format %r with %d dimension(s)" % (view.format, view.ndim))
    if not view.c_contiguous:
        raise InvalidKeyError("expected a contiguous array of keys")
    return view


def _key_list(keys):
    """An iterable of int keys as a uint64 memoryview, checked."""
    try:
        items = keys if isinstance(keys, (list, tuple)) else list(keys)
    except TypeError:
        raise InvalidKeyError("expected keys as an array of ints, got %s"
                              % _ext.shown(keys)) from None
    try:
        if any(type(key) is bool for key in items):
            raise TypeError
        return memoryview(array("Q", items))
    except (TypeError, OverflowError):
        for i, key in enumerate(items):
            if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < 2**64:
                raise InvalidKeyError("keys of an array must be ints in [0, 2**64), got %s at "
                                      "index %d" % (_ext.shown(key), i)) from None
        raise


def hit_arrays(found):
    """(probe indexes array('q'), keys array('Q'), distances array('B')) of
    the hits of each probe in ``found`` (lists of (stored key, fingerprint,
    distance)), sorted by (probe, distance, key).

    :raises InvalidKeyError: a key is not an int in [0, 2**64).
    """
    try:
        return _records.hit_arrays(found)
    except ValueError as exc:
        key = "a long key" if is_digest(exc.args[0]) else _ext.shown(decode_key(exc.args[0]))
        raise InvalidKeyError("arrays of matches hold keys that are ints in [0, 2**64), and "
                              "the database holds %s: query it without arrays=True" % key) \
            from None


def check_record(record: Any) -> None:
    """Raise the error :meth:`DB.insert_many` would raise for ``record``, if any:
    to find the bad record of a batch before writing it."""
    encode_documents([record], MAX_KEY_BYTES, 0)


def with_signature(value, signature):
    """A document value (as :func:`encode_documents` made it) with a text's
    resemblance signature after its stored time."""
    if value[:1] == b"\x93":
        return b"\x94" + value[1:] + _pack(signature)
    items = unpack(value)  # a long key's: the signature before the key
    items[3] = signature
    return _pack(items)


def damaged(why):
    """The error of a stored record that is not what simhashdb writes (its
    ``why`` says what is wrong, for :meth:`DB.check`)."""
    error = DatabaseError("a stored record is damaged (%s): restore the database from a "
                          "backup, or `export` what is readable" % why)
    error.why = str(why)
    return error


def unpack(data):
    """A stored key or value, decoded.

    :raises DatabaseError: the bytes are not msgpack (a damaged record).
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise damaged(exc) from None


def document_items(value):
    """The items of a document value (see the module's docstring), checked.

    :raises DatabaseError: the value is not one simhashdb writes (damaged).
    """
    items = _records.plain_items(value)
    if items is not None:
        return items
    items = unpack(value)
    n = len(items) if type(items) is list else 0
    if not 2 <= n <= 5:
        raise damaged("a document is not an array of 2 to 5 items")
    if type(items[0]) is not int or not 0 <= items[0] < 2**64:
        raise damaged("a document's fingerprint is not an int in [0, 2**64)")
    if n > 2:
        _stored_time(items[2])
    if n > 3 and (items[3] is not None and type(items[3]) is not bytes
                  or n > 4 and type(items[4]) is not bytes):
        raise damaged("a document's signature or long key is not bytes")
    return items


def decode(key, value):
    """The Record of ``key`` (decoded; a long key's digest is replaced by the
    key its value holds) from its stored value."""
    items = document_items(value)
    if len(items) > 4:
        key = unpack(items[4])
    return Record(key, items[0], items[1], items[2] if len(items) > 2 else None)


def decode_key(key_bytes, value=None):
    """A stored key, decoded; a long key's digest needs its ``value``."""
    if is_digest(key_bytes):
        items = document_items(value)
        if len(items) < 5:
            raise damaged("a document of a long key does not hold the key")
        return unpack(items[4])
    return unpack(key_bytes)


def signature(value):
    """The resemblance signature a document value holds, or None (a document
    stored without one, or of a text with no word to sign)."""
    theirs = _records.signature(value)
    if theirs is None:
        items = document_items(value)
        theirs = items[3] if len(items) > 3 else None
    return theirs if theirs and any(theirs) else None


def stored_at(value):
    """The stored time a document value records, or None."""
    unpacker, count = _after_meta(value)
    return _stored_time(_read(unpacker.unpack)) if count > 2 else None


def _stored_time(when):
    """``when``, a document's stored time as read: None or UNIX seconds."""
    if when is not None and (type(when) is not int or not 0 <= when < 2**64):
        raise damaged("a document's stored time is not UNIX seconds")
    return when


def restamped(value, now):
    """A document value recording that it was stored ``now``, the bytes of its
    fingerprint, meta and signature as they were."""
    unpacker, count = _after_meta(value)
    head = value[1:unpacker.tell()]
    if count > 2:
        _read(unpacker.skip)
    return bytes([0x90 | max(count, 3)]) + head + _pack(now) + value[unpacker.tell():]


def value_fingerprint(value):
    """The fingerprint that leads an encoded document value: a msgpack array
    whose first item is an unsigned int."""
    if value[:1] in (b"\xdc", b"\xdd"):
        value = value[3:] if value[:1] == b"\xdc" else value[5:]
    else:
        value = value[1:]
    tag = value[0] if value else None
    if tag is not None and tag < 0x80:
        return tag
    width = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}.get(tag)
    if width is None or len(value) < 1 + width:
        raise damaged("a document's fingerprint is unreadable")
    return int.from_bytes(value[1:1 + width], "big")


def whole_seconds(when, what):
    """A datetime or a UNIX time (int or float) as whole seconds since the epoch,
    floored (for ``what``, in messages)."""
    if isinstance(when, datetime.datetime):
        try:
            when = when.timestamp()
        except (ValueError, OverflowError) as exc:  # naive, within a day of year 1 or 9999
            raise InvalidArgumentError("%s must be a time in the range of UNIX times, got %s (%s)"
                                       % (what, when, exc)) from None
    elif not (isinstance(when, int) and not isinstance(when, bool)
              or isinstance(when, float) and math.isfinite(when)):
        raise InvalidArgumentError("%s must be a datetime or a UNIX time (int or float), got "
                                   "%s %s" % (what, type(when).__name__, _ext.shown(when)))
    return math.floor(when)


def _whole_seconds(when):
    seconds = whole_seconds(when, "stored_at")
    if not 0 <= seconds < 2**64:
        raise InvalidArgumentError("stored_at must be UNIX seconds in [0, 2**64), a time from "
                                   "1970-01-01 on, got %s" % _ext.shown(when))
    return seconds


def _after_meta(value):
    """An unpacker positioned after a document value's fingerprint and meta,
    and the number of items the value holds."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(value)
    count = _read(unpacker.read_array_header)
    if count < 2:
        raise damaged("a document is not an array of 2 to 5 items")
    _read(unpacker.skip)
    _read(unpacker.skip)
    return unpacker, count


def _read(step):
    """``step()`` of an Unpacker of a stored record; DatabaseError where it is damaged."""
    try:
        return step()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise damaged(exc) from None
