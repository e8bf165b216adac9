"""The HTTP server of ``simhashdb-cli serve``: a database for crawlers in any
language, as JSON over HTTP, on aiohttp. The calls of concurrent requests go
through :class:`simhashdb.aio.AsyncDB`, which groups them into durable
transactions: a write is on disk when its answer is sent.

Usage::

    simhashdb.server.serve("crawl.db", port=8750)   # until SIGINT or SIGTERM

    curl -s localhost:8750/v1/insert-text-if-new \\
         -d '{"key": "https://example.com/", "text": "<p>Hello</p>", "html": true}'
    {"key": "https://example.com/", "status": "stored", "matches": []}
"""

import asyncio
import base64
import contextlib
import hmac
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from multiprocessing import connection

from aiohttp import web

from .aio import AsyncDB
from .errors import (
    DatabaseError,
    DiskFullError,
    InvalidArgumentError,
    InvalidFingerprintError,
    InvalidKeyError,
    InvalidMetadataError,
    ParameterMismatchError,
    SimhashDBError,
)

DEFAULT_PORT = 8750
MAX_BODY = 32 * 2**20  # bytes of a request: 1,000 pages of 16 KB with room to spare
MAX_ITEMS = 10_000  # items of one request
MAX_DEFAULT_WORKERS = 4  # all workers' commits take turns: more rarely serve more
TOKEN_VARIABLE = "SIMHASHDB_TOKEN"
DB = web.AppKey("db", object)  # the application's AsyncDB
# what one page's item may hold, by endpoint; the first field is required
FIELDS = {"insert-text-if-new": ("text", "key", "html", "metadata", "threshold", "short_words",
                                  "refresh"),
          "query-text": ("text", "key", "html", "threshold", "short_words"),
          "insert-if-new": ("fingerprint", "key", "metadata", "refresh"),
          "query": ("fingerprint", "key", "distance")}
# a page's own fault: answered as its item's "invalid" status, not as a failed request
PAGE_ERRORS = (InvalidArgumentError, InvalidFingerprintError, InvalidKeyError,
               InvalidMetadataError)


def make_app(db, *, token=None, max_body=MAX_BODY):
    """The aiohttp application answering for ``db`` (an open AsyncDB).

    :param str token: requests (but ``GET /healthz``) must carry
        ``Authorization: Bearer <token>`` (default: None, no token asked).
    :param int max_body: the largest request body in bytes (default: 32 MiB).
    """
    middlewares = [_json_errors] + ([] if token is None else [_bearer(token)])
    app = web.Application(middlewares=middlewares, client_max_size=max_body)
    app[DB] = db
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/stats", _stats)
    app.router.add_delete("/v1/documents/{key:.+}", _delete)
    for name in FIELDS:
        app.router.add_post("/v1/" + name, _decide)
    return app


def serve(path, host="127.0.0.1", port=DEFAULT_PORT, *, workers=1, token=None,
          max_body=MAX_BODY, announce=None, **db_options):
    """Serve the database at ``path`` until SIGINT or SIGTERM, then stop
    taking requests, answer those in flight and close the database.

    :param int workers: processes answering on the port (default: 1, this
        one). More are started as Python processes of their own that share
        the port (SO_REUSEPORT: Linux spreads the connections over them),
        each with its own :class:`~simhashdb.aio.AsyncDB` of the database;
        this process watches them, starts another for one that ends, and
        stops them all on SIGINT or SIGTERM (or they stop once it is gone).
    :param announce: called with the server's URL once it listens (default:
        a line on stderr).
    :param db_options: passed to :class:`simhashdb.aio.AsyncDB`.
    :raises InvalidArgumentError: ``workers`` below 1, or above 1 on a system
        without SO_REUSEPORT.
    :raises DatabaseError: a worker could not start (the message says why).
    """
    if type(workers) is not int or workers < 1:
        raise InvalidArgumentError("workers must be an integer >= 1, got %r" % (workers,))
    settings = (path, host, port, token, max_body, db_options)
    if workers == 1:
        asyncio.run(_serve(*settings, announce or _announce))
    else:
        _supervise(workers, settings, announce or _announce)


