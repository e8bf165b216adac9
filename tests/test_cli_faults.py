"""The command line's faults found in a first hour beside it: an export that
import reads back whole, bounded keys, imports that report what they did,
messages in the command line's words."""

import io
import json
import random
import sys

import pytest

import simhashdb
from simhashdb import cli

WORDS = ["river", "bridge", "morning", "farmer", "cattle", "school", "valley", "water",
         "street", "official", "friday", "rain", "road", "north", "library", "town",
         "square", "reading", "children", "cafe", "hall", "lecture", "history", "market"]


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def text(rng, words=120):
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


def edited(rng, original, share):
    words = original.split()
    for i in rng.sample(range(len(words)), int(len(words) * share)):
        words[i] = "edit%d" % rng.randrange(10**6)
    return " ".join(words)


@pytest.mark.usefixtures("backend")
def test_export_then_import_keeps_a_text_database_whole(tmp_path, capsys):
    rng = random.Random(4)
    texts = [text(rng) for _ in range(30)]
    source, copy = str(tmp_path / "source.db"), str(tmp_path / "copy.db")
    with simhashdb.DB(source, recipe=simhashdb.RECIPE) as db:
        db.insert_text_many((i, t) for i, t in enumerate(texts))
    code, dump, _ = run(capsys, "export", source)
    assert code == 0
    (tmp_path / "dump.jsonl").write_text(dump)
    code, _, err = run(capsys, "import", copy, tmp_path / "dump.jsonl")
    assert code == 0, err
    assert run(capsys, "export", copy)[1] == dump  # signatures and all
    probes = [edited(rng, t, share) for t in texts[:10] for share in (0.02, 0.1, 0.3)]
    probes += [text(rng) for _ in range(5)]
    decisions = []
    for path in (source, copy):
        with simhashdb.DB(path) as db:
            assert db.recipe == simhashdb.RECIPE
            decisions.append([[(m.key, m.distance, m.resemblance) for m in found]
                              for found in db.insert_text_if_new_many(
                                  ("probe%d" % i, p) for i, p in enumerate(probes))])
    assert decisions[0] == decisions[1]
    assert any(found and found[0][2] is not None for found in decisions[0])
