"""A damaged run answers right or raises: a block lost from its run (a bit of
its key's run id flipped) or holding another count of entries (a bit of its
value's header flipped) is a DatabaseError naming check(), never a silently
wrong answer, on both LMDB backends."""

import random

import lmdb
import pytest

from conftest import brute_force

from simhashdb import DB, DatabaseError
from simhashdb.storage.lmdb import format as lmdb_format

pytestmark = pytest.mark.lmdb_only

DOCUMENTS, PROBES = 20_000, 4_000


def damage_a_block(path, where):
    """Flip one bit of a block in the middle of table 0's run: in its key's
    run id, or in its value's count of entries."""
    env = lmdb.open(path, max_dbs=lmdb_format.max_dbs(256))
    with env.begin(write=True) as txn:
        directory = env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn, create=False)
        [(run, slot, entries)] = lmdb_format.directory_runs(
            txn.get(lmdb_format.directory_key(0), db=directory))
        blocks = env.open_db(lmdb_format.TABLE_RUNS.name(0, slot), txn=txn, create=False)
        key, value = list(txn.cursor(blocks).iternext())[entries // 800]
        assert key[:4] == run.to_bytes(4, "big")
        txn.delete(key, db=blocks)
        if where == "run id":
            key = bytes([key[0] ^ 0x40]) + key[1:]
        else:
            value = bytes([value[0] ^ 0x01]) + value[1:]
        txn.put(key, value, db=blocks)
    env.close()


@pytest.mark.parametrize("where", ["run id", "count"])
def test_a_damaged_run_answers_right_or_raises(tmp_path, backend, where):
    rng = random.Random(452)
    docs = {key: rng.getrandbits(64) for key in range(DOCUMENTS)}
    path = str(tmp_path / "db")
    with DB(path, distance=3) as db:
        db.insert_many(docs.items())
    damage_a_block(path, where)
    stored = list(docs.values())
    # 3 bits flipped: many such probes have their match in one table alone
    probes = [stored[rng.randrange(DOCUMENTS)] ^ sum(1 << bit for bit in rng.sample(range(64), 3))
              for _ in range(PROBES)]
    with DB(path, readonly=True) as db:
        try:
            found = db.query_many(probes)
        except DatabaseError as exc:
            assert "check()" in str(exc)
            assert db.check()  # which finds the damage too
        else:
            assert [sorted((m.key, m.fingerprint, m.distance) for m in hits) for hits in found] \
                == [sorted(brute_force(docs, probe, 3)) for probe in probes]
