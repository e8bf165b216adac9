"""simhashdb-cli: the command line over the simhashdb library.

Data goes to stdout as JSON lines; progress (on a terminal) and errors go to
stderr. Exit status: 0 success, 1 an error in the input or the data, 2 a
usage error, 130 interrupted. Every error is one line; ``--debug`` shows its
traceback.
"""

import contextlib
import json
import os
import re
import sys
import time
import warnings

import simhashdb
from simhashdb import inputs, options, rule, sparkjob
from simhashdb.console import (ClosedStdout, emit, match_json, note, output_file, pair_json,
                               progress, record_json, say, show_warning, silence_stdout, working,
                               write)
from simhashdb.results import size_of
from simhashdb.errors import CliError, UsageError
from simhashdb.inputs import Skipped, TextRecord
from simhashdb.options import BATCH_SECONDS
from simhashdb.wiring import (
    _bits,
    _distance,
    _fingerprinter,
    _note_decoded,
    _note_skipped,
    _of_a_database,
    _open,
    _read_hashes,
    _reader,
    _scan_distance,
    _skip,
    _text_rule_option,
    in_cli_words,
)

PROGRESS_SECONDS = 60  # how often an import without a terminal reports its counts on stderr


# Commands


def cmd_init(args):
    """Create a database (or show an existing one's parameters)."""
    if (args.recipe or "").startswith("simhashdb-") and args.recipe not in simhashdb.RECIPES:
        raise UsageError("%r is not one of simhashdb's recipes (%s); a recipe of your own needs "
                         "a name that does not start with 'simhashdb-'"
                         % (args.recipe, ", ".join(sorted(simhashdb.RECIPES))))
    with _open(args.path, args, create=True, recipe=args.recipe) as db:
        if args.recipe is not None and args.recipe not in simhashdb.RECIPES:
            note(args, "%r is not a recipe this simhashdb knows: give fingerprints, not text"
                 % args.recipe)
        emit(db.stats())


def cmd_import(args):
    """Import records from files, directories or stdin, one transaction per batch."""
    counts = {"imported": 0, "invalid": 0, "near_duplicates": 0, "skipped_files": {}}
    if args.if_new:
        counts["unchanged"] = 0  # stored under their own key already, unchanged
    given = _text_rule_option(args) or ("--refresh" if args.refresh else None)
    if not args.if_new and given:
        raise UsageError("%s is for --if-new: without it, import stores every record" % given)
    stdin_text = "text" if args.key is not None else None  # --key names a text document
    formats = {given: inputs.input_format(given, args.format or (stdin_text if given == "-"
                                                                 else None))
               for given in args.files or ["-"]}
    if args.key is not None and list(formats.items()) != [("-", "text")]:
        raise UsageError("--key names the one text document read from stdin; other inputs are "
                         "keyed by their path or line")
    walked = [given for given in formats if given != "-" and os.path.isdir(given)]
    if walked and args.format not in (None, "text"):
        raise UsageError("--format %s is for named files and stdin, and %s is a directory, whose "
                         "files are walked as text documents: name the files instead"
                         % (args.format, walked[0]))
    if list(formats) == ["-"] and inputs.stdin_is_empty():
        note(args, "stdin is empty: nothing was imported (and no database made)")
        emit(counts)
        return
    header = inputs.export_header(formats)
    with _open(args.path, args, create=True, text="text" in formats.values(),
               recipe=header.get("recipe"), like=header,
               lines_recipe=header.get("lines_recipe")) as db:
        reader = _reader(args, _fingerprinter(db), stdin_key=args.key)
        if formats.get("-") in LIST_FORMATS and args.key_prefix is None and \
                1 in db:
            note(args, "lines from stdin are keyed by their line number, so they replace the "
                 "records stored under those numbers; --key-prefix P keeps them apart")
        for given in walked if args.include else ():
            if not reader.walks_a_file(given):
                note(args, "no file below %s matches --include %s" % (
                    given, " ".join(args.include)))
        try:
            with progress(args, "import", unit="B", total=reader.size(list(formats))) as bar, \
                    db.bulk_load():  # its batches merged once the last commits
                _import(args, db, reader, formats, counts, bar)
            if reader.decoded:
                counts["decoded"] = reader.decoded
            if reader.unread_fields:
                note(args, "JSON lines' fields %s were not read: a line's fields are key (or "
                     "path), fingerprint (or text), meta and stored_at"
                     % ", ".join(sorted(map(repr, reader.unread_fields))))
        except KeyboardInterrupt:
            args.interrupted = ("%d records were imported, in batches that were committed (a "
                                "batch commits at %d records or after %d s of reading)"
                                % (counts["imported"], args.batch_size, BATCH_SECONDS))
            raise
        except inputs.InputError as exc:  # an input that could not be read on
            raise CliError("%s (%d records were imported before, in batches that were "
                           "committed)" % (exc, counts["imported"])) from None
        except simhashdb.SimhashDBError as exc:  # a batch that could not be stored (disk full)
            if not counts["imported"] or isinstance(exc, (simhashdb.InvalidArgumentError,
                                                            CliError)):
                raise
            raise CliError("%s; the %d records imported before, in batches that were "
                           "committed, stay" % (str(exc).rstrip("."), counts["imported"])
                           ) from None
    emit(counts)


