"""A database's layout chosen for its size and the machine's memory: tables
built for a smaller distance than the database's (few tables, each probed at
every prefix within the bits left) stay exact against brute force in every
call that takes the database's distance; the choice is stored and checked."""

import json
import math
import random

import msgpack
import pytest
from conftest import as_tuples, brute_force, flip
from test_multiprobe import adversarial_docs, spread_bits

import simhashdb
from simhashdb import DB, InvalidArgumentError, ParameterMismatchError
from simhashdb.layout import Layout

GIB = 1 << 30


def table_bytes(layout, n):
    return layout.tables * n * ((66 - math.log2(n)) / 8 + 0.5)


@pytest.mark.parametrize("distance", [1, 2, 3, 4])
def test_small_databases_keep_a_table_per_choice_of_blocks(distance):
    for n in (10**4, 10**6, 10**7):
        layout = Layout.choose(distance, n, memory=24 * GIB)
        assert layout.distance == distance
        assert layout.blocks == Layout.choose_blocks(distance, n)


@pytest.mark.parametrize("distance", [2, 3, 4])
def test_big_databases_get_fewer_tables_where_a_table_per_choice_would_not_fit(distance):
    manku = Layout(Layout.choose_blocks(distance, 10**9), distance)
    outgrown = 0
    for memory in (24 * GIB, 64 * GIB, 1 << 50):  # room for two tables of 10**9 at least
        layout = Layout.choose(distance, 10**9, memory=memory)
        if table_bytes(manku, 10**9) <= memory / 2:
            assert (layout.blocks, layout.distance) == (manku.blocks, distance)
        else:
            outgrown += 1
            assert layout.distance < distance and layout.tables < manku.tables
            assert table_bytes(layout, 10**9) <= memory / 2
    assert outgrown


def test_a_fixed_table_distance_chooses_the_blocks_alone():
    layout = Layout.choose(3, 10**6, memory=24 * GIB, table_distance=1)
    assert layout.distance == 1 and layout.probes_per_table(3) <= 1 << 16


@pytest.mark.parametrize("blocks,table_distance,distance", [(2, 1, 3), (4, 2, 3), (3, 1, 2)])
def test_a_database_of_narrower_tables_is_exact_at_its_distance(tmp_path, backend, blocks,
                                                               table_distance, distance):
    layout = Layout(blocks, table_distance)
    bases, docs = adversarial_docs(layout, blocks + distance, crowd=400)
    for i, base in enumerate(bases):  # exactly the distance and one more, spread the worst way
        for n in (distance, distance + 1):
            docs["wide%d-%d" % (i, n)] = flip(base, spread_bits(layout, n, i + 1))
    stored = dict(list(docs.items())[::2])
    path = str(tmp_path / "narrow.db")
    with DB(path, distance=distance, blocks=blocks, table_distance=table_distance) as db:
        assert (db.distance, db.table_distance, db.blocks) == (distance, table_distance, blocks)
        assert db.tables == math.comb(blocks, table_distance)
        db.insert_many(stored.items(), batch_size=300)
        probes = list(docs.values())[1::2][:80] + \
            [flip(b, spread_bits(layout, distance, s)) for s, b in enumerate(bases)]
        assert [as_tuples(m) for m in db.query_many(probes)] == \
            [brute_force(stored, p, distance) for p in probes]
        assert as_tuples(db.query(probes[0])) == brute_force(stored, probes[0], distance)
        pairs = sorted(tuple(sorted((p.key_a, p.key_b), key=str)) for p in db.find_all())
        want = sorted(tuple(sorted((a, b), key=str)) for a, b in
                      ((a, b) for a in stored for b in stored if str(a) < str(b)
                       and (stored[a] ^ stored[b]).bit_count() <= distance))
        assert pairs == want
        rng = random.Random(7)
        offered = [("new%d" % j, flip(b, rng.sample(range(64), distance + j % 2)))
                   for j, b in enumerate(bases * 3)]
        expected = []
        for key, fp in offered:
            expected.append(brute_force(stored, fp, distance))
            if not expected[-1]:
                stored[key] = fp
        assert [as_tuples(m) for m in db.insert_if_new_many(offered, batch_size=7)] == expected
        assert any(expected) and not all(expected)
        assert db.stats()["table_distance"] == table_distance and db.check() == []
    with DB(path) as db:  # reopened: the stored choice
        assert (db.distance, db.table_distance, db.blocks) == (distance, table_distance, blocks)
        assert {r.key: r.fingerprint for r in db} == stored
    with pytest.raises(ParameterMismatchError, match="table_distance"):
        DB(path, table_distance=distance)


