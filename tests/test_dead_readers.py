"""A reader killed while it holds a snapshot does not make the file grow: the
writer clears dead readers' slots, so their snapshots keep no freed page
from reuse."""

import os
import random
import signal
import subprocess
import sys

import pytest

from simhashdb import DB
from simhashdb.storage.lmdb.files import LmdbStorage

pytestmark = pytest.mark.lmdb_only

DOCUMENTS, BATCHES, BATCH = 20_000, 12, 4_000

HOLD_A_SNAPSHOT = """
import sys, time
from simhashdb import DB
db = DB(sys.argv[1], readonly=True)
records = iter(db)  # an unfinished iteration holds its snapshot
next(records)
print("holding", flush=True)
time.sleep(600)
"""


def file_growth(path, dead_reader):
    """The bytes the data file grows by under batches of upserts, with or
    without a reader killed (SIGKILL) while it held a snapshot."""
    rng = random.Random(45)
    with DB(path, distance=3) as db:
        db.insert_many((key, rng.getrandbits(64)) for key in range(DOCUMENTS))
    with DB(path) as db:
        db.insert(0, rng.getrandbits(64))  # a first commit: reader slots were just swept
        if dead_reader:
            reader = subprocess.Popen([sys.executable, "-c", HOLD_A_SNAPSHOT, path],
                                      stdout=subprocess.PIPE, text=True)
            assert reader.stdout.readline() == "holding\n"
            os.kill(reader.pid, signal.SIGKILL)
            reader.wait()
            reader.stdout.close()
        before = os.path.getsize(os.path.join(path, "data.mdb"))
        for _ in range(BATCHES):
            db.insert_many((rng.randrange(DOCUMENTS), rng.getrandbits(64)) for _ in range(BATCH))
        return os.path.getsize(os.path.join(path, "data.mdb")) - before


def test_a_killed_reader_does_not_make_the_file_grow(tmp_path, backend, monkeypatch):
    # not the once-a-second sweep: the writer must find the dead reader itself
    monkeypatch.setattr(LmdbStorage, "reader_check_seconds", 3600.0)
    alone = file_growth(str(tmp_path / "alone"), dead_reader=False)
    behind_a_dead_reader = file_growth(str(tmp_path / "dead"), dead_reader=True)
    assert behind_a_dead_reader <= 1.5 * alone + (1 << 20), (behind_a_dead_reader, alone)