def _import(args, db, reader, formats, counts, bar):
    """Read the records of ``formats`` and store them in batches, counting in
    ``counts``: a batch commits when full or after BATCH_SECONDS of reading;
    without a terminal, the counts go to stderr every PROGRESS_SECONDS."""
    batch, where = [], []
    began = reported = time.monotonic()

    def flush():
        size = len(batch) or 1
        text = bool(batch) and isinstance(batch[0], TextRecord)
        html = text and batch[0].html
        if args.if_new:
            found_all = (db.insert_text_if_new_many(batch, html=html, batch_size=size,
                                                    threshold=args.threshold,
                                                    short_words=args.short_words,
                                                    refresh=args.refresh, invalid="raise")
                         if text else db.insert_if_new_many([r[:4] for r in batch],
                                                            batch_size=size,
                                                            refresh=args.refresh,
                                                            invalid="raise"))
            for (source, line), record, found in zip(where, batch, found_all):
                if found.status == "unchanged":
                    counts["unchanged"] += 1
                elif found.status == "duplicate":
                    counts["near_duplicates"] += 1
                    emit({"skipped": record[0], "source": source, "line": line,
                          "matches": [match_json(m) for m in found]})
                else:
                    counts["imported"] += 1
                    if found.replaced:
                        emit({"replaced": record[0], "source": source, "line": line,
                              "fingerprint_before": found.replaced.fingerprint})
        elif text:
            counts["imported"] += db.insert_text_many(batch, html=html, batch_size=size)
        elif any(len(record) == 5 for record in batch):  # exported texts, with signatures
            counts["imported"] += db.import_records(batch, db.recipe, batch_size=size,
                                                    source="the input")
        else:
            counts["imported"] += db.insert_many(batch, batch_size=size)
        batch.clear()
        where.clear()

    for source, line, record in reader.records(formats, bar):
        if isinstance(record, Skipped):
            _skip(args, counts.setdefault("skipped_records", {}) if record.routine
                  else counts["skipped_files"], source, record)
            continue
        try:
            if isinstance(record, Exception):
                raise record
            if isinstance(record, TextRecord) and db.recipe not in (None, *simhashdb.RECIPES):
                raise CliError("this database holds fingerprints made with %r, a recipe "
                               "this simhashdb cannot fingerprint text with" % (db.recipe,))
            simhashdb.check_record((record[0], 0, *record[2:])
                                   if isinstance(record, TextRecord) else record[:4])
        except simhashdb.SimhashDBError as exc:
            if not args.skip_invalid:
                told = formats.get(source) in LIST_FORMATS and not args.format
                raise CliError("%s:%s: %s (%d records were imported before the batch that "
                               "held this line; nothing of that batch was written; "
                               "--skip-invalid skips bad lines%s)"
                               % (source, line, exc, counts["imported"],
                                  ", --format text stores the file as one text document"
                                  if told else "")) from None
            counts["invalid"] += 1
            continue
        if batch and (isinstance(batch[0], TextRecord), getattr(batch[0], "html", None)) != \
                (isinstance(record, TextRecord), getattr(record, "html", None)):
            flush()  # a batch goes whole through the text methods (of HTML or not) or the others
        if not batch:
            began = time.monotonic()
        batch.append(record)
        where.append((source, line))
        if len(batch) >= args.batch_size or time.monotonic() - began >= BATCH_SECONDS:
            flush()
            if bar.disable and not args.quiet and time.monotonic() - reported >= PROGRESS_SECONDS:
                reported = time.monotonic()
                print("simhashdb-cli: import: %s so far" % json.dumps(counts), file=sys.stderr,
                      flush=True)
    flush()