def default_workers():
    """The workers ``simhashdb-cli serve`` starts unless told: the cores this
    process may use, at most MAX_DEFAULT_WORKERS; 1 without SO_REUSEPORT."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_DEFAULT_WORKERS))


async def _serve(path, host, port, token, max_body, db_options, announce, parent=None):
    """Answer on ``host``:``port`` until SIGINT or SIGTERM, or until
    ``parent`` (a worker's stdin, from its parent) ends."""
    async with AsyncDB(path, **db_options) as db:
        runner = web.AppRunner(make_app(db, token=token, max_body=max_body), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_port=parent is not None).start()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            if parent is not None:  # readable once the parent is gone
                loop.add_reader(parent.fileno(), _stopping, loop, parent, stop)
            bound = runner.addresses[0]
            announce("http://%s:%d" % ((bound[0] if ":" not in bound[0] else
                                        "[%s]" % bound[0]), bound[1]))
            await stop.wait()
        finally:
            await runner.cleanup()  # requests in flight are answered first


def _stopping(loop, parent, stop):
    loop.remove_reader(parent.fileno())
    stop.set()


def _announce(url):
    print("simhashdb-cli: serving on %s (Ctrl-C or SIGTERM stops it)" % url, file=sys.stderr,
          flush=True)


# Workers: processes of their own, each with its AsyncDB (whose group commits
# then take turns under the database's write lock), sharing one port. A
# worker reads its settings from its stdin, whose end tells it that its
# parent is gone, and writes a line to its stdout once it listens (its URL)
# or cannot (why); the end of its stdout tells its parent that it ended.


def _supervise(count, settings, announce):
    """Run ``count`` workers until SIGINT or SIGTERM, starting another for
    each that ends before; then stop them all (each answers its requests in
    flight first)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise InvalidArgumentError("several server workers share a port through SO_REUSEPORT, "
                                   "which this system lacks: serve with 1 worker")
    path, host, port = settings[:3]
    settings = (path, host, _free_port(host, port)) + settings[3:]
    stopping, workers = [], {}
    woken, waking = socket.socketpair()
    waking.setblocking(False)
    handlers = {signum: signal.signal(signum, lambda *_: stopping.append(True))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    wakeup = signal.set_wakeup_fd(waking.fileno())
    try:
        for number in range(1, count + 1):
            url = _start_worker(number, settings, workers, woken, stopping)
        if not stopping:
            announce(url)
        while not stopping:
            ready = connection.wait([woken] + [w.stdout for w in workers.values()])
            if woken in ready:
                woken.recv(64)
            for number, process in list(workers.items()):
                if process.stdout in ready and not process.stdout.readline() and not stopping:
                    print("simhashdb-cli serve: worker %d (pid %d) ended (%s); starting another"
                          % (number, process.pid, _ending(process.wait())), file=sys.stderr,
                          flush=True)
                    _start_worker(number, settings, workers, woken, stopping)
    finally:
        for process in workers.values():
            with contextlib.suppress(ProcessLookupError):
                process.terminate()  # SIGTERM: a worker's graceful stop
        for process in workers.values():
            process.wait()
            process.stdin.close()
            process.stdout.close()
        signal.set_wakeup_fd(wakeup)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        waking.close()
        woken.close()


def _free_port(host, port):
    """``port``, or a free one for 0, where no process listens (tried
    without SO_REUSEPORT, which would join another server's listeners)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.create_server((host, port), family=family) as probe:
        return probe.getsockname()[1]


def _start_worker(number, settings, workers, woken, stopping):
    """Start worker ``number`` and wait until it listens: its URL (None if
    the server is stopped first). A worker that cannot start stops the
    server with its reason."""
    process = subprocess.Popen([sys.executable, "-c", "from simhashdb import server; "
                                "server._work()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    workers[number] = process
    process.stdin.write(pickle.dumps(settings))
    process.stdin.flush()
    while not stopping:
        if process.stdout in connection.wait([process.stdout, woken]):
            said = process.stdout.readline()
            if not said:
                said = json.dumps([False, "it ended (%s)" % _ending(process.wait())])
            started, said = json.loads(said)
            if not started:
                raise DatabaseError("server worker %d could not start: %s" % (number, said))
            return said
        woken.recv(64)
    return None


def _work():
    """A worker process: serve until SIGTERM or its parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its parent's SIGTERM stops it
    started = []

    def tell(listening, said):
        print(json.dumps([listening, said]), flush=True)
        started.append(listening)
    try:
        asyncio.run(_serve(*pickle.load(sys.stdin.buffer), lambda url: tell(True, url),
                           sys.stdin))
    except Exception as exc:
        if started:  # a failure while serving: its traceback on stderr
            raise
        tell(False, str(exc) or type(exc).__name__)  # the parent's error says it
        sys.exit(1)


def _ending(code):
    return "exit status %d" % code if code >= 0 else "signal %d" % -code


# Requests


async def _decide(request):
    """POST /v1/<endpoint>: one item, or ``{"items": [...]}``, each answered
    with its key, status and matches."""
    endpoint = request.path.rsplit("/", 1)[1]
    body = await _json_body(request)
    if "items" in body:
        if set(body) != {"items"} or not isinstance(body["items"], list):
            raise _Refused(400, 'a batch is {"items": [...]}: a list of items, nothing else')
        if len(body["items"]) > MAX_ITEMS:
            raise _Refused(413, "a request holds at most %d items, got %d: send them in "
                           "several requests" % (MAX_ITEMS, len(body["items"])))
        items = [_item(item, endpoint, "items[%d]: " % i) for i, item in enumerate(body["items"])]
        answers = await asyncio.gather(*(_answer(request.app[DB], endpoint, item)
                                         for item in items))
        return _json({"items": answers})
    return _json(await _answer(request.app[DB], endpoint, _item(body, endpoint, "")))


async def _answer(db, endpoint, item):
    """The decision on one checked item, as JSON."""
    key = item.get("key")
    try:
        if endpoint == "insert-text-if-new":
            found = await db.insert_text_if_new(
                key, item["text"], item.get("metadata"), html=item.get("html", False),
                threshold=item.get("threshold"), short_words=item.get("short_words"),
                refresh=item.get("refresh", False))
        elif endpoint == "insert-if-new":
            found = await db.insert_if_new(key, item["fingerprint"], item.get("metadata"),
                                           refresh=item.get("refresh", False))
        elif endpoint == "query-text":
            found = await db.query_text(item["text"], html=item.get("html", False),
                                        threshold=item.get("threshold"),
                                        short_words=item.get("short_words"))
        else:
            found = await db.query(item["fingerprint"], item.get("distance"))
    except PAGE_ERRORS as exc:
        return {"key": key, "status": "invalid", "reason": str(exc), "matches": []}
    answer = {"key": key, "status": getattr(found, "status", "duplicate" if found else "new"),
              "matches": [{"key": m.key, "distance": m.distance,
                           "resemblance": None if m.resemblance is None
                           else round(m.resemblance, 4)} for m in found]}
    if answer["status"] == "invalid":
        answer["reason"] = found.reason
    return answer


def _item(item, endpoint, where):
    """``item`` checked against what ``endpoint`` takes; a 400 error says
    what is wrong with it."""
    fields = FIELDS[endpoint]
    if not isinstance(item, dict):
        raise _Refused(400, "%san item is a JSON object, got %s" % (where, _kind(item)))
    unknown = sorted(set(item) - set(fields))
    if unknown:
        raise _Refused(400, "%sunknown field %r: an item of /v1/%s has %s"
                       % (where, unknown[0], endpoint, ", ".join(fields)))
    needed = [fields[0]] + (["key"] if endpoint.startswith("insert") else [])
    missing = [name for name in needed if name not in item]
    if missing:
        raise _Refused(400, "%s%r is missing" % (where, missing[0]))
    for name in ("key", "text"):
        if name in item and not isinstance(item[name], str):
            raise _Refused(400, "%s%r must be a string, got %s" % (where, name, _kind(item[name])))
    html = item.get("html", False)
    if not (isinstance(html, bool) or html == "main"):
        raise _Refused(400, '%s\'html\' must be true, false or "main", got %s'
                       % (where, _kind(html)))
    threshold = item.get("threshold")
    if threshold is not None and (type(threshold) not in (int, float) or
                                  not 0 <= threshold <= 1):
        raise _Refused(400, "%s'threshold' must be a number in [0, 1], got %s"
                       % (where, json.dumps(threshold)))
    short_words = item.get("short_words")
    if short_words is not None and (type(short_words) is not int or short_words < 0):
        raise _Refused(400, "%s'short_words' must be an integer >= 0, got %s"
                       % (where, json.dumps(short_words)))
    if type(item.get("refresh", False)) is not bool:
        raise _Refused(400, "%s'refresh' must be true or false, got %s"
                       % (where, _kind(item["refresh"])))
    if "fingerprint" in item:
        item["fingerprint"] = _fingerprint(item["fingerprint"], where)
    distance = item.get("distance")
    if distance is not None and (type(distance) is not int or not 0 <= distance <= 63):
        raise _Refused(400, "%s'distance' must be an integer in [0, 63], got %s"
                       % (where, _kind(distance)))
    return item


def _fingerprint(value, where):
    """A fingerprint given as an integer or as a string of hex digits."""
    if isinstance(value, str):
        try:
            value = int(value, 16)
        except ValueError:
            value = None
    if type(value) is not int or not 0 <= value < 2**64:
        raise _Refused(400, "%s'fingerprint' must be an integer in [0, 2**64) or a string "
                       "of up to 16 hex digits" % where)
    return value


async def _json_body(request):
    """The request's body, a JSON object."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Refused(400, "the body is not JSON (%s): send one JSON object" % exc) from None
    except RecursionError:
        raise _Refused(400, "the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object, got %s" % _kind(body))
    return body


async def _delete(request):
    key = request.match_info["key"]
    return _json({"key": key, "deleted": await request.app[DB].delete(key)})


async def _stats(request):
    return _json(await request.app[DB].stats())


async def _healthz(request):
    return _json({"status": "ok", "pid": os.getpid()})  # the worker that answered


# Answers and errors


class _Refused(SimhashDBError):
    """A request the server refuses: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status, message, headers=()):
        super().__init__(message)
        self.status, self.headers = status, dict(headers)



def _json(obj, status=200):
    return web.json_response(obj, status=status, dumps=_dumps)


def _dumps(obj):
    return json.dumps(obj, default=_bytes_json, ensure_ascii=False)


def _bytes_json(value):
    if isinstance(value, bytes):  # a key stored as bytes (by the library or the CLI)
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError("cannot write %s as JSON" % type(value).__name__)


def _kind(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


@web.middleware
async def _json_errors(request, handler):
    """Every error answered as JSON: ``{"error": "what was wrong"}``."""
    try:
        return await handler(request)
    except _Refused as exc:
        response = _json({"error": str(exc)}, exc.status)
        response.headers.update(exc.headers)
        return response
    except web.HTTPException as exc:  # aiohttp's own: no route, wrong method, body too large
        if exc.status < 400:
            raise
        if exc.status == 413:
            return _json({"error": "%s: send less in one request" % exc.text.rstrip(".")}, 413)
        return _json({"error": exc.reason}, exc.status)
    except DiskFullError as exc:
        return _json({"error": str(exc)}, 507)
    except ParameterMismatchError as exc:  # this database cannot take the request, ever
        return _json({"error": str(exc)}, 409)
    except DatabaseError as exc:
        return _json({"error": str(exc)}, 503)
    except Exception:
        request.app.logger.exception("simhashdb-cli serve: %s %s failed", request.method,
                                     request.path)
        return _json({"error": "the server failed on this request (its log has the "
                               "traceback): report it"}, 500)


def _bearer(token):
    expected = ("Bearer " + token).encode()

    @web.middleware
    async def check(request, handler):
        given = request.headers.get("Authorization", "").encode(errors="surrogateescape")
        if request.path != "/healthz" and not hmac.compare_digest(given, expected):
            raise _Refused(401, "this server asks for a token: send the header "
                           "'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
        return await handler(request)
    return check
