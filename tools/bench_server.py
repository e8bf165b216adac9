"""simhashdb-cli serve beside the embedded library, on the same pages in the
same run (tools/bench_aio.py's: the standard library's sources as pages of
one site template, then the HTML under /usr/share/doc), each run into a new
database (``DB(path, recipe=simhashdb.RECIPE)``, every commit durable):

- **batches**: ``DB.insert_text_if_new_many(..., html=True)`` in batches of 1,000;
- **awaits**: ``AsyncDB.insert_text_if_new`` from C tasks, in this process;
- **server**: ``simhashdb-cli serve --workers W`` (its own processes), and C
  clients in this process (a crawler's fetchers on the same machine, sharing
  its cores) each posting one page a request to ``/v1/insert-text-if-new``:
  ``aiohttp``'s client, or ``lean`` ones (one keep-alive connection each,
  writing requests encoded before the clock starts, as a crawler in another
  language spends its own CPU on them, and reading the answers' bytes).

The runs alternate, ``--rounds`` times. Prints pages/s, the ratios to the
batches of the round (and at the end each run's median ratio), the server's latencies (p50, p99) as its clients saw
them, and the CPU time a page took (all threads: of this process for the
batches and the awaits; of the server's processes while the clients posted,
and of their event loops' threads alone (HTTP, JSON and the grouping of the
calls; the rest is AsyncDB's fingerprinting and commits); and apart, of the
clients), which a busy machine sways less than the rates.

Usage: python tools/bench_server.py [--pages N] [--clients C] [--rounds R]
       [--workers 1,2] [--client aiohttp,lean]
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

import aiohttp
from bench_aio import awaits, batches, pages, timed

import simhashdb


def cpu_of(run, *args):
    """(pages/s, CPU s of this process) of ``run(path, items, ...)``."""
    before = time.process_time()
    rate = len(args[1]) / timed(run, *args)
    return rate, time.process_time() - before


def served(path, items, clients, workers, client):
    """(pages/s, p50 s, p99 s, the server's CPU s, that of its event loops'
    threads, its clients' CPU s) of C clients posting ``items`` to a server
    of ``path`` with ``workers`` processes."""
    server = subprocess.Popen([sys.executable, "-m", "simhashdb", "serve", str(path), "--port",
                               "0", "--workers", str(workers)], stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"serving on (\S+)", server.stderr.readline()).group(1)
        loops = [server.pid] + children(server.pid) if workers > 1 else [server.pid]
        requests = [lean_request(url, key, text) for key, text in items] if client == "lean" \
            else items
        before, started, looped = (time.process_time(), cpu_seconds(loops),
                                   cpu_seconds(loops, main_thread=True))
        outcome = asyncio.run((_lean_post_all if client == "lean" else _post_all)(
            url, requests, clients))
        return outcome + (cpu_seconds(loops) - started,
                          cpu_seconds(loops, main_thread=True) - looped,
                          time.process_time() - before)
    finally:
        server.terminate()
        server.wait()


def children(pid):
    """The ids of process ``pid``'s children (Linux's /proc)."""
    with open("/proc/%d/task/%d/children" % (pid, pid)) as read:
        return [int(child) for child in read.read().split()]


def cpu_seconds(pids, main_thread=False):
    """The CPU time of processes ``pids`` so far, all their threads or only
    their main ones (Linux's /proc; a process's main thread has its id)."""
    total = 0
    for pid in pids:
        stat = "/proc/%d/task/%d/stat" % (pid, pid) if main_thread else "/proc/%d/stat" % pid
        with open(stat) as read:
            fields = read.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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
        return await _clients(client, clients, latencies, len(items))


def lean_request(url, key, text):
    """The bytes of one keep-alive POST of a page to ``url``'s server."""
    body = json.dumps({"key": key, "text": text, "html": True}).encode()
    return (b"POST /v1/insert-text-if-new HTTP/1.1\r\nHost: %s\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (urllib.parse.urlsplit(url).netloc.encode(), len(body), body))


async def _lean_post_all(url, requests, clients):
    latencies = []
    queue = iter(requests)
    address = urllib.parse.urlsplit(url)

    async def client():
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        for request in queue:
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            await reader.readexactly(int(re.search(rb"Content-Length: (\d+)", head).group(1)))
            latencies.append(time.perf_counter() - sent)
        writer.close()
    return await _clients(client, clients, latencies, len(requests))


async def _clients(client, count, latencies, pages):
    """(pages/s, p50 s, p99 s) of ``count`` ``client()`` tasks."""
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(count)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return (pages / elapsed, statistics.median(latencies),
            latencies[int(0.99 * (len(latencies) - 1))])


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pages", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", default="1,2", help="the server's workers, a list")
    parser.add_argument("--client", default="aiohttp,lean", help="the clients: aiohttp, lean")
    args = parser.parse_args()
    items = pages(args.pages)
    options = {"recipe": simhashdb.RECIPE}
    servers = [(int(workers), client) for workers in args.workers.split(",")
               for client in args.client.split(",")]
    print("%d pages (%.1f MB of HTML), %d clients and tasks, %d cores; load average %.1f\n" % (
        len(items), sum(len(b) for _, b in items) / 1e6, args.clients, os.cpu_count(),
        os.getloadavg()[0]))
    print("| round | run | pages/s | ratio to the batches | p50 / p99 ms | CPU ms a page "
          "[event loops] | clients' CPU ms a page |\n|---|---|---|---|---|---|---|")
    per_page = 1000 / len(items)
    ratios = {}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-server-") as where:
            runs = [("batches of 1,000", lambda: cpu_of(batches, where + "/b", items, options)),
                    ("%d tasks awaiting" % args.clients, lambda: cpu_of(
                        awaits, where + "/a", items, options, args.clients))]
            runs += [("server, %d worker%s, %s clients" % (w, "s" * (w > 1), client),
                      lambda w=w, client=client: served("%s/s%d%s" % (where, w, client), items,
                                                        args.clients, w, client))
                     for w, client in servers]
            got = dict((name, run()) for name, run in (runs if r % 2 == 0 else runs[::-1]))
        base = got["batches of 1,000"][0]
        for name, outcome in got.items():
            rate, cpu = outcome[0], outcome[-1] if len(outcome) == 2 else outcome[3]
            ratios.setdefault(name, []).append(rate / base)
            latency = loops = clients = "-"
            if len(outcome) > 2:
                latency = "%.1f / %.1f" % (outcome[1] * 1000, outcome[2] * 1000)
                loops = " [%.2f]" % (outcome[4] * per_page)
                clients = "%.2f" % (outcome[5] * per_page)
            print("| %d | %s | %.0f | %.2f | %s | %.2f%s | %s |" % (
                r + 1, name, rate, rate / base, latency, cpu * per_page,
                "" if loops == "-" else loops, clients), flush=True)
    print("\nmedian ratios to the batches of their round: " + "; ".join(
        "%s %.2f (%d of %d rounds >= 0.60)" % (name, statistics.median(each),
                                               sum(ratio >= 0.6 for ratio in each), len(each))
        for name, each in ratios.items() if not name.startswith("batches")))


if __name__ == "__main__":
    main()