def cmd_query(args):
    """Print the stored documents near each fingerprint: arguments, stdin lines
    (fingerprints, or JSON lines with "fingerprint" as `fingerprint` prints),
    or the text of --text files and directories."""
    if args.text and args.fingerprints:
        raise UsageError("give fingerprints or --text files, not both")
    _bits(args.distance, 64)
    with _open(args.path, args, readonly=True, text=bool(args.text)) as db:
        if args.text:
            fingerprint = _fingerprinter(db)
            if args.distance is not None:
                raise UsageError("--distance is for fingerprints: --text finds near-duplicates "
                                 "by the database's distance and the texts' resemblance")
            probes, results, skipped = [], [], {}
            reader = _reader(args, fingerprint)
            for source, record in _texts(args, reader, reader.text_formats(args.text), skipped):
                probes.append((record[0], reader.fingerprint_of(record[1], record.html)))
                results.append(db.query_text(record[1], html=record.html,
                                             threshold=args.threshold,
                                             short_words=args.short_words))
            _note_skipped(args, skipped)
            _note_decoded(args, reader)
        else:
            files = [arg for arg in args.fingerprints if os.path.exists(arg)
                     and not (inputs.DEC.fullmatch(arg) or inputs.HEX.fullmatch(arg))]
            if files:
                raise UsageError("%s is a file, not a fingerprint: to query the text of files, "
                                 "name them after --text" % files[0])
            probes = []
            for label, fp, recipe in inputs.probes(args.fingerprints or inputs.stdin_lines(),
                                                   args.format):
                if recipe is not None and db.recipe is not None and recipe != db.recipe:
                    raise CliError("the fingerprint of %s was made with %r, and this database's "
                                   "with %r: it would match nothing; %s"
                                   % (label or fp, recipe, db.recipe, "query the text (--text), "
                                      "or fingerprint it with --recipe %s" % db.recipe.split("/")[0]
                                      if db.recipe in simhashdb.RECIPES else
                                      "make its fingerprint as the database's were made"))
                probes.append((label, fp))
            results = db.query_many([fp for _, fp in probes], args.distance)
        for (label, fp), matches in zip(probes, results):
            out = {"query": fp} if label is None else {"query": label, "fingerprint": fp}
            out["matches"] = [match_json(m) for m in matches]
            emit(out)


def cmd_delete(args):
    """Delete documents by key (arguments or stdin lines); a key of digits is
    the int key if there is one, else the str key. A key given again counts
    once, so deleted + not found = requested."""
    texts = args.keys or inputs.stdin_lines()
    with _open(args.path, args) as db:
        named = {}  # stored key -> the text that first named it
        for text in texts:
            named.setdefault(_stored_key(db, text, args), text)
        missing = [text for key, text in named.items() if key not in db]
        emit({"deleted": db.delete_many(named), "requested": len(named), "not_found": missing})


