"""A user's script and the examples pass ``mypy --strict`` against the
package, as it sees an installed one (its own modules not checked)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytest.importorskip("mypy")


def mypy(tmp_path, *files):
    env = dict(os.environ, MYPYPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / "cache"), *map(str, files)],
        capture_output=True, text=True, env=env, cwd=tmp_path)


def test_a_typed_script_and_the_examples_pass_mypy_strict(tmp_path):
    files = [ROOT / "tests" / "typed_usage.py", *sorted((ROOT / "examples").glob("*.py"))]
    result = mypy(tmp_path, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_types_are_seen_so_a_wrong_use_is_refused(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import simhashdb\n"
                     "with simhashdb.DB('x.db') as db:\n"
                     "    name: bytes = db.query(1)[0].distance\n"
                     "    simhashdb.fingerprint(3.5)\n")
    result = mypy(tmp_path, wrong)
    assert result.returncode == 1
    assert 'type "int", variable has type "bytes"' in result.stdout
    assert 'Argument 1 to "fingerprint" has incompatible type "float"' in result.stdout
