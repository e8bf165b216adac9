"""Every outcome of the *_if_new calls as a Decision (stored, unchanged,
duplicate, invalid) on every backend, and batches with invalid records:
reported, or raised with nothing of the batch written."""

import random

import pytest

import simhashdb
from simhashdb import (Decision, InvalidArgumentError, InvalidFingerprintError,
                       InvalidKeyError, Match)

FAR = [0xFFFF << s for s in (48, 32, 16, 0)]  # 16+ bits from each other


def page(seed, words=300):
    rng = random.Random(seed)
    return " ".join("w%d" % rng.randrange(5000) for _ in range(words))


@pytest.fixture
def text_db(db_path, backend):
    with simhashdb.DB(db_path, recipe=simhashdb.RECIPE, backend=backend) as database:
        yield database


def statuses(decisions):
    return [(d.key, d.status) for d in decisions]


def test_every_outcome_of_insert_if_new(db):
    first = db.insert_if_new("a", FAR[0], {"v": 1})
    assert isinstance(first, Decision) and first == [] and first.reason is None
    assert (first.key, first.status, first.replaced) == ("a", "stored", None)
    again = db.insert_if_new("a", FAR[0], {"v": 2})
    assert again.status == "unchanged" and again == [Match("a", FAR[0], 0)]
    changed = db.insert_if_new("a", FAR[0] ^ 0b11)  # a little changed, near nothing else
    assert changed.status == "unchanged" and changed == [Match("a", FAR[0], 2)]
    copy = db.insert_if_new("b", FAR[0] ^ 1)
    assert copy.status == "duplicate" and copy == [Match("a", FAR[0], 1)]
    db.insert("c", FAR[1])
    moved = db.insert_if_new("c", FAR[0] ^ 1)  # far from its own stored version, near a
    assert moved.status == "duplicate" and moved == [Match("a", FAR[0], 1)]
    rewritten = db.insert_if_new("c", FAR[2])  # far from everything: replaces its own
    assert rewritten.status == "stored" and rewritten.replaced[:2] == ("c", FAR[1])
    assert db.get("a").meta == {"v": 1} and "b" not in db and db.check() == []


def test_an_identical_own_version_is_unchanged_among_other_near_duplicates(db):
    db.insert_many([("a", FAR[0]), ("b", FAR[0] ^ 1)])
    found = db.insert_if_new("a", FAR[0])
    assert found.status == "unchanged" and [m.key for m in found] == ["a", "b"]
    found = db.insert_if_new("a", FAR[0] ^ 0b11)  # own at 2, b at 1: another key's copy
    assert found.status == "duplicate" and [m.key for m in found] == ["b", "a"]


def test_a_batch_reports_each_invalid_record_and_stores_the_valid_ones(db):
    records = [("a", FAR[0]), ("bad-fp", 2**64), ("b", FAR[1]), (["list key"], 5),
               "not a record", ("c", FAR[0] ^ 1), ("meta", FAR[2], {1, 2}), ("a", FAR[0])]
    decisions = db.insert_if_new_many(records)
    assert statuses(decisions) == [
        ("a", "stored"), ("bad-fp", "invalid"), ("b", "stored"), (["list key"], "invalid"),
        (None, "invalid"), ("c", "duplicate"), ("meta", "invalid"), ("a", "unchanged")]
    assert all(d.reason and d == [] for d in decisions if d.status == "invalid")
    assert "2**64" in decisions[1].reason or "[0, 2**64)" in decisions[1].reason
    assert {r.key for r in db} == {"a", "b"} and db.check() == []


def test_a_batch_that_raises_names_the_key_and_writes_nothing_of_it(db):
    db.insert_if_new_many([("a", FAR[0])], batch_size=1)
    with pytest.raises(InvalidFingerprintError, match="key 'bad'"):
        db.insert_if_new_many([("b", FAR[1]), ("bad", -1), ("c", FAR[2])], invalid="raise")
    with pytest.raises(InvalidKeyError, match="record 1 of the batch"):
        db.insert_if_new_many([("b", FAR[1]), (1.5, 1)], invalid="raise")
    with pytest.raises(InvalidFingerprintError, match="key 'x'"):
        db.insert_if_new("x", "12")
    assert [r.key for r in db] == ["a"]
    with pytest.raises(InvalidArgumentError, match='"raise" or "report"'):
        db.insert_if_new_many([("b", FAR[1])], invalid="skip")
    with pytest.raises(InvalidArgumentError, match='"raise" or "report"'):
        db.insert_text_if_new_many([("b", "some words")], invalid=None)


def test_every_outcome_of_insert_text_if_new(text_db):
    a, b = page(1), page(2)
    assert statuses([text_db.insert_text_if_new("u/a", a)]) == [("u/a", "stored")]
    again = text_db.insert_text_if_new("u/a", "<p>%s</p>" % a, html=True)
    assert again.status == "unchanged" and [m.key for m in again] == ["u/a"]
    assert again[0].resemblance == 1.0
    mirror = text_db.insert_text_if_new("u/mirror", a + " w1 w2")
    assert mirror.status == "duplicate" and [m.key for m in mirror] == ["u/a"]
    decisions = text_db.insert_text_if_new_many(
        [("u/b", b), ("u/empty", "   "), ("u/nav", "<nav> </nav>"), ("u/b2", b + " w9"),
         ("u/a", a), ("u/meta", page(4), {1}), ("u/c", page(3))], html=True)
    assert statuses(decisions) == [
        ("u/b", "stored"), ("u/empty", "invalid"), ("u/nav", "invalid"), ("u/b2", "duplicate"),
        ("u/a", "unchanged"), ("u/meta", "invalid"), ("u/c", "stored")]
    assert "no words" in decisions[1].reason and decisions[3][0].key == "u/b"
    assert sorted(r.key for r in text_db) == ["u/a", "u/b", "u/c"] and text_db.check() == []


def test_a_text_batch_that_raises_writes_nothing_of_it(text_db):
    with pytest.raises(InvalidArgumentError, match="key 'u/empty'.*no words"):
        text_db.insert_text_if_new_many([("u/b", page(2)), ("u/empty", "")], invalid="raise")
    with pytest.raises(InvalidArgumentError, match="key 'e'.*no words"):
        text_db.insert_text_if_new("e", "... !!!")
    assert len(text_db) == 0
    only_bad = text_db.insert_text_if_new_many([("x", ""), ("y", 12)])
    assert statuses(only_bad) == [("x", "invalid"), ("y", "invalid")]
    assert "str or bytes" in only_bad[1].reason and len(text_db) == 0


def test_refresh_records_an_unchanged_page_as_seen_now(text_db, monkeypatch):
    text_db.insert_text("u/a", page(1))
    monkeypatch.setattr(simhashdb.batches, "_now", lambda: 4_000_000_000)
    again = text_db.insert_text_if_new("u/a", page(1), refresh=True)
    assert again.status == "unchanged" and text_db.get("u/a").stored_at == 4_000_000_000
