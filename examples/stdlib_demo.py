"""Import the Python standard library's .py files into ./demo.db (each file
fingerprinted), then show some files' near-duplicates. Run it twice: the
second run finds the database already filled."""

import pathlib
import sys
import sysconfig
import time

import simhashdb

DB_PATH = sys.argv[1] if len(sys.argv) > 1 else "demo.db"
SHOWN = 6


def stdlib_files() -> tuple[pathlib.Path, list[pathlib.Path]]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return root, sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)


def main() -> None:
    root, paths = stdlib_files()
    try:
        db = simhashdb.DB(DB_PATH, distance=3, recipe=simhashdb.RECIPE)
    except simhashdb.DatabaseError as exc:  # e.g. filled by an older recipe or simhashdb
        sys.exit("%s\nRemove %s to rebuild it." % (exc, DB_PATH))
    with db:
        if len(db):
            print("%s already holds %d documents (stored by an earlier run)" % (DB_PATH, len(db)))
        else:
            start = time.perf_counter()
            files = ((str(p.relative_to(root)), simhashdb.fingerprint(p.read_bytes()),
                      {"bytes": p.stat().st_size}) for p in paths)
            count = db.insert_many(files, batch_size=500)
            print("imported %d files from %s into %s in %.1f s"
                  % (count, root, DB_PATH, time.perf_counter() - start))
        records = list(db)
        near = [(r, [m for m in matches if m.key != r.key]) for r, matches in
                zip(records, db.query_many(r.fingerprint for r in records))]
        shown = sorted(((r, others) for r, others in near if any(m.distance for m in others)),
                       key=lambda item: (min(m.distance for m in item[1] if m.distance),
                                         item[0].key))
        print("%d files have a near-duplicate 1 to %d bits away; the %d closest, with the "
              "files near each (0 bits: the same fingerprint):"
              % (len(shown), db.distance, min(SHOWN, len(shown))))
        for record, others in shown[:SHOWN]:
            print("  %s (%016x)" % (str(record.key), record.fingerprint))
            for match in others[:4]:
                print("      %d bits  %s" % (match.distance, str(match.key)))
        stats = db.stats()
        on_disk = "disk_bytes" in stats  # else Redis: the RAM of its keys
        print("%d documents, %d tables (blocks=%d, distance=%d), %.1f MB %s"
              % (stats["count"], stats["tables"], stats["blocks"], stats["distance"],
                 stats["disk_bytes" if on_disk else "memory_bytes"] / 1e6,
                 "on disk" if on_disk else "of RAM"))


if __name__ == "__main__":
    main()
