"""The CLI's ``spark`` command: a Spark session, the inputs (and an old corpus,
``--against``) as DataFrames, a call of :mod:`simhashdb.spark`, its output
written. It needs the spark extra (pip install '.[spark]' in simhashdb's
source directory)."""

import contextlib
import datetime
import decimal
import importlib
import os
import sys
import tempfile

import simhashdb
from simhashdb import inputs, rule
from simhashdb.console import emit, note, output_file, progress
from simhashdb.errors import CliError, UsageError
from simhashdb.inputs import Skipped, TextRecord
from simhashdb.wiring import (_distance, _note_decoded, _note_skipped, _reader, _skip,
                              _text_rule_option)


def cmd_spark(args):
    """Pairs, clusters or dedupe of a whole corpus on Spark (simhashdb.spark).

INPUT is Parquet (a .parquet file or a directory of them; --key, --fingerprint
and --signature name its columns) or any input `import` reads. OUTPUT ending in
.parquet is written by Spark as Parquet; anything else (or -) gets JSON lines:
[key_a, key_b, distance] for find-all, [key, cluster] for clusters, the kept
rows as objects for dedupe (which `import --format jsonl` reads back).

Which rule decides: texts (files, directories, JSON lines with "text") are
fingerprinted with their resemblance signature (the current recipe) and
paired by the text rule, as by `import --if-new` and `clusters` on a
database of texts: they share a band of their signatures or their
fingerprints are within --distance, and their resemblance is at least
--threshold (find-all prints it last); a document without text (a
fingerprint) pairs by its distance. Parquet with a signature column
(--signature, or a binary column named signature) is decided the same way.
Input with no text at all is paired by the distance of its
fingerprints alone. A note on stderr says which rule ran.

With --against OLD (Parquet, what `import` reads, or a database), INPUT is a
new segment of the corpus OLD holds: dedupe keeps the rows of INPUT that are
near-duplicates of nothing in OLD, deduplicated among themselves; find-all
prints the pairs within INPUT and those across, [new key, old key, ...,
true]. OLD is read, but never paired with itself."""
    session, spark, errors = _spark_session(args)
    if args.against is not None and args.action == "clusters":
        raise UsageError("--against is for dedupe and find-all")
    try:
        with contextlib.ExitStack() as stack:
            _spark_run(args, session, spark, stack)
    except errors as exc:
        raise CliError("spark: %s" % str(exc).strip().splitlines()[0]) from None


def _spark_run(args, session, spark, stack):
    """Run cmd_spark's action and write its output."""
    old = _against_database(args.against) if args.against is not None else None
    if old is not None:
        stack.enter_context(old)
    bits = old.stats()["signature_bits"] if old is not None else 8  # signed as the old texts
    df, signature, made = _spark_input(session, args, args.input, args.format, bits)
    options = {"key": args.key, "fingerprint": args.fingerprint}
    if args.against is not None:
        options["against"], options["against_columns"] = _spark_against(
            session, args, stack, signature in made, old)
    if signature is not None:
        options.update(signature=signature, threshold=args.threshold,
                       short_words=args.short_words)
        note(args, "pairs of texts by the text rule: a shared band of their signatures or "
             "fingerprints within %d bits, and a resemblance of at least %g; documents "
             "without text by their distance (signatures from column %r)"
             % (_distance(args), args.threshold if args.threshold is not None
                else rule.THRESHOLD, signature))
    elif _text_rule_option(args):
        raise CliError("%s is the text rule's, and this input has no text (give "
                       "texts, or Parquet with a --signature column)" % _text_rule_option(args))
    else:
        note(args, "pairs by the distance of their fingerprints (within %d bits): the "
             "input has no text or signatures" % _distance(args))
    run = {"find-all": spark.find_all, "clusters": spark.clusters, "dedupe": spark.dedupe}
    result = run[args.action](df, _distance(args), args.blocks, **options)
    if args.target.endswith(".parquet"):
        result.write.parquet(args.target)
        emit({"output": args.target, "rows": session.read.parquet(args.target).count()})
    else:
        if signature in made and args.action == "dedupe":  # made here: no one reads them
            result = result.drop(signature)
        with output_file(args.target) as out:
            fingerprint = args.fingerprint if args.action == "dedupe" else None
            for row in result.toLocalIterator():
                line = _spark_json(row, fingerprint, "meta" in made)
                across = line.pop() if args.against is not None and \
                    args.action == "find-all" else None
                if signature is not None and args.action == "find-all":
                    score = line.pop()  # as find-all on a database: last, if two texts
                    line += [round(score, 4)] if score is not None else []
                emit(line if across is None else line + [across], out)


