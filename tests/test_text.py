"""Text in, decisions out: DB.insert_text, insert_text_if_new(_many), query_text,
by the database's own recipe, candidates confirmed by the stored signature."""

import pathlib
import random
import sysconfig

import msgpack
import pytest

import simhashdb
from simhashdb.db import FORMAT_VERSION
from simhashdb import InvalidArgumentError, ParameterMismatchError
from simhashdb.storage.lmdb import format as lmdb_format

from conftest import store_values, stored_value

RECIPE_2 = "simhashdb-2/nfkc-casefold/chars/runs-3/shingles-2-3-4/cjk-shingles-1-2/counts/fast-hash"
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])


def texts(n, seed=0):
    paths = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 5000)
    return [p.read_text("utf-8") for p in random.Random(seed).sample(paths, n)]


def edited(text, rate, seed=0):
    rng = random.Random(seed)
    words = text.split(" ")
    for _ in range(max(1, round(rate * len(words)))):
        i = rng.randrange(len(words))
        words[i] = rng.choice(words)
    return " ".join(words)


def test_insert_text_if_new_stores_new_texts_and_reports_edited_copies(tmp_path):
    docs = texts(20)
    with simhashdb.DB(tmp_path / "db") as db:
        for i, text in enumerate(docs):
            assert db.insert_text_if_new(i, text, {"n": i}) == []
        assert len(db) == 20 and db.recipe == simhashdb.RECIPE
        for i, text in enumerate(docs):
            found = db.insert_text_if_new("copy%d" % i, edited(text, 0.01, i))
            assert [m.key for m in found] == [i]
            assert found[0].fingerprint == simhashdb.fingerprint(text)
        assert len(db) == 20 and db.get(3).meta == {"n": 3}
        assert db.get(3).fingerprint == simhashdb.fingerprint(docs[3])


def test_query_text_answers_from_a_snapshot_and_a_readonly_database(tmp_path):
    docs = texts(10, seed=1)
    with simhashdb.DB(tmp_path / "db") as db:
        db.insert_text_many([("k%d" % i, t) for i, t in enumerate(docs)])
    with simhashdb.DB(tmp_path / "db", readonly=True) as db:
        found = [[m.key for m in db.query_text(edited(text, 0.02, i))]
                 for i, text in enumerate(docs)]
        # recall at 2% edits is above 0.9, and the stdlib files sampled differ
        # between Python versions: most copies are found, none as another key
        assert sum(keys == ["k%d" % i] for i, keys in enumerate(found)) >= 8
        assert all(keys in ([], ["k%d" % i]) for i, keys in enumerate(found))
        unrelated = " ".join("word%d" % (i % 97) for i in range(3000))
        assert db.query_text(unrelated) == []


def test_html_is_stripped_before_both_signatures(tmp_path):
    body = texts(1, seed=2)[0].replace("<", " ").replace("&", " ")
    page = "<html><body><nav>Home Index Next</nav><pre>%s</pre></body></html>" % body
    with simhashdb.DB(tmp_path / "db") as db:
        db.insert_text("page", page, html=True)
        assert db.get("page").fingerprint == simhashdb.fingerprint(page, html=True)
        assert [m.key for m in db.query_text(body)] == ["page"]
        assert [m.key for m in db.query_text(page.replace("Home", "Start"), html=True)] == \
            ["page"]


def test_a_batch_checks_each_text_against_those_stored_before_it(tmp_path):
    a, b = texts(2, seed=3)
    with simhashdb.DB(tmp_path / "db") as db:
        found = db.insert_text_if_new_many([("a", a), ("b", b), ("a2", edited(a, 0.01)),
                                            ("b2", b, {"x": 1})])
        assert [[m.key for m in f] for f in found] == [[], [], ["a"], ["b"]]
        assert sorted(r.key for r in db) == ["a", "b"]


def _store(db, key, fp, value):
    store_values(db, [(key, fp, msgpack.packb(value))])


