"""simhashdb-cli: the command line over the simhashdb library.

Data goes to stdout as JSON lines; progress (on a terminal) and errors go to
stderr. Exit status: 0 success, 1 an error in the input or the data, 2 a
usage error. ``--debug`` shows the traceback of an error.
"""

import argparse
import base64
import contextlib
import datetime
import decimal
import fnmatch
import json
import os
import re
import sys

from tqdm import tqdm

import simhashdb

DEFAULT_BATCH = 10_000
FORMATS = ("dec", "hex", "jsonl", "text")


class CliError(Exception):
    """An error in the command's input: one line on stderr, exit status 1."""


# Commands


def cmd_init(args):
    """Create a database (or show an existing one's parameters)."""
    with _open(args.path, args) as db:
        _emit(db.stats())


def cmd_import(args):
    """Import records from files, directories or stdin, one transaction per batch."""
    counts = {"imported": 0, "invalid": 0, "near_duplicates": 0}
    formats = {given: _input_format(given, args.format) for given in args.files or ["-"]}
    with _open(args.path, args, text="text" in formats.values()) as db, \
            _progress(args, "import", unit="B") as bar:
        args.fingerprint = _fingerprinter(db, args)
        batch, where = [], []

        def flush():
            if args.if_new:
                for (source, line), record, found in zip(
                        where, batch, db.insert_if_new_many(batch, batch_size=len(batch) or 1)):
                    if found:
                        counts["near_duplicates"] += 1
                        _emit({"skipped": record[0], "source": source, "line": line,
                               "matches": [_match_json(m) for m in found]})
                    else:
                        counts["imported"] += 1
            else:
                counts["imported"] += db.insert_many(batch, batch_size=len(batch) or 1)
            batch.clear()
            where.clear()

        for source, line, record in _records(formats, args, bar):
            try:
                if isinstance(record, Exception):
                    raise record
                if isinstance(record, _TextRecord) and db.recipe not in (None, *simhashdb.RECIPES):
                    raise CliError("this database holds fingerprints made with %r, a recipe "
                                   "this simhashdb cannot fingerprint text with" % (db.recipe,))
                simhashdb.check_record(record)
            except (CliError, simhashdb.SimhashDBError) as exc:
                if not args.skip_invalid:
                    raise CliError("%s:%s: %s (%d records were imported before the batch that "
                                   "held this line; nothing of that batch was written)"
                                   % (source, line, exc, counts["imported"])) from None
                counts["invalid"] += 1
                continue
            batch.append(record)
            where.append((source, line))
            if len(batch) >= args.batch_size:
                flush()
        flush()
    _emit(counts)


def cmd_query(args):
    """Print the stored documents near each fingerprint (arguments, stdin, or --text files)."""
    with _open(args.path, args, readonly=True, text=bool(args.text)) as db:
        if args.text:
            fingerprint = _fingerprinter(db, args)
            probes = [(path, fingerprint(_read_file(path))) for path in args.text]
        else:
            values = args.fingerprints or _stdin_lines()
            probes = [(None, _parse_fingerprint(v, args.format, "argument")) for v in values]
        results = db.query_many([fp for _, fp in probes], args.distance)
        for (path, fp), matches in zip(probes, results):
            out = {"query": fp} if path is None else {"query": path, "fingerprint": fp}
            out["matches"] = [_match_json(m) for m in matches]
            _emit(out)


def cmd_delete(args):
    """Delete documents by key (arguments or stdin lines)."""
    keys = [_parse_key(k, args.str_keys) for k in (args.keys or _stdin_lines())]
    with _open(args.path, args) as db:
        _emit({"deleted": db.delete_many(keys), "requested": len(keys)})


def cmd_get(args):
    """Print one document."""
    with _open(args.path, args, readonly=True) as db:
        record = db.get(_parse_key(args.key, args.str_keys))
    if record is None:
        raise CliError("no document with key %r in %s" % (args.key, args.path))
    _emit(_record_json(record))


def cmd_stats(args):
    """Print counts, parameters and sizes."""
    with _open(args.path, args, readonly=True) as db:
        _emit(db.stats())


def cmd_compact(args):
    """Rewrite the database without the space freed by deletes."""
    with _open(args.path, args) as db:
        before = db.stats()["disk_bytes"]
        db.compact()
        _emit({"disk_bytes_before": before, "disk_bytes_after": db.stats()["disk_bytes"]})