def cmd_get(args):
    """Print one document; a key of digits is the int key if there is one, else the str key."""
    with _open(args.path, args, readonly=True) as db:
        record = db.get(_stored_key(db, args.key, args))
    if record is None:
        raise CliError("no document with key %r in %s" % (args.key, args.path))
    emit(record_json(record))


def cmd_stats(args):
    """Print counts, parameters and sizes."""
    with _open(args.path, args, readonly=True) as db:
        emit(db.stats())


def cmd_expire(args):
    """Remove the documents stored more than --older-than ago."""
    with _open(args.path, args) as db:
        emit({"expired": db.expire(time.time() - args.older_than)})


def cmd_compact(args):
    """Rewrite the database without the space freed by deletes."""
    with _open(args.path, args) as db:
        before = db.stats()
        with working(args, "compact"):
            db.compact()
        size, bytes_before = size_of(before)
        emit({size + "_before": bytes_before, size + "_after": db.stats()[size]})


def cmd_upgrade(args):
    """Convert a database made by an earlier simhashdb to this version's format:
    written as a copy put in the database's place once whole, so a crash
    leaves it as it was or converted. Needs the database to itself."""
    with working(args, "upgrade"):
        simhashdb.upgrade(args.path)
    with _open(args.path, args, readonly=True) as db:
        emit({"format": db.stats()["format"], "tables": db.tables})


def cmd_relayout(args):
    """Build a database's tables again in another layout for its distance: the
    one --blocks and --table-distance give, or the one a database of
    --expected-size documents gets on this machine (see `init`). Written as a
    compacted copy put in the database's place once whole: a crash leaves it
    as it was or relaid out. Needs the database to itself."""
    with working(args, "relayout"):
        try:
            done = simhashdb.relayout(args.path, blocks=args.blocks,
                                      table_distance=args.table_distance,
                                      expected_size=args.expected_size)
        except simhashdb.InvalidArgumentError as exc:
            raise UsageError(in_cli_words(exc)) from None
    emit(done)


def cmd_check(args):
    """Verify that every table agrees with the documents (exit status 1 if not)."""
    with _open(args.path, args, readonly=True) as db, working(args, "check"):
        problems = db.check()
    emit({"problems": problems})
    if problems:
        raise CliError("%d problem(s) found in %s" % (len(problems), args.path))


def cmd_export(args):
    """Print every document as a JSON line that `import` reads back, after a
    first line with the database's recipe, distance and blocks."""
    with _open(args.path, args, readonly=True) as db, \
            progress(args, "export", total=len(db)) as bar:
        emit({"simhashdb": {"recipe": db.recipe, "distance": db.distance, "blocks": db.blocks,
                            "table_distance": db.table_distance}})
        for record in db.export_records():
            emit(record_json(record))
            bar.update()


def cmd_find_all(args):
    """Every matching pair: of a database's documents, or of a file of hashes."""
    if _of_a_database(args):
        with _open(args.path, args, readonly=True) as db, progress(args, "pairs") as bar, \
                contextlib.closing(db.find_all(_scan_distance(args, db),
                                               threshold=args.threshold,
                                               short_words=args.short_words)) as pairs:
            _note_rule(args, db)
            for pair in pairs:
                emit(pair_json(pair), args.output_file)
                bar.update()
        return
    hashes = _read_hashes(args)
    for a, b in simhashdb.find_all(hashes, args.blocks, _distance(args)):
        if a != b or args.duplicates:
            emit([a, b], args.output_file)


def cmd_clusters(args):
    """Clusters of matching documents (keys), or of a file of hashes."""
    if _of_a_database(args):
        with _open(args.path, args, readonly=True) as db, progress(args, "clusters") as bar, \
                contextlib.closing(db.clusters(_scan_distance(args, db),
                                               threshold=args.threshold,
                                               short_words=args.short_words)) as found:
            _note_rule(args, db)
            for cluster in found:
                emit(cluster, args.output_file)
                bar.update()
        return
    for cluster in simhashdb.find_clusters(_read_hashes(args), args.blocks, _distance(args)):
        emit(cluster, args.output_file)