def test_candidates_share_a_band_or_the_distance_and_resemblance_confirms_them(tmp_path):
    text, other = texts(2, seed=4)
    fp, signature = simhashdb.fingerprint_with_signature(text)
    _, other_signature = simhashdb.fingerprint_with_signature(other)
    with simhashdb.DB(tmp_path / "db", recipe=simhashdb.RECIPE) as db:
        # the same words, however far the fingerprint moved: they share every band
        far = fp ^ (2**64 - 1)
        _store(db, "same words, 64 bits", far, [far, None, None, signature])
        # other words within the distance: a candidate the resemblance turns away
        _store(db, "other words, 2 bits", fp ^ 0b11, [fp ^ 0b11, None, None, other_signature])
        # other words far away: no band shared, not a candidate
        _store(db, "other words, 40 bits", fp ^ (2**40 - 1),
               [fp ^ (2**40 - 1), None, None, other_signature])
        # stored by fingerprint alone: the exact Hamming contract, within the distance
        db.insert("fingerprint, 3 bits", fp ^ 0b111)
        db.insert("fingerprint, 4 bits", fp ^ 0b1111 << 8)
        found = db.query_text(text)
        assert [(m.key, m.distance) for m in found] == [
            ("fingerprint, 3 bits", 3), ("same words, 64 bits", 64)]
        assert found[0].resemblance is None and found[1].resemblance == 1.0
        assert db.query_text(text, threshold=1.0) == found
        assert [m.key for m in db.query_text(other, threshold=0)] == [
            "other words, 2 bits", "other words, 40 bits"]


def test_a_database_keeps_its_recipe_and_text_uses_it(tmp_path):
    docs = texts(3, seed=5)
    with simhashdb.DB(tmp_path / "old", recipe=RECIPE_2) as db:
        db.insert_many([(i, simhashdb.fingerprint(t, **simhashdb.RECIPES[RECIPE_2]))
                        for i, t in enumerate(docs)])
    with simhashdb.DB(tmp_path / "old") as db:  # older databases keep working
        assert db.recipe == RECIPE_2
        assert [m.key for m in db.query_text(docs[1])] == [1]
        db.insert_text("new", edited(docs[2], 0.3))
        assert db.get("new").fingerprint == simhashdb.fingerprint(
            edited(docs[2], 0.3), **simhashdb.RECIPES[RECIPE_2])
    with pytest.raises(ParameterMismatchError, match="recipes cannot be compared"):
        simhashdb.DB(tmp_path / "old", recipe=simhashdb.RECIPE)


def test_an_unnamed_database_takes_the_default_only_while_empty(tmp_path):
    with simhashdb.DB(tmp_path / "empty") as db:
        assert db.recipe is None and db.query_text("some words here") == []
        db.insert_text("a", "some words here")
    with simhashdb.DB(tmp_path / "empty") as db:
        assert db.recipe == simhashdb.RECIPE
    with simhashdb.DB(tmp_path / "raw") as db:
        db.insert("a", 12345)
        with pytest.raises(ParameterMismatchError, match="unnamed recipe"):
            db.insert_text("b", "some words here")
        with pytest.raises(ParameterMismatchError, match="unnamed recipe"):
            db.query_text("some words here")


def test_texts_without_words_and_bad_records_are_refused(tmp_path):
    with simhashdb.DB(tmp_path / "db") as db:
        for empty in ("", "  \n", "... --- !!!"):
            with pytest.raises(InvalidArgumentError, match="no words"):
                db.insert_text_if_new("e", empty)
        with pytest.raises(InvalidArgumentError, match="no words"):
            db.insert_text("e", b"<p> <script>var x;</script></p>", html=True)
        with pytest.raises(InvalidArgumentError, match="record"):
            db.insert_text_if_new_many(["just a text"], invalid="raise")
        assert db.insert_text_if_new_many(["just a text"])[0].status == "invalid"
        with pytest.raises(InvalidArgumentError, match="str or bytes"):
            db.insert_text("k", 12)
        assert len(db) == 0


def test_resemblance_estimates_word_shingle_overlap():
    text = texts(1, seed=6)[0]
    _, a = simhashdb.fingerprint_with_signature(text)
    assert len(a) == 128 and simhashdb.resemblance(a, a) == 1.0
    for rate, low in ((0.01, 0.8), (0.05, 0.45)):
        _, b = simhashdb.fingerprint_with_signature(edited(text, rate))
        assert low <= simhashdb.resemblance(a, b) < 1.0
    _, c = simhashdb.fingerprint_with_signature(texts(1, seed=7)[0])
    assert simhashdb.resemblance(a, c) < 0.2
    _, short = simhashdb.fingerprint_with_signature("two words")
    assert sum(1 for byte in short if byte) <= 2  # one shingle, one bin
    with pytest.raises(InvalidArgumentError):
        simhashdb.resemblance(a, a[:100])


