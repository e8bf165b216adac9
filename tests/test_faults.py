"""Storage under faults, on each backend: data that once crashed compaction,
leftover compaction files beside open handles, dead readers behind a
churning writer, damaged data files, many snapshots, dropped handles, fork
children, and SIGKILL during bulk loads and compaction."""

import gc
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import BACKENDS, brute_force

from simhashdb import DB, DatabaseBusyError, DatabaseError, SimhashDBError

MAX = 2**64 - 1
CI = bool(os.environ.get("CI"))
TESTS = os.path.dirname(os.path.abspath(__file__))


def as_tuples(matches):
    return [(m.key, m.fingerprint, m.distance) for m in matches]


def run_forked(body, timeout=60):
    """Run ``body()`` in a forked child; returns (status, its JSON result).
    A signal shows as a negative status, a hang as a failed test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 0
        try:
            result = body()
        except BaseException as exc:  # reported to the parent, which fails on it
            result, code = {"unexpected": "%s: %s" % (type(exc).__name__, exc)}, 3
        os.write(write_end, json.dumps(result).encode())
        os._exit(code)
    os.close(write_end)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the child hung for %ds" % timeout)
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(read_end)
    status = os.waitpid(pid, 0)[1]
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, json.loads(out) if out else None


def spawn(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def template_pages(count, seed=0):
    """``count`` distinct fingerprints that share their top 39 bits, as
    near-identical pages of one site template: blocks 0-2 of a (5, 3) layout
    are equal, so three tables put them all under one 2-byte key and the other
    seven under eight keys."""
    rng = random.Random(seed)
    top = rng.getrandbits(64) & ~((1 << 25) - 1)
    return [top | low for low in rng.sample(range(1 << 25), count)]


# Compaction of data that crashed it (defect 1)

@pytest.mark.usefixtures("backend")
def test_compaction_of_10000_fingerprints_under_one_table_key(tmp_path):
    fps = template_pages(10000)
    docs = {"page%d" % i: fp for i, fp in enumerate(fps)}
    docs.update(("dup%d" % i, fps[i]) for i in range(0, 10000, 97))
    path = str(tmp_path / "template.db")
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(docs.items())
        gone = ["page%d" % i for i in range(0, 10000, 3)]
        db.delete_many(gone)
        for key in gone:
            del docs[key]
        db.compact()
        assert not os.path.exists(os.path.join(path, "data.mdb.compact"))
        assert db.check() == [] and len(db) == len(docs)
        probes = [fps[1], fps[2] ^ 0b101, fps[5] ^ (1 << 40), fps[7] ^ (0b11 << 50)]
        for d in (0, 3, 4):
            assert [as_tuples(m) for m in db.query_many(probes, d)] == \
                [brute_force(docs, p, d) for p in probes]
    # and through the command line, in a process of its own
    done = subprocess.run([sys.executable, "-m", "simhashdb", "compact", path],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with DB(path) as db:
        assert db.check() == [] and {r.key: r.fingerprint for r in db} == docs


# A leftover compaction file beside open handles (defect 2)

HOLDER = """
import sys, simhashdb
db = simhashdb.DB(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
db.close()
print("closed", flush=True)
sys.stdin.read()
"""
COMPACT_ONCE = """
import sys, simhashdb
with simhashdb.DB(sys.argv[1]) as db:
    try:
        db.compact()
        print("compacted")
    except simhashdb.DatabaseBusyError:
        print("busy")
"""


def compact_in_another_process(path):
    done = subprocess.run([sys.executable, "-c", COMPACT_ONCE, path], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.usefixtures("backend")
def test_a_leftover_compaction_file_never_unlocks_a_writer(tmp_path):
    """With a dead compaction's file left behind and another handle open, a
    writer keeps its lock: a later compaction is refused while it is open, and
    no insert it committed is lost."""
    path = str(tmp_path / "leftover.db")
    with DB(path, distance=3, blocks=5) as db:
        db.insert_many(("old%d" % i, i * 7919) for i in range(100))
    leftover = os.path.join(path, "data.mdb.compact")
    with open(leftover, "wb") as f:
        f.write(os.urandom(10000))
    holder = spawn(HOLDER, path)
    try:
        assert holder.stdout.readline().strip() == "open"
        writer = DB(path)  # not alone: the leftover stays, and so does the lock
        try:
            holder.stdin.write("close\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "closed"
            assert compact_in_another_process(path) == "busy"
            writer.insert_many(("new%d" % i, MAX - i) for i in range(100))
            assert compact_in_another_process(path) == "busy"
            writer.insert("last", 5)
        finally:
            writer.close()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert compact_in_another_process(path) == "compacted"
    assert not os.path.exists(leftover)
    with DB(path) as db:
        assert len(db) == 201 and db.get("last").fingerprint == 5
        assert all(db.get("new%d" % i).fingerprint == MAX - i for i in range(100))
        assert db.check() == []
