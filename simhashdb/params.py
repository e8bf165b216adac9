"""A database's stored parameters (its format version, layout, recipe and
the width of its texts' signature bins):
checked, packed and stored in this one place, and a database of an earlier
format brought to this one (:func:`simhashdb.upgrade` copies one whose
documents are in an earlier form)."""

from __future__ import annotations

import msgpack

from . import _ext
from .errors import (DatabaseError, FormatVersionError, InvalidArgumentError,
                     ParameterMismatchError)
from .layout import DEFAULT_EXPECTED_SIZE, Layout

# 2: text documents have a band index (0.3); 3: LMDB tables as runs (0.4);
# 4: the LMDB fingerprint index in slots, a union of runs; 5: the LMDB bands as runs;
# 6: a database's distance may exceed its tables' (``table_distance``);
# 7: the LMDB documents as records under ids, a key map and an index of ids;
# 8: the LMDB key map by the key's hash (the key stored once, in its record);
# 9: the LMDB run entries of small writes kept together in `recent` (format 8 reads as it is);
# 10: the texts keep signatures of 8-bit bins (``signature_bits``); a database of 16-bit
#     bins (made before it) reads as it is and stays at 9, which earlier versions write
# 11: the LMDB documents in compressed blocks of records; a database of records one an id
#     (made before it) reads and writes as it is and stays at 9 or 10 until `upgrade`
FORMAT_VERSION = 11
SIGNATURE_BITS = 8  # a new database's signature bins
EARLIER_SIGNATURE_BITS = 16  # those of a database made before format 10
DEFAULT_DISTANCE = 3


LAYOUT_ARGUMENTS = {"distance": (0, 63), "blocks": (1, 64), "expected_size": (1, 2**64),
                    "table_distance": (0, 63)}  # the least and most of each


def check_layout_arguments(**given):
    """Raise unless each of ``given`` (a name of LAYOUT_ARGUMENTS) is None or
    an int within its bounds."""
    for name, value in given.items():
        low, high = LAYOUT_ARGUMENTS[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not low <= value <= high):
            raise InvalidArgumentError("%s must be an int in [%d, %d], got %s"
                                       % (name, low, high, _ext.shown(value)))


def new_layout(distance, blocks, expected_size, table_distance=None):
    """(distance, layout) of a new database of these parameters: its
    distance and the tables' layout (built for ``table_distance``, at most
    the distance; both chosen where not given: :meth:`Layout.choose`);
    raises for one that cannot be."""
    k = DEFAULT_DISTANCE if distance is None else distance
    Layout(k + 1, k)  # validates distance before the choice uses it
    if table_distance is not None and not 0 <= table_distance <= k:
        raise InvalidArgumentError("table_distance must be at most distance (%d), got %d"
                                   % (k, table_distance))
    if blocks is None:
        layout = Layout.choose(k, expected_size or DEFAULT_EXPECTED_SIZE,
                               table_distance=table_distance)
    else:
        d = k if table_distance is None else table_distance
        if not d < blocks <= 64:
            raise InvalidArgumentError("blocks must be more than the distance the tables are "
                                       "built for (%d) and at most 64, got %d" % (d, blocks))
        layout = Layout(blocks, d)
    layout.check_query_distance(k)
    return k, layout


def stored_layout(params):
    """The tables' layout that stored ``params`` give (a database of format 5
    or earlier has tables built for its distance)."""
    return Layout(params["blocks"], params.get("table_distance", params["distance"]))


def read(storage):
    """The parameters ``storage`` holds, checked, or None where it holds none.

    :raises DatabaseError: they are damaged.
    :raises FormatVersionError: a newer simhashdb wrote them.
    """
    with storage.read() as view:
        raw = view.params()
    return None if raw is None else _checked(raw, storage.path)


def _checked(raw, path):
    try:
        params = msgpack.unpackb(raw)
        params["blocks"], params["distance"], params["format"]
    except (ValueError, TypeError, KeyError, msgpack.UnpackException):
        raise DatabaseError("%s has damaged parameters: restore it from a backup" % path) from None
    if params["format"] > FORMAT_VERSION:
        raise FormatVersionError(
            "%s has format version %d; this simhashdb reads up to %d: upgrade simhashdb"
            % (path, params["format"], FORMAT_VERSION))
    if params.setdefault("signature_bits", EARLIER_SIGNATURE_BITS) not in (8, 16):
        raise DatabaseError("%s has damaged parameters: restore it from a backup" % path)
    return params


def written_format(signature_bits, record_blocks):
    """The format a database is kept in: this one where its documents are in
    blocks of records (``record_blocks``: LMDB's, since format 11), else 10,
    or 9 where its signatures have ``signature_bits`` 16 (nothing else of 10
    is new): a Redis database, or an LMDB one made before format 11 until
    ``upgrade``, so that the versions that made them still open them."""
    if record_blocks:
        return FORMAT_VERSION
    return 10 if signature_bits == SIGNATURE_BITS else 9


def store(storage, **changes):
    """Store the parameters ``storage`` holds with ``changes`` made to them."""
    def change(txn):
        params = msgpack.unpackb(txn.params())
        params.update(changes)
        txn.set_params(msgpack.packb(params))

    storage.write(change)