def cmd_check(args):
    """Verify that every table agrees with the documents (exit status 1 if not)."""
    with _open(args.path, args, readonly=True) as db:
        problems = db.check()
    _emit({"problems": problems})
    if problems:
        raise CliError("%d problem(s) found in %s" % (len(problems), args.path))


def cmd_export(args):
    """Print every document as a JSON line that `import --format jsonl` reads back."""
    with _open(args.path, args, readonly=True) as db:
        for record in db:
            _emit(_record_json(record))


def cmd_find_all(args):
    """Every matching pair: of a database's documents, or of a file of decimal hashes."""
    if args.path:
        with _open(args.path, args, readonly=True) as db, _progress(args, "pairs") as bar:
            for key_a, key_b, distance in db.find_all(args.distance):
                _emit([key_a, key_b, distance], args.output_file)
                bar.update()
        return
    hashes = _read_hash_file(args)
    for a, b in simhashdb.find_all(hashes, args.blocks, _distance(args)):
        if a != b or args.duplicates:
            _emit([a, b], args.output_file)


def cmd_clusters(args):
    """Clusters of matching documents (keys), or of a file of decimal hashes."""
    if args.path:
        with _open(args.path, args, readonly=True) as db, _progress(args, "clusters") as bar:
            for cluster in db.clusters(args.distance):
                _emit(cluster, args.output_file)
                bar.update()
        return
    for cluster in simhashdb.find_clusters(_read_hash_file(args), args.blocks, _distance(args)):
        _emit(cluster, args.output_file)


def cmd_fingerprint(args):
    """Print the fingerprint of each text file (or of stdin)."""
    options = simhashdb.RECIPES[args.recipe]
    for path in args.files or ["-"]:
        fp = simhashdb.fingerprint(_read_file(path), html=args.html, **options)
        if args.format == "jsonl":
            _emit({"path": path, "fingerprint": fp, "hex": "%016x" % fp})
        else:
            print(fp if args.format == "dec" else "%016x" % fp)


# Spark and Parquet (the spark extra: pip install 'simhashdb[spark]')


def cmd_spark(args):
    """Pairs, clusters or dedupe of a whole corpus on Spark (simhashdb.spark).

INPUT is Parquet (a .parquet file or a directory of them; --key and
--fingerprint name its columns) or any input `import` reads. OUTPUT ending in
.parquet is written by Spark as Parquet; anything else (or -) gets JSON lines:
[key_a, key_b, distance] for find-all, [key, cluster] for clusters, the kept
rows as objects for dedupe (which `import --format jsonl` reads back)."""
    session, spark, errors = _spark_session(args)
    try:
        df = _spark_input(session, args)
        run = {"find-all": spark.find_all, "clusters": spark.clusters, "dedupe": spark.dedupe}
        result = run[args.action](df, _distance(args), args.blocks, key=args.key,
                                  fingerprint=args.fingerprint)
        if args.target.endswith(".parquet"):
            result.write.parquet(args.target)
            _emit({"output": args.target, "rows": session.read.parquet(args.target).count()})
        else:
            with _output_file(args.target) as out:
                fingerprint = args.fingerprint if args.action == "dedupe" else None
                for row in result.toLocalIterator():
                    _emit(_spark_json(row, fingerprint), out)
    except errors as exc:
        raise CliError("spark: %s" % str(exc).strip().splitlines()[0]) from None


def cmd_export_parquet(args):
    """Write every document to a Parquet file (key, fingerprint as uint64, meta as msgpack)."""
    with _open(args.path, args, readonly=True) as db:
        _emit({"exported": db.export_parquet(args.file)})


def cmd_import_parquet(args):
    """Import the documents of a Parquet file or directory (e.g. `spark dedupe` output)."""
    with _open(args.path, args) as db:
        _emit({"imported": db.import_parquet(args.file, args.key, args.fingerprint)})


def _spark_session(args):
    """The active Spark session or a new one (local workers run this Python),
    the simhashdb.spark module, and the exceptions Spark raises."""
    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession

        from simhashdb import spark
    except ImportError:
        raise CliError("spark needs pyspark and Java 17 or later: pip install "
                       "'simhashdb[spark]'") from None
    local = (args.master or "local").startswith("local")
    if local and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("simhashdb").config(
        "spark.ui.showConsoleProgress", str(not args.quiet and sys.stderr.isatty()).lower())
    session = (builder.master(args.master) if args.master else builder).getOrCreate()
    if not args.debug:
        session.sparkContext.setLogLevel("ERROR")
    return session, spark, (PySparkException, Py4JError)


