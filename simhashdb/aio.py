"""AsyncDB: the database for asyncio programs, per-page calls at batch speed.

Usage::

    async with simhashdb.aio.AsyncDB("crawl.db", recipe=simhashdb.RECIPE) as db:
        decision = await db.insert_text_if_new(url, html, html=True)
        if decision.status == "stored":
            ...

The calls that many tasks make at once are grouped: the inserts into one
transaction (group commit), the queries into one snapshot, run on a worker
thread while the event loop goes on. An insert's await returns once its group
is committed, so what it acknowledges survives a crash.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from .db import DB, Decision, Html, Key, Match, Text, TextMatch
from .errors import DatabaseError

GROUP_LIMIT = 1000  # calls a group takes at most (one transaction for the inserts)


class AsyncDB:
    """A :class:`~simhashdb.DB` for asyncio: ``AsyncDB(path, **options)`` opens
    the database as ``DB(path, **options)`` does, and its calls are awaitable.

    Calls from many tasks are grouped and run on one worker thread, in the
    order they were made: consecutive inserts of one kind are one
    transaction (durable when their awaits return), consecutive queries of
    one kind read one snapshot. A group that fails writes nothing; each of
    its calls is then run alone, so each caller gets its own result or error.
    An invalid record (such as a page with no words) is not an error: its
    Decision says ``"invalid"`` and why, as the batch calls' ``invalid="report"``.
    """

    def __init__(self, path: Any, **options: Any) -> None:
        self._db = DB(path, **options)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="simhashdb-aio")
        self._pending: list[tuple[str, Any, Any, asyncio.Future]] = []
        self._flushing: Optional[asyncio.Task] = None
        self._closed = False

    @property
    def db(self) -> DB:
        """The underlying :class:`~simhashdb.DB` (its calls block: use them off the loop)."""
        return self._db

    async def insert_text_if_new(self, key: Key, text: Text, meta: Any = None, *,
                                 html: Html = False) -> Decision:
        """:meth:`DB.insert_text_if_new`, grouped with other tasks' calls."""
        return await self._call("insert_text", html, (key, text, meta))

    async def insert_if_new(self, key: Key, fingerprint: int, meta: Any = None) -> Decision:
        """:meth:`DB.insert_if_new`, grouped with other tasks' calls."""
        return await self._call("insert", None, (key, fingerprint, meta))

    async def query_text(self, text: Text, *, html: Html = False) -> list[TextMatch]:
        """:meth:`DB.query_text`, grouped with other tasks' calls."""
        return await self._call("query_text", html, text)

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
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        await asyncio.get_running_loop().run_in_executor(self._worker, self._db.close)
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
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((kind, option, argument, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = loop.create_task(self._flush())
        return await future

    async def _flush(self):
        """Run the pending calls, a group at a time, until none are left."""
        loop = asyncio.get_running_loop()
        while self._pending:
            calls = self._pending[:GROUP_LIMIT]
            del self._pending[:GROUP_LIMIT]
            outcomes = await loop.run_in_executor(self._worker, _run, self._db, calls)
            for (*_, future), (ok, value) in zip(calls, outcomes):
                if not future.done():  # its caller may have been cancelled
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)


_GROUPED = {
    "insert_text": lambda db, html, records: db.insert_text_if_new_many(
        records, html=html, batch_size=len(records)),
    "insert": lambda db, _, records: db.insert_if_new_many(records, batch_size=len(records)),
    "query_text": lambda db, html, texts: db.query_text_many(texts, html=html),
    "query": lambda db, distance, fingerprints: db.query_many(fingerprints, distance),
    "delete": lambda db, _, keys: [db.delete(key) for key in keys],
    "stats": lambda db, _, nones: [db.stats() for _ in nones],
}


def _run(db, calls):
    """(True, result) or (False, error) of each call, its consecutive calls of
    one kind and option run as one group."""
    outcomes = []
    for (kind, option), group in itertools.groupby(calls, key=lambda call: call[:2]):
        outcomes += _run_group(db, kind, option, [argument for _, _, argument, _ in group])
    return outcomes


def _run_group(db, kind, option, arguments):
    try:
        return [(True, result) for result in _GROUPED[kind](db, option, arguments)]
    except Exception as exc:  # handed to the callers: each alone gets its own
        if len(arguments) == 1:
            return [(False, exc)]
        return [outcome for argument in arguments
                for outcome in _run_group(db, kind, option, [argument])]