def open_params(storage, distance, blocks, expected_size, recipe, table_distance=None):
    """(distance, layout, recipe, format, signature bits) of the database of ``storage``: its stored
    parameters, or, for a new one, those these arguments make, stored;
    explicit ones checked against the stored, an empty database without a
    recipe given ``recipe``, one of an earlier format brought to this one.

    :raises ParameterMismatchError: explicit parameters or recipe differ from
        the stored ones.
    """
    params = read(storage)
    if params is not None and storage.old_documents:
        raise DatabaseError(
            "%s keeps its documents in the form of simhashdb 0.8 and earlier (format %d), "
            "which this version does not read: convert it once with `simhashdb-cli upgrade %s` "
            "(or simhashdb.upgrade(path))" % (storage.path, params["format"], storage.path))
    if params is None:
        if storage.readonly:
            raise DatabaseError("%s is not a simhashdb database" % storage.path)
        k, layout = new_layout(distance, blocks, expected_size, table_distance)
        storage.open_tables(layout)
        new = msgpack.packb({"format": written_format(SIGNATURE_BITS, storage.record_blocks),
                             "distance": k,
                             "table_distance": layout.distance, "blocks": layout.blocks,
                             "widths": layout.widths, "recipe": recipe,
                             "signature_bits": SIGNATURE_BITS})

        def store_new(txn):  # unless a concurrent creator stored its own first
            existing = txn.params()
            if existing is None:
                txn.set_params(new)
            return existing or new

        params = _checked(storage.write(store_new), storage.path)
    params.setdefault("table_distance", params["distance"])
    for name, given in (("distance", distance), ("blocks", blocks),
                        ("table_distance", table_distance)):
        if given is not None and given != params[name]:
            mismatch = ParameterMismatchError(
                "%s was created with %s=%d, not %r; open it without %s= or with %s=%d"
                % (storage.path, name, params[name], given, name, name, params[name]))
            mismatch.parameter, mismatch.stored = name, params[name]  # (the CLI's words)
            raise mismatch
    layout = stored_layout(params)
    storage.open_tables(layout)
    stored = params.get("recipe")
    if recipe is not None and recipe != stored:
        if stored is not None or _adopt(storage, recipe) != recipe:
            raise ParameterMismatchError(
                "%s holds fingerprints made %s, not with %r: fingerprints of different "
                "recipes cannot be compared; use another database"
                % (storage.path, "with %r" % stored if stored else "by an unnamed "
                   "recipe", recipe))
        stored = recipe
    if params["format"] < written_format(params["signature_bits"], storage.record_blocks):
        _upgrade(storage, params)
    elif not storage.readonly:
        storage.format_stored()
    return params["distance"], layout, stored, params["format"], params["signature_bits"]


def adopt_recipe(storage, recipe):
    """An unnamed database of ``storage`` takes ``recipe`` while empty and writable.

    :raises ParameterMismatchError: it is not.
    """
    held = _adopt(storage, recipe)
    if held != recipe:
        raise ParameterMismatchError(
            "%s holds fingerprints %s, so text cannot be compared with them; use a "
            "database opened with recipe=%r" % (storage.path, "made with %r" % held if held
                                                else "of an unnamed recipe", recipe))
    return recipe


def _adopt(storage, recipe):
    """The recipe of the database of ``storage`` once it took ``recipe`` if it
    had none and was empty, checked and stored in one write transaction (so
    that no other writer stores documents or another recipe in between)."""
    def adopt(txn):
        params = msgpack.unpackb(txn.params())
        if params.get("recipe") is None and not txn.count():
            params["recipe"] = recipe
            txn.set_params(msgpack.packb(params))
        return params.get("recipe")

    return None if storage.readonly else storage.write(adopt)


def _upgrade(storage, params):
    """Store this format in the parameters of a database of an earlier one
    whose form this version reads as it is (a writable open)."""
    if not storage.readonly:
        params["format"] = written_format(params["signature_bits"], storage.record_blocks)
        store(storage, format=params["format"])
        storage.format_stored()


def relayout(storage, blocks, table_distance, expected_size):
    """Build the tables of the database of ``storage`` again in the layout
    these arguments choose for its distance (``expected_size``: by default
    the documents it holds); returns the layout, the same one where nothing
    changed.

    :raises DatabaseError: it holds no database; its backend cannot.
    """
    params = _existing(storage)
    old = stored_layout(params)
    storage.open_tables(old)
    if expected_size is None:
        with storage.read() as view:
            expected_size = max(2, view.count())
    _, layout = new_layout(params["distance"], blocks, expected_size, table_distance)
    if (layout.blocks, layout.distance) != (old.blocks, old.distance):
        _copy_into(storage, params, layout)
    return layout


def convert_documents(storage):
    """Copy the database of ``storage``, whose documents are in an earlier
    form, into this format (its tables in the layout it has, its bands built
    from its texts' signatures), put in its place once whole.

    :raises DatabaseError: it holds no database.
    """
    params = _existing(storage)
    layout = stored_layout(params)
    storage.open_tables(layout)
    _copy_into(storage, params, layout)


def compact(storage, format):
    """Compact the database of ``storage`` (of ``format``); returns its format
    then: an LMDB one whose documents are a record an id is copied into
    blocks, as ``upgrade`` copies it, and takes this format."""
    if not storage.old_records:
        storage.compact()
        return format
    convert_documents(storage)
    return FORMAT_VERSION


def _copy_into(storage, params, layout):
    """Copy the database of ``storage`` (stored ``params``) into this format
    with its tables in ``layout``, put in its place once whole."""
    storage.relayout(layout, msgpack.packb(dict(
        params, format=written_format(params["signature_bits"], True),  # (a copy: in blocks)
        table_distance=layout.distance,
        blocks=layout.blocks, widths=layout.widths)))


def _existing(storage):
    """The parameters ``storage`` holds, which must be a database's."""
    params = read(storage)
    if params is None:
        raise DatabaseError("%s is not a simhashdb database" % storage.path)
    return params
