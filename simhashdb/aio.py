"""AsyncDB: the database for asyncio programs, per-page calls at batch speed.

Usage::

    async with simhashdb.aio.AsyncDB("crawl.db", recipe=simhashdb.RECIPE) as db:
        decision = await db.insert_text_if_new(url, html, html=True)
        if decision.status == "stored":
            ...

The calls that many tasks make at once are grouped: the inserts into one
transaction (group commit), the queries into one snapshot, run on a worker
thread while the event loop goes on; pages are fingerprinted on another
thread while the group before them commits. An insert's await returns once
its group is committed, so what it acknowledges survives a crash.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from . import batches
from .db import DB, Decision, Html, Key, Match, Text, TextMatch, _threshold
from .errors import DatabaseError

GROUP_LIMIT = 1000  # calls a group takes at most (one transaction for the inserts)
PREPARE_CHUNK = 32  # calls fingerprinted at a time, while the group before them commits
FULL_GROUP = 256  # prepared calls that commit without waiting for those being prepared
FILL_STEP = 0.0005  # seconds between looks at a small group's calls while it waits for more


class AsyncDB:
    """A :class:`~simhashdb.DB` for asyncio: ``AsyncDB(path, **options)`` opens
    the database as ``DB(path, **options)`` does, and its calls are awaitable.

    Calls from many tasks are grouped and run on one worker thread, in the
    order they were made (text inserts fingerprinted beforehand on another
    thread, while the group before them commits): consecutive inserts of one
    kind are one transaction (durable when their awaits return), consecutive
    queries of one kind read one snapshot. A group that fails writes nothing;
    each of its calls is then run alone, so each caller gets its own result
    or error. An invalid record (such as a page with no words) is not an
    error: its Decision says ``"invalid"`` and why, as the batch calls'
    ``invalid="report"``. The database opens when the AsyncDB is made.
    """

    def __init__(self, path: Any, **options: Any) -> None:
        self._db = DB(path, **options)
        self._preparer = ThreadPoolExecutor(1, thread_name_prefix="simhashdb-aio-prepare")
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="simhashdb-aio")
        self._arriving: list[tuple[str, Any, Any, asyncio.Future]] = []
        self._ready: list[tuple[str, Any, Any, asyncio.Future, Any]] = []
        self._preparing: Optional[asyncio.Task] = None
        self._committing: Optional[asyncio.Task] = None
        self._closed = False
        self._last_group, self._last_commit = 0, 0.0  # calls and seconds of the last group

    @property
    def db(self) -> DB:
        """The underlying :class:`~simhashdb.DB` (its calls block: use them off the loop)."""
        return self._db

    async def insert_text_if_new(self, key: Key, text: Text, meta: Any = None, *,
                                 html: Html = False, threshold: Optional[float] = None,
                                 short_words: Optional[int] = None,
                                 refresh: bool = False) -> Decision:
        """:meth:`DB.insert_text_if_new`, grouped with other tasks' calls."""
        return await self._call("insert_text", (html, _threshold(threshold, short_words),
                                                bool(refresh)), (key, text, meta))

    async def insert_if_new(self, key: Key, fingerprint: int, meta: Any = None,
                            distance: Optional[int] = None, refresh: bool = False) -> Decision:
        """:meth:`DB.insert_if_new`, grouped with other tasks' calls."""
        return await self._call("insert", (distance, bool(refresh)), (key, fingerprint, meta))

    async def query_text(self, text: Text, *, html: Html = False,
                         threshold: Optional[float] = None,
                         short_words: Optional[int] = None) -> list[TextMatch]:
        """:meth:`DB.query_text`, grouped with other tasks' calls."""
        _threshold(threshold, short_words)  # bad arguments raise here, not in the group
        return await self._call("query_text", (html, threshold, short_words), text)

    async def query(self, fingerprint: int, distance: Optional[int] = None) -> list[Match]:
        """:meth:`DB.query`, grouped with other tasks' calls."""
        return await self._call("query", distance, fingerprint)

    async def delete(self, key: Key) -> bool:
        """:meth:`DB.delete`: True if the document was there."""
        return await self._call("delete", None, key)

    async def stats(self) -> dict[str, Any]:
        """:meth:`DB.stats`."""
        return await self._call("stats", None, None)

    async def close(self) -> None:
        """Finish the calls made so far, then close the database."""
        if self._closed:
            return
        self._closed = True
        if self._preparing is not None:
            await asyncio.shield(self._preparing)
        if self._committing is not None:  # (started by the last of the preparing)
            await asyncio.shield(self._committing)
        await asyncio.get_running_loop().run_in_executor(self._worker, self._db.close)
        self._preparer.shutdown()
        self._worker.shutdown()

    async def __aenter__(self) -> AsyncDB:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self):
        return "AsyncDB(%r)" % self._db.path

    async def _call(self, kind, option, argument):
        if self._closed:
            raise DatabaseError("this AsyncDB of %s is closed" % self._db.path)
        future = asyncio.get_running_loop().create_future()
        self._arriving.append((kind, option, argument, future))
        self._preparing = _running(self._preparing, self._prepare)
        return await future

    async def _prepare(self):
        """Fingerprint the calls that arrive, a few at a time, while the
        worker commits the group before them; hand them on, in order."""
        loop = asyncio.get_running_loop()
        while self._arriving:
            calls = self._arriving[:PREPARE_CHUNK]
            del self._arriving[:PREPARE_CHUNK]
            prepared = await loop.run_in_executor(self._preparer, _prepared, self._db, calls)
            self._ready += [(*call, done) for call, done in zip(calls, prepared)]
            if not self._arriving or len(self._ready) >= FULL_GROUP:
                self._committing = _running(self._committing, self._commit)

    async def _commit(self):
        """Run the prepared calls, a group at a time, until none are left or
        more calls are waiting to be prepared: a group waits for those (up to
        FULL_GROUP calls), which then start it, so that the calls of many
        tasks made at once are one group, not several (a transaction's fixed
        cost is that of tens of pages)."""
        loop = asyncio.get_running_loop()
        while self._ready:
            await self._filled(loop)
            calls = self._ready[:GROUP_LIMIT]
            del self._ready[:GROUP_LIMIT]
            started = loop.time()
            outcomes = await loop.run_in_executor(self._worker, _run, self._db, calls)
            self._last_group, self._last_commit = len(calls), loop.time() - started
            for (_, _, _, future, _), (ok, value) in zip(calls, outcomes):
                if not future.done():  # its caller may have been cancelled
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
            if len(self._ready) < FULL_GROUP and self._arriving:
                return

    async def _filled(self, loop):
        """Wait while fewer calls are ready than half the last group, for at
        most as long as the last group took: the tasks answered together call
        again together, the first of them a little before the others."""
        until = loop.time() + self._last_commit
        while len(self._ready) < self._last_group // 2 and loop.time() < until:
            await asyncio.sleep(FILL_STEP)