def cmd_fingerprint(args):
    """Print the fingerprint of each text file (directories walked; default: stdin)."""
    options = simhashdb.RECIPES[args.recipe]
    skipped = {}
    reader = _reader(args, lambda text, html: simhashdb.fingerprint(text, html=html, **options))
    formats = reader.text_formats(args.files or ["-"])
    for source, record in _texts(args, reader, formats, skipped):
        fp = reader.fingerprint_of(record[1], record.html)
        if args.format == "jsonl":
            named = {"key": record[0]} if len(record) > 2 \
                else {"path": "-" if source == "<stdin>" else source}  # an archived page: its key
            emit(dict(named, fingerprint=fp, hex="%016x" % fp, recipe=args.recipe))
        else:
            write(sys.stdout, "%d\n" % fp if args.format == "dec" else "%016x\n" % fp)
    _note_skipped(args, skipped)
    _note_decoded(args, reader)


def _texts(args, reader, formats, skipped):
    """(source, TextRecord) of the text documents and archived pages of
    ``formats``; what is left out counted in ``skipped`` (and noted, but an
    archive's routine records), a malformed record an error (or, with
    --skip-invalid where the command has it, noted and left out)."""
    for source, line, record in reader.records(formats):
        if isinstance(record, Skipped):
            _skip(args, skipped, source, record)
        elif isinstance(record, Exception):
            if not getattr(args, "skip_invalid", False):
                raise CliError("%s:%s: %s" % (source, line, record))
            note(args, "skipped %s:%s: %s" % (source, line, record))
        else:
            yield source, record


# Parquet (the spark extra: pip install '.[spark]' in simhashdb's source directory)


def cmd_export_parquet(args):
    """Write every document to a Parquet file (key, fingerprint as uint64, meta as msgpack)."""
    with _open(args.path, args, readonly=True) as db:
        emit({"exported": db.export_parquet(args.file)})


def cmd_import_parquet(args):
    """Import the documents of a Parquet file or directory, such as `spark dedupe` output."""
    with _open(args.path, args, create=True) as db:
        emit({"imported": db.import_parquet(args.file, args.key, args.fingerprint)})


def cmd_serve(args):
    """Serve a database over HTTP with JSON, for crawlers in any language.

Endpoints: POST /v1/insert-text-if-new, /v1/query-text, /v1/insert-if-new and
/v1/query (one item, or {"items": [...]}); DELETE /v1/documents/KEY;
GET /v1/stats; GET /healthz. The writes of concurrent requests are grouped
into transactions, and each is on disk before its answer is sent. --workers
processes share the port, each with its own groups (a worker that ends is
replaced). SIGINT or SIGTERM stops it: the requests in flight are answered,
then the database is closed. The guide is docs/crawlers.md."""
    try:
        from simhashdb import server
    except ImportError:
        raise CliError("serve needs aiohttp: pip install '.[server]' in simhashdb's source "
                       "directory") from None
    token = args.token or os.environ.get(server.TOKEN_VARIABLE) or None
    if args.max_body < 1:
        raise UsageError("--max-body must be at least 1 (MiB), got %g" % args.max_body)
    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be in [0, 65535] (0: any free port), got %d" % args.port)
    workers = server.default_workers() if args.workers is None else args.workers
    if workers < 1:
        raise UsageError("--workers must be at least 1, got %d" % workers)
    _open(args.path, args, create=True).close()  # made with the options given, or checked
    try:
        server.serve(args.path, args.host, args.port, workers=workers, token=token,
                     max_body=int(args.max_body * 2**20))
    except OSError as exc:
        raise CliError("cannot listen on %s port %d: %s; choose another --host or --port"
                       % (args.host, args.port, os.strerror(exc.errno) if exc.errno else exc)
                       ) from None