def _spark_against(session, args, stack, texts, db):
    """The old corpus of --against as a DataFrame and the names of its key,
    fingerprint and signature columns: Parquet (named by --against-key and
    the rest, else as INPUT), what `import` reads, or a database (``db``,
    opened: exported to Parquet in a directory that lasts while ``stack`` is
    open); a database's recipe must be the current one where the new rows
    are ``texts`` fingerprinted here."""
    given, exported = args.against, False
    if db is not None:
        if texts and db.recipe != simhashdb.RECIPE:
            raise CliError("%s holds fingerprints made with %r, and the texts of %s are "
                           "fingerprinted with %r: they would match nothing"
                           % (given, db.recipe, args.input, simhashdb.RECIPE))
        given = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()),
                             "against.parquet")
        db.export_parquet(given)
        exported = True
    if not inputs.is_parquet(given):
        df, signature, _ = _spark_input(session, args, given, None)
        names = {"key": args.key, "fingerprint": args.fingerprint}
        return df, dict(names, signature=signature) if signature else names
    df = session.read.parquet(given)
    names = {column: column if exported else getattr(args, "against_" + column) or
             getattr(args, column) or column for column in ("key", "fingerprint", "signature")}
    for column, name in names.items():
        if name not in df.columns and (column != "signature" or args.against_signature):
            raise CliError("%s has no %s column %r (its columns: %s); name it with --against-%s"
                           % (args.against, column, name, ", ".join(df.columns), column))
    if names["signature"] not in df.columns:
        del names["signature"]   # documents without text
    return df, names


def _spark_session(args):
    """The active Spark session or a new one (local workers run this Python),
    the simhashdb.spark module, and the exceptions Spark raises."""
    try:
        importlib.import_module("pyarrow")  # texts and numbers go to Spark as Arrow tables
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession

        from simhashdb import spark
    except ImportError:
        raise CliError("spark needs pyspark, pyarrow and Java 17 or later: pip install '.[spark]' "
                       "in simhashdb's source directory") from None
    local = (args.master or "local").startswith("local")
    if local and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("simhashdb").config(
        "spark.ui.showConsoleProgress", str(not args.quiet and sys.stderr.isatty()).lower())
    try:
        session = (builder.master(args.master) if args.master else builder).getOrCreate()
    except (PySparkException, Py4JError) as exc:
        raise CliError("Spark did not start (it needs Java 17 or later): %s"
                       % str(exc).strip().splitlines()[0]) from None
    if not args.debug:
        session.sparkContext.setLogLevel("ERROR")
    return session, spark, (PySparkException, Py4JError)


def _against_database(given):
    """The database --against names, opened read-only, or None (Parquet or
    another input)."""
    if inputs.is_parquet(given) or not (given.startswith("redis://") or os.path.isdir(given)):
        return None
    try:
        return simhashdb.DB(given, readonly=True, create=False)
    except simhashdb.DatabaseNotFoundError:
        return None


def _spark_input(session, args, given, fmt, signature_bits=8):
    """An input as a DataFrame: Parquet read by Spark, other formats parsed
    here (texts signed in bins of ``signature_bits``); the name of its
    signature column (None: no text, the distance rule decides) and the
    columns made here (the signatures of texts, the metadata of an archive's
    pages as msgpack)."""
    if fmt == "parquet" or inputs.is_parquet(given):
        df = session.read.parquet(given)
        signature = args.signature
        if signature is None and "signature" in df.columns and \
                df.schema["signature"].dataType.typeName() == "binary":
            signature = "signature"  # as `spark dedupe` of texts writes it
        return df, signature or None, set()  # --signature '': the distance alone
    from simhashdb import spark
    recipe = dict(simhashdb.RECIPES[simhashdb.RECIPE], signature_bits=signature_bits)
    last = {}  # the text the reader fingerprinted last: (fingerprint, signature)

    def fingerprint(text, html):
        last.clear()
        last[text] = simhashdb.fingerprint_with_signature(text, html=html, **recipe)
        return last[text][0]

    records, skipped = [], {}
    reader = _reader(args, fingerprint, stdin_key=None)
    with progress(args, "read", unit="B") as bar:
        for source, line, record in reader.records(
                {given: inputs.input_format(given, fmt)}, bar):
            if isinstance(record, Skipped):
                _skip(args, skipped, source, record)
                continue
            if isinstance(record, Exception) and args.skip_invalid:
                note(args, "skipped %s:%s: %s" % (source, line, record))
                continue
            if isinstance(record, Exception):
                raise CliError("%s:%s: %s" % (source, line, record))
            meta = record[2] if len(record) > 2 else None
            if isinstance(record, TextRecord):
                fp, signature = last.get(record[1]) or simhashdb.fingerprint_with_signature(
                    record[1], html=record.html, **recipe)
                records.append((record[0], fp, meta, signature))
            else:
                records.append((record[0], simhashdb.check_fingerprint(record[1]), meta, None))
    _note_skipped(args, skipped)
    _note_decoded(args, reader)
    try:
        df, signature = spark.from_records(session, records, args.key, args.fingerprint,
                                           args.signature)
    except inputs.InputError as exc:
        raise CliError("%s: %s" % (given, exc)) from None
    return df, signature, set(df.columns) - {args.key, args.fingerprint}


def _spark_json(row, fingerprint, meta=False):
    """A result row as JSON: a list of its values, or (with the name of the
    fingerprint column, for dedupe) an object with the fingerprint unsigned
    (and with ``meta``, the metadata of the meta column made here)."""
    if fingerprint is None:
        return [_spark_value(v) for v in row]
    out = {name: _spark_value(v) for name, v in row.asDict().items()}
    if meta:
        from simhashdb import parquet
        out["meta"] = parquet.meta_value(out["meta"])
    value = row[fingerprint]
    out[fingerprint] = int.from_bytes(value, "big") if isinstance(value, (bytes, bytearray)) \
        else int(value) % 2**64
    return out


def _spark_value(value):
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value
