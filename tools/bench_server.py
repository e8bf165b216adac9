"""simhashdb-cli serve against the embedded library, on the same pages in the
same run: N pages (the standard library's modules as HTML pages, the first
16 KB of each, in one site template) decided by

- **embedded**: ``DB.insert_text_if_new_many(..., html=True)`` in batches of
  1,000, one process;
- **server**: ``simhashdb-cli serve`` in a process of its own, and C clients
  (aiohttp, in this process: a crawler's fetchers on the same machine) each
  posting one page a request to ``/v1/insert-text-if-new``.

Each into a new database. Prints pages/s, the server's share of the embedded
rate, and the server's latencies (p50, p99) as the clients saw them.

Usage: python tools/bench_server.py [--pages N] [--clients C] [--repeat R]
"""

import argparse
import asyncio
import html
import pathlib
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import aiohttp

import simhashdb

TEMPLATE = ("<html><head><title>%s</title></head><body><nav><a href='/'>Home</a></nav>"
            "<main><pre>%s</pre></main><footer>the standard library</footer></body></html>")


def pages(n):
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        text = path.read_text("utf-8", errors="replace")[:16_384]
        if len(text) > 2000 and "site-packages" not in path.parts:
            name = path.relative_to(stdlib).as_posix()
            found.append(("https://example.org/" + name, TEMPLATE % (name, html.escape(text))))
        if len(found) == n:
            break
    return found


def embedded(path, docs, batch=1000):
    with simhashdb.DB(path) as db:
        start = time.perf_counter()
        for i in range(0, len(docs), batch):
            db.insert_text_if_new_many(docs[i:i + batch], html=True)
        return len(docs) / (time.perf_counter() - start)


def served(path, docs, clients):
    server = subprocess.Popen([sys.executable, "-m", "simhashdb", "serve", str(path), "--port",
                               "0"], stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"serving on (\S+)", server.stderr.readline()).group(1)
        return asyncio.run(_post_all(url, docs, clients))
    finally:
        server.terminate()
        server.wait()


async def _post_all(url, docs, clients):
    latencies = []
    queue = iter(docs)
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
    return (len(docs) / elapsed, statistics.median(latencies),
            latencies[int(0.99 * (len(latencies) - 1))])


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    docs = pages(args.pages)
    print("%d pages of %.1f KB on average, %d clients\n" % (
        len(docs), sum(len(t) for _, t in docs) / len(docs) / 1024, args.clients))
    print("| run | embedded, batches of 1,000 (pages/s) | server (pages/s) | server / embedded "
          "| server p50 (ms) | server p99 (ms) |\n|---|---|---|---|---|---|")
    for run in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-server-") as where:
            base = embedded(where + "/embedded.db", docs)
            rate, p50, p99 = served(where + "/served.db", docs, args.clients)
        print("| %d | %.0f | %.0f | %.2f | %.1f | %.1f |"
              % (run + 1, base, rate, rate / base, p50 * 1000, p99 * 1000), flush=True)


if __name__ == "__main__":
    main()
