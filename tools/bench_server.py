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
batches of the round, and the server's latencies (p50, p99) as its clients
saw them.

Usage: python tools/bench_server.py [--pages N] [--clients C] [--rounds R]
"""

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
from bench_aio import awaits, batches, pages, timed

import simhashdb


def served(path, items, clients):
    """(pages/s, p50 s, p99 s) of C clients posting ``items`` to a server of ``path``."""
    server = subprocess.Popen([sys.executable, "-m", "simhashdb", "serve", str(path), "--port",
                               "0"], stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"serving on (\S+)", server.stderr.readline()).group(1)
        return asyncio.run(_post_all(url, items, clients))
    finally:
        server.terminate()
        server.wait()


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
          "| server p50 / p99 ms |\n|---|---|---|---|---|---|---|")
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-server-") as where:
            runs = [("batches", lambda: len(items) / timed(batches, where + "/b", items, options)),
                    ("awaits", lambda: len(items) / timed(awaits, where + "/a", items, options,
                                                          args.clients)),
                    ("server", lambda: served(where + "/s", items, args.clients))]
            rate = {name: run() for name, run in (runs if r % 2 == 0 else runs[::-1])}
        served_rate, p50, p99 = rate["server"]
        print("| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %.1f / %.1f |" % (
            r + 1, rate["batches"], rate["awaits"], rate["awaits"] / rate["batches"],
            served_rate, served_rate / rate["batches"], p50 * 1000, p99 * 1000), flush=True)


if __name__ == "__main__":
    main()