def _spark_input(session, args):
    """The input as a DataFrame: Parquet read by Spark, other formats parsed here."""
    given = args.input
    if args.format == "parquet" or given.endswith(".parquet") or (
            os.path.isdir(given) and any(n.endswith(".parquet") for n in os.listdir(given))):
        return session.read.parquet(given)
    import pyarrow

    keys, fps = [], []
    reader = argparse.Namespace(**dict(vars(args), include=[], exclude=[], fingerprint=lambda
                                       data: simhashdb.fingerprint(data, html=args.html)))
    with _progress(args, "read", unit="B") as bar:
        for source, line, record in _records({given: _input_format(given, args.format)},
                                             reader, bar):
            if isinstance(record, Exception):
                raise CliError("%s:%s: %s" % (source, line, record))
            keys.append(record[0])
            fps.append(simhashdb.check_fingerprint(record[1]))
    try:
        key_array = pyarrow.array(keys)
    except (pyarrow.ArrowException, OverflowError, TypeError):
        raise CliError("%s: keys must all be strings or all be integers below 2**63" % given) \
            from None
    return session.createDataFrame(pyarrow.table({
        args.key: key_array,
        args.fingerprint: pyarrow.array(fps, pyarrow.uint64()).cast(pyarrow.decimal128(20, 0))}))


def _spark_json(row, fingerprint):
    """A result row as JSON: a list of its values, or (with the name of the
    fingerprint column, for dedupe) an object with the fingerprint unsigned."""
    if fingerprint is None:
        return [_spark_value(v) for v in row]
    out = {name: _spark_value(v) for name, v in row.asDict().items()}
    value = row[fingerprint]
    out[fingerprint] = int.from_bytes(value, "big") if isinstance(value, (bytes, bytearray)) \
        else int(value) & simhashdb._ext.MAX_FINGERPRINT
    return out


def _spark_value(value):
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value


# Reading input


def _input_format(given, fmt):
    """The format of an input: as given, "text" for a directory, else detected."""
    if given != "-" and os.path.isdir(given):
        return "text"
    return fmt or _detect_format(given)


def _records(formats, args, bar):
    """Yield (source, line, record or the error in that line) from the inputs,
    ``formats`` mapping each to its format."""
    for given, fmt in formats.items():
        if given != "-" and os.path.isdir(given):
            for path in _walk(given, args.include, args.exclude):
                yield path, 1, _text_record(path, args, bar)
            continue
        if fmt == "text":
            if given == "-":
                data = sys.stdin.buffer.read()
                bar.update(len(data))
                yield "<stdin>", 1, (args.key_prefix or "-", args.fingerprint(data))
            else:
                yield given, 1, _text_record(given, args, bar)
            continue
        yield from _line_records(given, fmt, args, bar, len(formats) > 1)


def _line_records(given, fmt, args, bar, several):
    source = "<stdin>" if given == "-" else given
    with _open_input(given) as stream:
        for number, raw in enumerate(stream, 1):
            bar.update(len(raw))
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                if fmt == "jsonl":
                    record = _json_record(line, args.fingerprint)
                else:
                    fp = _parse_fingerprint(line, fmt, "line")
                    key = "%s:%d" % (given, number) if several else number
                    record = (key if args.key_prefix is None else
                              "%s%s" % (args.key_prefix, key), fp)
            except (CliError, simhashdb.SimhashDBError) as exc:
                record = exc
            yield source, number, record


def _json_record(line, fingerprint):
    try:
        obj = json.loads(line, object_hook=_from_json)
    except json.JSONDecodeError as exc:
        raise CliError("not JSON: %s" % exc.msg) from None
    if not isinstance(obj, dict) or "key" not in obj:
        raise CliError('expected an object with "key" and "fingerprint" or "text"')
    if "fingerprint" in obj:
        value = obj["fingerprint"]
        fp = _parse_fingerprint(value, None, "fingerprint") if isinstance(value, str) else value
    elif isinstance(obj.get("text"), str):
        return _TextRecord((obj["key"], fingerprint(obj["text"]), obj.get("meta")))
    else:
        raise CliError('expected "fingerprint" (an int) or "text" (a string)')
    return obj["key"], fp, obj.get("meta")


