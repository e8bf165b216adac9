"""The quality harness in quick mode: the default recipe still meets the
figures it was chosen by (tools/eval_quality.py, README)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))

import eval_quality  # noqa: E402

DEFAULT = "simhashdb default (chars, n=3, CJK n=2)"


def test_default_recipe_meets_its_recall_and_false_positive_figures():
    (row,) = eval_quality.run(**eval_quality.QUICK, only=[DEFAULT])
    assert row["recall"][0.05][3] >= 0.80
    assert row["recall"][0.01][3] >= 0.95
    assert row["fpr"][3] <= 2e-4  # one pair in the 5,000 of the quick sample


def test_edits_change_the_requested_share_of_words():
    import random
    text = " ".join("w%d" % i for i in range(1000))
    edited = eval_quality.edit(text, 0.05, random.Random(1))
    changed = sum(a != b for a, b in zip(text.split(), edited.split()))
    assert 0 < changed and edited != text
    assert eval_quality.is_cjk("网页" * 100) and not eval_quality.is_cjk(text)
