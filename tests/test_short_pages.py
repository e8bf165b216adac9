"""short_words: short pages decided by near-exact match only, against the
default rule, through every path the text rule decides (DB calls, find_all,
the in-memory pairs, the CLI, AsyncDB); Spark's are in tests/test_spark.py."""

import asyncio
import json
import random

import pytest

import simhashdb
from simhashdb import cli, matching, rule
from simhashdb.aio import AsyncDB
from simhashdb.layout import Layout

SHORT = 132  # the value docs/crawlers.md recommends
WORDS = ("river bridge farmer cattle school valley volunteer sandbag street official rain road "
         "north library square reading children lecture history market harbour ship train "
         "station garden winter summer letter paper window").split()
# a site's template that is not marked up as one (no nav, header or footer):
# html="main" cannot find it, short_words can
MENU = ("Home Products Solutions Pricing Documentation Downloads Community Forum Blog Events "
        "Careers About us Contact Support Partners Press Legal Privacy policy Terms of use "
        "Cookie settings Sitemap Accessibility Status Security Newsletter Sign in Register "
        "Search this site English Deutsch Francais Espanol")
FOOTER = ("Follow us on social media Copyright 2026 Example Corporation All rights reserved "
          "Made with care in Europe Report a problem with this page")


def words(seed, n):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n))


def templated(content):
    return ('<div class="menu">%s</div><div class="text"><p>%s</p></div>'
            '<div class="bottom">%s</div>' % (MENU, content, FOOTER))


def short_page(seed):
    """A page of 20 words of its own under the 63 words of the template."""
    return templated(words(seed, 20))


def full_page(seed):
    return templated(words(seed, 600))


def edited(text, seed, every=40):
    """``text`` with one word in ``every`` replaced."""
    rng = random.Random(seed)
    parts = text.split(" ")
    for i in range(5, len(parts) - 5, every):
        parts[i] = rng.choice(WORDS) + "x"
    return " ".join(parts)


def pages():
    """(key, page): short pages that only their template makes alike, exact
    copies of two of them, full pages and edited copies of each."""
    short = [("s%d" % i, short_page(i)) for i in range(6)]
    copies = [("s0-copy", short[0][1]), ("s1-copy", short[1][1].replace("<p>", "<p> "))]
    full = [("f%d" % i, full_page(100 + i)) for i in range(3)]
    full_copies = [("f%d-edit" % i, edited(page, i)) for i, (_, page) in enumerate(full)]
    return short + copies + full + full_copies


EXPECTED = {("s0", "s0-copy"), ("s1", "s1-copy")} | {("f%d" % i, "f%d-edit" % i)
                                                    for i in range(3)}  # with short_words


def check_pairs(found, short_words):
    """With short_words, the pairs are EXPECTED; without, more: pairs of short
    pages alike through their template."""
    if short_words:
        assert found == EXPECTED
    else:
        assert found > EXPECTED and all(a[0] == b[0] == "s" for a, b in found - EXPECTED)


def test_the_template_makes_short_pages_alike_and_full_pages_are_edited():
    """The premise of the other tests: two short pages resemble each other
    through the template alone, between the rule's threshold and NEAR_EXACT;
    an edited full page resembles its page well below NEAR_EXACT."""
    def signature(page):
        return simhashdb.fingerprint_with_signature(page, html=True)[1]
    alike = simhashdb.resemblance(signature(short_page(1)), signature(short_page(2)))
    assert rule.THRESHOLD <= alike < rule.NEAR_EXACT
    edit = simhashdb.resemblance(signature(full_page(100)), signature(edited(full_page(100), 0)))
    assert rule.THRESHOLD <= edit < rule.NEAR_EXACT


@pytest.mark.parametrize("n, short", [(40, True), (100, True), (120, True), (150, False),
                                      (200, False), (1000, False)])
def test_a_text_is_short_by_the_bins_its_signature_fills(n, short):
    signature = simhashdb.fingerprint_with_signature(words(n, n))[1]
    assert (rule.filled_bins(signature) < rule.text_rule(short_words=SHORT).short_bins) == short


@pytest.mark.parametrize("short_words", [-1, 1.5, True, "132"])
def test_a_bad_short_words_raises(db_path, short_words):
    with simhashdb.DB(db_path, recipe=simhashdb.RECIPE) as db:
        with pytest.raises(simhashdb.InvalidArgumentError, match="short_words must be an int"):
            db.insert_text_if_new("a", "some words here", short_words=short_words)
        with pytest.raises(simhashdb.InvalidArgumentError, match="short_words"):
            db.query_text("some words here", short_words=short_words)


