"""How long a Redis Cluster primary that hangs (SIGSTOP) or dies (SIGKILL)
stalls simhashdb's calls, and whether any acknowledged batch is lost or any
answer wrong.

A 3-primary, 3-replica cluster on loopback (node timeout 1 s, as the tests'):
a reader thread runs query_many (100 probes, each 2 bits from a stored
fingerprint) and a writer thread insert_many (50 documents a batch), each on
its own handle, while a primary is stopped: in odd trials the primary of the
database's own slot (lock, epoch, pending batch), in even ones another. The
stall of a thread is the longest a call waited counted from the stop
(end - max(begin, stop)); the promotion is when another node first names a
new primary for the stopped one's slots; "new handle" is how long a handle
opened at the stop (its connections all new) took to answer len(). Then the
node is continued, or started again (it rejoins as a replica), and at the
end every acknowledged batch and every answer is checked against the oracle.

Usage: python tools/bench_redis_failover.py [--trials 6] [--fault stop|kill] [--options 'retry=30']
Run it with PYTHONPATH pointing at another checkout to measure that one.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import simhashdb
from simhashdb import _redis

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from redis_cluster import LocalCluster  # noqa: E402


def owner_of(cluster, slot, besides=None):
    """The port of the primary of ``slot``, as the first node but ``besides`` sees it."""
    for port in cluster.ports:
        if port != besides:
            with cluster.client(port) as client:
                for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return int(primary[1])


def open_and_count(url, began, waited):
    """Open ``url``, read len(), and append the time since ``began`` to ``waited``."""
    try:
        with simhashdb.DB(url) as db:
            len(db)
    finally:
        waited.append(time.monotonic() - began)


class Loop(threading.Thread):
    """Calls ``call(i)`` until stopped, keeping (begin, end) of each."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.times, self.done, self.failures = call, [], [], []
        self.stopping = False

    def run(self):
        i = 0
        while not self.stopping:
            begin = time.monotonic()
            try:
                self.call(i)
                self.done.append(i)
            except simhashdb.SimhashDBError as exc:
                self.failures.append((begin, repr(exc)))
            self.times.append((begin, time.monotonic()))
            i += 1

    def stall(self, stopped):
        return max(end - max(begin, stopped) for begin, end in self.times if end > stopped)

    def began_after(self, moment):
        return sum(begin > moment for begin, _ in self.times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--fault", choices=("stop", "kill"), default="stop")
    parser.add_argument("--options", default="", help="URL options, e.g. retry=30")
    args = parser.parse_args()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="failover-")).start()
    try:
        url = cluster.url + "/failover" + ("?" + args.options if args.options else "")
        rng = random.Random(5)
        seeds = {"seed%d" % i: rng.getrandbits(64) for i in range(2000)}
        with simhashdb.DB(url, distance=3, blocks=5) as db:
            db.insert_many(seeds.items())
            keys = db._storage.keys
        meta_slot = _redis.key_slot(keys.params)
        wrong = []
        probes = list(seeds.items())

        reader_db, writer_db = simhashdb.DB(url), simhashdb.DB(url)

        def read(i):
            chosen = [probes[(i * 100 + j) % len(probes)] for j in range(100)]
            found = reader_db.query_many([fp ^ 0b101 << (j % 60) for j, (_, fp) in
                                          enumerate(chosen)])
            for (key, _), matches in zip(chosen, found):
                if [m.key for m in matches] != [key]:
                    wrong.append((key, matches))

        def write(i):
            writer_db.insert_many(("w%d-%d" % (i, j), (i * 1000 + j) * 0x9E3779B97F4A7C15 % 2**64)
                                  for j in range(50))
        seeded = "redis://%s/failover" % ",".join("127.0.0.1:%d" % p for p in cluster.ports)
        print("| trial | stopped | promoted after | read stall | write stall | new handle |")
        print("|---|---|---|---|---|---|")
        reader, writer = Loop(read), Loop(write)
        reader.start()
        writer.start()
        rows = []
        for trial in range(1, args.trials + 1):
            time.sleep(2)
            slot = meta_slot if trial % 2 else (meta_slot + 8192) % 16384
            port = owner_of(cluster, slot)
            stopped = time.monotonic()
            (cluster.pause if args.fault == "stop" else cluster.kill)(port)
            promoted, opened = None, []
            threading.Thread(target=open_and_count, args=(seeded, stopped, opened),
                             daemon=True).start()
            while (reader.began_after(stopped + 0.1) < 2 or writer.began_after(stopped + 0.1) < 2
                   or promoted is None or not opened):
                if promoted is None and owner_of(cluster, slot, port) != port:
                    promoted = time.monotonic() - stopped
                if time.monotonic() - stopped > 120:
                    break
                time.sleep(0.05)
            rows.append((promoted, reader.stall(stopped), writer.stall(stopped),
                         opened[0] if opened else float("nan")))
            print("| %d | %s | %s | %.2f s | %.2f s | %.2f s |" % (
                trial, "own slot" if trial % 2 else "another", "%.2f s" % promoted
                if promoted else "-", *rows[-1][1:]), flush=True)
            if args.fault == "stop":
                cluster.resume(port)
            else:
                cluster.start_node(port)
            cluster.wait_healthy()
        reader.stopping = writer.stopping = True
        reader.join()
        writer.join()
        reader_db.close()
        writer_db.close()
        with simhashdb.DB(url) as db:
            docs = {r.key: r.fingerprint for r in db}
            lost = [i for i in writer.done for j in range(50)
                    if docs.get("w%d-%d" % (i, j)) != (i * 1000 + j) * 0x9E3779B97F4A7C15 % 2**64]
            problems = db.check()
        for name, column in (("read stall", 1), ("write stall", 2), ("new handle", 3)):
            values = [row[column] for row in rows]
            print("%s: median %.2f s, max %.2f s" % (name, statistics.median(values), max(values)))
        print("reads %d (wrong %d), batches acknowledged %d (lost %d), errors %d + %d, check %s"
              % (len(reader.times), len(wrong), len(writer.done), len(lost),
                 len(reader.failures), len(writer.failures), problems or "clean"))
        for failure in reader.failures[:3] + writer.failures[:3]:
            print("  error:", failure[1])
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