def _running(task, stage):
    """``task`` while it runs, else a new task of the coroutine function ``stage``."""
    return task if task is not None and not task.done() else asyncio.ensure_future(stage())


def _prepared(db, calls):
    """What each call needs done before its transaction: a text insert's
    record fingerprinted and checked (or the error of that), None for others
    and for every call while the database has no recipe: its first text takes
    one, which only the worker may do, after the calls made before it."""
    if db.recipe is None:
        return [None] * len(calls)
    return [_prepared_text(db, option, argument) if kind == "insert_text" else None
            for kind, option, argument, _ in calls]


def _prepared_text(db, option, argument):
    """A text insert's record fingerprinted and checked, or the error of that."""
    try:
        return db._prepared_texts([argument], option[0], batches._now(), "report")
    except Exception as exc:  # the caller's own error
        return exc


def _merged(prepared):
    """One batch's (valid, refused) of the one-record ones of its calls."""
    valid, refused = [], {}
    for i, (one_valid, one_refused) in enumerate(prepared):
        valid += [(i, text) for _, text in one_valid]
        refused.update((i, reason) for reason in one_refused.values())
    return valid, refused


_GROUPED = {
    "insert_text": lambda db, option, records, prepared: db._texts_if_new(
        records, _merged(prepared), option[1], option[2], batches._now()),
    "insert": lambda db, option, records, _: db.insert_if_new_many(
        records, option[0], batch_size=len(records), refresh=option[1]),
    "query_text": lambda db, option, texts, _: db.query_text_many(
        texts, html=option[0], threshold=option[1], short_words=option[2]),
    "query": lambda db, distance, fingerprints, _: db.query_many(fingerprints, distance),
    "stats": lambda db, _, nones, __: [db.stats() for _ in nones],
}


def _attempt(call, argument):
    """(True, call(argument)) or (False, the error it raised)."""
    try:
        return True, call(argument)
    except Exception as exc:  # handed to its caller
        return False, exc


def _run(db, calls):
    """(True, result) or (False, error) of each prepared call, its consecutive
    calls of one kind and option run as one group."""
    outcomes = []
    for (kind, option), group in itertools.groupby(calls, key=lambda call: call[:2]):
        group = list(group)
        arguments = [call[2] for call in group]
        prepared = [_prepared_text(db, option, argument)  # made before there was a recipe
                    if kind == "insert_text" and done is None else done
                    for _, _, argument, _, done in group]
        outcomes += _run_group(db, kind, option, arguments, prepared)
    return outcomes


def _run_group(db, kind, option, arguments, prepared):
    if kind == "delete":  # a transaction a key, each run once: never again after a failure
        return [_attempt(db.delete, key) for key in arguments]
    if len(arguments) == 1 and isinstance(prepared[0], Exception):
        return [(False, prepared[0])]
    if not any(isinstance(done, Exception) for done in prepared):
        try:
            return [(True, result) for result in _GROUPED[kind](db, option, arguments, prepared)]
        except Exception as exc:  # handed to the callers: each alone gets its own
            if len(arguments) == 1:
                return [(False, exc)]
    return [outcome for argument, done in zip(arguments, prepared)
            for outcome in _run_group(db, kind, option, [argument], [done])]
