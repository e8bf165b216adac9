"""simhashdb-cli serve beside the embedded library, on the same pages in the
same run (tools/bench_aio.py's: the standard library's sources as pages of
one site template, then the HTML under /usr/share/doc), each run into a new
database (``DB(path, recipe=simhashdb.RECIPE)``, every commit durable):

- **batches**: ``DB.insert_text_if_new_many(..., html=True)`` in batches of 1,000;
- **awaits**: ``AsyncDB.insert_text_if_new`` from C tasks, in this process;
- **server**: ``simhashdb-cli serve`` in a process of its own, and C clients
  (aiohttp, in this process: a crawler's fetchers on the same machine) each
  posting one page a request to ``/v1/insert-text-if-new``.

The runs alternate, ``--rounds`` times. Prints pages/s, the ratios to the
batches of the round, the server's latencies (p50, p99) as its clients saw
them, and the CPU time a page took (all threads: of this process for the
batches and the awaits; of the server's process while the clients posted,
and of its event loop's thread alone (HTTP, JSON and the grouping of the
calls; the rest is AsyncDB's fingerprinting and commits), and apart of its
clients), which a busy machine sways less than the rates.

Usage: python tools/bench_server.py [--pages N] [--clients C] [--rounds R]
"""

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
from bench_aio import awaits, batches, pages, timed

import simhashdb


def cpu_of(run, *args):
    """(pages/s, CPU s of this process) of ``run(path, items, ...)``."""
    before = time.process_time()
    rate = len(args[1]) / timed(run, *args)
    return rate, time.process_time() - before


def served(path, items, clients):
    """(pages/s, p50 s, p99 s, the server's CPU s, that of its event loop's
    thread, its clients' CPU s) of C clients posting ``items`` to a server
    of ``path``."""
    server = subprocess.Popen([sys.executable, "-m", "simhashdb", "serve", str(path), "--port",
                               "0"], stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"serving on (\S+)", server.stderr.readline()).group(1)
        before, started, looped = (time.process_time(), cpu_seconds(server.pid),
                                   cpu_seconds(server.pid, server.pid))
        outcome = asyncio.run(_post_all(url, items, clients))
        return outcome + (cpu_seconds(server.pid) - started,
                          cpu_seconds(server.pid, server.pid) - looped,
                          time.process_time() - before)
    finally:
        server.terminate()
        server.wait()


def cpu_seconds(pid, thread=None):
    """The CPU time of process ``pid`` so far, all its threads or only
    ``thread`` (Linux's /proc; a process's main thread has its id)."""
    stat = "/proc/%d/stat" % pid if thread is None else "/proc/%d/task/%d/stat" % (pid, thread)
    with open(stat) as read:
        fields = read.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _post_all(url, items, clients):
    latencies = []
    queue = iter(items)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as http:
        async def client():
            for key, text in queue:
                sent = time.perf_counter()
                async with http.post("/v1/insert-text-if-new",
                                     json={"key": key, "text": text, "html": True}) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                latencies.append(time.perf_counter() - sent)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return (len(items) / elapsed, statistics.median(latencies),
            latencies[int(0.99 * (len(latencies) - 1))])


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pages", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    items = pages(args.pages)
    options = {"recipe": simhashdb.RECIPE}
    print("%d pages (%.1f MB of HTML), %d clients and tasks\n" % (
        len(items), sum(len(b) for _, b in items) / 1e6, args.clients))
    print("| round | batches of 1,000 pages/s | awaits pages/s | ratio | server pages/s | ratio "
          "| server p50 / p99 ms | CPU ms a page: batches, awaits, server [its event loop] "
          "(its clients) |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-server-") as where:
            runs = [("batches", lambda: cpu_of(batches, where + "/b", items, options)),
                    ("awaits", lambda: cpu_of(awaits, where + "/a", items, options,
                                              args.clients)),
                    ("server", lambda: served(where + "/s", items, args.clients))]
            got = {name: run() for name, run in (runs if r % 2 == 0 else runs[::-1])}
        (base, base_cpu), (aio, aio_cpu) = got["batches"], got["awaits"]
        rate, p50, p99, server_cpu, loop_cpu, client_cpu = got["server"]
        per_page = 1000 / len(items)
        print("| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %.1f / %.1f | %.2f, %.2f, %.2f [%.2f] "
              "(%.2f) |" % (r + 1, base, aio, aio / base, rate, rate / base, p50 * 1000,
                            p99 * 1000, base_cpu * per_page, aio_cpu * per_page,
                            server_cpu * per_page, loop_cpu * per_page, client_cpu * per_page),
              flush=True)


if __name__ == "__main__":
    main()
