import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
pytestmark = pytest.mark.usefixtures("backend")  # the examples inherit SIMHASHDB_BACKEND


def run(*argv):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
                          check=True).stdout


def test_stdlib_demo_imports_then_finds_the_database_persisted(tmp_path):
    db = tmp_path / "demo.db"
    first = run(EXAMPLES / "stdlib_demo.py", db)
    assert first.startswith("imported ") and "bits  encodings/" in first
    second = run(EXAMPLES / "stdlib_demo.py", db)
    assert "already holds" in second
    assert second.splitlines()[1:] == first.splitlines()[1:]


def test_crawler_dedupe_reports_near_duplicates(tmp_path):
    out = run(EXAMPLES / "crawler_dedupe.py", "--db", tmp_path / "crawl.db", "--limit", "1500")
    assert "duplicate  " in out and "resemblance" in out
    assert "crawled 1500 pages" in out and "holds" in out


def test_incremental_update_stays_in_sync(tmp_path):
    out = run(EXAMPLES / "incremental_update.py", "--rounds", "3", "--files", "120")
    assert "round 2:" in out and "check: no problems" in out
    assert out.rstrip().endswith("database matches the corpus: True")