class _TextRecord(tuple):
    """A record whose fingerprint this command made from text."""


def _text_record(path, args, bar):
    data = _read_file(path)
    bar.update(len(data))
    key = path if args.key_prefix is None else args.key_prefix + path
    return key, args.fingerprint(data)


def _walk(root, include, exclude):
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if include and not any(fnmatch.fnmatch(relative, g) or fnmatch.fnmatch(name, g)
                                   for g in include):
                continue
            if any(fnmatch.fnmatch(relative, g) or fnmatch.fnmatch(name, g) for g in exclude):
                continue
            yield path


def _detect_format(given):
    """jsonl for .jsonl files or a first line starting with "{", hex for 0x or
    a-f digits, dec for digits only; any other named file is one text document."""
    if given.endswith(".jsonl"):
        return "jsonl"
    with _open_input(given, peek=True) as stream:
        first = next((line.strip() for line in stream if line.strip()), b"")
    if first.startswith(b"{"):
        return "jsonl"
    if re.fullmatch(rb"\d+", first):
        return "dec"
    if re.fullmatch(rb"(0[xX])?[0-9a-fA-F]+", first):
        return "hex"
    if given == "-":
        raise CliError("cannot tell the format of stdin from its first line %r; pass --format"
                       % first[:40].decode("utf-8", "replace"))
    return "text"


@contextlib.contextmanager
def _open_input(given, peek=False):
    if given == "-":
        stream = sys.stdin.buffer
        if peek:
            yield iter(stream.peek(1 << 16).splitlines() if hasattr(stream, "peek") else ())
        else:
            yield stream
        return
    try:
        with open(given, "rb") as stream:
            yield stream
    except OSError as exc:
        raise CliError("cannot read %s: %s" % (given, exc.strerror)) from None


def _read_file(path):
    with _open_input(path) as stream:
        return stream.read()


def _read_hash_file(args):
    if args.blocks is None:
        raise CliError("without a database PATH, give --blocks (and --distance) for the hashes")
    hashes = []
    with _open_input(args.input) as stream:
        for number, raw in enumerate(stream, 1):
            line = raw.strip()
            if line:
                try:
                    hashes.append(_parse_fingerprint(line.decode("ascii", "replace"), "dec", "line"))
                except simhashdb.SimhashDBError as exc:
                    raise CliError("%s:%d: %s" % (args.input, number, exc)) from None
    return hashes


def _stdin_lines():
    return [line.strip() for line in sys.stdin if line.strip()]


def _parse_fingerprint(text, fmt, what):
    text = text.strip()
    try:
        if fmt == "dec" or (fmt is None and text.isdigit()):
            value = int(text, 10)
        else:
            value = int(text[2:] if text[:2].lower() == "0x" else text, 16)
    except ValueError:
        raise CliError("%s %r is not a %s fingerprint"
                       % (what, text[:40], {"dec": "decimal", "hex": "hex"}.get(fmt, "decimal or "
                                                                                  "hex"))) from None
    return simhashdb.check_fingerprint(value)


def _parse_key(text, as_str):
    return int(text) if not as_str and re.fullmatch(r"-?\d+", text) else text


# Output


def _emit(obj, stream=None):
    (stream or sys.stdout).write(json.dumps(obj, default=_to_json, ensure_ascii=False) + "\n")


def _to_json(value):
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError("cannot write %s as JSON" % type(value).__name__)


def _from_json(obj):
    if len(obj) == 1 and isinstance(obj.get("$bytes"), str):
        try:
            return base64.b64decode(obj["$bytes"], validate=True)
        except ValueError:
            raise CliError("bad base64 in {\"$bytes\": ...}") from None
    return obj


def _match_json(match):
    return {"key": match.key, "fingerprint": match.fingerprint, "distance": match.distance}


def _record_json(record):
    return {"key": record.key, "fingerprint": record.fingerprint, "meta": record.meta}


# Plumbing


