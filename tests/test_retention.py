"""Retention: every document records when it was stored; expire() forgets the old."""

import datetime

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import simhashdb
from simhashdb import DB, InvalidArgumentError
from simhashdb import batches as db_clock

from conftest import brute_force, store_values

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def clock(monkeypatch):
    """Set the time the DB stores documents at: ``clock.now = t``."""
    class Clock:
        now = 1_000
    monkeypatch.setattr(db_clock, "_now", lambda: Clock.now)
    return Clock


def test_documents_record_when_they_were_stored(db, clock):
    db.insert("a", 1, {"m": 1})
    clock.now = 2_000
    db.insert_many([("b", 2), ("c", 3, None, 1_500),
                    ("d", 4, "x", datetime.datetime(2001, 9, 9, 1, 46, 40,
                                                    tzinfo=datetime.timezone.utc))])
    assert db.get("a") == ("a", 1, {"m": 1}, 1_000)
    assert db.get("b").stored_at == 2_000 and db.get("c").stored_at == 1_500
    assert db.get("d").stored_at == 1_000_000_000
    assert {r.key: r.stored_at for r in db} == {"a": 1_000, "b": 2_000, "c": 1_500,
                                                "d": 1_000_000_000}
    clock.now = 3_000
    db.insert("a", 1, {"m": 2})  # an upsert is a new store
    assert db.get("a") == ("a", 1, {"m": 2}, 3_000)


def test_expire_removes_what_was_stored_before(db, clock):
    for t in (1_000, 2_000, 3_000):
        clock.now = t
        db.insert_many([("%d-%d" % (t, i), t * 100 + i) for i in range(5)])
    assert db.expire(2_000) == 5
    assert sorted({r.stored_at for r in db}) == [2_000, 3_000] and len(db) == 10
    assert db.expire(2_000) == 0
    # times are whole seconds: what was stored in the second before `before` may stay
    assert db.expire(datetime.datetime.fromtimestamp(2_000.5, datetime.timezone.utc)) == 0
    moment = datetime.datetime.fromtimestamp(2_001.5, datetime.timezone.utc)
    assert db.expire(moment, batch_size=3) == 5
    assert len(db) == 5 and db.query(300_000, distance=3)[0].key == "3000-0"
    assert db.check() == []


def test_documents_without_a_stored_time_are_read_and_kept(db, clock):
    """Values of [fingerprint, meta], as earlier versions wrote them."""
    store_values(db, [("old", 7, msgpack.packb([7, {"v": 1}]))])
    db.insert("new", 8)
    assert db.get("old") == ("old", 7, {"v": 1}, None)
    assert db.expire(10**9) == 1 and list(db) == [("old", 7, {"v": 1}, None)]
    clock.now = 5_000
    assert db.insert_if_new("again", 7, refresh=True) == [simhashdb.Match("old", 7, 0)]
    assert db.get("old") == ("old", 7, {"v": 1}, 5_000)
    assert db.check() == []


def test_insert_if_new_refreshes_the_duplicates_it_found_when_asked(db, clock):
    db.insert_many([("a", 0b1111, {"keep": b"\x00", "n": [1, 2.5]}), ("b", 0b0111), ("far", 2**63)])
    clock.now = 5_000
    assert [m.key for m in db.insert_if_new("x", 0b1111)] == ["a", "b"]
    assert db.get("a").stored_at == 1_000  # not asked
    found = db.insert_if_new_many([("y", 0b1110), ("z", 0x00FF00FF00000000)], refresh=True)
    assert [[m.key for m in hits] for hits in found] == [["a", "b"], []]
    assert db.get("a") == ("a", 0b1111, {"keep": b"\x00", "n": [1, 2.5]}, 5_000)
    assert db.get("b").stored_at == 5_000 and db.get("far").stored_at == 1_000
    assert db.get("z").stored_at == 5_000 and db.get("x") is None
    assert db.expire(5_000) == 1 and "far" not in db
    assert db.check() == []


def test_a_refreshed_duplicate_replaced_later_in_the_batch_keeps_its_new_fingerprint(db, clock):
    """A record near "a" is a duplicate; a later record of the same batch
    replaces "a" with a far fingerprint. The refresh stamps "a" as it is
    after the batch, under its new fingerprint (it used to re-store the old
    one beside the new value: an index that disagreed with the documents)."""
    db.insert_many([("a", 0b1111), ("b", 2**40)])
    clock.now = 5_000
    far = 0xF0F0F0F000000000
    found = db.insert_if_new_many([("x", 0b1110), ("a", far), ("y", 0b1101)], refresh=True)
    assert [[m.key for m in hits] for hits in found] == [["a"], [], []]
    assert db.get("a") == ("a", far, None, 5_000)
    assert [m.key for m in db.query(0b1111)] == ["y"] and db.query(far)[0].key == "a"
    assert db.check() == []
    db.insert_many([("a", 3)])  # a later write of "a" finds it where its value says
    assert db.get("a").fingerprint == 3 and db.check() == []


@pytest.mark.parametrize("before", ["yesterday", None, True, float("nan"), float("inf"), [1]])
def test_expire_rejects_what_is_not_a_time(db, before):
    db.insert("a", 1)
    with pytest.raises(InvalidArgumentError, match="datetime or a UNIX time"):
        db.expire(before)
    assert len(db) == 1


def test_a_datetime_no_unix_time_can_say_is_refused(db):
    db.insert("a", 1)
    with pytest.raises(InvalidArgumentError, match="range of UNIX times"):
        db.expire(datetime.datetime.min)
    with pytest.raises(InvalidArgumentError, match="range of UNIX times"):
        db.insert_many([("b", 2), ("c", 3, None, datetime.datetime.min)])
    assert len(db) == 1


@pytest.mark.parametrize("stored_at", ["now", -1, 2.0**64, True])
def test_a_bad_stored_time_is_refused_and_nothing_is_written(db, stored_at):
    with pytest.raises(InvalidArgumentError):
        db.insert_many([("a", 1), ("b", 2, None, stored_at)])
    assert len(db) == 0


@given(times=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 10)), max_size=40),
       cutoff=st.integers(0, 11), batch_size=st.integers(1, 7))
def test_expire_keeps_exactly_what_the_oracle_keeps(tmp_path_factory, times, cutoff,
                                                    batch_size):
    path = str(tmp_path_factory.mktemp("expire") / "e.db")
    with DB(path, distance=3, blocks=5) as db:
        docs = {i: (fp, t) for i, (fp, t) in enumerate(times)}
        db.insert_many([(k, fp, None, t) for k, (fp, t) in docs.items()])
        kept = {k: fp for k, (fp, t) in docs.items() if t >= cutoff}
        assert db.expire(cutoff, batch_size=batch_size) == len(docs) - len(kept)
        assert {r.key: r.fingerprint for r in db} == kept
        for probe in [fp for fp, _ in docs.values()][:5]:
            assert [tuple(m) for m in db.query(probe)] == brute_force(kept, probe, 3)
        assert db.check() == []


@pytest.mark.parametrize("batch_size", [2**63, 2**64, 10**30])
def test_expire_takes_any_batch_size_an_int_can_say(db, clock, batch_size):
    db.insert_many([("a", 1), ("b", 2)])
    assert db.expire(0, batch_size=batch_size) == 0
    assert db.expire(clock.now + 1, batch_size=batch_size) == 2
