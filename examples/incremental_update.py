"""Keep a database in sync with a corpus that changes between runs: new files
are inserted, edited ones upserted, removed ones deleted; then compact.

The corpus is made here, in a temporary folder, from paragraphs of the Python
standard library's docstrings, and changed a little on every round.

Usage: python examples/incremental_update.py [--rounds 4] [--files 300]
"""

import argparse
import inspect
import pathlib
import random
import shutil
import tempfile

import simhashdb


def sync(db: simhashdb.DB, root: pathlib.Path) -> dict[str, int]:
    """Bring ``db`` in line with the files under ``root``; return what changed."""
    on_disk = {str(p.relative_to(root)): simhashdb.fingerprint(p.read_bytes())
               for p in root.rglob("*.txt")}
    changed = [(key, fp) for key, fp in on_disk.items()
               if (record := db.get(key)) is None or record.fingerprint != fp]
    added = sum(1 for key, _ in changed if key not in db)
    db.insert_many(changed)
    removed = db.delete_many([r.key for r in db if r.key not in on_disk])
    return {"added": added, "edited": len(changed) - added, "removed": removed}


def paragraphs() -> list[str]:
    texts = [inspect.getdoc(obj) or "" for module in (random, pathlib, inspect, argparse)
             for obj in vars(module).values()]
    return [t for t in texts if len(t) > 200]


def change(root: pathlib.Path, rng: random.Random, texts: list[str], round_number: int) -> None:
    files = sorted(root.glob("*.txt"))
    for path in rng.sample(files, len(files) // 10):  # edit a few words
        words = path.read_text().split()
        for i in rng.sample(range(len(words)), max(1, len(words) // 50)):
            words[i] = "edited%d" % round_number
        path.write_text(" ".join(words))
    for path in rng.sample(files, len(files) // 20):
        path.unlink()
    for i in range(len(files) // 10):
        (root / ("new-%d-%d.txt" % (round_number, i))).write_text(rng.choice(texts) * 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--files", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(7)
    texts = paragraphs()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="incremental-"))
    try:
        root = workdir / "corpus"
        root.mkdir()
        for i in range(args.files):
            (root / ("doc-%04d.txt" % i)).write_text(" ".join(rng.sample(texts, 3)))
        with simhashdb.DB(str(workdir / "corpus.db"), distance=3, recipe=simhashdb.RECIPE) as db:
            for round_number in range(args.rounds):
                if round_number:
                    change(root, rng, texts, round_number)
                print("round %d: %s, %d documents" % (round_number, sync(db, root), len(db)))
            size = "disk_bytes" if "disk_bytes" in db.stats() else "memory_bytes"  # Redis: RAM
            before = db.stats()[size]
            db.compact()
            problems = db.check()
            print("compacted %d -> %d bytes; check: %s"
                  % (before, db.stats()[size], problems or "no problems"))
            in_sync = sync(db, root) == {"added": 0, "edited": 0, "removed": 0}
            print("database matches the corpus:", in_sync)
            if problems or not in_sync:
                raise SystemExit(1)
    finally:
        shutil.rmtree(workdir)  # the corpus and its database were the example's alone


if __name__ == "__main__":
    main()
