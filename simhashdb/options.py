"""The options of ``simhashdb-cli``: its parser, the types of its
arguments and their defaults (the commands themselves are in cli.py)."""

import argparse
import inspect
import re

import simhashdb
from simhashdb import inputs, rule
from simhashdb.fingerprint import recipe_named
from simhashdb.inputs import FORMATS

DEFAULT_BATCH = 10_000
BATCH_SECONDS = 2  # an import commits a batch read for this long, full or not
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
LISTS = ("text", "files", "fingerprints", "keys")  # the commands' lists of arguments


def build_parser(handlers):
    """The argument parser of simhashdb-cli: each command runs ``handlers``'s
    ``cmd_<command>`` (its description and summary are that function's docstring)."""
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
    parser.add_argument("--version", action="version", version="simhashdb " + simhashdb.__version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, example, path=True):
        handler = handlers["cmd_" + name.replace("-", "_")]
        summary = " ".join(handler.__doc__.split()).split(". ")[0].rstrip(".")
        sub = commands.add_parser(name, parents=[common], help=summary,
                                  description=inspect.cleandoc(handler.__doc__),
                                  epilog="Example:\n  " + example,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        if path:
            sub.add_argument("path", metavar="PATH",
                             help="the database: a directory, or redis://host:port/name")
        sub.set_defaults(handler=handler, usage_of=sub)
        return sub

    def creation(sub):
        sub.add_argument("--distance", dest="create_distance", type=int, metavar="K",
                         help="the most bits a new database's near-duplicates differ in "
                              "(default: 3)")
        sub.add_argument("--blocks", dest="create_blocks", type=int, metavar="M",
                         help="blocks of a new database (default: chosen from distance, "
                              "expected size and memory)")
        sub.add_argument("--table-distance", dest="create_table_distance", type=int,
                         metavar="D", help="the distance a new database's tables are built "
                         "for, at most --distance: fewer tables, each scanned at more "
                         "prefixes (default: chosen with --blocks)")
        sub.add_argument("--expected-size", dest="create_expected_size", type=int,
                         metavar="N", help="documents expected, to choose the tables "
                         "(default: 10,000,000)")

    sub = command("init", "simhashdb-cli init crawl.db --distance 3 --recipe simhashdb-3")
    creation(sub)
    sub.add_argument("--recipe", metavar="NAME", type=recipe,
                     help="the recipe of the fingerprints it will hold (one of: %s, each also "
                          "named by its first part, such as simhashdb-3; or a name of your "
                          "own, not starting with simhashdb-)" % ", ".join(sorted(simhashdb.RECIPES)))

    def walking(sub):
        sub.add_argument("--include", action="append", default=[], metavar="GLOB",
                         help="in directories, only files matching GLOB (repeatable)")
        sub.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                         help="in directories, skip files matching GLOB (repeatable)")

    def threshold(sub, more=""):
        sub.add_argument("--threshold", type=fraction, metavar="R",
                         help="the least resemblance of two texts that are near-duplicates, "
                              "in [0, 1] (default: %g)%s"
                              % (rule.THRESHOLD, "; " + more if more else ""))
        sub.add_argument("--short-words", type=int, metavar="N",
                         help="texts of fewer than N words are near-duplicates only at a "
                              "resemblance of %g or more (default: %d, none)"
                              % (rule.NEAR_EXACT, rule.SHORT_WORDS))

    def decoding(sub):
        sub.add_argument("--encoding", type=encoding, metavar="NAME",
                         help="decode every text document with this encoding (default: the "
                              "charset its HTTP header or HTML <meta> declares, else UTF-8, "
                              "else the encoding detected)")
        sub.add_argument("--archive-key", choices=inputs.ARCHIVE_KEYS, default="uri",
                         help="what keys the pages of a web archive (WARC, ARC, WET): its "
                              "target URI, the URI and the record's date, or its record id "
                              "(default: uri)")

    def rooting(sub):
        sub.add_argument("--root", metavar="DIR",
                         help="text documents are keyed by their path relative to DIR "
                              "(default: their absolute path)")

    sub = command("import",
                  "simhashdb-cli import crawl.db pages/ --include '*.html' --html --if-new")
    creation(sub)
    sub.add_argument("files", nargs="*", metavar="FILE",
                     help="files or directories (default: stdin)")
    sub.add_argument("--format", choices=FORMATS,
                     help="dec, hex, jsonl, text or warc (a web archive: WARC, ARC or WET) "
                          "(default: detected)")
    sub.add_argument("--key-prefix", help="prefix of generated keys (line numbers, paths)")
    sub.add_argument("--key", help="the key of a text document read from stdin")
    walking(sub)
    rooting(sub)
    sub.add_argument("--batch-size", type=positive, default=DEFAULT_BATCH,
                     help="records per transaction, at most (default: %d; a batch also "
                     "commits after %d s of reading); the batches are merged as one load "
                     "once the last commits" % (DEFAULT_BATCH, BATCH_SECONDS))
    sub.add_argument("--if-new", action="store_true",
                     help="import only documents with no near-duplicate stored or earlier in "
                          "the input; print the skipped ones. Texts are near-duplicates by "
                          "the text rule: they share a band of their signatures or their "
                          "fingerprints are within the distance, and their resemblance is at "
                          "least --threshold; fingerprints, by their distance")
    threshold(sub)
    sub.add_argument("--skip-invalid", action="store_true",
                     help="skip malformed lines and archive records and report their count")
    decoding(sub)
    sub.add_argument("--refresh", action="store_true",
                     help="with --if-new, record the near-duplicates found as stored now "
                          "(see expire)")
    sub.add_argument("--html", action="store_true",
                     help="text documents are HTML: fingerprint their text only")

    sub = command("query", "simhashdb-cli query crawl.db 0x1f2e3d4c5b6a7988 --distance 2")
    sub.add_argument("fingerprints", nargs="*", metavar="FP",
                     help="fingerprints, decimal or hex (default: stdin lines)")
    sub.add_argument("--text", action="extend", nargs="+", metavar="FILE",
                     help="the near-duplicates of these documents (files, directories) by "
                          "the text rule (as import --if-new): a shared band of their "
                          "signatures or fingerprints within the distance, and resemblance")
    threshold(sub)
    walking(sub)
    rooting(sub)
    sub.add_argument("--format", choices=("dec", "hex"),
                     help="how fingerprints are written (default: decimal if all are digits "
                          "only, else hex)")
    sub.add_argument("--distance", type=int, metavar="K",
                     help="query fingerprints at any distance, exactly (default: the "
                          "database's; above it a query probes more prefixes); not for --text")
    sub.add_argument("--html", action="store_true", help="--text files are HTML")
    sub.add_argument("--skip-invalid", action="store_true",
                     help="leave out malformed archive records, noted (default: an error)")
    decoding(sub)

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
    sub = command("expire", "simhashdb-cli expire crawl.db --older-than 30d")
    sub.add_argument("--older-than", type=duration, required=True, metavar="AGE",
                     help="remove documents stored longer ago than AGE: a number and a unit, "
                          "s, m, h, d or w (e.g. 30d)")
    command("compact", "simhashdb-cli compact crawl.db")
    command("check", "simhashdb-cli check crawl.db")
    command("upgrade", "simhashdb-cli upgrade crawl.db")
    sub = command("relayout", "simhashdb-cli relayout crawl.db --expected-size 1000000000")
    sub.add_argument("--blocks", type=int, metavar="M",
                     help="blocks (default: chosen with --table-distance)")
    sub.add_argument("--table-distance", type=int, metavar="D",
                     help="the distance the tables are built for, at most the database's "
                          "(default: chosen)")
    sub.add_argument("--expected-size", type=int, metavar="N",
                     help="documents expected, to choose the tables (default: those it holds)")
    command("export", "simhashdb-cli export crawl.db > crawl.jsonl")

    for name, example in (
            ("find-all", "simhashdb-cli find-all --input hashes.txt --blocks 6 --distance 3"),
            ("clusters", "simhashdb-cli clusters crawl.db --distance 2")):
        sub = command(name, example, path=False)
        sub.add_argument("path", nargs="?", metavar="PATH",
                         help="a database (default: read hashes from --input)")
        sub.add_argument("--input", help="file of hashes, one a line (default: stdin)")
        sub.add_argument("--format", choices=("dec", "hex"),
                         help="how --input hashes are written (default: decimal if all are "
                              "digits only, else hex)")
        sub.add_argument("--output", default="-", help="output file (default: stdout)")
        sub.add_argument("--blocks", type=int, help="blocks, for hashes from --input")
        sub.add_argument("--distance", type=int,
                         help="largest distance (default: the database's, or 3); in a "
                              "database of texts, of the fingerprints the text rule pairs "
                              "(texts sharing a band are paired by resemblance alone)")
        threshold(sub, "in a database of texts, pairs of texts are decided by the text rule "
                       "(as import --if-new)%s" % (", and their resemblance is printed last"
                                                   if name == "find-all" else
                                                   ": a cluster is joined by such pairs"))
        if name == "find-all":
            sub.add_argument("--duplicates", action="store_true",
                             help="with --input, also print [a, a] for a repeated hash")

    sub = command("spark", "simhashdb-cli spark dedupe crawl.parquet deduped.parquet "
                           "--master local[4]", path=False)
    sub.add_argument("action", choices=("find-all", "clusters", "dedupe"))
    sub.add_argument("input", metavar="INPUT", help="Parquet, or what import reads (- for stdin)")
    sub.add_argument("target", metavar="OUTPUT",
                     help="*.parquet, or a JSON lines file (- for stdout)")
    sub.add_argument("--master", help="Spark master URL (default: spark-submit's, or local[*])")
    sub.add_argument("--distance", type=int,
                     help="largest distance of a pair (default: 3)")
    sub.add_argument("--blocks", type=int, help="blocks (default: chosen from the corpus size)")
    sub.add_argument("--key", default="key", help="key column of Parquet input (default: key)")
    sub.add_argument("--fingerprint", default="fingerprint",
                     help="fingerprint column of Parquet input (default: fingerprint)")
    sub.add_argument("--signature", metavar="COLUMN",
                     help="the column of resemblance signatures (binary, 128 or 256 bytes; null for a "
                          "document without text) of Parquet input, which makes the text rule "
                          "decide (default: a binary column named signature, where there is "
                          "one; '' for none: the distance alone); the column the signatures of "
                          "texts are put in")
    threshold(sub, "texts only: the text rule decides pairs of texts (see above)")
    sub.add_argument("--format", choices=FORMATS + ("parquet",),
                     help="format of INPUT (default: detected)")
    sub.add_argument("--against", metavar="OLD",
                     help="dedupe or find-all INPUT as a new segment of the corpus OLD holds: "
                          "Parquet (export-parquet's, or an earlier run's), what import reads, "
                          "or a database")
    for column in ("key", "fingerprint", "signature"):
        sub.add_argument("--against-" + column, metavar="COLUMN",
                         help="the %s column of Parquet OLD (default: --%s's)" % (column, column))
    sub.add_argument("--key-prefix", help="prefix of generated keys (line numbers, paths)")
    walking(sub)
    rooting(sub)
    sub.add_argument("--html", action="store_true", help="text documents are HTML")
    sub.add_argument("--skip-invalid", action="store_true",
                     help="leave out malformed archive records, noted (default: an error)")
    decoding(sub)

    for name, example in (
            ("export-parquet", "simhashdb-cli export-parquet crawl.db crawl.parquet"),
            ("import-parquet", "simhashdb-cli import-parquet new.db deduped.parquet")):
        sub = command(name, example)
        sub.add_argument("file", metavar="FILE",
                         help="the Parquet file (or, to import, directory)")
        if name == "import-parquet":
            creation(sub)
            sub.add_argument("--key", default="key", help="key column (default: key)")
            sub.add_argument("--fingerprint", default="fingerprint",
                             help="fingerprint column (default: fingerprint)")

    sub = command("serve", "simhashdb-cli serve crawl.db --port 8750")
    creation(sub)
    sub.add_argument("--host", default="127.0.0.1",
                     help="the address to listen on (default: 127.0.0.1, this machine only)")
    sub.add_argument("--port", type=int, default=8750, help="the port (default: 8750; 0: any)")
    sub.add_argument("--token", help="ask every request but GET /healthz for the header "
                                     "'Authorization: Bearer TOKEN' (default: $SIMHASHDB_TOKEN; "
                                     "unset: no token)")
    sub.add_argument("--max-body", type=float, default=32, metavar="MIB",
                     help="the largest request body, in MiB (default: 32)")
    sub.add_argument("--workers", type=int, metavar="N",
                     help="server processes sharing the port, each fingerprinting and "
                          "committing its requests (default: the cores, at most 4; 1: one "
                          "process)")

    sub = command("fingerprint", "simhashdb-cli fingerprint README.md docs/*.txt", path=False)
    sub.add_argument("files", nargs="*", metavar="FILE",
                     help="text files or directories (default: stdin)")
    walking(sub)
    sub.add_argument("--format", choices=("jsonl", "dec", "hex"), default="jsonl")
    sub.add_argument("--html", action="store_true", help="the files are HTML")
    sub.add_argument("--skip-invalid", action="store_true",
                     help="leave out malformed archive records, noted (default: an error)")
    decoding(sub)
    sub.add_argument("--recipe", type=known_recipe, default=simhashdb.RECIPE, metavar="NAME",
                     help="the fingerprint recipe, named in full or by its first part "
                          "(simhashdb-1 to simhashdb-3; default: the current one)")
    return parser