def test_the_choice_follows_the_machines_memory(tmp_path, monkeypatch):
    monkeypatch.setattr("simhashdb.layout.physical_memory", lambda: 400 << 20)
    rng = random.Random(3)
    docs = {i: rng.getrandbits(64) for i in range(3000)}
    docs.update(("near%d" % i, flip(docs[i], rng.sample(range(64), 3))) for i in range(50))
    with DB(str(tmp_path / "small-machine.db"), expected_size=10**7) as db:
        assert db.distance == 3 and db.table_distance < 3
        db.insert_many(docs.items())
        probes = list(docs.values())[:200]
        assert [as_tuples(m) for m in db.query_many(probes)] == \
            [brute_force(docs, p, 3) for p in probes]


def test_bad_table_distances_are_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="table_distance must be at most distance"):
        DB(str(tmp_path / "a"), distance=2, table_distance=3)
    with pytest.raises(InvalidArgumentError, match="table_distance"):
        DB(str(tmp_path / "b"), table_distance=-1)
    with pytest.raises(InvalidArgumentError, match="table_distance"):
        DB(str(tmp_path / "c"), table_distance="1")
    with pytest.raises(InvalidArgumentError, match="prefixes per table"):
        DB(str(tmp_path / "d"), distance=12, blocks=2, table_distance=1)
    with pytest.raises(InvalidArgumentError, match="ask for a larger table distance"):
        DB(str(tmp_path / "e"), distance=4, table_distance=0)  # no block count serves it
    with pytest.raises(InvalidArgumentError, match="more than the distance the tables"):
        DB(str(tmp_path / "f"), distance=3, blocks=2)
    assert not any((tmp_path / name).exists() for name in "abcdef")


def test_a_database_of_format_5_is_upgraded_to_tables_built_for_its_distance(tmp_path):
    from conftest import documents_as_in_format_6
    path = str(tmp_path / "five.db")
    with DB(path, distance=2, blocks=4, backend="py-lmdb") as db:
        db.insert_many([(1, 5), (2, 5 ^ 0b11)])
    documents_as_in_format_6(path, format=5)
    storage = simhashdb.storage.registry.open_storage(path, backend="py-lmdb")
    try:
        def without_table_distance(txn):
            params = msgpack.unpackb(txn.params())
            del params["table_distance"]
            txn.set_params(msgpack.packb(params))
        storage.write(without_table_distance)
    finally:
        storage.close()
    simhashdb.upgrade(path)
    with DB(path) as db:
        assert (db.distance, db.table_distance, db.tables) == (2, 2, 6)
        assert db.stats()["format"] == simhashdb.db.FORMAT_VERSION == 11
        assert [m.key for m in db.query(5)] == [1, 2]


def test_the_cli_makes_and_exports_a_database_of_narrower_tables(tmp_path, capsys):
    from test_cli import run
    path, copy = tmp_path / "db", tmp_path / "copy"
    assert run(capsys, "init", path, "--distance", 3, "--blocks", 2, "--table-distance", 1)[0] == 0
    with DB(str(path)) as db:
        db.insert(7, 1)
    code, out, _ = run(capsys, "stats", path)
    assert code == 0 and (out[0]["distance"], out[0]["table_distance"], out[0]["tables"]) == (3, 1, 2)
    code, out, _ = run(capsys, "export", path)
    exported = tmp_path / "export.jsonl"
    exported.write_text("".join(json.dumps(line) + "\n" for line in out))
    assert run(capsys, "import", copy, exported)[0] == 0
    with DB(str(copy), readonly=True) as db:
        assert (db.distance, db.table_distance, db.blocks) == (3, 1, 2)
        assert [m.key for m in db.query(1 ^ 0b111)] == [7]