def test_menu_dominated_pages_are_stored_with_short_words_full_pages_decided_alike(db):
    """Short pages are stored with the option (without it, each is found
    alike to others through the template); copies of short pages and edited full
    pages are duplicates either way, with the same matches."""
    records = pages()
    with_option = db.insert_text_if_new_many(records, html=True, short_words=SHORT)
    got = {key: [m.key for m in d] for (key, _), d in zip(records, with_option)}
    assert all(d.status == "stored" for (key, _), d in zip(records, with_option)
               if key.startswith("s") and "-" not in key)
    assert got["s0-copy"] == ["s0"] and got["s1-copy"] == ["s1"]
    assert all(got["f%d-edit" % i] == ["f%d" % i] for i in range(3))
    for key, page in records:
        default = db.query_text(page, html=True)
        strict = db.query_text(page, html=True, short_words=SHORT)
        if key.startswith("f"):  # full pages: the option changes nothing
            assert [(m.key, m.resemblance) for m in strict] == [
                (m.key, m.resemblance) for m in default]
        elif "-" not in key:   # short pages: the template alone matches them
            assert len(default) > len(strict) == 1  # itself


def test_find_all_and_the_pairs_in_memory_keep_the_option(db_path):
    records = pages()
    with simhashdb.DB(db_path, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many(records, html=True)
        for short_words in (None, SHORT):
            check_pairs({(p.key_a, p.key_b) for p in db.find_all(short_words=short_words)},
                        short_words)
        assert {tuple(c) for c in db.clusters(short_words=SHORT)} == EXPECTED
    keys = [k for k, _ in records]
    prints = [simhashdb.fingerprint_with_signature(page, html=True) for _, page in records]
    for short_words in (None, SHORT):
        found = matching.text_pairs([fp for fp, _ in prints], [s for _, s in prints],
                                    Layout(4, 3), rule.text_rule(None, short_words))
        check_pairs({tuple(sorted((keys[i], keys[j]))) for i, j, _ in found}, short_words)


def test_the_cli_takes_short_words(tmp_path, capsys):
    folder = tmp_path / "pages"
    folder.mkdir()
    for key, page in pages():
        (folder / (key + ".html")).write_text(page)
    every = str(tmp_path / "every")
    assert cli.main(["import", every, str(folder), "--html", "--quiet"]) == 0
    dropped = {}
    for short_words in ([], ["--short-words", str(SHORT)]):
        path = str(tmp_path / ("db%d" % len(short_words)))
        assert cli.main(["import", path, str(folder), "--html", "--if-new", "--quiet"]
                        + short_words) == 0
        dropped[bool(short_words)] = json.loads(
            capsys.readouterr().out.splitlines()[-1])["near_duplicates"]
        assert cli.main(["find-all", every, "--quiet"] + short_words) == 0
        check_pairs({tuple(sorted(k.rsplit("/", 1)[-1][:-5] for k in json.loads(line)[:2]))
                     for line in capsys.readouterr().out.splitlines()}, short_words)
    assert dropped[True] == len(EXPECTED) < dropped[False]


@pytest.mark.parametrize("argv, said", [
    (["import", "DB", "FILE", "--short-words", "132"], "--short-words is for --if-new"),
    (["find-all", "--input", "FILE", "--blocks", "4", "--short-words", "132"],
     "--short-words is for the texts of a database"),
])
def test_short_words_where_the_text_rule_does_not_decide_is_a_usage_error(
        tmp_path, capsys, argv, said):
    (tmp_path / "FILE").write_text("1\n2\n")
    argv = [str(tmp_path / a) if a in ("DB", "FILE") else a for a in argv]
    assert cli.main(argv) == 2
    assert said in capsys.readouterr().err


def test_async_db_takes_short_words(db_path):
    async def decide():
        async with AsyncDB(db_path, recipe=simhashdb.RECIPE) as db:
            await db.insert_text_if_new("s0", short_page(0), html=True)
            return (await db.insert_text_if_new("s1", short_page(1), html=True,
                                                short_words=SHORT),
                    await db.query_text(short_page(2), html=True),
                    await db.query_text(short_page(2), html=True, short_words=SHORT))

    stored, default, strict = asyncio.run(decide())
    assert stored.status == "stored" and [m.key for m in default] and not strict