def test_a_refreshed_text_document_keeps_its_signature(tmp_path):
    text = texts(1, seed=8)[0]
    with simhashdb.DB(tmp_path / "db") as db:
        db.insert_text("a", text, {"m": 1})
        before = db.get("a")
        found = db.insert_if_new("b", before.fingerprint ^ 1, refresh=True)
        assert [m.key for m in found] == ["a"]
        value = msgpack.unpackb(_raw_value(db, "a"))
        assert value[:2] == [before.fingerprint, {"m": 1}] and len(value[3]) == 128
        assert db.get("a").meta == {"m": 1}
        assert [m.key for m in db.query_text(edited(text, 0.03))] == ["a"]


def _raw_value(db, key):
    return stored_value(db, key)


def foreign_block(text, foreign, rate, seed=0):
    """``text`` with a run of ``rate`` of its words' length, from ``foreign``,
    inserted at one place: new words, which move a fingerprint far."""
    rng = random.Random(seed)
    words = text.split(" ")
    at, start = rng.randrange(len(words)), rng.randrange(len(foreign) // 2)
    return " ".join(words[:at] + foreign[start:start + int(rate * len(words))] + words[at:])


def made_by_0_2(path):
    """Make the LMDB database at ``path`` look as simhashdb 0.2 left it: format
    1, the documents of format 6 and before, no band index (its text documents
    kept their signatures)."""
    import lmdb

    from conftest import documents_as_in_format_6
    documents_as_in_format_6(path, format=1)
    env = lmdb.open(path, max_dbs=1100)
    with env.begin(write=True) as txn:
        for band in range(32):
            for name in lmdb_format.BAND_RUNS.names(band):
                txn.drop(env.open_db(name, txn=txn), delete=True)
            txn.delete(lmdb_format.band_directory_key(band),
                       db=env.open_db(lmdb_format.RUN_DIRECTORY.name(), txn=txn))
    env.close()


@pytest.mark.lmdb_only
def test_a_database_of_0_2_gets_its_band_index_from_upgrade(tmp_path, backend):
    docs = texts(8, seed=6)
    path = str(tmp_path / "old")
    with simhashdb.DB(path, backend=backend) as db:
        db.insert_text_many([("k%d" % i, t) for i, t in enumerate(docs)])
        db.insert("raw", 12345)
    made_by_0_2(path)
    foreign = texts(1, seed=7)[0].split(" ")
    far_edit = [foreign_block(t, foreign, 0.1, i) for i, t in enumerate(docs)]
    with pytest.raises(simhashdb.DatabaseError, match="simhashdb-cli upgrade"):
        simhashdb.DB(path, readonly=True, backend=backend)
    simhashdb.upgrade(path, backend=backend)
    with simhashdb.DB(path, backend=backend) as db:
        assert db.stats()["format"] == FORMAT_VERSION and db.check() == []
        assert db.get("raw").fingerprint == 12345
        by_bands = [[m.key for m in found] for found in db.query_text_many(far_edit)]
        assert all(keys in ([], ["k%d" % i]) for i, keys in enumerate(by_bands))
        assert sum(map(len, by_bands)) >= len(docs) // 2


def test_text_documents_of_long_keys_keep_their_signature_and_key(tmp_path):
    url = "https://example.org/?q=" + "x" * 700
    text = texts(1, seed=9)[0]
    with simhashdb.DB(tmp_path / "db") as db:
        assert db.insert_text_if_new(url, text, {"m": 1}) == []
        found = db.insert_text_if_new("copy", edited(text, 0.03), refresh=True)
        assert [m.key for m in found] == [url] and found[0].resemblance > 0.45
        assert db.get(url).meta == {"m": 1} and db.check() == []
        assert [m.key for m in db.query_text(edited(text, 0.03, seed=1))] == [url]
        db.insert_text("copy", edited(text, 0.02))
        assert [(p.key_a, p.key_b) for p in db.find_all()] == [("copy", url)]
