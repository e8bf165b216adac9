"""The quality harness in quick mode, on a small corpus made of what any Python
has: the default recipe still meets the goal it was chosen by, and the text
rule (bands or fingerprint candidates, confirmed by resemblance) meets the
goals of issue 21 on it (tools/eval_quality.py, tools/eval_dedupe.py,
tools/README.md).
"""

import pathlib
import random
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))

import eval_dedupe  # noqa: E402
import eval_quality  # noqa: E402

import simhashdb  # noqa: E402

pytestmark = pytest.mark.slow  # the corpus, the recipes and the stream take a minute
DEFAULT = "simhashdb default (%s)" % simhashdb.RECIPE.split("/")[0]
OLD = "simhashdb recipe 2 (chars 2+3+4, counts)"


@pytest.fixture(scope="module")
def quick():
    c = eval_quality.Corpus(eval_quality.python_corpus(), recall_per_kind=60,
                            pairs_per_kind=1000)
    assert c.kinds == ["cjk", "code", "html", "prose"]
    return c


@pytest.fixture(scope="module")
def rows(quick):
    methods = eval_quality.methods(peers_too=False)
    return {name: eval_quality.evaluate(name, methods[name], quick) for name in (DEFAULT, OLD)}


def test_default_recipe_keeps_unrelated_documents_apart_and_finds_edited_ones(rows):
    row = rows[DEFAULT]
    assert row["false"][3]["all"] <= 0.01  # unrelated documents within 3 bits, per document
    assert row["recall"][0.01][3]["all"] >= 0.90
    assert row["recall"][0.05][3]["all"] >= 0.80
    # independent fingerprints sit 32 bits apart; pydoc's pages repeat the same
    # generated descriptions of every class, so they get a little less room
    real = [row["distance"][kind] for kind in ("code", "html", "prose")]
    assert sum(real) / 3 >= 28 and min(real) >= 27
    # composed CJK has generated script, so no word of it is in the table:
    # its frequent words weigh as much as its rare ones
    assert row["distance"]["cjk"] >= 24


def test_the_old_default_drew_unrelated_pages_of_one_template_together(rows):
    # what recipe 3 was made for: pydoc's pages of different modules
    assert rows[OLD]["distance"]["html"] < 20 < 28 <= rows[DEFAULT]["distance"]["html"]


@pytest.fixture(scope="module")
def dedupe(quick):
    """The quick corpus through DB.insert_text_if_new_many in one shuffled
    stream, each edited copy planted after its original (240 a cell)."""
    return eval_dedupe.run_db(quick)


def test_the_text_rule_flags_no_unrelated_document(dedupe):
    # the goal: at most 0.01% of a corpus taken for copies of unrelated
    # documents; of 358 documents, that is none
    assert dedupe["flagged"] == 0


@pytest.mark.parametrize("model", list(eval_quality.EDIT_MODELS))
def test_the_text_rule_finds_copies_by_every_edit_model(dedupe, model):
    found = dedupe["found_by_model"][model]
    least = eval_quality.EDIT_MODELS[model][0]  # 1% (a foreign block: 3%)
    assert found[least]["all"] >= 0.99
    # the goal at 5%, which the band index makes: the fingerprint alone
    # (within 3 bits) finds 0.37 of the foreign-word copies here
    assert found[0.05]["all"] >= 0.95


def test_the_text_rule_draws_its_line_where_10_percent_edits_leave_a_copy(dedupe):
    # A 10% edit of words leaves a word 5-shingle Jaccard near 0.49, at the
    # line (resemblance 0.45), so the share of such copies found measures the
    # line: about 0.66 here at 0.45, 0.81 at 0.4, 0.47 at 0.5. This corpus has
    # no unrelated documents near the line, so a line drawn too low would
    # show nowhere else (on the whole corpus unrelated candidates reach 0.40).
    cells = [dedupe["found_by_model"][model][0.10]["all"]
             for model in (eval_quality.FOREIGN_WORDS, eval_quality.SAME_DOCUMENT)]
    assert 0.55 <= sum(cells) / 2 <= 0.75


def test_edits_change_the_requested_share_of_words_and_keep_separators():
    rng = random.Random(1)
    words = ["w%d" % i for i in range(1000)]
    latin = eval_quality.Document("\n".join(words), "prose")
    edited = eval_quality.edit(latin, 0.05, rng)
    removed = set(words) - set(edited.split())  # by deletions and substitutions
    assert 10 <= len(removed) <= 50 and edited.count("\n") == 999
    cjk = eval_quality.Document("网页搜索引擎" * 100, "cjk")
    assert len(cjk.units) == 600
    assert eval_quality.edit(cjk, 0.05, rng) != cjk.text


def test_html_edits_touch_the_text_not_the_markup():
    page = "<html><body>" + "".join("<p class='x'>word%d here</p>" % i for i in range(200))
    doc = eval_quality.Document(page, "html", html=True)
    edited = eval_quality.edit(doc, 0.10, random.Random(3))
    assert edited != page
    assert edited.count("<p class='x'>") == 200 and edited.count("</p>") == 200


def test_cjk_documents_are_composed_in_cjk_scripts_with_real_word_statistics():
    rng = random.Random(2)
    texts = [p.read_text("utf-8", "replace") for p in
             sorted(pathlib.Path(eval_quality.__file__).parent.parent.rglob("*.py"))]
    docs = eval_quality.cjk_documents(texts * 3, 3, rng)
    assert docs and all(len(d) >= 1000 for d in docs)
    for doc in docs:
        cjk = sum(1 for c in doc if ord(c) >= 0x3040)
        assert cjk > 0.8 * len(doc.replace(" ", ""))


def test_false_matches_are_confirmed_by_word_shingles():
    a = eval_quality.Document("one two three four five six seven eight nine ten", "prose")
    b = eval_quality.Document("one two three four five six seven eight nine eleven", "prose")
    c = eval_quality.Document("alpha beta gamma delta epsilon zeta eta theta iota", "prose")
    sa, sb, sc = (eval_quality.shingle_set(d) for d in (a, b, c))
    assert eval_quality.jaccard(sa, sb) == 5 / 7 and eval_quality.jaccard(sa, sc) == 0