@pytest.mark.lmdb_only
def test_relayout_builds_the_tables_again_and_keeps_every_document(tmp_path, backend):
    rng = random.Random(5)
    docs = {i: rng.getrandbits(64) for i in range(4000)}
    docs.update(("near%d" % i, flip(docs[i], rng.sample(range(64), 3 + i % 2))) for i in range(300))
    path = str(tmp_path / "re.db")
    with DB(path, distance=3, blocks=5, backend=backend, recipe=simhashdb.RECIPE) as db:
        db.insert_many(docs.items(), batch_size=700)
        db.insert_text_many([("t1", "the quick brown fox jumps over the lazy dog " * 20),
                             ("t2", "the quick brown fox jumps over the lazy cat " * 20)])
        db.delete_many(range(0, 4000, 9))
        left = {r.key: r.fingerprint for r in db}
        texts = db.query_text("the quick brown fox jumps over the lazy dog " * 20)
        assert [m.key for m in texts] == ["t1"] + ["t2"] * (len(texts) == 2)
    assert simhashdb.relayout(path, blocks=2, table_distance=1, backend=backend) == \
        {"blocks": 2, "table_distance": 1, "tables": 2}
    with DB(path, backend=backend) as db:
        assert (db.distance, db.table_distance, db.tables) == (3, 1, 2)
        assert {r.key: r.fingerprint for r in db} == left and db.check() == []
        probes = [left["near%d" % i] for i in range(0, 300, 7)] + [rng.getrandbits(64)]
        assert [as_tuples(m) for m in db.query_many(probes)] == \
            [brute_force(left, p, 3) for p in probes]
        assert db.query_text("the quick brown fox jumps over the lazy dog " * 20) == texts
    # back to the choice for its size: a table per choice of 3 blocks
    assert simhashdb.relayout(path, backend=backend)["table_distance"] == 3
    with DB(path, backend=backend) as db:
        assert db.blocks == Layout.choose_blocks(3, len(left))
        assert [as_tuples(m) for m in db.query_many(probes)] == \
            [brute_force(left, p, 3) for p in probes]
        assert db.check() == []


def test_relayout_needs_the_database_to_itself_and_a_layout_it_can_take(tmp_path, backend):
    path = str(tmp_path / "busy.db")
    with DB(path) as db:
        db.insert(1, 5)
        with pytest.raises(simhashdb.DatabaseBusyError if backend != "redis" else
                           simhashdb.DatabaseError):
            simhashdb.relayout(path, blocks=2, table_distance=1)
    with pytest.raises(InvalidArgumentError, match="table_distance"):
        simhashdb.relayout(path, table_distance=4)
    with pytest.raises(InvalidArgumentError, match="blocks"):
        simhashdb.relayout(path, blocks="2")
    with DB(path) as db:
        assert db.table_distance == 3 and db.query(5)[0].key == 1
    if backend == "redis":
        with pytest.raises(simhashdb.DatabaseError, match="export the database and import it"):
            simhashdb.relayout(path, blocks=2, table_distance=1)


RELAYOUTS = """
import sys, simhashdb
while True:
    for blocks, table_distance in ((2, 1), (6, 3), (4, 2)):
        simhashdb.relayout(sys.argv[1], blocks=blocks, table_distance=table_distance)
        print(blocks, flush=True)
"""


@pytest.mark.lmdb_only
def test_sigkill_during_relayouts_leaves_one_whole_layout(db_path, backend):
    from test_durability import batch_records, run_and_kill
    with DB(db_path, distance=3, blocks=5) as db:
        for i in range(8):
            db.insert_many(batch_records(i))
        docs = {r.key: r.fingerprint for r in db}
    rng = random.Random(13)
    layouts = set()
    for _ in range(5):
        run_and_kill(RELAYOUTS, [db_path], 1, rng.uniform(0, 0.6))  # after one relayout
        with DB(db_path) as db:
            layouts.add((db.blocks, db.table_distance))
            assert db.distance == 3 and db.check() == []
            assert {r.key: r.fingerprint for r in db} == docs
            probes = [docs["b3-%d" % j] ^ 0b1011 for j in range(0, 1500, 100)]
            assert [as_tuples(m) for m in db.query_many(probes)] == \
                [brute_force(docs, p, 3) for p in probes]
    assert layouts <= {(2, 1), (6, 3), (4, 2)}


def test_the_documents_share_the_memory_the_tables_leave():
    """At 100M on 24 GiB, twenty tables would fit half the memory alone but
    leave the documents (95 bytes each, read by every write and hit) on the
    disk: fewer tables are chosen, and the twenty where memory is ample."""
    roomy = Layout.choose(3, 10**8, memory=1 << 50)
    tight = Layout.choose(3, 10**8, memory=24 * GIB)
    assert table_bytes(roomy, 10**8) <= 12 * GIB
    assert tight.tables < roomy.tables == 20 and tight.distance == 3