def _open(path, args, readonly=False, text=False):
    """Open the database; with ``text``, one that text will be fingerprinted
    for: it keeps a recipe it already has, a new or empty one takes the default."""
    if readonly and not os.path.isdir(path):
        raise CliError("no database at %s (create one with: simhashdb-cli init %s)" % (path, path))
    options = {}
    for name in ("distance", "blocks", "expected_size"):
        if not readonly and getattr(args, "create_" + name, None) is not None:
            options[name] = getattr(args, "create_" + name)
    db = simhashdb.DB(path, readonly=readonly, **options)
    if text and db.recipe not in simhashdb.RECIPES:
        db.close()  # reopened naming the default: an empty database takes it, others refuse
        db = simhashdb.DB(path, readonly=readonly, recipe=simhashdb.RECIPE, **options)
    return db


def _fingerprinter(db, args):
    """Text to fingerprint by the database's recipe (the default if it has none)."""
    options = simhashdb.RECIPES.get(db.recipe, simhashdb.RECIPES[simhashdb.RECIPE])
    return lambda data: simhashdb.fingerprint(data, html=args.html, **options)


def _distance(args):
    return 3 if args.distance is None else args.distance


def _progress(args, what, unit="it"):
    return tqdm(desc=what, unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False,
                disable=args.quiet or not sys.stderr.isatty())