def parse(parser, argv):
    """The arguments, where a command's list may go on after its options
    (`import db --format dec a.txt`, which argparse alone refuses)."""
    args, rest = parser.parse_known_args(argv)
    listed = next((name for name in LISTS if isinstance(getattr(args, name, None), list)), None)
    if rest and listed and all(arg == "-" or not arg.startswith("-") or
                               re.fullmatch(r"-[0-9]+", arg) for arg in rest):
        getattr(args, listed).extend(rest)
    elif rest:  # argparse's error, with the command's usage
        getattr(args, "usage_of", parser).error("unrecognized arguments: %s" % " ".join(rest))
    return args


def recipe(text, ours=False):
    """A recipe named in full, or one of simhashdb's by its first part
    (simhashdb-3); with ``ours``, one of simhashdb's only."""
    try:
        return recipe_named(text, ours)
    except simhashdb.InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def known_recipe(text):
    """One of simhashdb's recipes (see _recipe)."""
    return recipe(text, ours=True)


def duration(text):
    """Seconds of a duration such as 90s, 45m, 12h, 30d or 2w."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhdw])", text.strip())
    if not match:
        raise argparse.ArgumentTypeError("%r is not a duration: write a number and a unit, s, m, "
                                         "h, d or w (e.g. 30d, 1.5d)" % text)
    return round(float(match.group(1)) * SECONDS[match.group(2)])


def encoding(name):
    """A text encoding Python knows (for --encoding)."""
    encoding = inputs.web_encoding(name)
    if encoding is None:
        raise argparse.ArgumentTypeError("%r is not an encoding Python knows (e.g. utf-8, "
                                         "windows-1252, shift_jis)" % name)
    return encoding


def fraction(text):
    """A number in [0, 1] (for --threshold)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("%r is not a number in [0, 1]" % text)
    return value


def positive(text):
    """An int >= 1 (for --batch-size)."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError("%r is not a positive whole number" % text)
    return int(text)