def _stored_key(db, text, args):
    """The key ``text`` names: a str with --str-keys; else for an int written
    as Python writes it (no leading zeros), the int
    key where one is stored, the str key where only that is (noted if both);
    else the str key, or the key ``import`` made of that path (absolute, and
    ``PATH:LINE`` for a line of a file), where only that is stored."""
    if args.str_keys:
        return text
    if re.fullmatch(r"-?[0-9]{1,20}", text) and str(int(text)) == text:  # not 0123: a str
        number = int(text)
        try:
            has_int = number in db
        except simhashdb.InvalidKeyError:  # beyond 64 bits: only a str key can be that
            return text
        if has_int and text in db:
            note(args, "both the int key %s and the str key %r are stored; this is the int one "
                 "(--str-keys for the other)" % (text, text))
        return number if has_int or text not in db else text
    if text in db:
        return text
    return next((key for key in inputs.path_keys(text) if key in db), text)


# Output


def _note_rule(args, db):
    """Say which rule decides a command's pairs in ``db``."""
    if db.recipe is not None:
        note(args, "pairs of texts by the text rule: a shared band of their signatures or "
             "fingerprints within %d bits, and a resemblance of at least %g; documents "
             "stored without text by their distance"
             % (db.distance if args.distance is None else args.distance,
                args.threshold if args.threshold is not None else rule.THRESHOLD))
    elif args.threshold is not None:
        note(args, "--threshold has no say here: the database holds fingerprints of no "
             "recipe, not texts, paired by their distance alone")


# Entry points


def build_parser():
    """The argument parser of simhashdb-cli, its commands run by this module's cmd_ functions
    (and the spark command's, in sparkjob)."""
    return options.build_parser(dict(globals(), cmd_spark=sparkjob.cmd_spark))


def main(argv=None):
    """Run simhashdb-cli with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    if sys.stderr is None:  # closed (2>&-): errors are told by the exit status alone
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # closed (>&-): the first write is an error that says so
        sys.stdout = ClosedStdout()
    parser = build_parser()
    args = options.parse(parser, argv)
    output = getattr(args, "output", "-")
    try:
        with output_file(output) as args.output_file, warnings.catch_warnings():
            if not sys.warnoptions:  # (-W or PYTHONWARNINGS decide where given)
                warnings.simplefilter("once", simhashdb.MaintenanceWarning)
            warnings.showwarning = show_warning  # a warning as one line
            args.handler(args)
            write(sys.stdout)  # a full disk or closed pipe is reported here, not at exit
    except BrokenPipeError:
        silence_stdout()
        return 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        silence_stdout()
        batched = args.handler in (cmd_import, cmd_import_parquet, cmd_delete, cmd_expire,
                                   cmd_upgrade)
        print("simhashdb-cli: interrupted%s" % (
            ": %s; every batch committed before stays in the database, the rest was not "
            "written" % getattr(args, "interrupted", "nothing more was written")
            if batched else ""), file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        silence_stdout()
        known = isinstance(exc, (simhashdb.SimhashDBError, OSError, ImportError))
        say("error", "%s%s" % (str(exc).strip() or type(exc).__name__, "" if known else
                               " (%s; run with --debug for the traceback and report it)"
                               % type(exc).__name__))
        return 2 if isinstance(exc, (UsageError, simhashdb.InvalidArgumentError)) else 1
    return 0


LIST_FORMATS = ("dec", "hex", "dec or hex")  # inputs.input_format's lists of fingerprints


def main_exit():
    """Console-script entry point."""
    try:
        status = main()
    except KeyboardInterrupt:  # before a command began (main's own handler tells the rest)
        if "--debug" in sys.argv:
            raise
        print("simhashdb-cli: interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)


if __name__ == "__main__":  # python -m simhashdb.cli, as python -m simhashdb
    main_exit()