def build_parser():
    """The argument parser of simhashdb-cli."""
    def flags(default):
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--quiet", action="store_true", default=default,
                            help="no progress bar")
        common.add_argument("--debug", action="store_true", default=default,
                            help="show tracebacks of errors")
        return common

    # before or after the command; a subcommand's unset flag must not reset the other
    common = flags(argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="simhashdb-cli", parents=[flags(False)],
        description="Near-duplicate fingerprint database on the command line.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, example, path=True):
        handler = globals()["cmd_" + name.replace("-", "_")]
        sub = commands.add_parser(name, parents=[common], help=handler.__doc__.splitlines()[0],
                                  description=handler.__doc__,
                                  epilog="Example:\n  " + example,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        if path:
            sub.add_argument("path", metavar="PATH", help="the database directory")
        sub.set_defaults(handler=handler)
        return sub

    def creation(sub):
        sub.add_argument("--distance", dest="create_distance", type=int,
                         help="largest query distance of a new database (default: 3)")
        sub.add_argument("--blocks", dest="create_blocks", type=int,
                         help="blocks of a new database (default: chosen from distance)")
        sub.add_argument("--expected-size", dest="create_expected_size", type=int,
                         help="documents expected, to choose blocks (default: 10,000,000)")

    creation(command("init", "simhashdb-cli init crawl.db --distance 3"))

    sub = command("import",
                  "simhashdb-cli import crawl.db pages/ --include '*.html' --html --if-new")
    creation(sub)
    sub.add_argument("files", nargs="*", metavar="FILE",
                     help="files or directories (default: stdin)")
    sub.add_argument("--format", choices=FORMATS,
                     help="dec, hex, jsonl or text (default: detected)")
    sub.add_argument("--key-prefix", help="prefix of generated keys (line numbers, paths)")
    sub.add_argument("--include", action="append", default=[], metavar="GLOB",
                     help="in directories, only files matching GLOB (repeatable)")
    sub.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                     help="in directories, skip files matching GLOB (repeatable)")
    sub.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                     help="records per transaction (default: %d)" % DEFAULT_BATCH)
    sub.add_argument("--if-new", action="store_true",
                     help="import only documents with no near-duplicate stored or earlier in "
                          "the input; print the skipped ones")
    sub.add_argument("--skip-invalid", action="store_true",
                     help="skip malformed lines and report their count")
    sub.add_argument("--html", action="store_true",
                     help="text documents are HTML: fingerprint their text only")

    sub = command("query", "simhashdb-cli query crawl.db 0x1f2e3d4c5b6a7988 --distance 2")
    sub.add_argument("fingerprints", nargs="*", metavar="FP",
                     help="fingerprints, decimal or hex (default: stdin lines)")
    sub.add_argument("--text", action="append", metavar="FILE",
                     help="fingerprint this document and query it (repeatable)")
    sub.add_argument("--format", choices=("dec", "hex"),
                     help="how fingerprints are written (default: decimal if all digits)")
    sub.add_argument("--distance", type=int, help="at most the database's distance")
    sub.add_argument("--html", action="store_true", help="--text files are HTML")

    for name, example in (("delete", "simhashdb-cli delete crawl.db https://example.com/a"),
                          ("get", "simhashdb-cli get crawl.db https://example.com/a")):
        sub = command(name, example)
        if name == "delete":
            sub.add_argument("keys", nargs="*", metavar="KEY", help="keys (default: stdin lines)")
        else:
            sub.add_argument("key", metavar="KEY")
        sub.add_argument("--str-keys", action="store_true",
                         help="keys made of digits are strings, not ints")

    command("stats", "simhashdb-cli stats crawl.db")
    command("compact", "simhashdb-cli compact crawl.db")
    command("check", "simhashdb-cli check crawl.db")
    command("export", "simhashdb-cli export crawl.db > crawl.jsonl")

    for name, example in (
            ("find-all", "simhashdb-cli find-all --input hashes.txt --blocks 6 --distance 3"),
            ("clusters", "simhashdb-cli clusters crawl.db --distance 2")):
        sub = command(name, example, path=False)
        sub.add_argument("path", nargs="?", metavar="PATH",
                         help="a database (default: read hashes from --input)")
        sub.add_argument("--input", default="-", help="file of decimal hashes (default: stdin)")
        sub.add_argument("--output", default="-", help="output file (default: stdout)")
        sub.add_argument("--blocks", type=int, help="blocks, for hashes from --input")
        sub.add_argument("--distance", type=int,
                         help="largest distance (default: the database's, or 3)")
        if name == "find-all":
            sub.add_argument("--duplicates", action="store_true",
                             help="with --input, also print [a, a] for a repeated hash")

    sub = command("spark", "simhashdb-cli spark dedupe crawl.parquet deduped.parquet "
                           "--master local[4]", path=False)
    sub.add_argument("action", choices=("find-all", "clusters", "dedupe"))
    sub.add_argument("input", metavar="INPUT", help="Parquet, or what import reads (- for stdin)")
    sub.add_argument("target", metavar="OUTPUT", help="*.parquet, or a JSON lines file (- for stdout)")
    sub.add_argument("--master", help="Spark master URL (default: spark-submit's, or local[*])")
    sub.add_argument("--distance", type=int, help="largest distance of a pair (default: 3)")
    sub.add_argument("--blocks", type=int, help="blocks (default: chosen from the corpus size)")
    sub.add_argument("--key", default="key", help="key column of Parquet input (default: key)")
    sub.add_argument("--fingerprint", default="fingerprint",
                     help="fingerprint column of Parquet input (default: fingerprint)")
    sub.add_argument("--format", choices=FORMATS + ("parquet",),
                     help="format of INPUT (default: detected)")
    sub.add_argument("--key-prefix", help="prefix of generated keys (line numbers, paths)")
    sub.add_argument("--html", action="store_true", help="text documents are HTML")

    for name, example in (("export-parquet", "simhashdb-cli export-parquet crawl.db crawl.parquet"),
                          ("import-parquet", "simhashdb-cli import-parquet new.db deduped.parquet")):
        sub = command(name, example)
        sub.add_argument("file", metavar="FILE", help="the Parquet file (or, to import, directory)")
        if name == "import-parquet":
            creation(sub)
            sub.add_argument("--key", default="key", help="key column (default: key)")
            sub.add_argument("--fingerprint", default="fingerprint",
                             help="fingerprint column (default: fingerprint)")

    sub = command("fingerprint", "simhashdb-cli fingerprint README.md docs/*.txt", path=False)
    sub.add_argument("files", nargs="*", metavar="FILE", help="text files (default: stdin)")
    sub.add_argument("--format", choices=("jsonl", "dec", "hex"), default="jsonl")
    sub.add_argument("--html", action="store_true", help="the files are HTML")
    sub.add_argument("--recipe", choices=sorted(simhashdb.RECIPES), default=simhashdb.RECIPE,
                     help="the fingerprint recipe (default: the current one)")
    return parser


def main(argv=None):
    """Run simhashdb-cli with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    output = getattr(args, "output", "-")
    try:
        with _output_file(output) as args.output_file:
            args.handler(args)
    except BrokenPipeError:
        return 0
    except (CliError, simhashdb.SimhashDBError, OSError) as exc:
        if args.debug:
            raise
        print("simhashdb-cli: error: %s" % exc, file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _output_file(path):
    if path in (None, "-"):
        yield sys.stdout
        return
    try:
        stream = open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise CliError("cannot write %s: %s" % (path, exc.strerror)) from None
    with stream:
        yield stream


def main_exit():
    """Console-script entry point."""
    sys.exit(main())
