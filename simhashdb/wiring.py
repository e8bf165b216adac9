"""What the CLI's commands share, wiring their options to library calls: a
database opened as the options say, an input Reader of them, --distance
checked, and the notes of what was skipped or how it was decoded."""

import os
import re

import simhashdb
from simhashdb import inputs
from simhashdb.console import note, say
from simhashdb.errors import CliError, UsageError

DECODED = {"forced": "by --encoding", "bom": "by a byte order mark", "http header":
           "by their HTTP header's charset", "meta": "by their <meta> charset",
           "utf-8": "as UTF-8", "detected": "in a detected encoding"}  # inputs.decode_text's
MANY_TABLES = 100


def _open(path, args, readonly=False, create=False, text=False, recipe=None, like=None,
          lines_recipe=None):
    """Open the database (with ``recipe``, one of that recipe); with ``create``,
    make it if there is none, with the parameters the command line gives, else
    those of ``like`` (an export's header), else the defaults; with ``text``,
    one that text will be fingerprinted for: it keeps a recipe it already has,
    a new or empty one takes the default; with ``lines_recipe`` (of the lines
    `fingerprint` wrote), a new or empty one takes it, one of another recipe
    refuses, and one of no recipe with documents takes them as before. Warns
    when it makes a database of more than MANY_TABLES tables."""
    options = {}
    for name in ("distance", "blocks", "table_distance", "expected_size"):
        if not readonly and getattr(args, "create_" + name, None) is not None:
            options[name] = getattr(args, "create_" + name)
    _bits(options.get("distance"), 63)
    try:
        db = simhashdb.DB(path, readonly=readonly, create=False, recipe=recipe, **options)
    except simhashdb.InvalidArgumentError as exc:
        raise UsageError(in_cli_words(exc)) from None
    except simhashdb.ParameterMismatchError as exc:
        if getattr(exc, "parameter", None) is None:
            raise
        option = exc.parameter.replace("_", "-")
        raise CliError("%s was created with --%s %d, not %d: leave --%s out, or give --%s %d"
                         % (path, option, exc.stored, options[exc.parameter],
                            option, option, exc.stored)) from None
    except simhashdb.DatabaseNotFoundError:
        if not create:
            if os.path.isdir(path) and os.listdir(path):  # init would refuse it
                raise CliError("no database at %s: it is a directory of other files; name a "
                               "database's directory" % path) from None
            raise CliError("no database at %s (create one with: simhashdb-cli init %s)"
                           % (path, path)) from None
        made = {name: (like or {}).get(name) for name in ("distance", "blocks", "table_distance")}
        try:
            db = simhashdb.DB(path, recipe=recipe, **dict(
                {name: value for name, value in made.items() if value is not None}, **options))
        except simhashdb.InvalidArgumentError as exc:
            raise UsageError(in_cli_words(exc)) from None
        if db.tables > MANY_TABLES:
            say("warning", "table distance %d with %d blocks makes %d tables: every "
                "fingerprint is stored in each, so inserts are slow and the file large; a "
                "smaller --table-distance (queries above it are still exact) keeps it small"
                % (db.table_distance, db.blocks, db.tables))
    named = simhashdb.RECIPE if text and db.recipe not in simhashdb.RECIPES else lines_recipe
    if named is not None and db.recipe != named and (text or db.recipe is not None or not len(db)):
        db.close()  # reopened naming it: an empty database takes it, others refuse
        db = simhashdb.DB(path, readonly=readonly, create=False, recipe=named, **options)
    return db


def _reader(args, fingerprint, stdin_key="<stdin>"):
    """The inputs.Reader of the command's options."""
    return inputs.Reader(include=getattr(args, "include", ()) or (),
                         exclude=getattr(args, "exclude", ()) or (),
                         root=getattr(args, "root", None),
                         key_prefix=getattr(args, "key_prefix", None),
                         stdin_key=stdin_key, fingerprint=fingerprint,
                         html=getattr(args, "html", False),
                         encoding=getattr(args, "encoding", None),
                         archive_key=getattr(args, "archive_key", "uri"))


def _of_a_database(args):
    """Whether find-all or clusters is of a database (PATH), not of a file of
    hashes; the options of the one given to the other are a usage error."""
    hashes = [name for name in ("input", "format", "blocks", "duplicates")
              if getattr(args, name, None) is not None and getattr(args, name) is not False]
    if args.path and hashes:
        raise UsageError("--%s is for a file of hashes, and %s names a database: give one or "
                         "the other" % (hashes[0], args.path))
    return bool(args.path)


def in_cli_words(exc):
    """An error about the layout's arguments in the command line's words
    (``table_distance`` is --table-distance)."""
    said = re.sub(r"\b(table_distance|expected_size)\b",
                  lambda name: "--" + name.group(1).replace("_", "-"), str(exc))
    return re.sub(r"^(blocks|distance)\b", r"--\1", said).replace("at most distance (",
                                                                   "at most --distance (")


def _text_rule_option(args):
    """The first option of the text rule given (--threshold, --short-words), or None."""
    return next((name for name, value in (("--threshold", args.threshold),
                                          ("--short-words", args.short_words))
                 if value is not None), None)


def _read_hashes(args):
    if _text_rule_option(args):
        raise UsageError("%s is for the texts of a database (PATH): hashes are paired "
                         "by their distance alone" % _text_rule_option(args))
    if args.blocks is None:
        raise UsageError("without a database PATH, give --blocks (and --distance) for the hashes")
    return inputs.read_hashes(args.input or "-", args.format)


def _fingerprinter(db):
    """Text (HTML or not) to fingerprint by the database's recipe (the default
    if it has none)."""
    options = simhashdb.RECIPES.get(db.recipe, simhashdb.RECIPES[simhashdb.RECIPE])
    return lambda data, html: simhashdb.fingerprint(data, html=html, **options)


def _bits(distance, high):
    """A --distance, refused (a usage error) unless in [0, high]."""
    if distance is not None and not 0 <= distance <= high:
        raise UsageError("--distance takes a number of bits in [0, %d], got %d"
                         % (high, distance))
    return distance


def _skip(args, counts, path, skipped):
    """Count a document left out by why, and note it (but an archive's
    routine records: requests, images...)."""
    counts[skipped.why] = counts.get(skipped.why, 0) + 1
    if not skipped.routine:
        note(args, "skipped %s: %s" % (path, skipped.why))


def _note_decoded(args, reader):
    """Say how documents were decoded, where any was not as UTF-8."""
    if set(reader.decoded) - {"utf-8"}:
        note(args, "decoded %s" % ", ".join("%d %s" % (n, DECODED[how]) for how, n in
                                            sorted(reader.decoded.items())))


def _note_skipped(args, counts):
    if counts:
        note(args, "skipped %d file(s): %s" % (sum(counts.values()), ", ".join(
            "%d %s" % (n, why) for why, n in sorted(counts.items()))))


def _scan_distance(args, db):
    """--distance of find-all or clusters on a database: at most the database's."""
    if args.distance is not None and args.distance > db.distance:
        raise UsageError("--distance %d is above the distance %s was built for, %d: find-all "
                         "and clusters of a database go up to it (query goes beyond)"
                         % (args.distance, args.path, db.distance))
    return _bits(args.distance, db.distance)


def _distance(args):
    return 3 if args.distance is None else args.distance
