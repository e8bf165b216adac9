"""What ARCHITECTURE.md says of the code, checked where it can be: the
imports go one way (CLI -> DB -> storage interface -> backend -> kernels),
nothing backend-specific is outside its backend, every exception class is
defined in errors.py (with the exceptions listed below, and why), and no
module is too long to read."""

import ast
import builtins
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simhashdb"
BACKENDS = {"simhashdb.storage.lmdb": {"lmdb", "simhashdb._lmdb"},
            "simhashdb.storage.redis": {"redis", "simhashdb._redis"}}
# DB and the modules of its concerns: below the CLI, Spark and the asyncio callers
DATABASE = {"simhashdb.db", "simhashdb.batches", "simhashdb.params", "simhashdb.check",
            "simhashdb.maintenance",
            "simhashdb.pairs", "simhashdb.results", "simhashdb.rule", "simhashdb.matching",
            "simhashdb.records", "simhashdb.layout", "simhashdb.fingerprint", "simhashdb.errors",
            "simhashdb.parquet"}
CALLERS = {"simhashdb.cli", "simhashdb.options", "simhashdb.console", "simhashdb.wiring",
           "simhashdb.sparkjob", "simhashdb.spark", "simhashdb.aio", "simhashdb.server",
           "simhashdb.scrapy", "simhashdb.inputs"}
# what a backend may import of the package besides the storage interface
BELOW = {"simhashdb.errors", "simhashdb.records", "simhashdb.layout"}
# the CLI's modules: the commands, their shared wiring and the spark command
CLI = {"simhashdb.cli", "simhashdb.wiring", "simhashdb.sparkjob"}
# Exception classes defined outside errors.py, and why they are still there
ELSEWHERE = {
    # the server's refusal of a request, answered as an HTTP status, never raised out
    ("simhashdb/server.py", "_Refused"),
}
LONGEST = 700  # lines of a module


def modules():
    """{module name: its parsed source} of the package's Python modules."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = (path, ast.parse(path.read_text("utf-8")))
    return found


def imports(name, tree):
    """The absolute names of the modules ``name`` imports, anywhere in it."""
    package = name
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = package.split(".")
                is_package = (PACKAGE.parent / pathlib.Path(*here) / "__init__.py").exists()
                stem = here if is_package else here[:-1]
                stem = stem[:len(stem) - (node.level - 1)]
                base = ".".join(stem + ([base] if base else []))
            names.add(base)
            names.update("%s.%s" % (base, alias.name) for alias in node.names)
    return names


def within(module, package):
    return module == package or module.startswith(package + ".")


def test_backends_import_nothing_above_the_storage_interface_nor_each_other():
    for name, (_, tree) in modules().items():
        backend = next((b for b in BACKENDS if within(name, b)), None)
        if backend is None:
            continue
        for imported in imports(name, tree):
            assert not any(within(imported, m) for m in (DATABASE | CALLERS) - BELOW), \
                (name, imported)
            assert not within(imported, "simhashdb.storage.registry"), (name, imported)
            assert not any(within(imported, other) for other in BACKENDS if other != backend), \
                (name, imported)


def test_nothing_backend_specific_is_outside_its_backend():
    """py-lmdb and the LMDB engine only under storage/lmdb, Redis only under
    storage/redis (the registry names them as strings, importing neither)."""
    for name, (_, tree) in modules().items():
        for backend, specific in BACKENDS.items():
            if not within(name, backend):
                assert not any(within(imported, s) for imported in imports(name, tree)
                               for s in specific | {backend}), (name, backend)


def test_the_database_imports_no_caller_and_the_callers_go_through_it():
    """DB and its concerns import neither the CLI nor Spark nor the asyncio
    callers; the CLI's modules reach storage only through DB (no storage import)."""
    found = modules()
    for name in DATABASE:
        for imported in imports(name, found[name][1]):
            assert not any(within(imported, caller) for caller in CALLERS), (name, imported)
    for name in CLI:
        for imported in imports(name, found[name][1]):
            assert not within(imported, "simhashdb.storage"), (name, imported)
    for name, (_, tree) in found.items():
        if name not in ("simhashdb.__main__", "simhashdb.cli"):
            assert not any(within(imported, "simhashdb.cli")
                           for imported in imports(name, tree)), name


def test_the_kernels_know_nothing_of_lmdb():
    """_ext and _text (and the parts they include) take ints and buffers:
    they declare no LMDB call."""
    for kernel in ("_ext.pyx", "_text.pyx"):
        source = (ROOT / "ext" / kernel).read_text("utf-8")
        parts = re.findall(r'^include "([^"]+)"', source, re.M)
        for text in [source] + [(ROOT / "ext" / part).read_text("utf-8") for part in parts]:
            assert "clmdb" not in text and "mdb_" not in text, kernel


def exception_classes():
    """(file, class) of every exception class defined in the package's
    Python and Cython sources: classes whose bases are exceptions."""
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "ext").glob("*.p[yx][xi]")):
        for name, bases in re.findall(r"^\s*(?:cdef\s+)?class\s+(\w+)\(([^)]*)\)\s*:",
                                      path.read_text("utf-8"), re.M):
            defined.append((path.relative_to(ROOT).as_posix(), name,
                            [b.strip().split(".")[-1] for b in bases.split(",") if b.strip()]))
    known = {name for name in dir(builtins)
             if isinstance(getattr(builtins, name), type)
             and issubclass(getattr(builtins, name), BaseException)}
    while True:
        more = {name for _, name, bases in defined if set(bases) & known} - known
        if not more:
            return {(where, name) for where, name, bases in defined if name in known
                    and not hasattr(builtins, name)}
        known |= more


def test_exception_classes_are_defined_in_errors_py():
    found = exception_classes()
    assert ("simhashdb/errors.py", "SimhashDBError") in found  # (the search finds them)
    assert ("simhashdb/errors.py", "CliError") in found
    elsewhere = {(where, name) for where, name in found if where != "simhashdb/errors.py"}
    assert elsewhere <= ELSEWHERE, elsewhere - ELSEWHERE


def test_modules_are_short_enough_to_read():
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text("utf-8").splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert {name: lines for name, lines in lengths.items() if lines > LONGEST} == {}
