"""The quality harness in quick mode: the default recipe still meets the
figures it was chosen by (tools/eval_quality.py, README)."""

import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))

import eval_quality  # noqa: E402

DEFAULT = "simhashdb default (chars n=2+3+4, CJK n=1+2)"


def test_default_recipe_meets_its_recall_and_false_positive_figures():
    (row,) = eval_quality.run(**eval_quality.QUICK, only=[DEFAULT])
    assert row["recall"][0.05][3] >= 0.90
    assert row["recall"][0.01][3] >= 0.98
    assert row["recall_cjk"][0.05][3] >= 0.90  # CJK text as usable as Latin
    assert row["fpr"][3] <= 1e-4  # at most two pairs of the quick sample's 20,000
    assert row["fpr_cjk"][3] <= 2e-4  # at most one of 5,000


def test_edits_change_the_requested_share_of_words_and_keep_separators():
    rng = random.Random(1)
    words = ["w%d" % i for i in range(1000)]
    latin = eval_quality.Document(words, ["\n"] * 999, " ", cjk=False)
    edited = eval_quality.edit(latin, 0.05, rng)
    removed = set(words) - set(edited.split())  # by deletions and substitutions
    assert 10 <= len(removed) <= 50 and edited.count("\n") == 999
    cjk = eval_quality.Document(["网页", "搜索", "引擎"] * 100, [""] * 299, "", cjk=True)
    assert cjk.text == "网页搜索引擎" * 100
    assert eval_quality.edit(cjk, 0.05, rng) != cjk.text


def test_cjk_documents_are_composed_in_cjk_scripts_with_real_word_statistics():
    rng = random.Random(2)
    docs = eval_quality.cjk_documents(eval_quality.stdlib_texts(rng), 6, rng)
    assert len(docs) == 6 and all(d.cjk and len(d.text) >= 1000 for d in docs)
    for doc in docs:
        cjk = sum(1 for c in doc.text if ord(c) >= 0x3040)
        assert cjk > 0.8 * len(doc.text.replace(" ", ""))
    assert " " not in docs[0].text and " " in docs[2].text  # Chinese; Korean
    # Zipf: the commonest word is far commoner than the median one
    counts = sorted((docs[0].units.count(u) for u in set(docs[0].units)), reverse=True)
    assert counts[0] >= 10 * counts[len(counts) // 2]
