"""simhashdb.aio.AsyncDB: calls from many tasks grouped into one transaction,
each caller its own result or error, the same decisions as the batch calls,
and every acknowledged page still there after the process is killed."""

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
from unittest import mock

import pytest

import simhashdb
from simhashdb import DatabaseError, DiskFullError, InvalidArgumentError
from simhashdb.aio import AsyncDB

pytestmark = pytest.mark.usefixtures("backend")


def page(seed, words=200):
    rng = random.Random(seed)
    return " ".join("w%d" % rng.randrange(3000) for _ in range(words))


def pages(n):
    """n pages, every fifth a copy of an earlier one, every seventh without words."""
    records = []
    for i in range(n):
        text = page(i // 5 * 5) + " x%d" % i if i % 5 else page(i)
        records.append(("u/%d" % i, "<p> </p><script>go()</script>" if i % 7 == 6 else text))
    return records


async def insert_all(db, records, tasks=64, **options):
    """Insert ``records`` from ``tasks`` concurrent tasks, in order; their Decisions."""
    queue, decisions = iter(enumerate(records)), [None] * len(records)

    async def worker():
        for i, (key, text) in queue:
            decisions[i] = await db.insert_text_if_new(key, text, html=True, **options)

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return decisions


@contextlib.contextmanager
def group_sizes():
    """The number of texts of each group of inserts committed meanwhile (a list)."""
    sizes = []
    grouped = simhashdb.DB._texts_if_new  # a group's transaction

    def counting(self, records, *args):
        sizes.append(len(records))
        return grouped(self, records, *args)

    with mock.patch.object(simhashdb.DB, "_texts_if_new", counting):
        yield sizes


def test_many_tasks_decide_as_one_batch_does_in_groups(tmp_path):
    records = pages(300)
    with simhashdb.DB(tmp_path / "batch", recipe=simhashdb.RECIPE) as db:
        expected = db.insert_text_if_new_many(records, html=True)
    async def run():
        async with AsyncDB(tmp_path / "aio", recipe=simhashdb.RECIPE) as db:
            with group_sizes() as groups:
                return await insert_all(db, records), await db.stats(), groups

    decisions, stats, groups = asyncio.run(run())
    assert [(d.key, d.status, list(d)) for d in decisions] == \
        [(d.key, d.status, list(d)) for d in expected]
    assert {d.status for d in decisions} == {"stored", "duplicate", "invalid"}
    assert sum(groups) == len(records) and max(groups) > 1 and len(groups) < len(records) / 8
    assert stats["count"] == sum(d.status == "stored" for d in expected)


def test_calls_made_at_once_are_one_transaction(tmp_path):
    """Calls made together wait for the ones made with them to be
    fingerprinted (in several parts) and commit as one group, not a group a part."""
    async def run():
        async with AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
            with group_sizes() as groups:
                return await asyncio.gather(*(db.insert_text_if_new(i, page(i)) for i in
                                              range(3 * simhashdb.aio.PREPARE_CHUNK + 5))), groups

    decided, groups = asyncio.run(run())
    assert {d.status for d in decided} == {"stored"} and groups == [len(decided)]


def test_a_threshold_decides_grouped_calls_as_it_decides_a_batch(tmp_path):
    records = pages(120)
    texts = [text for i, (_, text) in enumerate(records[:30]) if i % 7 != 6]
    with simhashdb.DB(tmp_path / "batch", recipe=simhashdb.RECIPE) as db:
        expected = db.insert_text_if_new_many(records, html=True, threshold=0.99)
        asked = db.query_text_many(texts, html=True, threshold=0.99)
    with simhashdb.DB(tmp_path / "default", recipe=simhashdb.RECIPE) as db:
        by_default = db.insert_text_if_new_many(records, html=True)

    async def run():
        async with AsyncDB(tmp_path / "aio", recipe=simhashdb.RECIPE) as db:
            decided = await insert_all(db, records, threshold=0.99)
            queried = await asyncio.gather(*(db.query_text(text, html=True, threshold=0.99)
                                             for text in texts))
            with pytest.raises(InvalidArgumentError):
                await db.insert_text_if_new("k", "some words", threshold=2)
            return decided, queried

    decided, queried = asyncio.run(run())
    assert [(d.key, d.status, list(d)) for d in decided] == \
        [(d.key, d.status, list(d)) for d in expected]
    assert [d.status for d in expected] != [d.status for d in by_default]  # it took effect
    assert queried == asked


def test_each_caller_gets_its_own_result_or_error(tmp_path):
    fp = simhashdb.fingerprint(page(1))

    async def run():
        async with AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
            stored = await asyncio.gather(db.insert_text_if_new("a", page(1)),
                                          db.insert_if_new("b", fp ^ 0xFF),
                                          db.insert_text_if_new("c", "  "))
            asked = await asyncio.gather(db.query_text(page(1) + " more"),
                                         db.query_text("..."), db.query(fp),
                                         db.query(fp, distance=70), db.query(fp, distance=8),
                                         return_exceptions=True)
            gone = await asyncio.gather(db.delete("a"), db.delete("zz"),
                                        db.delete("b"), db.delete(1.5),
                                        return_exceptions=True)
            return stored, asked, gone, await db.stats()

    stored, asked, gone, stats = asyncio.run(run())
    assert [(d.key, d.status) for d in stored] == [("a", "stored"), ("b", "stored"),
                                                   ("c", "invalid")]
    assert "no words" in stored[2].reason
    assert [m.key for m in asked[0]] == ["a"] and asked[0][0].resemblance > 0.9
    assert isinstance(asked[1], InvalidArgumentError) and "no words" in str(asked[1])
    assert [m.key for m in asked[2]] == ["a"]
    assert isinstance(asked[3], InvalidArgumentError)
    assert [(m.key, m.distance) for m in asked[4]] == [("a", 0), ("b", 8)]
    # a failed delete beside others: each told once what it did
    assert gone[:3] == [True, False, True] and isinstance(gone[3], simhashdb.InvalidKeyError)
    assert stats["count"] == 0


def test_calls_are_run_in_the_order_they_were_made(tmp_path):
    async def run():
        async with AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
            return await asyncio.gather(
                db.query_text(page(1)), db.insert_text_if_new("a", page(1)),
                db.query_text(page(1)), db.delete("a"), db.query_text(page(1)),
                db.insert_text_if_new("a", page(1), html="main"))

    before, stored, after, deleted, gone, again = asyncio.run(run())
    assert (before, stored.status, [m.key for m in after]) == ([], "stored", ["a"])
    assert (deleted, gone, again.status) == (True, [], "stored")


def test_a_new_database_takes_its_recipe_in_the_order_of_the_calls(tmp_path):
    """A fingerprint stored by a call made before a new database's first text
    makes that text a mismatch, as it is for the library; made after it, both
    are stored and the database takes the recipe."""
    text = page(1)

    def in_order(db, first_fingerprint):
        calls = [lambda: db.insert_if_new("f", 77), lambda: db.insert_text_if_new("t", text)]
        return calls if first_fingerprint else calls[::-1]

    async def grouped(path, first_fingerprint):
        async with AsyncDB(path) as db:
            return await asyncio.gather(*(call() for call in in_order(db, first_fingerprint)),
                                        return_exceptions=True)

    for first_fingerprint in (True, False):
        path, alone = tmp_path / str(first_fingerprint), tmp_path / ("%s-alone" % first_fingerprint)
        outcomes = asyncio.run(grouped(path, first_fingerprint))
        with simhashdb.DB(alone) as db:
            expected = []
            for call in in_order(db, first_fingerprint):
                try:
                    expected.append(call().status)
                except simhashdb.ParameterMismatchError as exc:
                    expected.append(type(exc))
        assert [getattr(o, "status", type(o)) for o in outcomes] == expected
        with simhashdb.DB(path) as db, simhashdb.DB(alone) as library:
            assert (db.recipe, sorted(r.key for r in db)) == \
                (library.recipe, sorted(r.key for r in library))
    assert expected == ["stored", "stored"]  # (text first: the recipe taken, then the fingerprint)


def test_refresh_records_the_pages_seen_again_as_seen_now(tmp_path, monkeypatch):
    clock = [1_000]
    monkeypatch.setattr(simhashdb.batches, "_now", lambda: clock[0])  # every write's clock
    fp = simhashdb.fingerprint(page(9))

    async def run():
        async with AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
            await asyncio.gather(*(db.insert_text_if_new(k, page(i)) for i, k in enumerate("abc")),
                                 db.insert_if_new("f", fp), db.insert_if_new("g", fp ^ 0xFFFFFFFF))
            clock[0] = 2_000
            return await asyncio.gather(
                db.insert_text_if_new("a", page(0), refresh=True), db.insert_text_if_new("b", page(1)),
                db.insert_text_if_new("c-copy", page(2), refresh=True),
                db.insert_if_new("f", fp, refresh=True), db.insert_if_new("g", fp ^ 0xFFFFFFFF))

    decided = asyncio.run(run())
    assert [d.status for d in decided] == ["unchanged", "unchanged", "duplicate", "unchanged",
                                           "unchanged"]
    with simhashdb.DB(tmp_path / "db") as db:
        assert {r.key: r.stored_at for r in db} == {"a": 2_000, "b": 1_000, "c": 2_000,
                                                   "f": 2_000, "g": 1_000}


def test_a_failed_group_writes_nothing_and_each_call_is_retried_alone(tmp_path):
    grouped = simhashdb.DB._texts_if_new  # a group's transaction

    def failing(self, records, *args):  # as a full disk would, for a group holding "bad"
        if any(key == "bad" for key, *_ in records):
            raise DiskFullError("the disk is full")
        return grouped(self, records, *args)

    async def run():
        async with AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
            with mock.patch.object(simhashdb.DB, "_texts_if_new", failing):
                return await asyncio.gather(
                    *(db.insert_text_if_new(key, page(i)) for i, key in
                      enumerate(["a", "b", "bad", "c"])), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert [getattr(o, "status", type(o)) for o in outcomes] == \
        ["stored", "stored", DiskFullError, "stored"]
    with simhashdb.DB(tmp_path / "db") as db:
        assert sorted(r.key for r in db) == ["a", "b", "c"]


def test_a_closed_asyncdb_refuses_calls_and_closing_finishes_the_pending(tmp_path):
    async def run():
        db = AsyncDB(tmp_path / "db", recipe=simhashdb.RECIPE)
        pending = [asyncio.ensure_future(db.insert_text_if_new(i, page(i))) for i in range(20)]
        await asyncio.sleep(0)  # the calls are made
        await db.close()
        await db.close()
        with pytest.raises(DatabaseError, match="closed"):
            await db.query(1)
        return [decision.status for decision in await asyncio.gather(*pending)]

    assert asyncio.run(run()) == ["stored"] * 20
    with simhashdb.DB(tmp_path / "db") as db:
        assert len(db) == 20


WRITER = textwrap.dedent("""
    import asyncio, sys
    import simhashdb
    from simhashdb.aio import AsyncDB

    async def main(path):
        async with AsyncDB(path, recipe=simhashdb.RECIPE) as db:
            async def task(t):
                for i in range(t, 10**6, 32):
                    words = " ".join("t%dw%d" % (i, j) for j in range(60))
                    decision = await db.insert_text_if_new("p%d" % i, words)
                    assert decision.status == "stored", decision
                    sys.stdout.write("%d\\n" % i)
                    sys.stdout.flush()
            await asyncio.gather(*(task(t) for t in range(32)))

    asyncio.run(main(sys.argv[1]))
""")


def test_every_acknowledged_page_survives_a_sigkill(tmp_path):
    path = str(tmp_path / "db")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True)
    acknowledged = []
    try:
        for line in writer.stdout:
            acknowledged.append(int(line))
            if len(acknowledged) == 400:
                break
        os.kill(writer.pid, signal.SIGKILL)
        acknowledged += [int(line) for line in writer.stdout]  # printed before the kill
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL and len(acknowledged) >= 400
    with simhashdb.DB(path) as db:
        missing = [i for i in acknowledged if "p%d" % i not in db]
        assert missing == [] and db.check() == []
