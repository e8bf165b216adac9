import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_stdlib_demo_imports_then_finds_the_database_persisted(tmp_path):
    db = str(tmp_path / "demo.db")
    run = [sys.executable, str(EXAMPLES / "stdlib_demo.py"), db]
    first = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert first.startswith("imported ") and "bits  encodings/" in first
    second = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "already holds" in second
    assert second.splitlines()[1:] == first.splitlines()[1:]
