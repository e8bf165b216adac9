"""Per-page calls against batches on the same pages: simhashdb.aio.AsyncDB's
insert_text_if_new awaited by 64 concurrent tasks, one page a call, beside
DB.insert_text_if_new_many in batches of 1,000 (the target: the awaits reach
70% of the batches' rate), and the sync per-page call, from one thread and
from 8 threads (what grouping the threads' calls could gain).

Each run stores the same pages, in the same order, into a new database
(``DB(path, recipe=simhashdb.RECIPE)``, every commit durable): the Python
standard library's source files, each as a page of one site template, and
the HTML under /usr/share/doc. Each round runs the batches and the awaits
next to each other (their order alternates), then the sync runs; the table
gives each run's pages/s and its ratio to the batches of its round, and the
median of the awaits' ratios (the machine is shared: pairs, not rates).

Usage: python tools/bench_aio.py [--pages 6000] [--single 1500] [--rounds 3]
       [--tasks 64] [--backend lmdb]
"""

import argparse
import asyncio
import html
import itertools
import pathlib
import statistics
import sysconfig
import tempfile
import threading
import time

import simhashdb
from simhashdb.aio import AsyncDB

TEMPLATE = ("<!DOCTYPE html><html><head><title>%s</title></head><body><nav><a href='/'>Home"
            "</a> | <a href='/index'>Index</a></nav><main><pre>%s</pre></main><footer>"
            "Served by the bench</footer></body></html>")


def pages(n):
    """n (url, html) pages: the stdlib's sources in a template, then /usr/share/doc's HTML."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    sources = (p for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts)
    found = []
    for path in itertools.chain(sources, sorted(pathlib.Path("/usr/share/doc").rglob("*.html"))):
        try:
            body = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if path.suffix == ".py":
            body = TEMPLATE % (path.name, html.escape(body))
        found.append(("https://example.org%s" % path, body))
        if len(found) == n:
            break
    return found


def batches(path, items, options, batch=1000):
    with simhashdb.DB(path, **options) as db:
        for start in range(0, len(items), batch):
            db.insert_text_if_new_many(items[start:start + batch], html=True)


def awaits(path, items, options, tasks):
    async def run():
        async with AsyncDB(path, **options) as db:
            queue = iter(items)

            async def task():
                for url, body in queue:
                    await db.insert_text_if_new(url, body, html=True)

            await asyncio.gather(*(task() for _ in range(tasks)))

    asyncio.run(run())


def one_thread(path, items, options):
    with simhashdb.DB(path, **options) as db:
        for url, body in items:
            db.insert_text_if_new(url, body, html=True)


def threads(path, items, options, count=8):
    with simhashdb.DB(path, **options) as db:
        queue, lock = iter(items), threading.Lock()

        def work():
            while True:
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                db.insert_text_if_new(*item, html=True)

        workers = [threading.Thread(target=work) for _ in range(count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


def timed(run, *args):
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=6000, help="pages a run of the batches "
                        "and of the awaits stores")
    parser.add_argument("--single", type=int, default=1500, help="pages a sync per-page run "
                        "stores (each its own durable commit; 0: no sync runs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--backend", default=None, help="lmdb (default), py-lmdb, ...")
    args = parser.parse_args()
    items = pages(args.pages)
    single = items[:args.single]
    options = {"recipe": simhashdb.RECIPE, "backend": args.backend}
    print("%d pages (%.1f MB of HTML), %d for the sync per-page runs; backend %s"
          % (len(items), sum(len(b) for _, b in items) / 1e6, len(single),
             args.backend or "default"))
    print("\n| round | batches of 1,000 pages/s | %d tasks awaiting pages/s | ratio | "
          "sync, 1 thread pages/s | ratio | sync, 8 threads pages/s | ratio |" % args.tasks)
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-aio-") as where:
            rate = {}
            runs = [("batch", batches, items), ("aio", awaits, items)]
            runs += [("sync", one_thread, single), ("threads", threads, single)] if single else []
            for name, run, given in runs if r % 2 == 0 else runs[1::-1] + runs[:1:-1]:
                extra = (args.tasks,) if name == "aio" else ()
                rate[name] = len(given) / timed(run, "%s/%s" % (where, name), given, options,
                                                *extra)
        ratios.append(rate["aio"] / rate["batch"])
        print("| %d | %.0f | %.0f | %.2f | %s |" % (
            r + 1, rate["batch"], rate["aio"], ratios[-1], " | ".join(
                "%.0f | %.2f" % (rate[name], rate[name] / rate["batch"]) if name in rate
                else "- | -" for name in ("sync", "threads"))))
    print("\nawaits / batches: median %.2f, %d of %d rounds >= 0.70"
          % (statistics.median(ratios), sum(ratio >= 0.7 for ratio in ratios), len(ratios)))


if __name__ == "__main__":
    main()
