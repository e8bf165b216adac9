"""What simhashdb-cli writes: an answer as one JSON line on stdout (or the
output file), notes, warnings and errors as one line on stderr, progress
bars where stderr is a terminal, and what a closed or full stdout does."""

import base64
import contextlib
import errno
import io
import json
import os
import sys
import threading

from simhashdb.errors import CliError


# Characters JSON leaves raw but some line readers (Python's str.splitlines,
# JavaScript) end a line at: escaped, so that one answer is always one line.
LINE_BREAKS = {ord(c): "\\u%04x" % ord(c) for c in "\x85\u2028\u2029"}


def emit(obj, stream=None):
    line = json.dumps(obj, default=_to_json, ensure_ascii=False).translate(LINE_BREAKS)
    write(stream or sys.stdout, line + "\n")


def write(stream, text=None):
    """Write ``text`` to an output (None: flush it); a failure, such as a full
    disk, names the output (a closed pipe stays BrokenPipeError)."""
    try:
        stream.write(text) if text is not None else stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        name = "stdout" if stream is sys.stdout else getattr(stream, "name", "the output")
        raise CliError("cannot write to %s: %s" % (name, exc.strerror or exc)) from None


def _to_json(value):
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError("cannot write %s as JSON" % type(value).__name__)


def match_json(match):
    out = {"key": match.key, "fingerprint": match.fingerprint, "distance": match.distance}
    if match.resemblance is not None:
        out["resemblance"] = round(match.resemblance, 4)
    return out


def pair_json(pair):
    """[key_a, key_b, distance], and the resemblance of a pair of texts."""
    return list(pair) + ([round(pair.resemblance, 4)] if pair.resemblance is not None else [])


def record_json(record):
    """A record's JSON line: key, fingerprint, meta, stored_at, and a text's
    resemblance signature where an exported record has one."""
    key, fingerprint, meta, stored_at, *signature = record
    out = {"key": key, "fingerprint": fingerprint, "meta": meta, "stored_at": stored_at}
    if signature and signature[0] is not None:
        out["signature"] = signature[0]
    return out


def note(args, message):
    """A remark on stderr (unless --quiet) that is not an error."""
    if not args.quiet:
        say("note", message)


def say(kind, message):
    """``simhashdb-cli: KIND: MESSAGE`` on stderr, as one line (a file name of
    other bytes than UTF-8 shown escaped)."""
    message = " ".join(message.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    print("simhashdb-cli: %s: %s" % (kind, message), file=sys.stderr)


def progress(args, what, unit="it", total=None, bar_format=None):
    from tqdm import tqdm  # imported here: a fifth of the start, and most verbs show no progress
    return tqdm(desc=what, unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False,
                total=total, disable=args.quiet or not sys.stderr.isatty(),
                bar_format=bar_format)


@contextlib.contextmanager
def working(args, what):
    """A progress line that shows the time spent while one long call runs."""
    with progress(args, what, bar_format="{desc}: running for {elapsed}") as bar:
        if bar.disable:
            yield
            return
        done = threading.Event()

        def tick():
            while not done.wait(0.5):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()


class ClosedStdout(io.TextIOBase):
    """What stands for a closed stdout: writing to it fails."""

    def write(self, text):
        raise OSError(errno.EBADF, "it is closed")


def show_warning(message, category, filename, lineno, file=None, line=None):
    say("warning", str(message))


def silence_stdout():
    """Drop what stdout still buffers for a pipe that is closed or a disk that
    is full, so that exiting does not print a second error."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass


@contextlib.contextmanager
def output_file(path):
    if path in (None, "-"):
        yield sys.stdout
        return
    try:
        stream = open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise CliError("cannot write to %s: %s" % (path, exc.strerror)) from None
    with stream:
        yield stream
        write(stream)
